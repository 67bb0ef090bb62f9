"""The small layers a Transformer block is made of: positional encoding,
the position-wise feed-forward network, and add & norm."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

__all__ = ["sinusoidal_encoding", "PositionalEncoding", "PositionWiseFFN", "AddNorm"]


def _drop(dropout: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """``dropout(x)``, skipped where it would return ``x`` anyway (eval mode, or ``p = 0``):
    a training step then runs no dropout op it does not need."""
    return dropout(x) if dropout.training and dropout.p > 0 else x


def sinusoidal_encoding(
    num_positions: int,
    d_model: int,
    offset: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The sinusoidal positional encoding of Vaswani et al. (2017).

    ``P[t, 2i] = sin(t / 10000^(2i/d_model))`` and ``P[t, 2i+1] = cos(...)`` for
    positions ``t = offset, ..., offset + num_positions - 1``.

    Returns:
        ``(num_positions, d_model)``.
    """
    if d_model % 2 != 0:
        raise ValueError(f"d_model must be even for the sinusoidal encoding, got {d_model}")
    position = torch.arange(offset, offset + num_positions, device=device, dtype=torch.float64)
    inv_freq = torch.pow(
        10000.0, -torch.arange(0, d_model, 2, device=device, dtype=torch.float64) / d_model
    )
    angles = position[:, None] * inv_freq[None, :]  # (L, d_model / 2)
    encoding = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # interleave
    return encoding.to(dtype)


class PositionalEncoding(nn.Module):
    """Add the sinusoidal encoding to ``x`` and apply dropout.

    The encoding is computed on ``x``'s device for the positions needed (from
    ``offset``, used when decoding one token at a time), so there is no length limit.
    """

    def __init__(self, d_model: int, dropout: float = 0.0):
        super().__init__()
        self.d_model = d_model
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``(batch, L, d_model)`` -> ``(batch, L, d_model)``."""
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(
                f"expected x of shape (batch, length, d_model={self.d_model}), got {tuple(x.shape)}"
            )
        P = sinusoidal_encoding(x.size(1), self.d_model, offset, device=x.device, dtype=x.dtype)
        return _drop(self.dropout, x + P)


class PositionWiseFFN(nn.Module):
    """The same two-layer MLP applied at every position: ``W_2 relu(W_1 x + b_1) + b_2``.

    ``(batch, L, d_model)`` -> ``(batch, L, d_model)``, hidden size ``d_ff``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(_drop(self.dropout, torch.relu(self.linear1(x))))


class AddNorm(nn.Module):
    """A residual connection around ``sublayer`` with layer normalisation.

    Post-norm (the original paper, ``norm_first=False``)::

        x = LayerNorm(x + Dropout(sublayer(x)))

    Pre-norm (``norm_first=True``, easier to train deep)::

        x = x + Dropout(sublayer(LayerNorm(x)))

    Shapes: ``(batch, L, d_model)`` in and out.
    """

    def __init__(
        self, d_model: int, dropout: float = 0.0, norm_first: bool = False, eps: float = 1e-5
    ):
        super().__init__()
        self.norm_first = norm_first
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        if self.norm_first:
            return x + _drop(self.dropout, sublayer(self.norm(x)))
        return self.norm(x + _drop(self.dropout, sublayer(x)))
