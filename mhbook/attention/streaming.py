"""Attention with sinks, positioned within the cache (StreamingLLM, Xiao et al., 2023).

Each query of a local layer with ``sinks`` sees the first ``sinks`` keys and its last
``window`` keys (:func:`mhbook.window_slots`). StreamingLLM places them at positions
``0, 1, ..., m - 1`` in that order, the query itself at ``m - 1``, whatever their text
positions: RoPE rotates them there (and ALiBi measures those distances), so no distance
exceeds ``sinks + window - 1``, however long the text. The first tokens' keys are used at
other positions than they were made at, so the cache keeps keys before RoPE and they are
rotated anew at every step.

Each query has its own ``K = sinks + window`` keys at its own positions, so each is a batch
row of its own: ``(B * T, h, 1, d_head)`` over ``(B * T, h_kv, K, d_head)``.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..core.masks import check_mask, window_slots
from .rope import apply_rope

__all__ = ["attend_within_cache"]


def attend_within_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    window: int,
    sinks: int,
    attend: Callable,
    slot_tables: tuple[torch.Tensor, torch.Tensor] | None = None,
    alibi: Callable | None = None,
    need_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The heads' attention of a layer with ``window`` and ``sinks``, positioned within the
    cache.

    Args:
        q: ``(B, h, T, d_head)`` the new queries, not rotated.
        k, v: ``(B, h_kv, N, d_head)`` what ``cache.update`` returned: the kept keys
            (not rotated) and values, then the ``T`` new ones (without a cache: the ``T``
            new ones).
        mask: bool, broadcastable to ``(B, h, T, N)``, or ``None``; the window and sinks
            apply whatever it says.
        window, sinks: the layer's.
        attend: the layer's attention of split heads, ``attend(q, k, v, mask, *,
            need_weights, bias) -> (heads, weights)`` (``MultiHeadAttention.attend_heads``).
        slot_tables: RoPE's ``(cos, sin)`` of the positions ``0 .. sinks + window - 1``
            (``(sinks + window, w)``), or ``None`` without RoPE.
        alibi: an :class:`mhbook.ALiBi`, or ``None``.
        need_weights: also return the weights ``(B, h, T, N)``.

    Returns:
        ``(heads, weights or None)``: heads ``(B, h, T, d_v)``.
    """
    B, h, T, N = *q.shape[:3], k.size(2)
    index, valid = window_slots(T, N, window, sinks, q.device)  # (T, K)
    K = index.size(1)
    k, v = k[:, :, index], v[:, :, index]  # (B, h_kv, T, K, d): each query's keys
    q_positions = valid.sum(-1) - 1  # (T,): the query's own key is its last slot
    if slot_tables is not None:
        cos, sin = slot_tables
        q, k = apply_rope(q, cos[q_positions], sin[q_positions]), apply_rope(k, cos, sin)
    bias = None
    if alibi is not None:
        bias = alibi(q_positions, torch.arange(K, device=q.device), q.dtype)  # (h, T, K)
        bias = _rows(bias.unsqueeze(0).expand(B, -1, -1, -1))
    allowed = valid.expand(B, 1, T, K)
    if mask is not None:  # the mask's columns, slot by slot
        check_mask(mask, (B, h, T, N), q.device)
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
        mask = mask.expand(B, mask.size(1), T, N)
        allowed = allowed & mask.gather(-1, index.expand(B, mask.size(1), T, K))
    heads, weights = attend(
        _rows(q), _rows(k), _rows(v), _rows(allowed), need_weights=need_weights, bias=bias
    )
    heads = heads.reshape(B, T, h, -1).transpose(1, 2)  # (B, h, T, d_v)
    if weights is not None:  # back to the columns of the N keys
        weights = weights.reshape(B, T, h, K).transpose(1, 2)
        full = weights.new_zeros(B, h, T, N)
        weights = full.scatter_add(-1, index.expand(B, h, T, K), weights)
    return heads, weights


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``(B, heads, T, ...)`` -> ``(B * T, heads, 1, ...)``: each query a batch row of its
    own, with its own keys (``(B, heads, T, K, d)`` -> ``(B * T, heads, K, d)``)."""
    x = x.transpose(1, 2)
    if x.dim() == 4:  # (B, T, heads, d): one query
        x = x.unsqueeze(3)
    return x.reshape(x.size(0) * x.size(1), *x.shape[2:])
