"""A model trained once and kept: :func:`train_once`, the load-or-train of the book's models.

The chapters share their trained models through checkpoints: the first chapter to need one
trains it and saves it, the others load it. :func:`train_once` does it for any model: under
a lock on the checkpoint (two chapters started at once train once), it loads the checkpoint
if it was written for the same settings, and otherwise trains from a fixed seed and saves.
:func:`mhbook.book_model` (Part II) and :func:`mhbook.shakespeare_model` (Part V) are
built on it.

A model too long to train in a chapter ships with the package, in ``trained/``: the file
that the same call wrote (``python -m benchmarks.ship_models`` writes them), loaded where no
checkpoint of the caller's is there. ``tests/training/test_trained.py`` checks that each one
is what this code trains: written for today's settings, and retraced by its first steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from ..core.utils import save_checkpoint, set_seed

__all__ = ["TrainedModel", "train_once", "shipped_weights"]

#: Where the trained models that ship with mhbook are (package data), with ``provenance.json``.
TRAINED_DIR = Path(__file__).parent / "trained"

# Bumped whenever fit's arithmetic changes (version 2: the fused AdamW; 3: the decoder's
# self-attention with is_causal, dropout only where the paper puts it, drawn with
# rand_like), so that a model is trained again over a checkpoint this code would not
# reproduce. Stored in every checkpoint of train_once as "trainer_version".
_TRAINER_VERSION = 3


class TrainedModel(NamedTuple):
    """A trained model with its data, as :func:`mhbook.book_model` and
    :func:`mhbook.shakespeare_model` give it: ``model, data, history = book_model()``.

    Attributes:
        model: the model, in eval mode.
        data: the data it was trained on (its vocabularies or tokenizer included).
        history: the history of :func:`mhbook.fit` (``None`` if the checkpoint holds none).
    """

    model: nn.Module
    data: object
    history: dict | None


def train_once(
    checkpoint: str | os.PathLike | None,
    expected: dict,
    build: Callable[[], nn.Module],
    train: Callable[[nn.Module], dict | None],
    *,
    seed: int,
    retrain: bool = False,
    progress: bool = True,
    shipped: str | os.PathLike | None = None,
) -> tuple[nn.Module, dict | None]:
    """Load the model kept in ``checkpoint``, or train it now and keep it there.

    Under an exclusive lock on ``checkpoint + ".lock"`` (POSIX ``flock``; a second process
    waits, then loads the first one's checkpoint):

    1. if ``checkpoint`` exists, ``retrain`` is false, and it holds every item of
       ``expected`` with the same value (and was written by this version of the trainer),
       the model is ``build()`` with the checkpoint's weights;
    2. else the same with ``shipped``, the weights that ship with the package, if any;
    3. otherwise ``set_seed(seed)``, ``model = build()``, ``history = train(model)``, and
       the model is saved there (:func:`mhbook.save_checkpoint`: a whole file or none) with
       ``history`` and ``expected``. ``checkpoint=None``: train, keep nothing.

    Args:
        expected: plain values (numbers, strings, lists, dicts) that say what the model is:
            its configs, its vocabulary, a version.
        build: a fresh model on its device (seeded by the caller of ``build``).
        train: trains the model in place and returns its history (``fit``'s).
        progress: say why a checkpoint that is there is not used.
        shipped: a checkpoint that the same call wrote, shipped with the package
            (:func:`shipped_weights`); never written here.

    Returns:
        ``(model, history)``: the model in eval mode, and the training history (the stored
        one when loaded; ``None`` for a checkpoint without one).
    """
    expected = {**expected, "trainer_version": _TRAINER_VERSION}
    with _exclusive(checkpoint):
        for path in () if retrain else (checkpoint, shipped):
            if path is None or not Path(path).exists():
                continue
            stored = _read_checkpoint(path, say=progress)
            if stored and all(stored.get(k) == v for k, v in expected.items()):
                model = build()
                model.load_state_dict(stored["model"])
                return model.eval(), stored.get("history")
            if stored and progress:
                print(f"{path} was written for another configuration or by an older fit: not used.")
        set_seed(seed)
        model = build()
        history = train(model)
        if checkpoint is not None:
            save_checkpoint(checkpoint, model, history=history, **expected)
        return model.eval(), history


def shipped_weights(name: str) -> Path:
    """The path of the trained model ``name`` that ships with mhbook, ``trained/{name}.pt``
    in this folder (it may not exist: then the model is trained where it is asked for)."""
    return TRAINED_DIR / f"{name}.pt"


@contextmanager
def _exclusive(checkpoint):
    """Hold an exclusive lock on ``checkpoint + ".lock"`` (POSIX ``flock``; elsewhere, or for
    ``checkpoint=None``, no lock). The lock goes with the process, even if it is killed."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock; at worst two processes train the same model
        fcntl = None
    if checkpoint is None or fcntl is None:
        yield
        return
    Path(checkpoint).parent.mkdir(parents=True, exist_ok=True)
    with open(f"{checkpoint}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_checkpoint(path, say: bool = True) -> dict:
    """The checkpoint's contents on the CPU, or ``{}`` (and a message if ``say``) if it
    cannot be read."""
    try:
        stored = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # e.g. a file cut short
        if say:
            print(f"could not read {path} ({type(error).__name__}): training again.")
        return {}
    return stored if isinstance(stored, dict) else {}
