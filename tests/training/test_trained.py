"""The trained models that ship with mhbook (``mhbook/training/trained/``) are what this code
trains: each is the file ``python -m benchmarks.ship_models`` recorded, written for today's
settings (so the chapters load it rather than train for minutes), and its first steps are
retraced by training again from its seed. A change to what these models train fails here,
naming the file to make again."""

import hashlib
import json

import pytest
import torch

import mhbook.training.number_lms as number_lms
import mhbook.training.shakespeare_lm as shakespeare_lm
from mhbook import TrainConfig, fit, set_seed
from mhbook.models.lm import DecoderOnlyLM
from mhbook.tasks.number_prompts import completion_loss, stream_loss
from mhbook.tasks.shakespeare import lm_loss
from mhbook.training.checkpoints import TRAINED_DIR, shipped_weights, train_once
from mhbook.training.head_counts import SHIPPED_MODELS

FOLDER = TRAINED_DIR
PROVENANCE = json.loads((FOLDER / "provenance.json").read_text())
NUMBER_LMS = {  # chapters 11 and 12: name -> the call that loads it, and its loss
    **{
        f"position-{position}": (lambda path, p=position: number_lms.position_model(
            p, path, device="cpu"), stream_loss)
        for position in number_lms.NUMBER_LM_POSITIONS
    },
    **{
        f"window-{window or 'full'}": (lambda path, w=window: number_lms.window_model(
            w, path, device="cpu"), completion_loss)
        for window in number_lms.NUMBER_LM_WINDOWS
    },
}  # fmt: skip
NAMES = ["shakespeare-llama", "copier-seed0", "copier-seed1", "copier-seed2", *NUMBER_LMS]
REMAKE = "make them again with python -m benchmarks.ship_models"


def _load(name, tmp_path):
    """The model and data the chapters' call returns, from a folder with no checkpoint."""
    if name in NUMBER_LMS:
        return NUMBER_LMS[name][0](tmp_path / "none.pt")
    if name == "shakespeare-llama":
        return shakespeare_lm.shakespeare_model(tmp_path / "none.pt", progress=False, device="cpu")
    seed = int(name.removeprefix("copier-seed"))
    return shakespeare_lm.copier_model(seed, tmp_path / "none.pt", device="cpu")


def test_every_shipped_file_is_recorded():
    every = NAMES + list(SHIPPED_MODELS)  # chapter 7's: tests/training/test_head_counts.py
    assert sorted(p.stem for p in FOLDER.glob("*.pt")) == sorted(every)
    assert sorted(PROVENANCE["models"]) == sorted(every)
    for name in every:
        digest = hashlib.sha256(shipped_weights(name).read_bytes()).hexdigest()
        assert digest == PROVENANCE["models"][name]["sha256"], f"{name}.pt is not the recorded file"


@pytest.mark.parametrize("name", NAMES)
def test_the_chapters_load_it_without_training(name, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name}.pt does not match what the code trains today: {REMAKE}")

    monkeypatch.setattr(shakespeare_lm, "fit", refuse)
    monkeypatch.setattr(number_lms, "fit", refuse)
    model, _, history = _load(name, tmp_path)
    assert history["step"][-1] == PROVENANCE["models"][name]["steps"]
    assert not (tmp_path / "none.pt").exists()  # loading writes nothing


@pytest.mark.parametrize("name", NAMES)
def test_training_again_retraces_its_first_steps(name, tmp_path):
    """From the shipped model's seed, 20 steps of its training give the losses it recorded
    (the learning rate of the first steps does not depend on the number of steps: the
    Shakespeare model and chapters 11 and 12's are in their warm-up, the copier's is
    constant). Their weights' seed is their batches' seed."""
    shipped, data, history = _load(name, tmp_path)
    stored = torch.load(shipped_weights(name), map_location="cpu", weights_only=True)
    train = TrainConfig(**stored["train_config"])
    steps = 20
    assert train.warmup_steps >= steps or train.min_lr_ratio == 1.0
    set_seed(train.seed)
    model = DecoderOnlyLM(shipped.config, shipped.vocab_size)
    loss_fn = NUMBER_LMS[name][1] if name in NUMBER_LMS else lm_loss
    again = fit(model, data, train.replace(num_steps=steps, eval_every=0), loss_fn=loss_fn,
                progress=False)  # fmt: skip
    recorded = torch.tensor(history["loss"][:steps])
    diff = (torch.tensor(again["loss"]) - recorded).abs().max().item()
    # Another CPU's kernels change the last bits, which 20 steps of Adam barely grow.
    assert diff < 1e-3, f"{name}: the first {steps} losses differ by {diff:.2e}: {REMAKE}"


def test_a_shipped_file_for_other_settings_is_not_used(tmp_path, capsys):
    """train_once loads ``shipped`` only when it holds the caller's settings, and never
    writes it; a caller's own checkpoint comes first."""
    shipped = shipped_weights("copier-seed0")
    before = shipped.read_bytes()
    trained = []

    def build():
        return torch.nn.Linear(2, 2)

    def train(model):
        trained.append(True)
        return {"step": [1]}

    model, history = train_once(tmp_path / "mine.pt", {"other": 1}, build, train, seed=0,
                                shipped=shipped)  # fmt: skip
    assert trained and history == {"step": [1]}
    assert "not used" in capsys.readouterr().out
    assert shipped.read_bytes() == before and (tmp_path / "mine.pt").exists()
    trained.clear()
    train_once(tmp_path / "mine.pt", {"other": 1}, build, train, seed=0, shipped=shipped)
    assert not trained  # the caller's own checkpoint, written above
