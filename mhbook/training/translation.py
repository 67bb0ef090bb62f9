"""The book's translation model (Part II): the Transformer on the number-words task.

* :func:`make_data` and :func:`make_model` build the task and a fresh model of a
  :class:`~mhbook.Config`;
* :func:`evaluate` translates a split greedily and scores it (exact match, BLEU);
* :func:`book_model` gives the model of the later chapters: it loads
  ``checkpoints/book-transformer.pt`` if that was written for the same config and
  vocabularies, and otherwise trains it from fixed seeds with :data:`~mhbook.BOOK_CONFIG`
  (a minute or two on a laptop CPU) and saves it with its config
  (:func:`~mhbook.training.checkpoints.train_once`);
  :func:`load_model` rebuilds a model from such a checkpoint alone.

Its loss, :func:`mhbook.translation_loss`, lives with the task
(:meth:`mhbook.NumberTranslation.loss_fn`), which :func:`mhbook.fit` takes from the data.
"""

from __future__ import annotations

import dataclasses
import os

import torch
from torch import nn

from ..core.config import BOOK_CONFIG, Config
from ..core.utils import get_device
from ..models.transformer import Transformer
from ..tasks.bleu import translation_scores
from ..tasks.numbers import NumberTranslation
from .checkpoints import TrainedModel, train_once
from .trainer import fit

__all__ = ["make_data", "make_model", "load_model", "evaluate", "book_model"]


# -- data and models ----------------------------------------------------------------------
def make_data(config: Config = BOOK_CONFIG) -> NumberTranslation:
    """The data set of ``config.data``."""
    return NumberTranslation(**dataclasses.asdict(config.data))


def make_model(
    data: NumberTranslation, config: Config = BOOK_CONFIG, device: torch.device | str | None = None
) -> Transformer:
    """A fresh :class:`~mhbook.Transformer` sized for ``data``'s vocabularies, with
    ``config.model``. Seed first (``mhbook.set_seed``) for reproducible weights."""
    model = Transformer(config.model, len(data.src_vocab), len(data.tgt_vocab))
    return model.to(device if device is not None else get_device())


def load_model(
    path: str | os.PathLike, device: torch.device | str | None = None
) -> tuple[Transformer, dict]:
    """The :class:`~mhbook.Transformer` stored in a checkpoint of :func:`book_model`.

    The checkpoint alone is enough: it holds the weights, the :class:`~mhbook.Config`
    and both vocabularies (``torch.load(weights_only=True)``, which runs no code).

    Args:
        device: default: :func:`mhbook.get_device`.

    Returns:
        ``(model, stored)``: the model in eval mode on ``device``, and the checkpoint's
        other values: ``config`` (a :class:`~mhbook.Config`; ``make_data(config)``
        rebuilds the data), ``src_vocab`` and ``tgt_vocab`` (token lists), ``history``.
    """
    stored = torch.load(path, map_location="cpu", weights_only=True)
    return _model_from(stored, device, path), stored


def _model_from(stored: dict, device, path) -> Transformer:
    """Build the model a checkpoint describes and load its weights (pops ``"model"``)."""
    missing = sorted({"model", "config", "src_vocab", "tgt_vocab"} - set(stored))
    if missing:
        raise ValueError(
            f"{path} lacks {missing}: write it with save_checkpoint(path, model, config=config, "
            "src_vocab=..., tgt_vocab=...) as book_model does"
        )
    config = Config.from_dict(stored["config"])
    model = Transformer(config.model, len(stored["src_vocab"]), len(stored["tgt_vocab"]))
    model.load_state_dict(stored.pop("model"))
    stored["config"] = config
    return model.to(device if device is not None else get_device()).eval()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: NumberTranslation,
    split: str = "test",
    batch_size: int = 500,
    max_len: int | None = None,
    device: torch.device | str | None = None,
) -> dict:
    """Translate every sentence of ``split`` greedily (with the KV cache) and score it.

    Returns:
        A dict with ``exact_match`` (the fraction of sentences translated exactly
        right, 0 to 1), ``bleu`` (corpus BLEU, 0 to 100, on the tokens of
        :func:`~mhbook.tasks.numbers.tokenize`), both from
        :func:`mhbook.tasks.bleu.translation_scores`,
        and the lists ``sources``, ``hypotheses`` and ``references`` (strings, in the
        split's order).
    """
    pairs = data.pairs(split)
    sources = [en for en, _ in pairs]
    references = [fr for _, fr in pairs]
    hypotheses: list[str] = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start : start + batch_size]
        hypotheses += data.translate(model, chunk, device=device, max_len=max_len)
    return {
        **translation_scores(hypotheses, references),
        "sources": sources,
        "hypotheses": hypotheses,
        "references": references,
    }


# -- the book's model ---------------------------------------------------------------------
def book_model(
    data: NumberTranslation | None = None,
    device: torch.device | str | None = None,
    checkpoint: str | os.PathLike | None = "checkpoints/book-transformer.pt",
    progress: bool = True,
    config: Config = BOOK_CONFIG,
    retrain: bool = False,
) -> TrainedModel:
    """The book's trained Transformer, loaded from ``checkpoint`` or trained now.

    If ``checkpoint`` exists and was written for the same ``config`` and
    vocabularies, it is loaded (``torch.load(weights_only=True)``). Otherwise the
    model is trained with ``config`` from its fixed seeds and saved there with its
    config and vocabularies (:func:`mhbook.save_checkpoint`, which writes a whole
    file or none; ``checkpoint=None``: train, do not save), all by
    :func:`~mhbook.training.checkpoints.train_once`. On a CPU the same configuration always
    gives the same weights.

    Args:
        data: the task; default: ``make_data(config)``.
        device: default: :func:`mhbook.get_device`.
        progress: show the training progress bar, and say why a checkpoint that is
            there is not used. ``False`` prints nothing (chapters that only need the
            model, whose printed output nbval compares).
        retrain: train even where a checkpoint is there, and write it anew (chapter 6,
            which shows the training). Decided under the checkpoint's lock, so a chapter
            running at the same time loads this run's model, never a half-written one.

    Returns:
        A :class:`~mhbook.TrainedModel` ``(model, data, history)``: the model in eval mode
        on ``device``, the data, and the training history of :func:`mhbook.fit` (also kept
        in the checkpoint; ``None`` for a checkpoint without one).
    """
    if data is None:
        data = make_data(config)
    device = torch.device(device) if device is not None else get_device()
    expected = {
        "config": config.to_dict(),
        "src_vocab": data.src_vocab.id_to_token,
        "tgt_vocab": data.tgt_vocab.id_to_token,
    }
    model, history = train_once(
        checkpoint,
        expected,
        build=lambda: make_model(data, config, device),
        train=lambda model: fit(model, data, config.train, device=device, progress=progress),
        seed=config.train.seed,
        retrain=retrain,
        progress=progress,
    )
    return TrainedModel(model, data, history)
