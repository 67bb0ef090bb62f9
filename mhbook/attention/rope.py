"""Rotary position embedding (RoPE, Su et al., 2021): position enters attention by
rotating queries and keys, not by adding a vector to the tokens.

Split a head's ``d_head`` features into ``d_head / 2`` pairs. At position ``m`` pair ``i``
is rotated by the angle ``m * theta_i``, with ``theta_i = rope_theta^(-2i / d_head)``::

    (x_a, x_b) -> (x_a cos(m theta_i) - x_b sin(m theta_i),
                   x_a sin(m theta_i) + x_b cos(m theta_i))

A rotation keeps lengths, and rotating ``q`` by ``m theta`` and ``k`` by ``n theta``
changes their dot product only through the difference ``m - n``: the score of a query
at ``m`` and a key at ``n`` depends on the offset ``m - n``, not on ``m`` and ``n``.

Which features form a pair is a choice of layout:

* ``interleaved=True``: adjacent features ``(x_0, x_1), (x_2, x_3), ...``, as in the paper;
* ``interleaved=False`` (the default): the two halves ``(x_0, x_{d/2}), (x_1, x_{d/2+1}),
  ...``, as Llama's reference code and Hugging Face ``transformers`` do ("rotate half").

The two are the same rotation up to a fixed permutation of the features
(:func:`interleaved_to_half`), which a model can absorb into the rows of ``W_q`` and
``W_k``; scores are unchanged when ``q`` and ``k`` are permuted alike.

    rope = RotaryEmbedding(d_head=16)
    q = rope(q, positions)  # q (batch, heads, T, 16), positions (T,) -> (batch, heads, T, 16)

A model owns one rotary embedding per kind of layer, computes its tables once per forward
pass and hands them to every layer, which rotates with a plain function, as Hugging Face's
Llama does (``position_embeddings = self.rotary_emb(x, position_ids)`` in the model,
``apply_rotary_pos_emb(q, k, cos, sin)`` in the layer)::

    cos, sin = rope.tables(positions, dtype)  # once per forward, in the model
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # in every layer

Context extension. A model trained on ``L`` positions has never seen the angles of
positions beyond ``L``. :class:`RopeScaling` changes the frequencies ``theta_i`` so that a
longer context ``s * L`` maps onto angles the model knows (:func:`rope_frequencies`):
position interpolation (``"linear"``), NTK-aware scaling (``"ntk"``) and YaRN (``"yarn"``)::

    rope = RotaryEmbedding(16, scaling=RopeScaling("yarn", factor=4.0, original_context=2048))
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..core.config import RopeScaling
from ..core.validate import check_bool, check_int, check_integers, check_number

__all__ = [
    "RotaryEmbedding",
    "apply_rope",
    "rope_frequencies",
    "ntk_base",
    "rope_angles",
    "interleaved_to_half",
]


def rope_frequencies(
    d_head: int,
    rope_theta: float = 10000.0,
    scaling: RopeScaling | None = None,
    *,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, float]:
    """RoPE's frequencies ``theta_i``, scaled to a longer context, and the factor that
    multiplies ``cos`` and ``sin``.

    Without ``scaling``, ``theta_i = rope_theta^(-2i / d)`` for the ``d / 2`` pairs ``i`` of a
    head of ``d = d_head`` features, and the factor is 1. With a factor ``s`` and an
    original context ``L``:

    * ``"linear"``, position interpolation (Chen et al., 2023): ``theta_i / s``. Position
      ``m`` gets the angles position ``m / s`` had: ``s L`` positions fit in the angles of
      ``L``, but neighbours are ``s`` times closer than the model is used to.
    * ``"ntk"``, NTK-aware scaling (bloc97, 2023): a larger base
      ``rope_theta' = rope_theta * s^(d / (d - 2))``. The fastest pair (``i = 0``, ``theta_0 = 1``)
      is unchanged, the slowest (``i = d/2 - 1``) is divided by exactly ``s``, the ones
      between by less: high frequencies extrapolate, low ones interpolate. Static here
      (Hugging Face's ``"dynamic"`` grows ``s`` with the sequence length).
    * ``"yarn"`` (Peng et al., 2024): pair ``i`` turns ``r_i = L theta_i / (2 pi)`` times
      over the original context. Pairs with ``r_i > beta_fast`` keep ``theta_i``, pairs
      with ``r_i < beta_slow`` get ``theta_i / s``, and a linear ramp over the pair index
      goes between (the indices where ``r_i`` is ``beta_fast`` and ``beta_slow``,
      rounded outwards)::

          gamma_i = clamp((high - i) / (high - low), 0, 1)   1: keep, 0: interpolate
          theta'_i = (1 - gamma_i) theta_i / s + gamma_i theta_i

      and cos and sin, so queries and keys, are multiplied by ``0.1 ln(s) + 1``: the
      scores by its square, a lower softmax temperature for the longer context.

    Computed in float32, in the order ``transformers`` computes them, so that the same
    config gives the same bits as Hugging Face's ``ROPE_INIT_FUNCTIONS``.

    Returns:
        ``(theta, attention_factor)``: float32 ``(d_head / 2,)`` on ``device``, a float.
    """
    _check_d_head(d_head)
    exponents = torch.arange(0, d_head, 2, dtype=torch.int64, device=device).float()  # 2i
    powers = rope_theta ** (exponents / d_head)  # rope_theta^(2i / d), (d_head / 2,)
    theta = 1.0 / powers
    if scaling is None:
        return theta, 1.0
    if not isinstance(scaling, RopeScaling):
        raise TypeError(f"scaling must be None or a RopeScaling, got {type(scaling).__name__}")
    s = scaling.factor
    if scaling.kind == "linear":
        return theta / s, 1.0
    if scaling.kind == "ntk":
        return 1.0 / (ntk_base(d_head, rope_theta, s) ** (exponents / d_head)), 1.0
    # YaRN: the (fractional) pair index whose theta_i turns r times over L,
    # from r = L rope_theta^(-2i/d) / (2 pi): i = d ln(L / (2 pi r)) / (2 ln rope_theta).
    L = scaling.original_context

    def pair_turning(r: float) -> float:
        return d_head * math.log(L / (2 * math.pi * r)) / (2 * math.log(rope_theta))

    low = max(math.floor(pair_turning(scaling.beta_fast)), 0)
    high = min(math.ceil(pair_turning(scaling.beta_slow)), d_head - 1)
    if low == high:
        high += 0.001  # as transformers does: no division by zero
    i = torch.arange(d_head // 2, dtype=torch.float32, device=device)
    gamma = 1 - ((i - low) / (high - low)).clamp(0, 1)  # 1: keep theta_i, 0: theta_i / s
    interpolated = 1.0 / (s * powers)  # theta_i / s
    theta = interpolated * (1 - gamma) + theta * gamma
    return theta, 0.1 * math.log(s) + 1.0


def ntk_base(d_head: int, rope_theta: float, factor: float) -> float:
    """NTK-aware scaling's base ``rope_theta' = rope_theta * factor^(d / (d - 2))`` for
    ``d = d_head`` (with one pair, ``d = 2``, ``theta_0 = 1`` whatever the base:
    ``rope_theta``)."""
    return rope_theta * factor ** (d_head / (d_head - 2)) if d_head > 2 else rope_theta


def rope_angles(
    positions: torch.Tensor,
    d_head: int,
    rope_theta: float = 10000.0,
    scaling: RopeScaling | None = None,
) -> torch.Tensor:
    """The rotation angles ``m * theta_i`` for every position ``m`` and pair ``i``.

    Computed in float32 whatever the inputs, as Llama's reference code does (so float64
    models give the same numbers as ``transformers``; MPS has no float64 anyway).

    Args:
        positions: integer positions ``(...,)``, e.g. ``(T,)`` or ``(batch, T)``.
        d_head: the (even) size of a head.
        rope_theta: the base, ``theta_i = rope_theta^(-2i / d_head)``.
        scaling: a :class:`RopeScaling` of the ``theta_i`` (see :func:`rope_frequencies`;
            YaRN's attention factor is not in the angles).

    Returns:
        float32 angles ``(..., d_head / 2)`` on the positions' device.
    """
    theta, _ = rope_frequencies(d_head, rope_theta, scaling, device=positions.device)
    return positions.float()[..., None] * theta


def interleaved_to_half(d_head: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The permutation of features that turns the paper's layout into Llama's.

    ``perm = [0, 2, 4, ..., 1, 3, 5, ...]``: for any ``x``,
    ``RotaryEmbedding(d, interleaved=True)(x, p)[..., perm] ==
    RotaryEmbedding(d)(x[..., perm], p)``.

    Returns:
        A LongTensor ``(d_head,)``.
    """
    _check_d_head(d_head)
    return torch.cat(
        [torch.arange(0, d_head, 2, device=device), torch.arange(1, d_head, 2, device=device)]
    )


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` by the tables of :meth:`RotaryEmbedding.tables`.

    Args:
        x: ``(..., T, d_head)`` queries or keys, e.g. ``(batch, heads, T, d_head)``.
        cos, sin: ``(T, w)``, or anything that broadcasts against ``x`` (``(batch, 1, T,
            w)`` for one row of positions per sequence). Their width ``w`` is the layout
            the tables were made for: ``w = d_head`` (each angle twice) pairs feature ``i``
            with ``i + d_head / 2`` (Llama's rotate-half), ``w = d_head / 2`` pairs ``2i``
            with ``2i + 1`` (the paper's interleaved pairs). So the tables and the rotation
            cannot disagree on the layout.

    Returns:
        The rotated ``x``, same shape and dtype.
    """
    d_head, width = x.size(-1), cos.size(-1)
    if width == d_head:  # Llama, written as Hugging Face writes it: x cos + rotate_half(x) sin
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin
    if 2 * width == d_head:  # the paper: pairs (x_0, x_1), (x_2, x_3), ...
        pairs = x.unflatten(-1, (width, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    raise ValueError(
        f"RoPE tables of width {width} rotate heads of d_head={width} (rotate-half) or "
        f"d_head={2 * width} (interleaved), got x of d_head={d_head}"
    )


class RotaryEmbedding(nn.Module):
    """Rotate queries or keys by their positions (no parameters).

    Args:
        d_head: the size of a head; must be even (features are rotated in pairs).
        rope_theta: the wavelengths' base, ``theta_i = rope_theta^(-2i / d_head)``; 10000
            in the paper and in Llama 1 and 2 (:attr:`mhbook.ModelConfig.rope_theta`).
        interleaved: ``False`` pairs feature ``i`` with ``i + d_head / 2`` (Llama's
            rotate-half layout), ``True`` pairs ``2i`` with ``2i + 1`` (the paper's).
        scaling: ``None``, or a :class:`RopeScaling` for a context longer than the
            model was trained on (see :func:`rope_frequencies`).
    """

    def __init__(
        self,
        d_head: int,
        rope_theta: float = 10000.0,
        *,
        interleaved: bool = False,
        scaling: RopeScaling | None = None,
    ):
        super().__init__()
        _check_d_head(d_head)
        check_number("rope_theta", rope_theta, 1.0, low_inclusive=False)
        check_bool("interleaved", interleaved)
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise TypeError(f"scaling must be None or a RopeScaling, got {type(scaling).__name__}")
        self.d_head = d_head
        self.rope_theta = float(rope_theta)
        self.interleaved = interleaved
        self.scaling = scaling
        # theta_i and the attention factor, made once per device (and settings) on first
        # use, as Hugging Face's inv_freq buffer is made once; computed on the device
        # itself, and not a buffer, so that a model made on the meta device has them too.
        self._frequencies: dict[tuple, tuple[torch.Tensor, float]] = {}

    def extra_repr(self) -> str:
        scaling = "" if self.scaling is None else f", scaling={self.scaling}"
        return (
            f"d_head={self.d_head}, rope_theta={self.rope_theta:g}, "
            f"interleaved={self.interleaved}{scaling}"
        )

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate each of the ``T`` vectors of ``x`` by its position: :meth:`tables`
        then :func:`apply_rope` (a model computes the tables once per forward pass).

        Args:
            x: ``(batch, heads, T, d_head)`` queries or keys (any ``(..., T, d_head)``).
            positions: integer ``(T,)`` absolute positions of the ``T`` vectors, or
                ``(batch, T)`` for one set per sequence; on ``x``'s device.

        Returns:
            The rotated ``x``, same shape and dtype.
        """
        self._check(x, positions)
        return apply_rope(x, *self.tables(positions, x.dtype))

    def frequencies(self, device: torch.device) -> tuple[torch.Tensor, float]:
        """``(theta, attention_factor)`` (:func:`rope_frequencies`), made once per device."""
        key = (device, self.d_head, self.rope_theta, self.scaling)
        if key not in self._frequencies:
            self._frequencies[key] = rope_frequencies(
                self.d_head, self.rope_theta, self.scaling, device=device
            )
        return self._frequencies[key]

    def tables(
        self, positions: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of the angles ``m * theta_i`` of every position, once for the
        queries and keys of every layer.

        Args:
            positions: integer ``(T,)``, or ``(batch, T)`` for one set per sequence.
            dtype: of the tables (the queries' dtype); the angles are float32.

        Returns:
            ``cos``, ``sin``: ``(T, w)``, or ``(batch, 1, T, w)`` (broadcast across the
            heads), times YaRN's attention factor; ``w = d_head`` in the rotate-half
            layout (each angle twice, for features ``i`` and ``i + d_head / 2``, as Hugging
            Face's tables are), ``d_head / 2`` in the interleaved one.
        """
        check_integers("positions", positions)
        theta, attention_factor = self.frequencies(positions.device)
        angles = positions.float()[..., None] * theta  # (T, d/2) or (B, T, d/2), float32
        if positions.dim() == 2:  # (batch, T, d/2) -> (batch, 1, T, d/2), across the heads
            angles = angles.unsqueeze(1)
        if not self.interleaved:  # Llama's layout: each angle serves i and i + d/2
            angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        if attention_factor != 1.0:  # YaRN's: scales q and k, so the scores by its square
            cos, sin = cos * attention_factor, sin * attention_factor
        return cos.to(dtype), sin.to(dtype)

    def _check(self, x: torch.Tensor, positions: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.size(-1) != self.d_head:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (..., T, d_head={self.d_head}), got {got}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
        check_integers("positions", positions)
        T = x.size(-2)
        ok = (positions.dim() == 1 and positions.size(0) == T) or (
            positions.dim() == 2 and x.dim() == 4 and positions.shape == (x.size(0), T)
        )
        if not ok:
            raise ValueError(
                f"positions must have shape (T,) = ({T},) or (batch, T) = ({x.size(0)}, {T}) "
                f"for x of shape {tuple(x.shape)}, got {tuple(positions.shape)}"
            )
        if positions.device != x.device:
            raise ValueError(
                f"positions must be on x's device {x.device}, got positions on {positions.device}"
            )


def _check_d_head(d_head) -> None:
    check_int("d_head", d_head, 2)
    if d_head % 2 != 0:
        raise ValueError(f"d_head must be even: RoPE rotates features in pairs, got {d_head}")
