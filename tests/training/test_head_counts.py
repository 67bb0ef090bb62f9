"""Chapter 7's grid (``mhbook.training.head_counts``): the models it defines, and the trained
ones that ship (``trained/head-counts-*.pt``): the chapter loads them without training, they
are the runs the results file records, and training again from their seeds retraces them."""

from __future__ import annotations

import json

import pytest
import torch

import mhbook
from mhbook import TrainConfig
from mhbook.training import head_counts
from mhbook.training.checkpoints import TRAINED_DIR, shipped_weights
from mhbook.training.head_counts import (
    ENSEMBLE_MEMBER,
    HEAD_COUNT_TRAIN,
    HEAD_COUNTS,
    SEEDS,
    SHIPPED_MODELS,
    head_count_model,
    member_seed,
    small_model,
    train_small,
)
from mhbook.training.trainer import valid_loss

PROVENANCE = json.loads((TRAINED_DIR / "provenance.json").read_text())["models"]
MEASURED = mhbook.load_measured("head_counts")
#: The results of the kernel set that also made the shipped models (the first one run).
RECORDED = {
    (r["variant"], r["num_heads"], r["seed"]): r
    for r in MEASURED["runs"]
    if r["kernel"] == MEASURED["kernels"][0] and r["variant"] in ("sweep", "member")
}
REMAKE = "make them again with python -m benchmarks.ship_models and benchmarks.head_counts"


def _variant(changes: dict) -> str:
    return "member" if changes == ENSEMBLE_MEMBER else "sweep"


def test_the_sweep_changes_how_the_matrices_are_cut_not_their_size():
    sizes = {
        h: sum(p.numel() for p in small_model(h, 0, device="cpu").parameters()) for h in HEAD_COUNTS
    }
    assert len(set(sizes.values())) == 1, sizes
    wide = small_model(8, 0, head_dim=16, device="cpu")
    assert wide.encoder.blocks[0].self_attn.W_q.out_features == 8 * 16
    member = small_model(1, member_seed(0, 0), device="cpu", **ENSEMBLE_MEMBER)
    assert member.config.d_model == 32 and member.config.num_heads == 1
    seeds = [member_seed(s, j) for s in SEEDS for j in range(4)]
    assert len(set(seeds)) == 12 and not set(seeds) & set(SEEDS)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="j must be in 0..3, got 4"):
        member_seed(0, 4)
    with pytest.raises(TypeError, match=r"changes must be fields of ModelConfig, got \['width'\]"):
        small_model(1, 0, width=3)


@pytest.mark.parametrize("name", sorted(SHIPPED_MODELS))
def test_the_chapter_loads_it_without_training_and_it_is_the_recorded_run(name, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name}.pt does not match what the code trains today: {REMAKE}")

    monkeypatch.setattr(head_counts, "fit", refuse)
    num_heads, seed, changes = SHIPPED_MODELS[name]
    model, data, history = head_count_model(num_heads, seed, device="cpu", **changes)
    assert history["step"][-1] == PROVENANCE[name]["steps"] == HEAD_COUNT_TRAIN.num_steps
    # the shipped weights give the test loss that the results file records for the run
    recorded = RECORDED[_variant(changes), num_heads, seed]
    with mhbook.cpu_threads(1):
        loss = valid_loss(model, data, "test")
    assert abs(loss - recorded["test_loss"]) < 1e-5, (name, loss, recorded["test_loss"], REMAKE)
    assert history["loss"][: HEAD_COUNT_TRAIN.warmup_steps] == pytest.approx(
        recorded["warmup_loss"], abs=1e-6
    )


@pytest.mark.parametrize("name", ["head-counts-h4-seed0", "head-counts-member-seed100"])
def test_training_again_retraces_its_warmup(name):
    """From its seed, the chapter's and the benchmark's call (``train_small``) retraces the
    warm-up of the shipped model's training, with the settings stored in the file (another
    CPU's kernels change the last bits, which 20 steps barely grow)."""
    num_heads, seed, changes = SHIPPED_MODELS[name]
    stored = torch.load(shipped_weights(name), map_location="cpu", weights_only=True)
    train = TrainConfig(**stored["train_config"])
    steps = 20
    assert train.warmup_steps >= steps  # the learning rate does not depend on num_steps
    again = train_small(num_heads, seed, train=train.replace(num_steps=steps), device="cpu",
                        **changes).history  # fmt: skip
    recorded = torch.tensor(stored["history"]["loss"][:steps])
    diff = (torch.tensor(again["loss"]) - recorded).abs().max().item()
    assert diff < 1e-3, f"{name}: the first {steps} losses differ by {diff:.2e}: {REMAKE}"
