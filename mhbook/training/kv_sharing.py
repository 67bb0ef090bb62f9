"""Chapter 10's comparison of MHA, GQA, MQA and MLA at one parameter budget, defined once.

The decoder-only model of chapter 9 (two pre-norm blocks, ``d_model`` 64, 4 query heads of
16, RoPE) with four kinds of attention, each given the ``d_ff`` that brings its parameters
closest to multi-head attention's (:func:`budget_configs`), trained to complete
``three hundred and five =`` with ``trois cent cinq <eos>`` (numbers below 1,000) and scored
by the exact match of its greedy completions of the 250 test prompts (:func:`train_variant`).

Three seeds of the four variants take about 40 seconds of one CPU thread, more than chapter
10 should spend, so ``python -m benchmarks.kv_sharing`` trains them and writes
``measured/kv_sharing.json`` (:func:`mhbook.load_measured`); the chapter trains seed 0 of
MHA live (its exercise 2 goes on from it), checks it against that record and plots the
record. On a GPU the chapter trains all of them, for :data:`SHARING_GPU_TRAIN`'s steps.
"""

from __future__ import annotations

import torch

from ..core.config import ModelConfig, TrainConfig
from ..core.utils import get_device, set_seed
from ..models.lm import DecoderOnlyLM
from ..tasks.number_prompts import PromptCompletion, completion_loss, evaluate_lm
from .trainer import fit

__all__ = [
    "SHARING_DATA",
    "SHARING_BASE",
    "SHARING_VARIANTS",
    "SHARING_TRAIN",
    "SHARING_GPU_TRAIN",
    "SHARING_SEEDS",
    "sharing_data",
    "count_parameters",
    "budget_configs",
    "train_variant",
]

#: The numbers below a thousand, 700 to train on, 50 to validate on and 250 to test on.
SHARING_DATA = {"max_number": 999, "num_train": 700, "num_valid": 50, "num_test": 250}

#: Multi-head attention with ``d_ff`` 128: the budget every variant is matched to.
SHARING_BASE = ModelConfig(
    d_model=64, num_heads=4, num_layers=2, d_ff=128, norm_first=True, position="rope", bias=True
)

#: Each variant: :data:`SHARING_BASE` with these fields changed (before ``d_ff`` is matched).
SHARING_VARIANTS = {
    "MHA": {},
    "GQA-2": {"num_kv_heads": 2},
    "MQA": {"num_kv_heads": 1},
    "MLA": {"d_latent": 24},
}

#: 200 steps of 64 sequences, 40 of them warm-up, the book's AdamW and schedule otherwise;
#: ``seed`` (the order of the batches) is the run's seed.
SHARING_TRAIN = TrainConfig(num_steps=200, warmup_steps=40, eval_every=0)

#: What a GPU affords in about the time: three times the steps.
SHARING_GPU_TRAIN = SHARING_TRAIN.replace(num_steps=600)

#: The seeds of the comparison (the initial weights and the order of the batches).
SHARING_SEEDS = (0, 1, 2)


def sharing_data() -> PromptCompletion:
    """The prompts and completions of :data:`SHARING_DATA` (the same numbers every call)."""
    return PromptCompletion(**SHARING_DATA)


def count_parameters(config: ModelConfig, vocab_size: int) -> int:
    """The parameters of ``DecoderOnlyLM(config, vocab_size)``, counted on the meta device
    (shapes only: nothing is allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in DecoderOnlyLM(config, vocab_size).parameters())


def budget_configs(
    vocab_size: int, variants: dict[str, dict] | None = None, base: ModelConfig = SHARING_BASE
) -> dict[str, ModelConfig]:
    """Each variant of ``variants`` (default :data:`SHARING_VARIANTS`) with the ``d_ff`` that
    brings its parameter count closest to ``base``'s: one more unit of ``d_ff`` adds
    ``num_layers * (2 d_model + 1)`` parameters, so the variant gets ``base.d_ff`` plus the
    parameters it lacks divided by that, rounded.

    Returns:
        ``{name: config}``, in the order of ``variants``.
    """
    if variants is None:
        variants = SHARING_VARIANTS
    budget = count_parameters(base, vocab_size)
    per_d_ff = base.num_layers * (2 * base.d_model + 1)  # what one more unit of d_ff adds
    configs = {}
    for name, change in variants.items():
        config = base.replace(**change)
        d_ff = base.d_ff + round((budget - count_parameters(config, vocab_size)) / per_d_ff)
        configs[name] = config.replace(d_ff=d_ff)
    return configs


def train_variant(
    name: str,
    seed: int,
    *,
    data: PromptCompletion | None = None,
    train: TrainConfig = SHARING_TRAIN,
    device: torch.device | str | None = None,
) -> tuple[DecoderOnlyLM, dict, float]:
    """Train variant ``name`` of :func:`budget_configs` from ``set_seed(seed)``, with
    ``train`` and the batches in the order of ``seed``, on one thread; score it.

    Args:
        data: default :func:`sharing_data`.
        device: default :func:`mhbook.get_device`.

    Returns:
        ``(model, history, exact_match)``: the model in eval mode, :func:`mhbook.fit`'s
        history (``history["loss"]``: the loss of each step), and the fraction of the test
        prompts it completes exactly (greedy, 0 to 1).

    Raises:
        ValueError: ``name`` is not a variant.
    """
    if name not in SHARING_VARIANTS:
        raise ValueError(f"name must be one of {list(SHARING_VARIANTS)}, got {name!r}")
    data = sharing_data() if data is None else data
    device = torch.device(device) if device is not None else get_device()
    config = budget_configs(len(data.vocab))[name]
    set_seed(seed)
    model = DecoderOnlyLM(config, len(data.vocab)).to(device)
    history = fit(model, data, train.replace(seed=seed), loss_fn=completion_loss, progress=False)
    return model, history, evaluate_lm(model, data, "test")["exact_match"]
