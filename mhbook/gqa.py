"""Grouped-query attention: fewer key/value heads than query heads.

Multi-head attention gives every one of the ``h`` query heads its own key and value
head. Grouped-query attention (Ainslie et al., 2023) keeps ``h`` query heads but only
``h_kv`` key/value heads; each key/value head serves a group of ``h / h_kv`` query
heads::

    q_i = X W_q^i                 i = 1..h
    k_j = X W_k^j, v_j = X W_v^j  j = 1..h_kv
    head_i = Attention(q_i, k_g(i), v_g(i)),   g(i) = i // (h / h_kv)
    GQA(X) = concat(head_1, ..., head_h) W_o

``h_kv == h`` is multi-head attention, ``h_kv == 1`` multi-query attention (Shazeer,
2019). The KV cache holds only the ``h_kv`` key/value heads: ``h / h_kv`` times less.

This is self-attention, the attention of a decoder-only model, with what such models
add: rotary position embedding applied to queries and keys (``rope``), a float bias
added to the scores (``alibi``) and a KV cache (``cache``).
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from . import attention
from .cache import LayerCache

__all__ = ["GroupedQueryAttention"]


class GroupedQueryAttention(nn.Module):
    """Self-attention with ``num_heads`` query heads and ``num_kv_heads`` key/value heads.

    Args:
        d_model: feature size of the input and of the output.
        num_heads: ``h``, query heads; must divide ``d_model`` unless ``d_head`` is given.
        num_kv_heads: ``h_kv``, key/value heads; must divide ``num_heads``. ``None``:
            ``num_heads`` (multi-head attention); 1: multi-query attention.
        dropout: dropout on the attention weights (training only).
        bias: whether the four projections have a bias (Llama's have none).
        d_head: size of one head; ``None`` means ``d_model // num_heads``.
        rope: ``None`` or a module ``rope(x, positions)`` (a ``mhbook.RotaryEmbedding``)
            applied to the queries and keys ``(batch, heads, T, d_head)`` after the head
            split and before the cache: the cache stores rotated keys (as Llama does).
        alibi: ``None`` or a module ``alibi(q_positions, k_positions)`` (a
            ``mhbook.ALiBi``) that gives a float bias ``(num_heads, T, S)`` added to the
            scores.

    Attributes:
        W_q: ``nn.Linear(d_model, num_heads * d_head)``.
        W_k, W_v: ``nn.Linear(d_model, num_kv_heads * d_head)``.
        W_o: ``nn.Linear(num_heads * d_head, d_model)``.
        keep_weights: when ``True``, every forward pass stores its weights
            ``(batch, num_heads, T, S)`` in ``weights`` (see :func:`mhbook.record_attention`).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = False,
        *,
        d_head: int | None = None,
        rope: nn.Module | None = None,
        alibi: nn.Module | None = None,
    ):
        super().__init__()
        optional = {"num_kv_heads": num_kv_heads, "d_head": d_head}
        for name, value in {"d_model": d_model, "num_heads": num_heads, **optional}.items():
            if value is None and name in optional:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                allowed = " or None" if name in optional else ""
                raise ValueError(
                    f"{name} must be a positive int{allowed}, got {value!r} "
                    f"({type(value).__name__})"
                )
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads must be divisible by num_kv_heads (each key/value head serves "
                f"a group of query heads): got num_heads={num_heads}, num_kv_heads="
                f"{num_kv_heads} (num_heads % num_kv_heads = {num_heads % num_kv_heads})"
            )
        if d_head is None and d_model % num_heads != 0:
            raise ValueError(
                f"d_model must be divisible by num_heads (or give d_head): got d_model="
                f"{d_model}, num_heads={num_heads} (d_model % num_heads = {d_model % num_heads})"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        for name, module in (("rope", rope), ("alibi", alibi)):
            if module is not None and not isinstance(module, nn.Module):
                raise TypeError(f"{name} must be None or an nn.Module, got {type(module).__name__}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.d_head = d_model // num_heads if d_head is None else d_head
        self.dropout = dropout
        # Created in this order (q, k, v, o), as in MultiHeadAttention.
        self.W_q = nn.Linear(d_model, num_heads * self.d_head, bias=bias)
        self.W_k = nn.Linear(d_model, num_kv_heads * self.d_head, bias=bias)
        self.W_v = nn.Linear(d_model, num_kv_heads * self.d_head, bias=bias)
        self.W_o = nn.Linear(num_heads * self.d_head, d_model, bias=bias)
        self.rope = rope
        self.alibi = alibi
        self.keep_weights = False
        self.weights: torch.Tensor | None = None

    @property
    def group_size(self) -> int:
        """Query heads per key/value head: ``num_heads // num_kv_heads``."""
        return self.num_heads // self.num_kv_heads

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Self-attention of the ``T`` new tokens ``x`` over the cached ones and themselves.

        Args:
            x: ``(batch, T, d_model)``.
            mask: bool, broadcastable to ``(batch, num_heads, T, S)``, ``True`` = may
                attend; ``S`` = the keys kept in ``cache`` before this call plus ``T``
                (``T`` without a cache). No mask: every query sees every key (pass
                :func:`mhbook.causal_mask` for a decoder).
            positions: ``(T,)`` integer positions of the new tokens (for ``rope`` and
                ``alibi``); default ``cache.length + arange(T)``, or ``arange(T)``
                without a cache.
            cache: ``None``, or this layer's :class:`mhbook.LayerCache`: the new keys
                and values are added to it and the queries attend to all it returns.
            need_weights: also return the weights (explicit attention path).

        Returns:
            ``(batch, T, d_model)``, or ``(output, weights)`` with weights
            ``(batch, num_heads, T, S)``.
        """
        self._check_input(x, positions, cache)
        batch, length, _ = x.shape
        past = 0 if cache is None else cache.length  # tokens seen before x
        kept = 0 if cache is None else cache.num_kept  # of which the cache still holds
        if positions is None:
            positions = torch.arange(past, past + length, device=x.device)
        q = self._split(self.W_q(x), self.num_heads)  # (B, h, T, d_head)
        k = self._split(self.W_k(x), self.num_kv_heads)  # (B, h_kv, T, d_head)
        v = self._split(self.W_v(x), self.num_kv_heads)
        if self.rope is not None:
            q, k = self.rope(q, positions), self.rope(k, positions)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, h_kv, kept + T, d_head)
        bias = None
        if self.alibi is not None:
            # The cached keys belong to the `kept` tokens just before the new ones.
            past_positions = torch.arange(past - kept, past, device=x.device)
            k_positions = torch.cat([past_positions, positions])
            bias = self.alibi(positions, k_positions).to(x.dtype)  # (h, T, S)
        heads, weights = attention.attend(
            q,
            k,
            v,
            mask,
            need_weights=need_weights or self.keep_weights,
            dropout_p=self.dropout if self.training else 0.0,
            bias=bias,
        )
        if self.keep_weights:
            self.weights = weights.detach()
        output = self.W_o(heads.transpose(1, 2).reshape(batch, length, -1))
        return (output, weights) if need_weights else output

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """``(batch, T, heads * d_head)`` -> ``(batch, heads, T, d_head)``."""
        batch, length, _ = x.shape
        return x.view(batch, length, heads, self.d_head).transpose(1, 2)

    def _check_input(self, x, positions, cache) -> None:
        weight = self.W_q.weight
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(
                f"x must have shape (batch, T, d_model={self.d_model}), got {tuple(x.shape)}"
            )
        if x.device != weight.device:
            raise ValueError(
                f"x is on {x.device} but the module is on {weight.device}; "
                f"move one of them (e.g. x.to({str(weight.device)!r}))"
            )
        if x.dtype != weight.dtype and not _autocasting(x.device):
            raise TypeError(
                f"x has dtype {x.dtype} but the module's weights are {weight.dtype}; "
                f"convert one of them (e.g. x.to({weight.dtype}))"
            )
        if positions is not None:
            if not isinstance(positions, torch.Tensor) or positions.shape != (x.size(1),):
                got = (
                    tuple(positions.shape)
                    if isinstance(positions, torch.Tensor)
                    else type(positions).__name__
                )
                raise ValueError(
                    f"positions must be a tensor of shape (T,) = ({x.size(1)},), got {got}"
                )
            if positions.is_floating_point() or positions.dtype == torch.bool:
                raise TypeError(f"positions must hold integers, got dtype {positions.dtype}")
            if positions.device != x.device:
                raise ValueError(
                    f"positions must be on x's device {x.device}, got {positions.device}"
                )
        if cache is not None and not isinstance(cache, LayerCache):
            raise TypeError(
                f"cache must be None or a mhbook.LayerCache (one layer of a KVCache), "
                f"got {type(cache).__name__}"
            )

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, d_head={self.d_head}"
        )


def _autocasting(device: torch.device) -> bool:
    """Whether autocast is on for ``device``: PyTorch then casts for the matrix products."""
    return torch.amp.is_autocast_available(device.type) and torch.is_autocast_enabled(device.type)
