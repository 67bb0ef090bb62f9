"""Typed, frozen configurations: one for the model, one for the data, one for training.

A model is built from a :class:`ModelConfig` (``Transformer(config, src_vocab_size,
tgt_vocab_size)``), trained with a :class:`TrainConfig` (``fit(model, data, config.train)``),
and a checkpoint stores the config it was made with (:meth:`Config.to_dict`,
:meth:`Config.from_dict`). :data:`BOOK_CONFIG` is the book's standard model.

Every field is checked when a config is made, with an error that names the field, the
value it got and what it expects. The configs are frozen: derive a variant with
:meth:`Config.replace`, e.g. ``BOOK_CONFIG.replace(model={"num_heads": 8})``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "POSITIONS",
    "ModelConfig",
    "DataConfig",
    "TrainConfig",
    "Config",
    "BOOK_CONFIG",
    "FAST_CONFIG",
]

#: The kinds of position information a model may use.
#: ``"sinusoidal"`` is added to the embeddings (Vaswani et al., 2017); ``"rope"`` rotates
#: queries and keys; ``"alibi"`` adds a distance penalty to the scores; ``"none"``.
POSITIONS = ("sinusoidal", "rope", "alibi", "none")


def _check_int(owner: str, name: str, value: Any, minimum: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = " or None" if optional else ""
        raise ValueError(
            f"{owner}.{name} must be an int >= {minimum}{allowed}, got {value!r} "
            f"({type(value).__name__})"
        )


def _check_float(owner: str, name: str, value: Any, low: float, high: float | None) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and value >= low and (high is None or value < high)
    if not ok:
        limit = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{owner}.{name} must be a number {limit}, got {value!r}")


def _check_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name} must be True or False, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Transformer.

    Attributes:
        d_model: the width of every token vector.
        num_heads: ``h``, attention heads per layer; must divide ``d_model`` unless
            ``head_dim`` is given.
        num_layers: blocks in the encoder and in the decoder (or in a decoder-only stack).
        d_ff: hidden size of the position-wise feed-forward network.
        dropout: dropout probability, in ``[0, 1)``, where the paper applies it: on the
            embeddings plus positions and on every sublayer's output before the residual
            sum (not on attention weights).
        norm_first: pre-norm (``True``) or the paper's post-norm (``False``).
        norm_eps: the layer norms' epsilon.
        num_kv_heads: heads of keys and values (grouped-query attention); ``None`` means
            ``num_heads`` (multi-head attention), 1 is multi-query attention.
            Must divide ``num_heads``.
        position: one of :data:`POSITIONS`.
        window: a sliding attention window of this many keys; ``None`` = full attention.
        d_latent: size of the key/value latent of multi-head latent attention;
            ``None`` = no latent. At most ``d_model``.
        head_dim: the size of one head, independent of ``num_heads`` (Bhojanapalli et
            al., 2020); ``None`` means ``d_model // num_heads``. Read :attr:`d_head`.
    """

    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 128
    dropout: float = 0.0
    norm_first: bool = False
    norm_eps: float = 1e-5
    num_kv_heads: int | None = None
    position: str = "sinusoidal"
    window: int | None = None
    d_latent: int | None = None
    head_dim: int | None = None

    def __post_init__(self) -> None:
        me = "ModelConfig"
        _check_int(me, "d_model", self.d_model, 1)
        _check_int(me, "num_heads", self.num_heads, 1)
        _check_int(me, "num_layers", self.num_layers, 0)
        _check_int(me, "d_ff", self.d_ff, 1)
        _check_float(me, "dropout", self.dropout, 0.0, 1.0)
        _check_bool(me, "norm_first", self.norm_first)
        _check_float(me, "norm_eps", self.norm_eps, 0.0, None)
        _check_int(me, "num_kv_heads", self.num_kv_heads, 1, optional=True)
        _check_int(me, "window", self.window, 1, optional=True)
        _check_int(me, "d_latent", self.d_latent, 1, optional=True)
        _check_int(me, "head_dim", self.head_dim, 1, optional=True)
        if self.head_dim is None and self.d_model % self.num_heads != 0:
            raise ValueError(
                f"ModelConfig.d_model must be divisible by num_heads (or set head_dim): got "
                f"d_model={self.d_model}, num_heads={self.num_heads}"
            )
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"ModelConfig.num_heads must be divisible by num_kv_heads: got num_heads="
                f"{self.num_heads}, num_kv_heads={self.num_kv_heads}"
            )
        if self.position not in POSITIONS:
            raise ValueError(
                f"ModelConfig.position must be one of {POSITIONS}, got {self.position!r}"
            )
        if self.d_latent is not None and self.d_latent > self.d_model:
            raise ValueError(
                f"ModelConfig.d_latent must be at most d_model={self.d_model}, got {self.d_latent}"
            )

    @property
    def d_head(self) -> int:
        """The size of one head: ``head_dim``, or ``d_model // num_heads`` when it is ``None``."""
        return self.d_model // self.num_heads if self.head_dim is None else self.head_dim

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads actually used (``num_kv_heads`` or ``num_heads``)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads


@dataclass(frozen=True)
class DataConfig:
    """The number-words task (:class:`mhbook.data.NumberTranslation`).

    Attributes:
        max_number: numbers are drawn from ``0 .. max_number``.
        num_train, num_valid, num_test: sizes of the three disjoint splits.
        seed: which numbers go to which split.
    """

    max_number: int = 999_999
    num_train: int = 20_000
    num_valid: int = 500
    num_test: int = 1_000
    seed: int = 0

    def __post_init__(self) -> None:
        me = "DataConfig"
        _check_int(me, "max_number", self.max_number, 0)
        _check_int(me, "num_train", self.num_train, 1)
        _check_int(me, "num_valid", self.num_valid, 0)
        _check_int(me, "num_test", self.num_test, 0)
        _check_int(me, "seed", self.seed, 0)


@dataclass(frozen=True)
class TrainConfig:
    """How :func:`mhbook.train.fit` trains: Adam, warm-up then cosine decay, clipping.

    The defaults are the book's: every chapter that calls ``fit`` without a config trains
    as chapter 6 does.

    Attributes:
        num_steps: mini-batches to train on.
        batch_size: sentences per mini-batch.
        lr: peak learning rate. warmup_steps: steps of linear warm-up.
        min_lr_ratio: the cosine decay ends at ``lr * min_lr_ratio``.
        weight_decay: AdamW's decoupled weight decay.
        clip_norm: clip the gradients' global norm to this; ``None``: no clipping.
        label_smoothing: in ``[0, 1)``.
        eval_every: validation loss every this many steps (and at the end); 0: never.
        seed: the order of the mini-batches. (Seed the weights with ``mhbook.set_seed``.)
        num_threads: PyTorch CPU threads while training; ``None``: leave as is. One thread
            gives the same weights on every run, whatever else the machine is doing.
    """

    num_steps: int = 800
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.01
    weight_decay: float = 0.0
    clip_norm: float | None = 1.0
    label_smoothing: float = 0.0
    eval_every: int = 200
    seed: int = 0
    num_threads: int | None = 1

    def __post_init__(self) -> None:
        me = "TrainConfig"
        _check_int(me, "num_steps", self.num_steps, 1)
        _check_int(me, "batch_size", self.batch_size, 1)
        _check_float(me, "lr", self.lr, 0.0, None)
        _check_int(me, "warmup_steps", self.warmup_steps, 0)
        _check_float(me, "min_lr_ratio", self.min_lr_ratio, 0.0, 1.000001)
        _check_float(me, "weight_decay", self.weight_decay, 0.0, None)
        if self.clip_norm is not None:
            _check_float(me, "clip_norm", self.clip_norm, 0.0, None)
        _check_float(me, "label_smoothing", self.label_smoothing, 0.0, 1.0)
        _check_int(me, "eval_every", self.eval_every, 0)
        _check_int(me, "seed", self.seed, 0)
        _check_int(me, "num_threads", self.num_threads, 1, optional=True)


@dataclass(frozen=True)
class Config:
    """A whole experiment: data, model and training."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        for name, kind in (("data", DataConfig), ("model", ModelConfig), ("train", TrainConfig)):
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise TypeError(
                    f"Config.{name} must be a {kind.__name__}, got {type(value).__name__}"
                )

    def replace(self, **parts: dict[str, Any]) -> Config:
        """A copy with some fields changed, e.g. ``replace(model={"num_heads": 8})``."""
        unknown = set(parts) - {"data", "model", "train"}
        if unknown:
            raise ValueError(f"Config has parts data, model and train, got {sorted(unknown)}")
        return dataclasses.replace(
            self,
            **{name: dataclasses.replace(getattr(self, name), **kw) for name, kw in parts.items()},
        )

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dicts of numbers and strings (what a checkpoint stores)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, dict[str, Any]]) -> Config:
        """The inverse of :meth:`to_dict`; every field is checked again."""
        return cls(
            data=DataConfig(**d.get("data", {})),
            model=ModelConfig(**d.get("model", {})),
            train=TrainConfig(**d.get("train", {})),
        )


#: The book's standard model and how it is trained (chapters 6, 7 and 8).
BOOK_CONFIG = Config()

#: A smaller, quicker variant for tests and exercises.
FAST_CONFIG = BOOK_CONFIG.replace(
    data={"num_train": 10_000, "num_valid": 200, "num_test": 300},
    model={"d_model": 32, "d_ff": 64},
    train={"num_steps": 600, "lr": 5e-3, "warmup_steps": 50},
)
