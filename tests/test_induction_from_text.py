"""``benchmarks/induction_from_text.py`` (chapter 15's exercise 3) still runs, and its committed
results are complete."""

from __future__ import annotations

import json

import pytest

import mhbook
from benchmarks import induction_from_text

pytestmark = pytest.mark.slow(seconds=8)  # trains the toy model for two steps


def test_the_benchmark_runs_for_two_steps(tmp_path):
    out = tmp_path / "induction.json"
    induction_from_text.main(["--steps", "2", "--every", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["commit"] and result["machine"] and result["train"]["num_steps"] == 2
    (run,) = result["runs"]
    assert [p["step"] for p in run["log"]] == [0, 1, 2]
    assert all(0 <= p["induction"] <= 1 and p["first"] > 0 for p in run["log"])


def test_the_test_sequences_are_chapter_15s():
    sequences = induction_from_text.test_sequences()
    assert sequences.shape == (64, 64)
    assert (sequences[:, 32:] == sequences[:, :32]).all()


def test_the_committed_results_are_complete_and_say_where_they_come_from():
    result = mhbook.load_measured("induction_from_text")
    assert result["command"].startswith("python -m benchmarks.induction_from_text")
    assert result["commit"] != "unknown" and result["machine"] and result["date"]
    (run,) = result["runs"]
    assert [p["step"] for p in run["log"]] == list(range(0, 2401, 300))
