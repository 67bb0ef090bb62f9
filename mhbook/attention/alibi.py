"""ALiBi, attention with linear biases (Press et al., 2022): no position vectors at all,
a penalty on the scores that grows with the distance between query and key.

Head ``h`` adds ``-m_h * (i - j)`` to the score of query ``i`` and key ``j``::

    softmax(q_i k_j / sqrt(d) - m_h * |i - j|)

The slopes ``m_h`` form a geometric sequence, one per head: with 8 heads
``1/2, 1/4, ..., 1/256``, so some heads look far back and others only at the last few
tokens. The paper defines the bias for causal attention (keys ``j <= i``); here it is
``-m_h * |i - j|``, the same on every key a causal mask lets through.

    alibi = ALiBi(num_heads=4)
    bias = alibi(q_positions, k_positions)  # (T,), (S,) -> (4, T, S), added to the scores
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..core.validate import check_int, check_integers, check_module

__all__ = ["alibi_slopes", "ALiBi"]


def alibi_slopes(
    num_heads: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The heads' slopes ``m_h``, as in the paper's code.

    For ``n`` a power of two, ``m_h = 2^(-8 (h + 1) / n)`` for ``h = 0 .. n-1``. Otherwise
    the slopes of the power of two ``p`` just below ``n``, followed by every other
    slope of ``2p`` heads, until there are ``n``.

    Returns:
        ``(num_heads,)``.
    """
    check_int("num_heads", num_heads)
    return torch.tensor(_slopes(int(num_heads)), device=device, dtype=dtype)


def _slopes(n: int) -> list[float]:
    def power_of_two(p: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / p) for h in range(p)]

    p = 2 ** math.floor(math.log2(n))
    return power_of_two(p) + power_of_two(2 * p)[0::2][: n - p]


class ALiBi(nn.Module):
    """The linear distance bias of every head (no parameters).

    Args:
        num_heads: one slope per head (:func:`alibi_slopes`).
    """

    def __init__(self, num_heads: int):
        super().__init__()
        alibi_slopes(num_heads)  # checks num_heads
        self.num_heads = int(num_heads)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"

    def forward(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """The bias ``-m_h * |i - j|`` for every head, query position ``i`` and key ``j``.

        Args:
            q_positions: integer ``(T,)`` positions of the queries, or ``(batch, T)`` for
                one row of positions per sequence.
            k_positions: integer ``(S,)`` positions of the keys, or ``(batch, S)``; on
                the same device.
            dtype: of the bias (the scores' dtype).

        Returns:
            A float bias ``(num_heads, T, S)``, or ``(batch, num_heads, T, S)`` when either
            positions have a batch dimension, to add to the scaled scores.
        """
        for name, p in (("q_positions", q_positions), ("k_positions", k_positions)):
            if not isinstance(p, torch.Tensor) or p.dim() not in (1, 2):
                got = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
                raise ValueError(
                    f"{name} must be a tensor of positions (T,) or (batch, T), got {got}"
                )
            check_integers(name, p)
        if q_positions.device != k_positions.device:
            raise ValueError(
                f"q_positions and k_positions must be on the same device, got "
                f"{q_positions.device} and {k_positions.device}"
            )
        if q_positions.dim() == k_positions.dim() == 2 and q_positions.size(0) != k_positions.size(
            0
        ):
            raise ValueError(
                f"q_positions {tuple(q_positions.shape)} and k_positions "
                f"{tuple(k_positions.shape)} must have the same batch size"
            )
        slopes = alibi_slopes(self.num_heads, device=q_positions.device, dtype=dtype)
        # Negated as integers, so that a distance of 0 gives 0.0, not -0.0.
        distance = q_positions.unsqueeze(-1) - k_positions.unsqueeze(-2)  # ([batch,] T, S)
        minus_distance = -distance.abs().unsqueeze(-3)  # (..., 1, T, S)
        return slopes[:, None, None] * minus_distance.to(dtype)


def check_alibi(alibi, num_heads: int) -> None:
    """A layer's ``alibi`` must be ``None`` or a module with one slope per query head."""
    check_module("alibi", alibi)
    if alibi is not None and getattr(alibi, "num_heads", num_heads) != num_heads:
        raise ValueError(
            f"alibi must give one slope per query head: got an ALiBi of "
            f"num_heads={alibi.num_heads} for a layer of num_heads={num_heads}"
        )
