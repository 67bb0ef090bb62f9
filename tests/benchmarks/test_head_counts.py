"""``benchmarks/head_counts.py`` still runs, and the committed results hold every run that
chapter 7 reads, made with today's settings."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import mhbook
from benchmarks import head_counts
from mhbook.training.head_counts import (
    ENSEMBLE_MEMBER,
    FIXED_HEAD_DIM,
    HEAD_COUNT_DATA,
    HEAD_COUNT_MODEL,
    HEAD_COUNT_TRAIN,
    SEEDS,
)

pytestmark = pytest.mark.slow(seconds=10)  # trains and measures 12 small models, two steps each

KEYS = {
    "kernel", "variant", "num_heads", "seed", "d_model", "d_head", "parameters", "test_loss",
    "exact_match", "last_train_loss", "warmup_loss", "cpu_seconds",
}  # fmt: skip


def _key(run: dict) -> tuple:
    return run["variant"], run["num_heads"], run.get("head_dim"), run["seed"]


def test_the_benchmark_runs_for_two_steps(tmp_path):
    out = tmp_path / "head_counts.json"
    argv = ["--steps", "2", "--seeds", "0", "--kernels", "native", "--workers", "1"]
    head_counts.main([*argv, "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["command"].startswith("python -m benchmarks.head_counts --steps 2")
    assert result["commit"] and result["machine"] and result["date"]
    assert result["torch"] == torch.__version__ and result["steps"] == 2
    assert result["kernels"] == [torch.backends.cpu.get_cpu_capability()]
    runs = result["runs"]
    assert [_key(r) for r in runs] == [_key(j) for j in head_counts.jobs([0], 2)]
    assert all(set(r) >= KEYS for r in runs)
    # every head count of the sweep has the same parameters; the fixed head size has more
    sweep = {r["num_heads"]: r for r in runs if r["variant"] == "sweep"}
    assert len({r["parameters"] for r in sweep.values()}) == 1
    assert {r["d_head"] for r in sweep.values()} == {64 // h for h in sweep}
    fixed = [r for r in runs if r["variant"] == "fixed"]
    assert all(r["d_head"] == 16 and r["parameters"] > sweep[1]["parameters"] for r in fixed)
    members = [r for r in runs if r["variant"] == "member"]
    assert [r["seed"] for r in members] == [100, 101, 102, 103]
    assert all(r["d_model"] == 32 and r["ensemble_seed"] == 0 for r in members)
    assert all(len(r["warmup_loss"]) == 2 and 0 <= r["exact_match"] <= 1 for r in runs)


def test_the_committed_results_hold_every_run_the_chapter_reads():
    result = mhbook.load_measured("head_counts")
    assert result["command"].startswith("python -m benchmarks.head_counts")
    assert result["commit"] != "unknown" and result["machine"] and result["date"]
    # made with today's settings: a change to the sweep's data, model or training fails here
    assert result["data"] == HEAD_COUNT_DATA
    assert result["model"] == dataclasses.asdict(HEAD_COUNT_MODEL)
    assert result["train"] == dataclasses.asdict(HEAD_COUNT_TRAIN)
    assert result["steps"] == HEAD_COUNT_TRAIN.num_steps
    assert result["fixed_head_dim"] == FIXED_HEAD_DIM
    assert result["ensemble_member"] == ENSEMBLE_MEMBER
    # the whole grid, once on each kernel set, the scalar kernels among them
    assert len(result["kernels"]) >= 2 and "DEFAULT" in result["kernels"]
    expected = [_key(j) for j in head_counts.jobs(list(SEEDS), HEAD_COUNT_TRAIN.num_steps)]
    for kernel in result["kernels"]:
        runs = [r for r in result["runs"] if r["kernel"] == kernel]
        assert [_key(r) for r in runs] == expected, kernel
        for r in runs:
            assert set(r) >= KEYS
            assert len(r["warmup_loss"]) == HEAD_COUNT_TRAIN.warmup_steps
            assert 0 < r["test_loss"] < 5 and 0 <= r["exact_match"] <= 1
    assert len(result["runs"]) == len(expected) * len(result["kernels"])
