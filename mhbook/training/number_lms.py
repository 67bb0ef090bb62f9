"""Part III's small language models of the number task, shared by chapters 11 and 12.

Chapter 9's decoder-only model at its small size, 2 pre-norm layers of width 64 with 4 heads
(``d_ff`` 128, biases), reads ``english = french <eos>`` as one sequence
(:class:`~mhbook.tasks.number_prompts.PromptCompletion`). Each chapter trains three of
them that differ in one setting, 500 steps each (1,500 on a GPU):

* :func:`position_model`, chapter 11: how the model knows positions (the sinusoid added to
  the embeddings, RoPE, ALiBi), trained on windows of 32 tokens of the stream of training
  pairs (:class:`~mhbook.tasks.number_prompts.PromptStream`) and tested on longer ones;
* :func:`window_model`, chapter 12: RoPE with full attention or a sliding window of 16 or 8
  tokens, trained on whole pairs (:func:`~mhbook.tasks.number_prompts.completion_loss`).

The six CPU runs take about 20 seconds each on one thread, a minute per chapter, so the
weights they give ship with the package (``trained/``, by ``python -m
benchmarks.ship_models``), as :func:`mhbook.copier_model`'s do: the chapters train the first
steps of one of them live, check that they retrace the shipped run, and load the three. On
a GPU nothing is shipped: the calls train the 1,500 steps there.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from ..core.config import ModelConfig, TrainConfig
from ..core.utils import cpu_or_gpu, get_device
from ..core.validate import check_choice
from ..models.lm import DecoderOnlyLM
from ..tasks.number_prompts import PromptCompletion, PromptStream, completion_loss, stream_loss
from .checkpoints import TrainedModel, shipped_weights, train_once
from .trainer import fit

__all__ = [
    "NUMBER_LM",
    "NUMBER_LM_TRAIN",
    "NUMBER_LM_GPU_TRAIN",
    "POSITION_TRAIN_LEN",
    "NUMBER_LM_POSITIONS",
    "NUMBER_LM_WINDOWS",
    "position_task",
    "position_data",
    "window_data",
    "position_model",
    "window_model",
]

#: The model of both chapters: 2 pre-norm layers of width 64, 4 heads, RoPE (chapter 11
#: changes ``position``, chapter 12 ``window``).
NUMBER_LM = ModelConfig(
    d_model=64,
    num_heads=4,
    num_layers=2,
    d_ff=128,
    norm_first=True,
    position="rope",
    bias=True,
)

#: Their training on a CPU: 500 batches of 64, Adam at 3e-3 after 50 warm-up steps, cosine
#: decay (the book's other defaults: clipping at 1, seed 0 for the batches, one thread).
NUMBER_LM_TRAIN = TrainConfig(num_steps=500, lr=3e-3, warmup_steps=50, eval_every=0)

#: On a GPU: three times the steps.
NUMBER_LM_GPU_TRAIN = NUMBER_LM_TRAIN.replace(num_steps=1500)

#: Chapter 11's training windows, in tokens.
POSITION_TRAIN_LEN = 32

#: The positions of chapter 11's models and the windows of chapter 12's (``None``: full
#: attention); the ones that ship.
NUMBER_LM_POSITIONS = ("sinusoidal", "rope", "alibi")
NUMBER_LM_WINDOWS = (None, 16, 8)

_SEED = 0  # the weights' seed (the batches' is NUMBER_LM_TRAIN.seed, also 0)
_VERSION = 1  # bump when what the same configs train changes


def position_task() -> PromptCompletion:
    """Chapter 11's task: 20,000 training pairs, 1,000 test pairs."""
    return PromptCompletion(num_train=20_000, num_valid=0, num_test=1_000)


def position_data() -> PromptStream:
    """Chapter 11's training data: :func:`position_task`'s training pairs as one stream in
    windows of :data:`POSITION_TRAIN_LEN` tokens (the task is its ``data``)."""
    return PromptStream(position_task(), POSITION_TRAIN_LEN)


def window_data() -> PromptCompletion:
    """Chapter 12's data: 20,000 training pairs, 500 test pairs."""
    return PromptCompletion(num_train=20_000, num_valid=0, num_test=500)


def position_model(
    position: str,
    checkpoint: str | os.PathLike | None = None,
    *,
    retrain: bool = False,
    progress: bool = False,
    device: torch.device | str | None = None,
) -> TrainedModel:
    """Chapter 11's model with ``position`` (``"sinusoidal"``, ``"rope"`` or ``"alibi"``),
    loaded or trained now.

    :data:`NUMBER_LM` with that position, trained from ``set_seed(0)`` with
    :data:`NUMBER_LM_TRAIN` (on a GPU, or with ``MHBOOK_GPU_SIZES=1``,
    :data:`NUMBER_LM_GPU_TRAIN`: :func:`mhbook.cpu_or_gpu`) on :func:`position_data`
    (:func:`~mhbook.tasks.number_prompts.stream_loss`): about 20 seconds on one CPU thread.

    Args:
        checkpoint: where to keep it; default ``checkpoints/position-{position}.pt``.

    Returns:
        A :class:`~mhbook.TrainedModel` ``(model, data, history)``: the model in eval mode on
        ``device`` (default :func:`mhbook.get_device`), the
        :class:`~mhbook.tasks.number_prompts.PromptStream` it trained on, and the history of
        :func:`mhbook.fit`.
    """
    check_choice("position", position, NUMBER_LM_POSITIONS)
    return _number_lm(
        f"position-{position}",
        NUMBER_LM.replace(position=position),
        position_data(),
        stream_loss,
        checkpoint,
        retrain=retrain,
        progress=progress,
        device=device,
    )


def window_model(
    window: int | None,
    checkpoint: str | os.PathLike | None = None,
    *,
    retrain: bool = False,
    progress: bool = False,
    device: torch.device | str | None = None,
) -> TrainedModel:
    """Chapter 12's model with a sliding window of ``window`` tokens (``None``: full
    attention; 16 and 8 ship), loaded or trained now.

    :data:`NUMBER_LM` with that window, trained from ``set_seed(0)`` with
    :data:`NUMBER_LM_TRAIN` (on a GPU :data:`NUMBER_LM_GPU_TRAIN`) on :func:`window_data`
    (:func:`~mhbook.tasks.number_prompts.completion_loss`): about 20 seconds on one CPU
    thread.

    Args:
        checkpoint: where to keep it; default ``checkpoints/window-{window or 'full'}.pt``.

    Returns:
        A :class:`~mhbook.TrainedModel` ``(model, data, history)``: the model in eval mode on
        ``device`` (default :func:`mhbook.get_device`), the
        :class:`~mhbook.tasks.number_prompts.PromptCompletion` it trained on, and the history
        of :func:`mhbook.fit`.
    """
    config = NUMBER_LM.replace(window=window)  # ModelConfig checks the window
    return _number_lm(
        f"window-{window or 'full'}",
        config,
        window_data(),
        completion_loss,
        checkpoint,
        retrain=retrain,
        progress=progress,
        device=device,
    )


def _number_lm(name, config, data, loss_fn, checkpoint, *, retrain, progress, device):
    """``config`` trained on ``data`` with ``loss_fn``, kept in ``checkpoint`` (default
    ``checkpoints/{name}.pt``); the shipped ``trained/{name}.pt`` where it holds the same."""
    if checkpoint is None:
        checkpoint = f"checkpoints/{name}.pt"
    task = data.data if isinstance(data, PromptStream) else data
    vocab_size = len(task.vocab)
    device = torch.device(device) if device is not None else get_device()
    train = cpu_or_gpu(NUMBER_LM_TRAIN, NUMBER_LM_GPU_TRAIN, device)
    expected = {
        "model_config": dataclasses.asdict(config),
        "train_config": dataclasses.asdict(train),
        "task": repr(task),
        "train_windows": getattr(data, "length", None),  # PromptStream's; None: whole pairs
        "vocab": list(task.vocab.id_to_token),
        "version": _VERSION,
    }
    model, history = train_once(
        checkpoint,
        expected,
        build=lambda: DecoderOnlyLM(config, vocab_size).to(device),
        train=lambda model: fit(
            model, data, train, loss_fn=loss_fn, device=device, progress=progress
        ),
        seed=_SEED,
        retrain=retrain,
        progress=progress,
        shipped=shipped_weights(name),
    )
    return TrainedModel(model, data, history)
