"""Part V's language model: a small Llama trained on Tiny Shakespeare, shared by its chapters.

The model is nanoGPT's ``shakespeare_char`` quick-start in the modern block: characters,
4 layers, 4 heads, ``d_model`` 128, a context of 64, no dropout; RMSNorm before each
sublayer, a SwiGLU feed-forward network, RoPE inside attention, grouped-query attention
(two key/value heads for four query heads) and no biases: a
``transformers.LlamaForCausalLM`` in all but name (:func:`mhbook.lm_to_hf`).

:func:`shakespeare_model` trains it once and keeps it in a checkpoint that the three
chapters of Part V share, under a lock (as :func:`mhbook.book_model` does for Part II). Its
1,000 steps take about two minutes on one CPU thread, more than a chapter should spend, so
the weights that this call trains ship with the package (``trained/``, by
``python -m benchmarks.ship_models``): chapter 14 trains the first 100 steps live and checks
that they retrace the shipped run, then loads it, as chapters 15 and 16 do.

:func:`copier_model` is chapter 16's small copier: chapter 15's task of repeated random
characters learned by a two-layer model without feed-forward networks, three seeds of it,
shipped likewise.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from ..core.config import ModelConfig, TrainConfig
from ..core.utils import cpu_or_gpu, get_device
from ..models.lm import DecoderOnlyLM
from ..tasks.copying import RepeatedRandom
from ..tasks.shakespeare import CharTokenizer, TextData, lm_loss, load_shakespeare, split_text
from .checkpoints import TrainedModel, shipped_weights, train_once
from .trainer import fit

__all__ = [
    "SHAKESPEARE_MODEL",
    "SHAKESPEARE_TRAIN",
    "SHAKESPEARE_GPU_TRAIN",
    "SHAKESPEARE_CONTEXT",
    "COPIER_MODEL",
    "COPIER_TRAIN",
    "shakespeare_data",
    "shakespeare_model",
    "copier_model",
]

#: The context the model is trained at (nanoGPT's CPU quick-start: 64 characters).
SHAKESPEARE_CONTEXT = 64

#: The modern block at nanoGPT's quick-start size. ``d_ff`` = 344 is about two thirds of
#: GPT's ``4 d_model`` = 512: SwiGLU has three matrices where GPT's MLP has two, and this
#: keeps the feed-forward parameters (and time) the same.
SHAKESPEARE_MODEL = ModelConfig(
    d_model=128,
    num_heads=4,
    num_kv_heads=2,
    num_layers=4,
    d_ff=344,
    dropout=0.0,
    norm_first=True,
    norm="rms",
    ffn="swiglu",
    bias=False,
    position="rope",
    scale_embeddings=False,
)

#: nanoGPT's quick-start training, shortened for a chapter on one CPU thread: batches of
#: 12 windows of 64 characters, AdamW at a peak of 1e-3 after 100 warm-up steps, cosine
#: decay to 1e-4, gradients clipped at 1. ``benchmarks/shakespeare_char.py`` runs the full
#: 2,000 steps.
SHAKESPEARE_TRAIN = TrainConfig(
    num_steps=1000,
    batch_size=12,
    lr=1e-3,
    warmup_steps=100,
    min_lr_ratio=0.1,
    weight_decay=0.1,
    clip_norm=1.0,
    eval_every=250,
    seed=1337,
    num_threads=1,
)

#: What a GPU trains in about a minute: 4,000 steps of 32 windows.
SHAKESPEARE_GPU_TRAIN = SHAKESPEARE_TRAIN.replace(num_steps=4000, batch_size=32, eval_every=500)

#: Chapter 16's copier: two layers of attention alone (no feed-forward network), RoPE, no
#: biases, on chapter 15's task of a random block of characters written again.
COPIER_MODEL = ModelConfig(
    d_model=64,
    num_heads=4,
    num_layers=2,
    ffn="none",
    norm_first=True,
    norm="rms",
    bias=False,
    position="rope",
    scale_embeddings=False,
)

#: The copier's training: 800 batches of 16 sequences at a constant learning rate.
COPIER_TRAIN = TrainConfig(
    num_steps=800,
    batch_size=16,
    lr=3e-3,
    warmup_steps=0,
    min_lr_ratio=1.0,
    weight_decay=0.0,
    eval_every=0,
)

_VERSION = 1  # bump when what the same configs train changes


def shakespeare_data(context: int = SHAKESPEARE_CONTEXT) -> TextData:
    """The corpus split 90/10 and encoded by characters, in windows of ``context`` tokens;
    its :class:`~mhbook.CharTokenizer` is ``data.tokenizer``."""
    text = load_shakespeare()
    chars = CharTokenizer(text)
    train, valid = split_text(text)
    return TextData(chars.encode(train), chars.encode(valid), context, tokenizer=chars)


def shakespeare_model(
    checkpoint: str | os.PathLike | None = "checkpoints/shakespeare-llama.pt",
    *,
    config: ModelConfig = SHAKESPEARE_MODEL,
    train: TrainConfig | None = None,
    retrain: bool = False,
    progress: bool = True,
    device: torch.device | str | None = None,
) -> TrainedModel:
    """Part V's trained model, loaded from ``checkpoint`` or trained now.

    Trained (from ``set_seed(train.seed)``, on one thread: the same weights on every CPU
    run) when the checkpoint is missing, was written for other configs, or ``retrain``;
    then saved there. Decided under the checkpoint's lock, so that two chapters started
    at once train it once (:func:`~mhbook.training.checkpoints.train_once`).

    Args:
        train: default :data:`SHAKESPEARE_TRAIN` on a CPU; on a GPU (or with
            ``MHBOOK_GPU_SIZES=1``, :func:`mhbook.cpu_or_gpu`) the same with 4,000 steps
            of 32 windows, about 10 times the characters.

    Returns:
        A :class:`~mhbook.TrainedModel` ``(model, data, history)``, as
        :func:`mhbook.book_model`'s: the model in eval mode on ``device`` (default
        :func:`mhbook.get_device`), :func:`shakespeare_data` (its tokenizer is
        ``data.tokenizer``), and the history of :func:`mhbook.fit` (``None`` if not
        recorded).
    """
    data = shakespeare_data()
    device = torch.device(device) if device is not None else get_device()
    if train is None:
        train = cpu_or_gpu(SHAKESPEARE_TRAIN, SHAKESPEARE_GPU_TRAIN, device)
    expected = {
        "model_config": dataclasses.asdict(config),
        "train_config": dataclasses.asdict(train),
        "chars": "".join(data.tokenizer.chars),
        "version": _VERSION,
    }
    model, history = train_once(
        checkpoint,
        expected,
        build=lambda: DecoderOnlyLM(config, data.tokenizer.vocab_size).to(device),
        train=lambda model: fit(
            model, data, train, loss_fn=lm_loss, device=device, progress=progress
        ),
        seed=train.seed,
        retrain=retrain,
        progress=progress,
        shipped=shipped_weights("shakespeare-llama"),
    )
    return TrainedModel(model, data, history)


def copier_model(
    seed: int,
    checkpoint: str | os.PathLike | None = None,
    *,
    retrain: bool = False,
    progress: bool = False,
    device: torch.device | str | None = None,
) -> TrainedModel:
    """Chapter 16's copier of seed ``seed`` (0, 1 and 2 ship), loaded or trained now.

    :data:`COPIER_MODEL` trained with :data:`COPIER_TRAIN` (seed ``seed`` for the weights and
    the batches, one thread) on ``mhbook.tasks.RepeatedRandom`` sequences of
    :data:`SHAKESPEARE_CONTEXT` characters of the Shakespeare model's vocabulary, a block of
    16 to 32 written again and again: 11 to 14 seconds on one CPU thread.

    Args:
        checkpoint: where to keep it; default ``checkpoints/copier-seed{seed}.pt``.

    Returns:
        A :class:`~mhbook.TrainedModel` ``(model, data, history)``: the model in eval mode on
        ``device`` (default :func:`mhbook.get_device`), the task, and the history of
        :func:`mhbook.fit`.
    """
    if checkpoint is None:
        checkpoint = f"checkpoints/copier-seed{seed}.pt"
    vocab_size = CharTokenizer(load_shakespeare()).vocab_size
    data = RepeatedRandom(vocab_size, length=SHAKESPEARE_CONTEXT)
    device = torch.device(device) if device is not None else get_device()
    train = COPIER_TRAIN.replace(seed=seed)
    expected = {
        "model_config": dataclasses.asdict(COPIER_MODEL),
        "train_config": dataclasses.asdict(train),
        "task": {"vocab_size": vocab_size, "length": data.length, "periods": list(data.periods)},
        "version": _VERSION,
    }
    model, history = train_once(
        checkpoint,
        expected,
        build=lambda: DecoderOnlyLM(COPIER_MODEL, vocab_size).to(device),
        train=lambda model: fit(
            model, data, train, loss_fn=lm_loss, device=device, progress=progress
        ),
        seed=seed,
        retrain=retrain,
        progress=progress,
        shipped=shipped_weights(f"copier-seed{seed}"),
    )
    return TrainedModel(model, data, history)
