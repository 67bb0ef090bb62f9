"""Training and evaluation, and the book's standard model.

* :func:`fit` trains a :class:`~mhbook.Transformer` on a :class:`~mhbook.data.NumberTranslation`
  with Adam, a learning rate that warms up then decays, gradient clipping and
  cross-entropy that ignores ``<pad>``, on any device.
* :func:`evaluate` translates a split greedily and scores it: exact match and corpus BLEU.
* :func:`book_model` gives the model used by the later chapters: it loads
  ``checkpoints/book-transformer.pt`` if it is there, and otherwise trains it from a
  fixed seed with :data:`BOOK_CONFIG` (about a minute or two on a laptop CPU) and saves it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .bleu import corpus_bleu
from .config import BOOK_CONFIG, FAST_CONFIG, Config
from .data import NumberTranslation, tokenize
from .transformer import Transformer
from .utils import get_device, load_checkpoint, save_checkpoint, set_seed

__all__ = [
    "BOOK_CONFIG",
    "FAST_CONFIG",
    "make_data",
    "make_model",
    "lr_lambda",
    "sequence_loss",
    "fit",
    "cpu_threads",
    "valid_loss",
    "evaluate",
    "book_model",
]


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


def lr_lambda(step: int, warmup_steps: int, num_steps: int, min_lr_ratio: float = 0.0) -> float:
    """The learning-rate factor at ``step`` (0-based): linear warm-up from ``1/warmup_steps``
    to 1 over ``warmup_steps`` steps, then a cosine decay to ``min_lr_ratio`` at ``num_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, num_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def sequence_loss(
    logits: torch.Tensor, tgt_out: torch.Tensor, pad_id: int, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Mean cross-entropy over the non-padding target tokens.

    Args:
        logits: ``(batch, T, vocab_size)``.
        tgt_out: ``(batch, T)`` the ids to predict; positions holding ``pad_id`` are ignored.
    """
    if logits.dim() != 3 or logits.shape[:2] != tgt_out.shape:
        raise ValueError(
            "logits must be (batch, T, vocab_size) for tgt_out (batch, T) = "
            f"{tuple(tgt_out.shape)}, got {tuple(logits.shape)}"
        )
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)),
        tgt_out.reshape(-1),
        ignore_index=pad_id,
        label_smoothing=label_smoothing,
    )


def fit(
    model: nn.Module,
    data: NumberTranslation,
    num_steps: int = 1_000,
    batch_size: int = 64,
    lr: float = 1e-3,
    warmup_steps: int = 100,
    min_lr_ratio: float = 0.01,
    weight_decay: float = 0.0,
    clip_norm: float | None = 1.0,
    label_smoothing: float = 0.0,
    eval_every: int | None = 250,
    seed: int | None = 0,
    device: torch.device | str | None = None,
    progress: bool = True,
    num_threads: int | None = None,
) -> dict[str, list]:
    """Train ``model`` on ``data``'s training split for ``num_steps`` mini-batches.

    Adam (AdamW with ``betas=(0.9, 0.98)``, ``eps=1e-9`` as in Vaswani et al.), the
    learning rate of :func:`lr_lambda` through ``torch.optim.lr_scheduler.LambdaLR``,
    gradients clipped to norm ``clip_norm``, and the loss of :func:`sequence_loss`
    (``<pad>`` ignored, optional label smoothing). The training split is reshuffled
    every epoch by a ``torch.Generator`` seeded with ``seed``, so with the same
    initial weights a CPU run is repeatable.

    Args:
        model: a :class:`~mhbook.Transformer` (or anything with its ``forward``).
        data: the task.
        device: default: the device of the model's parameters.
        eval_every: compute the validation loss every this many steps (and at the end);
            ``None`` or 0 to skip.
        progress: show a ``tqdm`` bar with the loss and tokens per second.
        num_threads: if given, PyTorch's CPU threads while training (restored after).
            The book's models are so small that one thread is about as fast as
            several, much faster when other programs share the cores, and gives
            the same weights on every machine with the same kernels.

    Returns:
        The history (a dict of lists) with ``step``, ``loss`` (training loss of that step),
        ``lr``, ``tokens_per_s`` (source and target tokens, padding not counted, per
        second of that step), ``valid_step`` and ``valid_loss`` (mean token
        cross-entropy on the validation split, without label smoothing), and
        ``time_s`` (seconds of training so far, validation not counted).
    """
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
    if device is None:
        device = next(model.parameters()).device
    model.to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_lambda(step, warmup_steps, num_steps, min_lr_ratio)
    )
    generator = torch.Generator()
    if seed is not None:
        generator.manual_seed(seed)
    pad_id = data.tgt_vocab.pad_id
    history: dict[str, list] = {
        "step": [],
        "loss": [],
        "lr": [],
        "tokens_per_s": [],
        "valid_step": [],
        "valid_loss": [],
        "time_s": [],
    }

    def batch_stream():
        while True:
            yield from data.batches(
                "train", batch_size, shuffle=True, device=device, generator=generator
            )

    with cpu_threads(num_threads):
        bar = tqdm(total=num_steps, desc="training", disable=not progress, leave=True)
        smooth_loss = smooth_speed = None
        train_time = 0.0
        model.train()
        for step, batch in zip(range(1, num_steps + 1), batch_stream()):
            start = time.perf_counter()
            current_lr = optimizer.param_groups[0]["lr"]
            logits = model(batch.src, batch.tgt_in, batch.src_valid_lens)
            loss = sequence_loss(logits, batch.tgt_out, pad_id, label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
            scheduler.step()
            loss_value = loss.item()  # waits for the device, so the timing below is honest
            seconds = time.perf_counter() - start
            train_time += seconds
            num_tokens = int(batch.src_valid_lens.sum() + batch.tgt_valid_lens.sum())
            speed = num_tokens / max(seconds, 1e-9)

            history["step"].append(step)
            history["loss"].append(loss_value)
            history["lr"].append(current_lr)
            history["tokens_per_s"].append(speed)
            history["time_s"].append(train_time)
            smooth_loss = (
                loss_value if smooth_loss is None else 0.9 * smooth_loss + 0.1 * loss_value
            )
            smooth_speed = speed if smooth_speed is None else 0.9 * smooth_speed + 0.1 * speed
            validate = eval_every and (step % eval_every == 0 or step == num_steps)
            if validate and data.numbers["valid"]:
                history["valid_step"].append(step)
                history["valid_loss"].append(valid_loss(model, data, "valid", device=device))
                model.train()
            postfix = {"loss": f"{smooth_loss:.3f}", "tok/s": f"{smooth_speed:,.0f}"}
            if history["valid_loss"]:
                postfix["valid"] = f"{history['valid_loss'][-1]:.3f}"
            bar.set_postfix(postfix, refresh=False)
            bar.update(1)
        bar.close()
        model.eval()
    return history


@contextmanager
def cpu_threads(num_threads: int | None):
    """Run the ``with`` block with ``torch.set_num_threads(num_threads)``, then restore
    the previous number (``None``: change nothing)."""
    previous = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@torch.no_grad()
def valid_loss(
    model: nn.Module,
    data: NumberTranslation,
    split: str = "valid",
    batch_size: int = 500,
    device: torch.device | str | None = None,
) -> float:
    """Mean cross-entropy per target token of ``split`` with teacher forcing (eval mode)."""
    if device is None:
        device = next(model.parameters()).device
    model.eval()
    total, count = 0.0, 0
    for batch in data.batches(split, batch_size, shuffle=False, device=device):
        logits = model(batch.src, batch.tgt_in, batch.src_valid_lens)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)),
            batch.tgt_out.reshape(-1),
            ignore_index=data.tgt_vocab.pad_id,
            reduction="sum",
        )
        total += loss.item()
        count += int(batch.tgt_valid_lens.sum())
    return total / count if count else float("nan")


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
        :func:`~mhbook.data.tokenize`), and the lists ``sources``, ``hypotheses``
        and ``references`` (strings, in the split's order).
    """
    pairs = data.pairs(split)
    sources = [en for en, _ in pairs]
    references = [fr for _, fr in pairs]
    hypotheses: list[str] = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start : start + batch_size]
        hypotheses += data.translate(model, chunk, device=device, max_len=max_len)
    exact = sum(h == r for h, r in zip(hypotheses, references)) / max(1, len(references))
    bleu = corpus_bleu([tokenize(h) for h in hypotheses], [tokenize(r) for r in references])
    return {
        "exact_match": exact,
        "bleu": bleu,
        "sources": sources,
        "hypotheses": hypotheses,
        "references": references,
    }


def book_model(
    data: NumberTranslation | None = None,
    device: torch.device | str | None = None,
    checkpoint: str | os.PathLike | None = "checkpoints/book-transformer.pt",
    progress: bool = True,
    config: Config = BOOK_CONFIG,
) -> tuple[Transformer, NumberTranslation, dict | None]:
    """The book's trained Transformer, loaded from ``checkpoint`` or trained now.

    If ``checkpoint`` exists and was written for the same ``config`` and
    vocabularies, its weights are loaded (``torch.load(weights_only=True)`` through
    :func:`mhbook.load_checkpoint`). Otherwise the model is trained with
    ``config`` from its fixed seeds and saved there (``checkpoint=None``: train,
    do not save). On a CPU the same configuration always gives the same weights.

    Args:
        data: the task; default: ``make_data(config)``.
        device: default: :func:`mhbook.get_device`.
        progress: show the training progress bar.

    Returns:
        ``(model, data, history)``: the model in eval mode on ``device``, the data,
        and the training history of :func:`fit` (also kept in the checkpoint;
        ``None`` for a checkpoint without one).
    """
    if data is None:
        data = make_data(config)
    device = torch.device(device) if device is not None else get_device()
    expected = {
        "config": config.to_dict(),
        "src_vocab": data.src_vocab.id_to_token,
        "tgt_vocab": data.tgt_vocab.id_to_token,
    }
    if checkpoint is not None and Path(checkpoint).exists():
        try:
            extra = torch.load(checkpoint, map_location="cpu", weights_only=True)
        except Exception as error:  # e.g. a file cut short
            extra = {}
            print(f"could not read {checkpoint} ({type(error).__name__}): training again.")
        else:
            if not all(extra.get(k) == v for k, v in expected.items()):
                print(f"{checkpoint} was written for another configuration: training again.")
        if extra and all(extra.get(k) == v for k, v in expected.items()):
            model = make_model(data, config, device)
            extra = load_checkpoint(checkpoint, model, map_location=device)
            model.eval()
            return model, data, extra.get("history")

    set_seed(config.train.seed)
    model = make_model(data, config, device)
    history = fit(model, data, device=device, progress=progress, **dataclasses.asdict(config.train))
    if checkpoint is not None:
        path = Path(checkpoint)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a reader (another chapter running now) never sees half a file.
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        save_checkpoint(partial, model, history=history, **expected)
        os.replace(partial, path)
    model.eval()
    return model, data, history
