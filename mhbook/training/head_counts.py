"""Chapter 7's experiment with the number of heads, defined once for the chapter, the
benchmark that runs it (``benchmarks/head_counts.py``) and the tests.

Small encoder-decoder Transformers on a smaller number task, each trained briefly from its
own seed:

* :func:`head_count_data`: :data:`HEAD_COUNT_DATA`, 5,000 training numbers, 200 validation
  and 300 test numbers;
* :func:`small_model`: :data:`HEAD_COUNT_MODEL` (one layer each side, ``d_model`` 64,
  ``d_ff`` 128, no dropout) with ``h`` heads of size ``d_model / h``, or heads of a size of
  their own (``head_dim``, Bhojanapalli et al.'s fixed head size), or another width (an
  ensemble member: :data:`ENSEMBLE_MEMBER`);
* :func:`train_small`: it, trained with :data:`HEAD_COUNT_TRAIN` (160 steps of 32 numbers,
  about one pass over the training numbers), the seed setting both the weights and the order
  of the batches;
* :func:`head_count_run`: one run of the sweep, its test loss and exact match;
* :func:`head_count_model`: a trained model of the sweep that the chapter analyses further
  (the 4-head models and the ensemble members), loaded from the copy that ships with mhbook
  (``trained/``, made by ``python -m benchmarks.ship_models``) or trained now.

The grid the chapter plots (:data:`HEAD_COUNTS` x :data:`SEEDS`, the fixed head size for
:data:`FIXED_HEAD_COUNTS`, the ensembles) is run by ``python -m benchmarks.head_counts``,
whose results ship as ``mhbook.load_measured("head_counts")``.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import torch

from ..core.config import ModelConfig, TrainConfig
from ..core.utils import get_device, set_seed
from ..models.transformer import Transformer
from ..tasks.bleu import exact_match
from ..tasks.numbers import NumberTranslation
from .checkpoints import TrainedModel, shipped_weights, train_once
from .trainer import cpu_threads, fit, valid_loss

__all__ = [
    "HEAD_COUNT_DATA",
    "HEAD_COUNT_MODEL",
    "HEAD_COUNT_TRAIN",
    "HEAD_COUNTS",
    "SEEDS",
    "FIXED_HEAD_COUNTS",
    "FIXED_HEAD_DIM",
    "ENSEMBLE_MEMBER",
    "ENSEMBLE_SIZE",
    "member_seed",
    "head_count_data",
    "small_model",
    "train_small",
    "head_count_run",
    "head_count_model",
    "shipped_name",
    "SHIPPED_MODELS",
]

#: The smaller number task of the sweep: :class:`~mhbook.tasks.numbers.NumberTranslation`'s
#: arguments.
HEAD_COUNT_DATA = {"num_train": 5_000, "num_valid": 200, "num_test": 300, "seed": 0}

#: The sweep's model: one encoder and one decoder layer, ``d_model`` 64; ``num_heads`` (and
#: ``head_dim``) are set per run by :func:`small_model`.
HEAD_COUNT_MODEL = ModelConfig(d_model=64, num_layers=1, d_ff=128, dropout=0.0)

#: The sweep's training: 160 steps of 32 numbers at a peak of 3e-3 after 25 warm-up steps,
#: cosine decay, clipping at 1, on one CPU thread; ``seed`` (the order of the batches) is
#: set per run. About one pass over the 5,000 training numbers.
HEAD_COUNT_TRAIN = TrainConfig(num_steps=160, batch_size=32, lr=3e-3, warmup_steps=25, eval_every=0)

#: The numbers of heads of the sweep at ``d_model`` 64: heads of size 64 down to 2.
HEAD_COUNTS = (1, 2, 4, 8, 16, 32)
#: The seeds of every setting.
SEEDS = (0, 1, 2)
#: The numbers of heads trained again with heads of size :data:`FIXED_HEAD_DIM`.
FIXED_HEAD_COUNTS = (8, 16)
#: The size of each head in those runs.
FIXED_HEAD_DIM = 16

#: An ensemble member: one head, half the width of the sweep's models (fields of
#: :data:`HEAD_COUNT_MODEL` to replace).
ENSEMBLE_MEMBER = {"d_model": 32, "d_ff": 64}
#: Members per ensemble: as many as the 4-head model has heads.
ENSEMBLE_SIZE = 4


def member_seed(seed: int, j: int) -> int:
    """The seed of member ``j`` (0 to ``ENSEMBLE_SIZE - 1``) of the ensemble that goes with
    the sweep's ``seed``: ``100 + ENSEMBLE_SIZE * seed + j``, none of the sweep's seeds."""
    if not 0 <= j < ENSEMBLE_SIZE:
        raise ValueError(f"j must be in 0..{ENSEMBLE_SIZE - 1}, got {j}")
    return 100 + ENSEMBLE_SIZE * seed + j


@functools.cache
def head_count_data() -> NumberTranslation:
    """The task of :data:`HEAD_COUNT_DATA` (made once per process; do not change it)."""
    return NumberTranslation(**HEAD_COUNT_DATA)


def _config(num_heads: int, head_dim: int | None, changes: dict) -> ModelConfig:
    unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(ModelConfig)})
    if unknown:
        raise TypeError(f"changes must be fields of ModelConfig, got {unknown}")
    return HEAD_COUNT_MODEL.replace(num_heads=num_heads, head_dim=head_dim, **changes)


def small_model(
    num_heads: int,
    seed: int,
    head_dim: int | None = None,
    *,
    data: NumberTranslation | None = None,
    device: torch.device | str | None = None,
    **changes,
) -> Transformer:
    """A fresh model of the sweep with ``num_heads`` heads, drawn after ``set_seed(seed)``.
    ``head_dim``: ``None`` for heads of size ``d_model / num_heads``, else that size;
    ``changes``: fields of :data:`HEAD_COUNT_MODEL` to replace; ``data``: default
    :func:`head_count_data`; ``device``: default :func:`mhbook.get_device`."""
    config = _config(num_heads, head_dim, changes)
    data = data if data is not None else head_count_data()
    set_seed(seed)
    model = Transformer(config, len(data.src_vocab), len(data.tgt_vocab))
    return model.to(device if device is not None else get_device())


def train_small(
    num_heads: int,
    seed: int,
    head_dim: int | None = None,
    *,
    train: TrainConfig = HEAD_COUNT_TRAIN,
    data: NumberTranslation | None = None,
    device: torch.device | str | None = None,
    **changes,
) -> TrainedModel:
    """:func:`small_model` trained with ``train``, ``seed`` also setting the order of the
    batches. Returns ``(model, data, history)``: the model in eval mode, the data, and
    :func:`mhbook.fit`'s history."""
    data = data if data is not None else head_count_data()
    model = small_model(num_heads, seed, head_dim, data=data, device=device, **changes)
    history = fit(model, data, train.replace(seed=seed), progress=False)
    return TrainedModel(model, data, history)


def head_count_run(num_heads: int, seed: int, head_dim: int | None = None, **options) -> dict:
    """One run of the sweep: :func:`train_small` (``options``: its keyword arguments), then
    the model measured on the test split, on one CPU thread: ``test_loss`` (teacher-forced,
    nats per token), ``exact_match`` (greedy, 0 to 1), and ``train_loss`` (every step's)."""
    model, data, history = train_small(num_heads, seed, head_dim, **options)
    english, french = zip(*data.pairs("test"))
    on_cpu = next(model.parameters()).device.type == "cpu"
    with cpu_threads(1 if on_cpu else None):
        return {
            "test_loss": valid_loss(model, data, "test"),
            "exact_match": exact_match(data.translate(model, english), french),
            "train_loss": history["loss"],
        }


def head_count_model(
    num_heads: int,
    seed: int,
    *,
    checkpoint: str | os.PathLike | None = None,
    retrain: bool = False,
    device: torch.device | str | None = None,
    **changes,
) -> TrainedModel:
    """A trained model of the sweep, loaded or trained now (:func:`train_small`'s model).

    The chapter analyses the 4-head models of the sweep and the ensemble members
    (``head_count_model(1, member_seed(seed, j), **ENSEMBLE_MEMBER)``) further; those ship
    with mhbook (:data:`SHIPPED_MODELS`, in ``trained/``), made by this call
    (``python -m benchmarks.ship_models``). Any other is trained now (a second or two on a
    CPU) and kept in ``checkpoint`` if one is named.

    Args:
        checkpoint: where to keep it (``None``: keep nothing).
        retrain: train even where a checkpoint or a shipped copy is there.

    Returns:
        A :class:`~mhbook.TrainedModel` ``(model, data, history)``: the model in eval mode on
        ``device``, :func:`head_count_data`, and the history of :func:`mhbook.fit`.
    """
    config = _config(num_heads, None, changes)
    data = head_count_data()
    device = torch.device(device) if device is not None else get_device()
    train = HEAD_COUNT_TRAIN.replace(seed=seed)
    expected = {
        "model_config": dataclasses.asdict(config),
        "train_config": dataclasses.asdict(train),
        "data": HEAD_COUNT_DATA,
    }
    model, history = train_once(
        checkpoint,
        expected,
        build=lambda: Transformer(config, len(data.src_vocab), len(data.tgt_vocab)).to(device),
        train=lambda model: fit(model, data, train, progress=False),
        seed=seed,
        retrain=retrain,
        progress=False,
        shipped=shipped_weights(shipped_name(num_heads, seed, changes)),
    )
    return TrainedModel(model, data, history)


def shipped_name(num_heads: int, seed: int, changes: dict | None = None) -> str:
    """The name in ``trained/`` of :func:`head_count_model`'s model: ``head-counts-h4-seed0``,
    or ``head-counts-member-seed100`` for an ensemble member."""
    if changes == ENSEMBLE_MEMBER and num_heads == 1:
        return f"head-counts-member-seed{seed}"
    extra = "".join(f"-{k}{v}" for k, v in (changes or {}).items())
    return f"head-counts-h{num_heads}-seed{seed}{extra}"


#: The models of the grid that ship with mhbook (chapter 7 analyses them further), by their
#: name in ``trained/``: ``(num_heads, seed, changes)`` for :func:`head_count_model`. The
#: three 4-head models of the sweep and the members of their ensembles.
SHIPPED_MODELS: dict[str, tuple[int, int, dict]] = {
    **{shipped_name(4, seed): (4, seed, {}) for seed in SEEDS},
    **{
        shipped_name(1, member_seed(seed, j), ENSEMBLE_MEMBER): (
            1,
            member_seed(seed, j),
            ENSEMBLE_MEMBER,
        )
        for seed in SEEDS
        for j in range(ENSEMBLE_SIZE)
    },
}
