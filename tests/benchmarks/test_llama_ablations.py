"""``benchmarks/llama_ablations.py`` still runs, and writes what chapter 14 plots."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import llama_ablations
from mhbook import DecoderOnlyLM

pytestmark = pytest.mark.slow(seconds=12)  # trains two models for two steps


def test_the_ablation_benchmark_runs_for_two_steps(tmp_path):
    out = tmp_path / "ablations.json"
    argv = ["--steps", "2", "--seeds", "0", "1", "--variants", "MHA"]
    llama_ablations.main([*argv, "--workers", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["steps"] == 2 and result["commit"] and result["machine"]
    assert [(r["variant"], r["seed"]) for r in result["runs"]] == [("MHA", 0), ("MHA", 1)]
    row = result["summary"]["MHA"]
    assert row["seeds"] == 2 and row["sd_nats"] > 0  # the seeds differ
    assert math.isclose(row["mean_bits"], row["mean_nats"] / math.log(2))
    # MHA has two more key/value heads' worth of W_k and W_v in each of the 4 layers
    llama = DecoderOnlyLM(llama_ablations.SHAKESPEARE_MODEL, vocab_size=llama_ablations.VOCAB)
    extra = row["parameters"] - sum(p.numel() for p in llama.parameters())
    assert extra == 4 * 2 * 2 * 32 * 128


def test_each_variant_changes_what_it_names():
    base = llama_ablations.SHAKESPEARE_MODEL
    for name, changes in llama_ablations.VARIANTS.items():
        config = base.replace(**changes)
        assert all(getattr(config, f) != getattr(base, f) for f in changes), name
    gpt = base.replace(**llama_ablations.VARIANTS["GPT"])
    assert (gpt.norm, gpt.ffn, gpt.position, gpt.kv_heads, gpt.bias) == (
        "layer", "gelu", "sinusoidal", 4, True,
    )  # fmt: skip


def test_the_committed_results_are_complete_and_say_where_they_come_from():
    import mhbook

    result = mhbook.load_measured("llama_ablations")
    assert result["command"].startswith("python -m benchmarks.llama_ablations")
    assert result["commit"] != "unknown" and result["machine"] and result["date"]
    assert list(result["summary"]) == list(llama_ablations.VARIANTS)
    assert all(row["seeds"] >= 3 for row in result["summary"].values())
    with pytest.raises(FileNotFoundError, match="no measured results 'nope'.*llama_ablations"):
        mhbook.load_measured("nope")
