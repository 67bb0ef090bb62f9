"""``benchmarks/induction_heads.py`` (chapter 15's runs, its timing runs and exercise 3) still
runs, its committed results are complete, and the code still trains what they record."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import mhbook
from benchmarks import induction_heads
from mhbook.training.shakespeare_lm import COPIER_TRAIN, copier_model

pytestmark = pytest.mark.slow(seconds=6)  # trains the toy model for a few steps, 3 x 50 more

RECORD = mhbook.load_measured("induction_heads")
REMAKE = "make the record again with python -m benchmarks.induction_heads"


def test_the_benchmark_runs_for_two_steps(tmp_path):
    out = tmp_path / "induction.json"
    argv = ["--timing-seeds", "0", "--timing-steps", "2", "--timing-every", "1"]
    argv += ["--chapter-steps", "2", "--chapter-every", "1"]
    induction_heads.main([*argv, "--text-steps", "2", "--text-every", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["commit"] and result["machine"] and result["text"]["train"]["num_steps"] == 2
    for part in ("timing", "text"):
        (run,) = result[part]["runs"]
        assert [p["step"] for p in run["log"]] == [0, 1, 2]
        assert all(0 <= p["induction"] <= 1 and 0 <= p["previous"] <= 1 for p in run["log"])
    runs = result["chapter"]["runs"]
    assert list(runs) == ["copier", "fixed_period", "one_layer"]
    assert all([p["step"] for p in run["log"]] == [0, 1, 2] for run in runs.values())
    assert np.shape(runs["copier"]["log"][-1]["induction"]) == (2, 4)  # every head
    assert "max_weight_diff_from_shipped" not in runs["copier"]  # not the shipped length
    assert all(set(run["blocks_24"]) == {"second", "induction"} for run in runs.values())


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


def test_the_chapters_runs_are_recorded_whole():
    chapter = RECORD["chapter"]
    assert chapter["train"] == dataclasses.asdict(COPIER_TRAIN.replace(seed=0)), REMAKE
    assert list(chapter["runs"]) == list(induction_heads.CHAPTER_RUNS)
    for run in chapter["runs"].values():
        assert [p["step"] for p in run["log"]] == list(range(0, 801, 25))
        assert isinstance(run["icl_score"], float) and set(run["blocks_24"]) == {
            "second",
            "induction",
        }
    # the copier's run is the one that ships: the same weights, on the machine that made both
    assert chapter["runs"]["copier"]["max_weight_diff_from_shipped"] < 1e-6


@pytest.mark.parametrize("name", list(induction_heads.CHAPTER_RUNS))
def test_training_again_retraces_the_chapters_runs(name):
    """50 steps of each run from its seed give the looks it recorded at steps 0, 25 and 50."""
    run = induction_heads.chapter_run(name, induction_heads.test_sequences(), steps=50, every=25)
    recorded = RECORD["chapter"]["runs"][name]["log"][:3]
    assert [p["step"] for p in run["log"]] == [p["step"] for p in recorded] == [0, 25, 50]
    for again, look in zip(run["log"], recorded):
        for key, value in look.items():
            diff = np.abs(np.subtract(again[key], value)).max()
            # Another CPU's kernels change the last bits, which 50 steps barely grow.
            assert diff < 1e-3, f"{name}, step {look['step']}, {key}: {diff:.2e}: {REMAKE}"


def test_the_shipped_copier_gives_the_records_last_look(tmp_path):
    model, _, _ = copier_model(0, tmp_path / "none.pt", device="cpu")  # the shipped weights
    look = induction_heads.probe_heads(model, induction_heads.test_sequences())
    last = RECORD["chapter"]["runs"]["copier"]["log"][-1]
    for key, value in last.items():
        if key != "step":
            assert np.abs(np.subtract(look[key], value)).max() < 1e-4, key
