"""``benchmarks/induction_heads.py`` (chapter 15's timing runs and exercise 3) still runs, and
its committed results are complete."""

from __future__ import annotations

import json

import pytest
import torch

import mhbook
from benchmarks import induction_heads

pytestmark = pytest.mark.slow(seconds=10)  # trains the toy model for a few steps, twice


def test_the_benchmark_runs_for_two_steps(tmp_path):
    out = tmp_path / "induction.json"
    argv = ["--timing-seeds", "0", "--timing-steps", "2", "--timing-every", "1"]
    induction_heads.main([*argv, "--text-steps", "2", "--text-every", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["commit"] and result["machine"] and result["text"]["train"]["num_steps"] == 2
    for part in ("timing", "text"):
        (run,) = result[part]["runs"]
        assert [p["step"] for p in run["log"]] == [0, 1, 2]
        assert all(0 <= p["induction"] <= 1 and 0 <= p["previous"] <= 1 for p in run["log"])


def test_the_test_sequences_are_chapter_15s():
    sequences = induction_heads.test_sequences()
    assert sequences.shape == (64, 64)
    assert (sequences[:, 32:] == sequences[:, :32]).all()
    book = mhbook.tasks.RepeatedRandom(65)
    assert (book.sample(64, torch.Generator().manual_seed(1), period=32) == sequences).all()


def test_the_committed_results_are_complete_and_say_where_they_come_from():
    result = mhbook.load_measured("induction_heads")
    assert result["command"].startswith("python -m benchmarks.induction_heads")
    assert result["commit"] != "unknown" and result["machine"] and result["date"]
    assert [r["seed"] for r in result["timing"]["runs"]] == [0, 1, 2]
    for run in result["timing"]["runs"]:
        assert [p["step"] for p in run["log"]] == list(range(0, 601, 5))
    (run,) = result["text"]["runs"]
    assert [p["step"] for p in run["log"]] == list(range(0, 2401, 300))
