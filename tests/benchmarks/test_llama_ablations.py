"""``benchmarks/llama_ablations.py`` still runs, and writes what chapter 14 plots."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import short_validation

from benchmarks import llama_ablations
from mhbook import DecoderOnlyLM

pytestmark = pytest.mark.slow(seconds=3)  # trains two models for two steps


def test_the_ablation_benchmark_runs_for_two_steps(tmp_path, monkeypatch):
    data = short_validation(llama_ablations._data())
    monkeypatch.setattr(llama_ablations, "_data", lambda: data)
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
    nano = base.replace(**llama_ablations.VARIANTS["nanoGPT"])
    assert (nano.norm, nano.ffn, nano.position, nano.kv_heads, nano.bias) == (
        "layer", "gelu", "learned", 4, False,
    )  # fmt: skip
    assert nano.max_position_embeddings == 64 and nano.tie_embeddings and nano.d_ff == 512


def test_nanogpt_init_is_nanogpts():
    """N(0, 0.02) for every weight, N(0, 0.02 / sqrt(8)) for the residual projections of
    4 layers, zero biases, tied embeddings; nothing else changes."""
    config = llama_ablations.SHAKESPEARE_MODEL.replace(
        **llama_ablations.VARIANTS["nanoGPT"], bias=True
    )
    torch.manual_seed(0)
    model = DecoderOnlyLM(config, vocab_size=65)
    llama_ablations.nanogpt_init(model)
    params = dict(model.named_parameters())
    assert model.output.weight is model.embedding.weight
    for name, weight in params.items():
        if name.endswith(("self_attn.W_o.weight", "ffn.linear2.weight")):
            assert abs(weight.std().item() - 0.02 / math.sqrt(8)) < 0.001, name
        elif name.endswith(".bias") and "norm" not in name:
            assert torch.equal(weight, torch.zeros_like(weight)), name
        elif "norm" in name:
            assert torch.equal(
                weight, torch.ones_like(weight) if name.endswith("weight") else weight
            )
        else:
            assert abs(weight.std().item() - 0.02) < 0.002, name


def test_paired_differences_and_their_interval():
    runs = [
        {"variant": v, "seed": s, "val_loss_nats": loss}
        for v, s, loss in [
            ("Llama block", 0, 1.0), ("Llama block", 1, 2.0), ("Llama block", 2, 3.0),
            ("MHA", 0, 1.1), ("MHA", 1, 2.3), ("MHA", 2, 3.2), ("GELU", 0, 1.5),
        ]
    ]  # fmt: skip
    pair = llama_ablations.paired(runs, "MHA")
    assert pair["seeds"] == [0, 1, 2]
    assert math.isclose(pair["mean_nats"], 0.2) and math.isclose(pair["sd_nats"], 0.1)
    assert math.isclose(pair["ci95_nats"], 4.303 * 0.1 / math.sqrt(3))
    assert llama_ablations.paired(runs, "GELU") is None  # one seed in common


def test_the_committed_results_are_complete_and_say_where_they_come_from():
    import mhbook

    result = mhbook.load_measured("llama_ablations")
    assert result["command"].startswith("python -m benchmarks.llama_ablations")
    assert result["commit"] != "unknown" and result["machine"] and result["date"]
    assert list(result["summary"]) == list(llama_ablations.VARIANTS)
    assert all(row["seeds"] >= 3 for row in result["summary"].values())
    assert result["nanogpt_init"] == list(llama_ablations.NANOGPT_INIT)
    pairs = [
        row["vs_llama_block"] for name, row in result["summary"].items() if name != "Llama block"
    ]
    assert all(p["seeds"] == [0, 1, 2] and p["ci95_nats"] > 0 for p in pairs)
    with pytest.raises(FileNotFoundError, match="no measured results 'nope'.*llama_ablations"):
        mhbook.load_measured("nope")
