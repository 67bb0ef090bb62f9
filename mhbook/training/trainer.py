"""The trainer: :func:`fit`, any model on any data, with its optimiser, schedule and log.

* :func:`fit` trains a model with a :class:`~mhbook.TrainConfig`: AdamW
  (:func:`make_optimizer`), warm-up then cosine decay (:func:`make_scheduler`),
  gradient clipping, a loss function, and a :class:`TrainingLog`; :func:`train_step` is
  one of its steps.
* :func:`valid_loss` is the mean loss per predicted token of a split.

What ``fit`` needs from ``data`` (the *batch protocol*)::

    data.batches(split, batch_size, shuffle=..., device=..., generator=...)

an iterator over one pass of ``split`` (``"train"``, ``"valid"``, ...) in mini-batches
on ``device``, shuffled by the CPU ``torch.Generator`` ``generator`` when ``shuffle``.
What a batch holds is the business of the loss function,
``loss_fn(model, batch) -> (loss, n_tokens)``: the mean loss over the batch's
``n_tokens`` predicted tokens. The caller passes it, or the data has it as
``data.loss_fn`` (:meth:`mhbook.NumberTranslation.loss_fn`,
:meth:`mhbook.PromptCompletion.loss_fn`); nothing here knows a task.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn

from ..core.config import TrainConfig

__all__ = [
    "lr_lambda",
    "make_optimizer",
    "make_scheduler",
    "cpu_threads",
    "TrainingLog",
    "fit",
    "train_step",
    "valid_loss",
]

#: ``loss_fn(model, batch) -> (loss, n_tokens)``: the mean loss over ``n_tokens`` tokens.
LossFn = Callable[[nn.Module, object], "tuple[torch.Tensor, torch.Tensor | int]"]


# -- optimisation -------------------------------------------------------------------------
def lr_lambda(step: int, warmup_steps: int, num_steps: int, min_lr_ratio: float = 0.0) -> float:
    """The learning-rate factor at ``step`` (0-based): linear warm-up from ``1/warmup_steps``
    to 1 over ``warmup_steps`` steps, then a cosine decay to ``min_lr_ratio`` at ``num_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, num_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with ``betas=(0.9, 0.98)``, ``eps=1e-9`` (Vaswani et al.), ``config.lr`` and
    ``config.weight_decay``, over the parameters that require grad.

    The fused implementation (one kernel for all parameters) where PyTorch has it for
    the parameters' device, else the ``foreach`` one. Both are deterministic.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    settings = dict(lr=config.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=config.weight_decay)
    try:
        return torch.optim.AdamW(params, fused=True, **settings)
    except RuntimeError:  # no fused AdamW for this device in this version of PyTorch
        return torch.optim.AdamW(params, foreach=True, **settings)


def make_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning rate of :func:`lr_lambda` (warm-up, then cosine decay) for ``config``."""
    factor = partial(
        lr_lambda,
        warmup_steps=config.warmup_steps,
        num_steps=config.num_steps,
        min_lr_ratio=config.min_lr_ratio,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


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


# -- the training loop ----------------------------------------------------------------------
class TrainingLog:
    """The history of a training run, and its ``tqdm`` progress bar.

    Attributes:
        history: a dict of lists: per step ``step``, ``loss`` (training loss),
            ``lr`` (the learning rate used), ``tokens_per_s`` (the loss's tokens per
            second of that step) and ``time_s`` (seconds of training so far, validation
            not counted); per validation ``valid_step`` and ``valid_loss``.
    """

    KEYS = ("step", "loss", "lr", "tokens_per_s", "valid_step", "valid_loss", "time_s")

    def __init__(self, num_steps: int, progress: bool = True):
        self.history: dict[str, list] = {key: [] for key in self.KEYS}
        self._bar = None
        if progress:
            from tqdm.auto import tqdm  # here, not above: in a notebook it imports ipywidgets

            # At most one refresh a second: every refresh is a few widget messages, which
            # nbval reads only when the cell has finished, and too many of them lose the
            # kernel's final "idle" (the cell then fails on nbval's output timeout).
            self._bar = tqdm(total=num_steps, desc="training", leave=True, mininterval=1.0)
        self._smooth: dict[str, float] = {}  # moving averages for the bar

    def train_step(self, step: int, loss: float, lr: float, n_tokens: int, seconds: float):
        """Record one optimisation step."""
        h = self.history
        speed = n_tokens / max(seconds, 1e-9)
        for key, value in (("step", step), ("loss", loss), ("lr", lr), ("tokens_per_s", speed)):
            h[key].append(value)
        h["time_s"].append((h["time_s"][-1] if h["time_s"] else 0.0) + seconds)
        for key, value in (("loss", loss), ("tok/s", speed)):
            old = self._smooth.get(key, value)
            self._smooth[key] = 0.9 * old + 0.1 * value
        if self._bar is not None:
            postfix = {
                "loss": f"{self._smooth['loss']:.3f}",
                "tok/s": f"{self._smooth['tok/s']:,.0f}",
            }
            if h["valid_loss"]:
                postfix["valid"] = f"{h['valid_loss'][-1]:.3f}"
            self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(1)

    def valid_step(self, step: int, loss: float) -> None:
        """Record a validation loss."""
        self.history["valid_step"].append(step)
        self.history["valid_loss"].append(loss)

    def close(self) -> None:
        """Close the progress bar."""
        if self._bar is not None:
            self._bar.close()


def fit(
    model: nn.Module,
    data,
    config: TrainConfig | None = None,
    *,
    loss_fn: LossFn | None = None,
    device: torch.device | str | None = None,
    progress: bool = True,
    **overrides,
) -> dict[str, list]:
    """Train ``model`` on ``data``'s ``"train"`` split for ``config.num_steps`` mini-batches.

    Each step: ``loss_fn`` on the next batch, backward, gradients clipped to norm
    ``config.clip_norm``, a step of :func:`make_optimizer`'s AdamW, a step of
    :func:`make_scheduler`'s learning rate. The training split is reshuffled every
    epoch by a ``torch.Generator`` seeded with ``config.seed``; with the same initial
    weights (``mhbook.set_seed``) and one thread (``config.num_threads``, the
    default), a CPU run gives the same weights every time.

    Args:
        model: the model; trained in train mode, left in eval mode.
        data: the batch protocol of this module (e.g. a
            :class:`~mhbook.tasks.numbers.NumberTranslation`, whose ``loss_fn`` is the
            encoder-decoder's translation loss).
        config: default ``TrainConfig()``, the book's settings.
        loss_fn: ``loss_fn(model, batch) -> (loss, n_tokens)``; default ``data.loss_fn``,
            the data's own loss. With ``config.label_smoothing`` above 0 the training
            steps call ``loss_fn(model, batch, label_smoothing=...)`` (validation
            without it), so ``loss_fn`` must then take that argument.
        device: default: the device of the model's parameters.
        progress: show a ``tqdm`` bar with the loss and tokens per second.
        overrides: fields of ``config`` to replace, e.g. ``fit(model, data, num_steps=250)``.

    Returns:
        The history of :class:`TrainingLog`: ``step``, ``loss``, ``lr``,
        ``tokens_per_s``, ``time_s``, and ``valid_step``, ``valid_loss`` (:func:`valid_loss`
        of the ``"valid"`` split every ``config.eval_every`` steps and at the end).
    """
    config = _train_config(config, overrides)
    eval_loss_fn = _loss_of(data, loss_fn)
    loss_fn = _smoothed(eval_loss_fn, config.label_smoothing)
    if device is None:
        device = next(model.parameters()).device
    model.to(device)
    optimizer = make_optimizer(model, config)
    scheduler = make_scheduler(optimizer, config)
    generator = torch.Generator().manual_seed(config.seed)
    validate = config.eval_every > 0 and _has_batches(data, "valid")
    log = TrainingLog(config.num_steps, progress)
    with cpu_threads(config.num_threads):
        try:
            model.train()
            batches = _endless(data, config.batch_size, device, generator)
            for step, batch in zip(range(1, config.num_steps + 1), batches):
                start = time.perf_counter()
                lr = optimizer.param_groups[0]["lr"]
                loss, n_tokens = train_step(
                    model, batch, loss_fn, optimizer, scheduler, config.clip_norm
                )
                loss_value = loss.item()  # waits for the device, so the timing is honest
                seconds = time.perf_counter() - start
                log.train_step(step, loss_value, lr, int(n_tokens), seconds)
                if validate and (step % config.eval_every == 0 or step == config.num_steps):
                    value = valid_loss(model, data, "valid", loss_fn=eval_loss_fn, device=device)
                    log.valid_step(step, value)
                    model.train()
        finally:
            log.close()
            model.eval()
    return log.history


def train_step(
    model: nn.Module,
    batch,
    loss_fn: LossFn,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    clip_norm: float | None,
):
    """One optimisation step of :func:`fit` (also what ``python -m benchmarks.bench`` times):
    ``loss_fn``, backward, gradients clipped to norm ``clip_norm`` (``None``: not clipped),
    a step of the optimizer and of the learning rate. Returns ``loss_fn``'s
    ``(loss, n_tokens)``."""
    loss, n_tokens = loss_fn(model, batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip_norm is not None:  # the optimizer's parameters: no walk through the modules
        params = [p for group in optimizer.param_groups for p in group["params"]]
        nn.utils.clip_grad_norm_(params, clip_norm)
    optimizer.step()
    scheduler.step()
    return loss, n_tokens


def _train_config(config: TrainConfig | None, overrides: dict) -> TrainConfig:
    """``config`` (default ``TrainConfig()``) with the fields in ``overrides`` replaced."""
    if config is None:
        config = TrainConfig()
    elif not isinstance(config, TrainConfig):
        raise TypeError(
            f"config must be a TrainConfig (e.g. BOOK_CONFIG.train), got {type(config).__name__}"
        )
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise TypeError(f"fit() got {unknown}, which are not fields of TrainConfig: {fields}")
    return dataclasses.replace(config, **overrides)


def _endless(data, batch_size: int, device, generator: torch.Generator):
    """Training batches, epoch after epoch, each epoch in a new order."""
    while True:
        yield from data.batches(
            "train", batch_size, shuffle=True, device=device, generator=generator
        )


def _has_batches(data, split: str) -> bool:
    return next(iter(data.batches(split, 1, shuffle=False)), None) is not None


def _loss_of(data, loss_fn: LossFn | None) -> LossFn:
    """``loss_fn``, or else the data's own ``data.loss_fn``."""
    if loss_fn is None:
        loss_fn = getattr(data, "loss_fn", None)
        if loss_fn is None:
            raise TypeError(
                f"{type(data).__name__} has no loss_fn of its own: pass "
                "loss_fn=... (loss_fn(model, batch) -> (loss, n_tokens))"
            )
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    return loss_fn


def _smoothed(loss_fn: LossFn, label_smoothing: float) -> LossFn:
    """``loss_fn`` with ``label_smoothing=`` bound when it is above 0 (checked first)."""
    if not label_smoothing:
        return loss_fn
    try:
        takes_it = "label_smoothing" in inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):  # a callable without a signature: let the call decide
        takes_it = True
    if not takes_it:
        raise ValueError(
            f"label_smoothing={label_smoothing}, but loss_fn takes no label_smoothing "
            "argument: smooth inside your loss_fn and leave label_smoothing at 0, or give "
            "loss_fn a label_smoothing keyword"
        )
    return partial(loss_fn, label_smoothing=label_smoothing)


@torch.no_grad()
def valid_loss(
    model: nn.Module,
    data,
    split: str = "valid",
    batch_size: int = 500,
    device: torch.device | str | None = None,
    *,
    loss_fn: LossFn | None = None,
) -> float:
    """Mean loss per predicted token of ``split``, in eval mode (teacher forcing).

    Args:
        loss_fn: as for :func:`fit`; default ``data.loss_fn`` (without label smoothing:
            for the number task, the cross-entropy of the non-padding target tokens).

    Returns:
        The loss of every batch weighted by its number of tokens; ``nan`` for an empty split.
    """
    if device is None:
        device = next(model.parameters()).device
    loss_fn = _loss_of(data, loss_fn)
    model.eval()
    total, count = 0.0, 0
    for batch in data.batches(split, batch_size, shuffle=False, device=device):
        loss, n_tokens = loss_fn(model, batch)
        total += loss.item() * int(n_tokens)
        count += int(n_tokens)
    return total / count if count else float("nan")
