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

from .validate import check_bool, check_choice, check_heads, check_int, check_number, check_window

__all__ = [
    "ROPE_SCALINGS",
    "RopeScaling",
    "POSITIONS",
    "NORMS",
    "FFNS",
    "LLAMA_SHAPE",
    "ModelConfig",
    "DataConfig",
    "TrainConfig",
    "Config",
    "BOOK_CONFIG",
    "FAST_CONFIG",
]

#: The kinds of position information a model may use.
#: ``"sinusoidal"`` is added to the embeddings (Vaswani et al., 2017); ``"learned"`` adds a
#: trained table of ``max_position_embeddings`` rows to them (GPT-2, nanoGPT's GPT);
#: ``"rope"`` rotates queries and keys; ``"alibi"`` adds a distance penalty to the scores;
#: ``"none"``.
POSITIONS = ("sinusoidal", "learned", "rope", "alibi", "none")

#: The normalisations: LayerNorm (the paper, GPT-2) or RMSNorm (Llama, Mistral, Gemma).
NORMS = ("layer", "rms")

#: The feed-forward networks: ``W_2 act(W_1 x)`` with ReLU (the paper) or GELU (BERT,
#: GPT-2), or the gated SwiGLU ``W_down (silu(W_gate x) * W_up x)`` (Llama, Mistral);
#: ``"none"``: no feed-forward sublayer, attention-only blocks (Elhage et al., 2021).
FFNS = ("relu", "gelu", "swiglu", "none")


#: The context-extension methods of :class:`RopeScaling`.
ROPE_SCALINGS = ("linear", "ntk", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """How to stretch RoPE over a context ``factor`` times the one a model was trained on.

    Attributes:
        kind: one of ``ROPE_SCALINGS``: ``"linear"`` (position interpolation, Chen
            et al., 2023), ``"ntk"`` (NTK-aware scaling, bloc97, 2023) or ``"yarn"``
            (Peng et al., 2024); :func:`mhbook.attention.rope.rope_frequencies` gives the math of
            each.
        factor: ``s >= 1``, the new context over the original one (1: no change).
        original_context: ``L``, the context the model was trained on (Hugging Face's
            ``original_max_position_embeddings``); only YaRN's ramp reads it.
        beta_fast, beta_slow: YaRN's ramp: pairs that turn more than ``beta_fast`` times
            over ``L`` keep their frequency, those that turn fewer than ``beta_slow``
            times are interpolated (32 and 1, the paper's and Hugging Face's defaults).
    """

    kind: str
    factor: float
    original_context: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def __post_init__(self) -> None:
        check_choice("RopeScaling.kind", self.kind, ROPE_SCALINGS)
        check_number("RopeScaling.factor", self.factor, 1.0)
        check_int("RopeScaling.original_context", self.original_context, 1)
        check_number("RopeScaling.beta_slow", self.beta_slow, 0.0, low_inclusive=False)
        check_number("RopeScaling.beta_fast", self.beta_fast, self.beta_slow, low_inclusive=False)


#: What a Llama-shaped :class:`ModelConfig` holds: field -> (its value, what Llama has).
#: :func:`mhbook.lm_to_hf` and the live language model require it (:meth:`ModelConfig.require`).
LLAMA_SHAPE: dict[str, tuple[Any, str]] = {
    "norm": ("rms", "RMSNorm"),
    "ffn": ("swiglu", "a SwiGLU feed-forward network"),
    "bias": (False, "no biases"),
    "position": ("rope", "RoPE"),
    "norm_first": (True, "pre-norm"),
    "scale_embeddings": (False, "unscaled embeddings"),
    "dropout": (0.0, "no residual dropout"),
    "d_latent": (None, "no latent attention"),
    "sinks": (0, "no attention sinks"),
    "global_every": (None, "one kind of attention in every layer"),
}


class _Replace:
    """``replace(**changes)``: a copy with some fields changed, checked again."""

    def replace(self, **changes: Any):
        """A copy with some fields changed, e.g. ``config.replace(num_kv_heads=1)``; the
        copy is checked as a new config is."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ModelConfig(_Replace):
    """The shape of a Transformer: every model of mhbook obeys every field, or refuses
    a combination it does not build with a ``ValueError`` that names the field.

    The defaults are the book's models as chapters 6 and 9 built them (the 2017 block:
    post-norm LayerNorm, ReLU, biases, embeddings scaled by ``sqrt(d_model)``). A
    Llama-style block is ``ModelConfig(norm_first=True, norm="rms", ffn="swiglu",
    bias=False, position="rope", scale_embeddings=False)``; the field names follow Hugging
    Face's ``LlamaConfig`` where it has the same idea (``rope_theta``, ``tie_embeddings``
    for ``tie_word_embeddings``, ``attention_dropout``, ``d_ff`` for ``intermediate_size``).

    Attributes:
        d_model: the width of every token vector (``hidden_size``).
        num_heads: ``h``, attention heads per layer; must divide ``d_model`` unless
            ``head_dim`` is given.
        num_layers: blocks in the encoder and in the decoder (or in a decoder-only stack).
        d_ff: hidden size of the position-wise feed-forward network; for ``ffn="swiglu"``
            the gated hidden size (Llama's ``intermediate_size``); unused with ``ffn="none"``.
        dropout: the one dropout of the residual stream, in ``[0, 1)``, where the paper
            applies it: on the embeddings (plus positions) and on every sublayer's output
            before the residual sum. Nowhere else.
        attention_dropout: dropout on the attention weights, in ``[0, 1)`` (Hugging
            Face's ``attention_dropout``; 0 in the paper).
        norm_first: pre-norm (``True``) or the paper's post-norm (``False``).
        norm: ``"layer"`` (LayerNorm) or ``"rms"`` (RMSNorm), see :data:`NORMS`.
        norm_eps: the norms' epsilon.
        ffn: ``"relu"``, ``"gelu"``, ``"swiglu"`` or ``"none"``, see :data:`FFNS`.
        bias: ``True`` (the default, the 2017 block, GPT-2): biases in every linear layer
            and LayerNorm; ``False``: none (Llama).
        num_kv_heads: heads of keys and values (grouped-query attention); ``None`` means
            ``num_heads`` (multi-head attention), 1 is multi-query attention.
            Must divide ``num_heads``.
        position: one of :data:`POSITIONS`.
        max_position_embeddings: with ``position="learned"`` (and only then), the rows of
            the learned position table: the longest sequence the model can read (Hugging
            Face's name, as in ``GPT2Config``; nanoGPT's ``block_size``). A position past
            it is refused by name, never wrapped or clipped.
        rope_theta: RoPE's base, ``theta_i = rope_theta^(-2i / d_head)``; used with
            ``position="rope"`` (and latent attention's decoupled RoPE).
        rope_scaling: ``None``, or a :class:`mhbook.RopeScaling` that stretches RoPE
            over a longer context than the model was trained on (position
            interpolation, NTK-aware scaling, YaRN); a dict of its fields (as
            :meth:`Config.to_dict` writes it) is turned into one. Needs
            ``position="rope"``; refused with ``d_latent`` (latent attention's decoupled
            RoPE is not scaled).
        window: a sliding attention window of this many keys; ``None`` = full attention.
        sinks: with ``window``, every query also sees the first ``sinks`` tokens (attention
            sinks, Xiao et al., 2023), and the keys are positioned within the cache
            (:attr:`mhbook.MultiHeadAttention.streaming`); 0 = none.
        global_every: with ``window``, layer ``i`` attends to every earlier token when
            ``(i + 1) % global_every == 0`` and to the window otherwise (2: Gemma 2's
            alternation; 6: Gemma 3's five local layers to one global); ``None`` = the
            window in every layer. See :attr:`layer_windows`.
        global_rope_theta: with ``global_every`` and ``position="rope"``, the RoPE base of
            the global layers, whose keys are far away (Gemma 3: 1,000,000, its local layers
            keeping 10,000; Hugging Face's ``Gemma3Config`` calls the two ``rope_theta`` and
            ``rope_local_base_freq``); ``None``: ``rope_theta`` in every layer. Not built
            with ``d_latent``.
        d_latent: size of the key/value latent of multi-head latent attention;
            ``None`` = no latent. At most ``d_model``.
        head_dim: the size of one head, independent of ``num_heads`` (Bhojanapalli et
            al., 2020); ``None`` means ``d_model // num_heads``. Read :attr:`d_head`.
        tie_embeddings: the output layer shares the token embedding's matrix (Press and
            Wolf, 2017; ``tie_word_embeddings``).
        scale_embeddings: multiply the token embeddings by ``sqrt(d_model)``, as the
            paper does (Llama does not).
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
    norm: str = "layer"
    ffn: str = "relu"
    bias: bool = True
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_embeddings: bool = False
    scale_embeddings: bool = True
    attention_dropout: float = 0.0
    sinks: int = 0
    global_every: int | None = None
    global_rope_theta: float | None = None
    max_position_embeddings: int | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        # max_position_embeddings is shown when it is set, which only learned positions allow
        shown = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.repr or getattr(self, f.name) is not None
        ]
        return f"ModelConfig({', '.join(shown)})"

    def __post_init__(self) -> None:
        me = "ModelConfig"
        for name, minimum in (("d_model", 1), ("num_heads", 1), ("num_layers", 0), ("d_ff", 1)):
            check_int(f"{me}.{name}", getattr(self, name), minimum)
        for name in ("num_kv_heads", "window", "d_latent", "head_dim"):
            check_int(f"{me}.{name}", getattr(self, name), 1, optional=True)
        for name in ("dropout", "attention_dropout"):
            check_number(f"{me}.{name}", getattr(self, name), 0.0, 1.0)
        check_number(f"{me}.norm_eps", self.norm_eps, 0.0)
        check_number(f"{me}.rope_theta", self.rope_theta, 1.0, low_inclusive=False)
        self._check_rope_scaling()
        for name in ("norm_first", "tie_embeddings", "scale_embeddings", "bias"):
            check_bool(f"{me}.{name}", getattr(self, name))
        check_choice(f"{me}.position", self.position, POSITIONS)
        self._check_learned_positions()
        check_choice(f"{me}.norm", self.norm, NORMS)
        check_choice(f"{me}.ffn", self.ffn, FFNS)
        check_heads(self.num_heads, self.num_kv_heads, self.d_model, self.head_dim, prefix=f"{me}.")
        if self.d_latent is not None and self.d_latent > self.d_model:
            raise ValueError(
                f"ModelConfig.d_latent must be at most d_model={self.d_model}, got {self.d_latent}"
            )
        if self.d_latent is not None and self.num_kv_heads not in (None, self.num_heads):
            raise ValueError(
                f"ModelConfig.num_kv_heads={self.num_kv_heads} with d_latent={self.d_latent}: "
                "latent attention rebuilds a key and a value for every head from its latent; "
                "leave num_kv_heads None"
            )
        check_window(self.window, self.sinks, prefix=f"{me}.")
        check_int(f"{me}.global_every", self.global_every, 2, optional=True)
        if self.global_every and self.window is None:
            raise ValueError(
                f"ModelConfig.global_every={self.global_every} needs a sliding window: set "
                "window (it says which layers keep their window)"
            )
        if self.global_rope_theta is not None:
            check_number(
                f"{me}.global_rope_theta", self.global_rope_theta, 1.0, low_inclusive=False
            )
            if self.global_every is None or self.position != "rope" or self.d_latent is not None:
                raise ValueError(
                    f"ModelConfig.global_rope_theta={self.global_rope_theta} is the RoPE base of "
                    "the global layers: it needs global_every and position='rope', without "
                    f"d_latent; got global_every={self.global_every}, "
                    f"position={self.position!r}, d_latent={self.d_latent}"
                )
            if None not in self.layer_windows:
                raise ValueError(
                    f"ModelConfig.global_rope_theta={self.global_rope_theta} is the RoPE base of "
                    f"the global layers, but global_every={self.global_every} with "
                    f"num_layers={self.num_layers} makes none: every layer keeps its window"
                )
        if self.position == "rope" and self.d_head % 2 != 0:
            raise ValueError(
                f"ModelConfig.position='rope' needs an even head size (RoPE rotates pairs), "
                f"got d_head={self.d_head}"
            )

    def _check_learned_positions(self) -> None:
        table = self.max_position_embeddings
        check_int("ModelConfig.max_position_embeddings", table, 1, optional=True)
        if self.position == "learned" and table is None:
            raise ValueError(
                "ModelConfig.position='learned' needs max_position_embeddings, the rows of its "
                "position table (the longest sequence it reads; nanoGPT's block_size), got None"
            )
        if self.position != "learned" and table is not None:
            raise ValueError(
                f"ModelConfig.max_position_embeddings={table} is the length of a learned "
                f"position table: it needs position='learned', got position={self.position!r}"
            )

    def _check_rope_scaling(self) -> None:
        scaling = self.rope_scaling
        if isinstance(scaling, dict):  # as to_dict (dataclasses.asdict) writes it
            scaling = RopeScaling(**scaling)
            object.__setattr__(self, "rope_scaling", scaling)
        if scaling is None:
            return
        if not isinstance(scaling, RopeScaling):
            raise ValueError(
                f"ModelConfig.rope_scaling must be None or a mhbook.RopeScaling, got "
                f"{scaling!r} ({type(scaling).__name__})"
            )
        if self.position != "rope":
            raise ValueError(
                f"ModelConfig.rope_scaling scales RoPE's frequencies: it needs "
                f"position='rope', got position={self.position!r}"
            )
        if self.d_latent is not None:
            raise ValueError(
                f"ModelConfig.rope_scaling with d_latent={self.d_latent}: latent attention's "
                "decoupled RoPE is not scaled; leave rope_scaling None"
            )

    def require(self, shape: dict[str, tuple[Any, str]], user: str) -> None:
        """Refuse this config unless each field of ``shape`` (field -> (value, what it
        means)) has that value: the ``ValueError`` names every field that differs, its value,
        and what ``user`` (e.g. "Hugging Face's Llama") needs instead."""
        wrong = [
            f"{name}={getattr(self, name)!r} ({user} needs {what}: {name}={value!r})"
            for name, (value, what) in shape.items()
            if getattr(self, name) != value
        ]
        if wrong:
            raise ValueError(f"this ModelConfig cannot be run by {user}: " + "; ".join(wrong))

    @property
    def d_head(self) -> int:
        """The size of one head: ``head_dim``, or ``d_model // num_heads`` when it is ``None``."""
        return self.d_model // self.num_heads if self.head_dim is None else self.head_dim

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's window: ``window``, but ``None`` (full attention) in the global
        layers of ``global_every``."""
        every = self.global_every
        return tuple(
            None if every is not None and (i + 1) % every == 0 else self.window
            for i in range(self.num_layers)
        )

    def layer_rope_theta(self, layer: int) -> float:
        """The RoPE base of layer ``layer`` (0-based): ``global_rope_theta`` in the global
        layers of ``global_every`` when it is set, else ``rope_theta``."""
        if self.global_rope_theta is not None and self.layer_windows[layer] is None:
            return self.global_rope_theta
        return self.rope_theta

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads actually used (``num_kv_heads`` or ``num_heads``)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def d_rope(self) -> int:
        """Latent attention's decoupled RoPE part of each query and key: half a head, as
        in DeepSeek-V2 (64 next to 128), rounded down to an even size, at least 2; 0
        unless ``position == "rope"``."""
        return 2 * max(1, self.d_head // 4) if self.position == "rope" else 0


@dataclass(frozen=True)
class DataConfig(_Replace):
    """The number-words task (:class:`mhbook.tasks.numbers.NumberTranslation`).

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
        check_int(f"{me}.max_number", self.max_number, 0)
        check_int(f"{me}.num_train", self.num_train, 1)
        check_int(f"{me}.num_valid", self.num_valid, 0)
        check_int(f"{me}.num_test", self.num_test, 0)
        check_int(f"{me}.seed", self.seed, 0)


@dataclass(frozen=True)
class TrainConfig(_Replace):
    """How :func:`mhbook.fit` trains: Adam, warm-up then cosine decay, clipping.

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
        check_int(f"{me}.num_steps", self.num_steps, 1)
        check_int(f"{me}.batch_size", self.batch_size, 1)
        check_number(f"{me}.lr", self.lr, 0.0)
        check_int(f"{me}.warmup_steps", self.warmup_steps, 0)
        check_number(f"{me}.min_lr_ratio", self.min_lr_ratio, 0.0, 1.000001)
        check_number(f"{me}.weight_decay", self.weight_decay, 0.0)
        if self.clip_norm is not None:
            check_number(f"{me}.clip_norm", self.clip_norm, 0.0)
        check_number(f"{me}.label_smoothing", self.label_smoothing, 0.0, 1.0)
        check_int(f"{me}.eval_every", self.eval_every, 0)
        check_int(f"{me}.seed", self.seed, 0)
        check_int(f"{me}.num_threads", self.num_threads, 1, optional=True)


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
