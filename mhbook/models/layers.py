"""The small layers a Transformer block is made of: positional encoding, the
feed-forward networks (ReLU or GELU, and Llama's SwiGLU), the norms (LayerNorm and
RMSNorm) and add & norm around a sublayer; ``make_norm`` and ``make_ffn`` build the ones
a :class:`mhbook.ModelConfig` names."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..core.validate import check_choice

__all__ = [
    "sinusoidal_encoding",
    "PositionalEncoding",
    "PositionWiseFFN",
    "SwiGLU",
    "RMSNorm",
    "AddNorm",
    "make_norm",
    "make_ffn",
]


class Dropout(nn.Dropout):
    """``nn.Dropout``, drawn faster on the CPU: in training each value of ``x`` is zeroed
    with probability ``p`` and the others are scaled by ``1 / (1 - p)``; in eval mode or
    for ``p = 0``, ``x`` itself, with no op run. ``(...)`` -> ``(...)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if self.p == 1:
            return F.dropout(x, 1.0)  # all zeros
        # Written by hand for speed, not F.dropout: PyTorch's CPU bernoulli_ draws two random
        # numbers per value, `rand >= p` one, for the same distribution; a residual dropout's
        # forward and backward is 1.3 to 1.6 times faster so (benchmarks/README.md).
        return x * torch.rand_like(x).ge_(self.p).div_(1 - self.p)


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
    It is kept for the next call (a table of the positions seen so far, not saved in
    the ``state_dict``), so a training step does not compute it again.
    """

    def __init__(self, d_model: int, dropout: float = 0.0):
        super().__init__()
        self.d_model = d_model
        self.dropout = Dropout(dropout)
        self._table: torch.Tensor | None = None  # (positions so far, d_model)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``(batch, L, d_model)`` -> ``(batch, L, d_model)``."""
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(
                f"expected x of shape (batch, length, d_model={self.d_model}), got {tuple(x.shape)}"
            )
        end = offset + x.size(1)
        P = self._table
        if P is None or P.size(0) < end or P.device != x.device or P.dtype != x.dtype:
            longer = max(end, 2 * P.size(0)) if P is not None else end  # grow by doubling
            P = sinusoidal_encoding(longer, self.d_model, device=x.device, dtype=x.dtype)
            self._table = P
        return self.dropout(x + P[offset:end])


class PositionWiseFFN(nn.Module):
    """The same two-layer MLP applied at every position: ``W_2 act(W_1 x + b_1) + b_2``.

    ``(batch, L, d_model)`` -> ``(batch, L, d_model)``, hidden size ``d_ff``.

    Args:
        activation: ``"relu"`` (the paper) or ``"gelu"`` (BERT, GPT-2; the exact GELU).
        bias: whether ``linear1`` and ``linear2`` have biases.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", bias: bool = True):
        super().__init__()
        check_choice("activation", activation, ("relu", "gelu"))
        self.activation = activation
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.linear1(x)
        hidden = torch.relu(hidden) if self.activation == "relu" else F.gelu(hidden)
        return self.linear2(hidden)

    def extra_repr(self) -> str:
        return "" if self.activation == "relu" else f"activation={self.activation!r}"


class SwiGLU(nn.Module):
    """The gated feed-forward network of Llama and Mistral (Shazeer, 2020)::

        SwiGLU(x) = W_down (silu(W_gate x) * W_up x),   silu(z) = z * sigmoid(z)

    ``(batch, L, d_model)`` -> ``(batch, L, d_model)``; ``d_ff`` is the gated hidden size
    (Llama's ``intermediate_size``). Three matrices instead of two: at the same number of
    parameters ``d_ff`` is two thirds of a ReLU network's.

    Attributes:
        W_gate, W_up: ``nn.Linear(d_model, d_ff)`` (Hugging Face's ``gate_proj``,
            ``up_proj``). W_down: ``nn.Linear(d_ff, d_model)`` (``down_proj``).
    """

    def __init__(self, d_model: int, d_ff: int, bias: bool = False):
        super().__init__()
        self.W_gate = nn.Linear(d_model, d_ff, bias=bias)
        self.W_up = nn.Linear(d_model, d_ff, bias=bias)
        self.W_down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.W_down(F.silu(self.W_gate(x)) * self.W_up(x))


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang and Sennrich, 2019), as Llama uses it::

        RMSNorm(x) = weight * x / sqrt(mean(x^2) + eps)

    LayerNorm without the mean and without a bias. Computed as Llama's reference code and
    Hugging Face's ``LlamaRMSNorm`` compute it: in float32 whatever the input's dtype, then
    cast back before the weight (so a float64 model gives the same numbers as
    ``transformers``; ``nn.RMSNorm`` would compute in float64), with PyTorch's
    ``F.rms_norm`` (one fused kernel outside autograd, the same bits as the formula).

    ``(..., d_model)`` -> ``(..., d_model)``.
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.to(torch.float32), self.weight.shape, eps=self.eps)
        return self.weight * normed.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


def make_norm(config) -> nn.Module:
    """The normalisation ``config.norm`` names, of width ``config.d_model``: a
    ``nn.LayerNorm`` (with a bias unless ``config.bias is False``) or an :class:`RMSNorm`."""
    if config.norm == "rms":
        return RMSNorm(config.d_model, config.norm_eps)
    return nn.LayerNorm(config.d_model, config.norm_eps, bias=config.bias)


def make_ffn(config) -> nn.Module:
    """The feed-forward network ``config.ffn`` names: a :class:`PositionWiseFFN` with
    ReLU or GELU, or a :class:`SwiGLU`; biases unless ``config.bias is False``."""
    bias = config.bias
    if config.ffn == "swiglu":
        return SwiGLU(config.d_model, config.d_ff, bias=bias)
    return PositionWiseFFN(config.d_model, config.d_ff, config.ffn, bias=bias)


class AddNorm(nn.Module):
    """A residual connection around ``sublayer`` with normalisation: its ``norm`` and its
    ``dropout``. The blocks (:mod:`mhbook.models.blocks`) write the residual out with them;
    ``addnorm(x, sublayer)`` computes it for any sublayer.

    Post-norm (the original paper, ``norm_first=False``)::

        x = Norm(x + Dropout(sublayer(x)))

    Pre-norm (``norm_first=True``, easier to train deep)::

        x = x + Dropout(sublayer(Norm(x)))

    Args:
        d_model, dropout, norm_first, eps: the residual's width, its dropout, where the
            norm goes and a LayerNorm's epsilon.
        norm: the normalisation module; default ``nn.LayerNorm(d_model, eps)``.

    Shapes: ``(batch, L, d_model)`` in and out.
    """

    def __init__(
        self,
        d_model: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        eps: float = 1e-5,
        *,
        norm: nn.Module | None = None,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.norm = nn.LayerNorm(d_model, eps=eps) if norm is None else norm
        self.dropout = Dropout(dropout)

    def forward(
        self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))
