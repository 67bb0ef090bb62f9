"""Training and evaluation, and the book's standard model.

* :func:`fit` trains a model with a :class:`~mhbook.TrainConfig`: AdamW
  (:func:`make_optimizer`), warm-up then cosine decay (:func:`make_scheduler`),
  gradient clipping, a loss function, and a :class:`TrainingLog`.
* :func:`valid_loss` is the mean loss per target token of a split;
  :func:`evaluate` translates a split greedily and scores it (exact match, BLEU).
* :func:`book_model` gives the model of the later chapters: it loads
  ``checkpoints/book-transformer.pt`` if that was written for the same config and
  vocabularies, and otherwise trains it from fixed seeds with :data:`~mhbook.BOOK_CONFIG`
  (a minute or two on a laptop CPU) and saves it with its config;
  :func:`load_model` rebuilds a model from such a checkpoint alone.

What ``fit`` needs from ``data`` (the *batch protocol*)::

    data.batches(split, batch_size, shuffle=..., device=..., generator=...)

an iterator over one pass of ``split`` (``"train"``, ``"valid"``, ...) in mini-batches
on ``device``, shuffled by the CPU ``torch.Generator`` ``generator`` when ``shuffle``.
What a batch holds is the business of the loss function,
``loss_fn(model, batch) -> (loss, n_tokens)``: the mean loss over the batch's
``n_tokens`` predicted tokens. The default, :func:`translation_loss`, is the
encoder-decoder's on a :class:`~mhbook.tasks.numbers.Batch`; another model (a decoder-only
one, with its own batches) trains with ``fit`` unchanged by passing its own.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..core.config import BOOK_CONFIG, Config, TrainConfig
from ..core.utils import get_device, save_checkpoint, set_seed
from ..models.transformer import Transformer
from ..tasks.bleu import translation_scores
from ..tasks.numbers import NumberTranslation

__all__ = [
    "make_data",
    "make_model",
    "load_model",
    "sequence_loss",
    "translation_loss",
    "lr_lambda",
    "make_optimizer",
    "make_scheduler",
    "TrainingLog",
    "fit",
    "cpu_threads",
    "valid_loss",
    "evaluate",
    "book_model",
]

# Bumped whenever fit's arithmetic changes (version 2: the fused AdamW; 3: the decoder's
# self-attention with is_causal, dropout only where the paper puts it, drawn with
# rand_like), so that book_model trains again over a checkpoint this code would not reproduce.
_TRAINER_VERSION = 3

#: ``loss_fn(model, batch) -> (loss, n_tokens)``: the mean loss over ``n_tokens`` tokens.
LossFn = Callable[[nn.Module, object], "tuple[torch.Tensor, torch.Tensor | int]"]


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


# -- losses -------------------------------------------------------------------------------
def sequence_loss(
    logits: torch.Tensor, tgt_out: torch.Tensor, pad_id: int, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Mean cross-entropy over the non-padding target tokens.

    With label smoothing ``ε`` the target of each token is ``1 - ε`` on the right id
    plus ``ε / vocab_size`` everywhere: the loss is ``(1 - ε) NLL + ε mean_v(-log p_v)``.

    Args:
        logits: ``(batch, T, vocab_size)``.
        tgt_out: ``(batch, T)`` the ids to predict; positions holding ``pad_id`` are ignored.
        label_smoothing: ``ε`` in ``[0, 1)``.

    Returns:
        A 0-dim tensor.
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


def translation_loss(
    model: nn.Module, batch, *, pad_id: int, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder-decoder's loss on a :class:`~mhbook.tasks.numbers.Batch`, with teacher forcing.

    ``model(batch.src, batch.tgt_in, batch.src_valid_lens)`` gives logits
    ``(batch, T, vocab_size)``, scored by :func:`sequence_loss` against ``batch.tgt_out``.

    Returns:
        ``(loss, n_tokens)``: the mean cross-entropy over the non-padding target tokens,
        and their number (a 0-dim tensor on the batch's device).
    """
    logits = model(batch.src, batch.tgt_in, batch.src_valid_lens)
    loss = sequence_loss(logits, batch.tgt_out, pad_id, label_smoothing)
    return loss, (batch.tgt_out != pad_id).sum()


def _translation_losses(data, label_smoothing: float) -> tuple[LossFn, LossFn]:
    """The default training loss (with label smoothing) and validation loss (without)."""
    vocab = getattr(data, "tgt_vocab", None)
    if vocab is None:
        raise TypeError(
            "the default loss_fn, translation_loss, needs data.tgt_vocab.pad_id; "
            f"{type(data).__name__} has no tgt_vocab: pass loss_fn=..."
        )
    train = partial(translation_loss, pad_id=vocab.pad_id, label_smoothing=label_smoothing)
    return train, partial(translation_loss, pad_id=vocab.pad_id)


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

            # At most one refresh a second: in a notebook every refresh is a few widget
            # messages, and nbval reads them only when the cell has finished; past a few
            # thousand, ZeroMQ drops the rest, the kernel's final "idle" among them, and nbval
            # fails the cell on "Timeout of 5 seconds exceeded waiting for output".
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
            :class:`~mhbook.tasks.numbers.NumberTranslation`).
        config: default ``TrainConfig()``, the book's settings.
        loss_fn: ``loss_fn(model, batch) -> (loss, n_tokens)``. Default: the
            encoder-decoder's :func:`translation_loss` with ``config.label_smoothing``
            for training, without for validation (it needs ``data.tgt_vocab``).
        device: default: the device of the model's parameters.
        progress: show a ``tqdm`` bar with the loss and tokens per second.
        overrides: fields of ``config`` to replace, e.g. ``fit(model, data, num_steps=250)``.

    Returns:
        The history of :class:`TrainingLog`: ``step``, ``loss``, ``lr``,
        ``tokens_per_s``, ``time_s``, and ``valid_step``, ``valid_loss`` (:func:`valid_loss`
        of the ``"valid"`` split every ``config.eval_every`` steps and at the end).
    """
    config = _train_config(config, overrides)
    if loss_fn is None:
        loss_fn, eval_loss_fn = _translation_losses(data, config.label_smoothing)
    elif config.label_smoothing:
        raise ValueError(
            f"label_smoothing={config.label_smoothing} is applied by the default loss only: "
            "smooth inside your loss_fn and leave label_smoothing at 0"
        )
    else:
        eval_loss_fn = loss_fn
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
                loss, n_tokens = _train_step(
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


def _train_step(model, batch, loss_fn, optimizer, scheduler, clip_norm):
    """One optimisation step of :func:`fit` (also what ``python -m benchmarks.bench`` times):
    loss, backward, clipping, a step of the optimizer and of the learning rate.
    Returns ``loss_fn``'s ``(loss, n_tokens)``."""
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


# -- evaluation ---------------------------------------------------------------------------
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
    """Mean loss per target token of ``split``, in eval mode (teacher forcing).

    Args:
        loss_fn: as for :func:`fit`; default :func:`translation_loss` without label
            smoothing, i.e. the cross-entropy of the non-padding target tokens.

    Returns:
        The loss of every batch weighted by its number of tokens; ``nan`` for an empty split.
    """
    if device is None:
        device = next(model.parameters()).device
    if loss_fn is None:
        _, loss_fn = _translation_losses(data, 0.0)
    model.eval()
    total, count = 0.0, 0
    for batch in data.batches(split, batch_size, shuffle=False, device=device):
        loss, n_tokens = loss_fn(model, batch)
        total += loss.item() * int(n_tokens)
        count += int(n_tokens)
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
) -> tuple[Transformer, NumberTranslation, dict | None]:
    """The book's trained Transformer, loaded from ``checkpoint`` or trained now.

    If ``checkpoint`` exists and was written for the same ``config`` and
    vocabularies, it is loaded (``torch.load(weights_only=True)``). Otherwise the
    model is trained with ``config`` from its fixed seeds and saved there with its
    config and vocabularies (:func:`mhbook.save_checkpoint`, which writes a whole
    file or none; ``checkpoint=None``: train, do not save). On a CPU the same
    configuration always gives the same weights.

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
        ``(model, data, history)``: the model in eval mode on ``device``, the data,
        and the training history of :func:`fit` (also kept in the checkpoint;
        ``None`` for a checkpoint without one).
    """
    if data is None:
        data = make_data(config)
    device = torch.device(device) if device is not None else get_device()
    expected = {
        "src_vocab": data.src_vocab.id_to_token,
        "tgt_vocab": data.tgt_vocab.id_to_token,
        "trainer_version": _TRAINER_VERSION,
    }
    # Two chapters started at once (two notebooks open, or nbval on two workers) must not
    # both train: the second waits for the first's checkpoint and loads it.
    with _exclusive(checkpoint):
        if checkpoint is not None and Path(checkpoint).exists() and not retrain:
            stored = _read_checkpoint(checkpoint, say=progress)
            same = stored.get("config") == config.to_dict()
            if same and all(stored.get(k) == v for k, v in expected.items()):
                return _model_from(stored, device, checkpoint), data, stored.get("history")
            if stored and progress:
                print(
                    f"{checkpoint} was written for another configuration or by an older fit: "
                    "training again."
                )

        set_seed(config.train.seed)
        model = make_model(data, config, device)
        history = fit(model, data, config.train, device=device, progress=progress)
        if checkpoint is not None:
            save_checkpoint(checkpoint, model, config=config, history=history, **expected)
        return model, data, history


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
