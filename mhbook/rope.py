"""Rotary position embedding (RoPE, Su et al., 2021): position enters attention by
rotating queries and keys, not by adding a vector to the tokens.

Split a head's ``d_head`` features into ``d_head / 2`` pairs. At position ``m`` pair ``i``
is rotated by the angle ``m * theta_i``, with ``theta_i = base^(-2i / d_head)``::

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
"""

from __future__ import annotations

import torch
from torch import nn

from .checks import check_bool, check_int, check_number

__all__ = ["RotaryEmbedding", "rope_angles", "interleaved_to_half"]


def rope_angles(positions: torch.Tensor, d_head: int, base: float = 10000.0) -> torch.Tensor:
    """The rotation angles ``m * theta_i`` for every position ``m`` and pair ``i``.

    Computed in float32 whatever the inputs, as Llama's reference code does (so float64
    models give the same numbers as ``transformers``; MPS has no float64 anyway).

    Args:
        positions: integer positions ``(...,)``, e.g. ``(T,)`` or ``(batch, T)``.
        d_head: the (even) size of a head.
        base: ``theta_i = base^(-2i / d_head)``.

    Returns:
        float32 angles ``(..., d_head / 2)`` on the positions' device.
    """
    exponents = torch.arange(0, d_head, 2, dtype=torch.int64, device=positions.device).float()
    inv_freq = 1.0 / (base ** (exponents / d_head))  # theta_i, (d_head / 2,)
    return positions.float()[..., None] * inv_freq


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


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(x1, x2) -> (-x2, x1)`` on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotate queries or keys by their positions (no parameters).

    Args:
        d_head: the size of a head; must be even (features are rotated in pairs).
        base: the wavelengths' base, ``theta_i = base^(-2i / d_head)``; 10000 in the
            paper and in Llama 1 and 2.
        interleaved: ``False`` pairs feature ``i`` with ``i + d_head / 2`` (Llama's
            rotate-half layout), ``True`` pairs ``2i`` with ``2i + 1`` (the paper's).
    """

    def __init__(self, d_head: int, base: float = 10000.0, *, interleaved: bool = False):
        super().__init__()
        _check_d_head(d_head)
        check_number("base", base, 1.0, low_inclusive=False)
        check_bool("interleaved", interleaved)
        self.d_head = d_head
        self.base = float(base)
        self.interleaved = interleaved

    def extra_repr(self) -> str:
        return f"d_head={self.d_head}, base={self.base:g}, interleaved={self.interleaved}"

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate each of the ``T`` vectors of ``x`` by its position.

        Args:
            x: ``(batch, heads, T, d_head)`` queries or keys (any ``(..., T, d_head)``).
            positions: integer ``(T,)`` absolute positions of the ``T`` vectors, or
                ``(batch, T)`` for one set per sequence; on ``x``'s device.

        Returns:
            The rotated ``x``, same shape and dtype.
        """
        self._check(x, positions)
        angles = rope_angles(positions, self.d_head, self.base)  # (T, d/2) or (B, T, d/2)
        if positions.dim() == 2:  # (batch, T, d/2) -> (batch, 1, T, d/2), across the heads
            angles = angles.unsqueeze(1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        if self.interleaved:  # the paper: pairs (x_0, x_1), (x_2, x_3), ...
            pairs = x.unflatten(-1, (self.d_head // 2, 2))
            a, b = pairs[..., 0], pairs[..., 1]
            return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
        # Llama: pairs (x_i, x_{i + d/2}), written as Hugging Face writes it,
        # x * cos + rotate_half(x) * sin with cos and sin repeated over both halves.
        cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
        return x * cos + _rotate_half(x) * sin

    def _check(self, x: torch.Tensor, positions: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.size(-1) != self.d_head:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (..., T, d_head={self.d_head}), got {got}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
        if not isinstance(positions, torch.Tensor):
            raise TypeError(f"positions must be a torch.Tensor, got {type(positions).__name__}")
        if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
            raise TypeError(f"positions must hold integers, got dtype {positions.dtype}")
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
