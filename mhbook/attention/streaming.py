"""Attention with sinks, positioned within the cache (StreamingLLM, Xiao et al., 2023).

Each query of a local layer with ``sinks`` sees the first ``sinks`` keys and its last
``window`` keys (:func:`mhbook.window_slots`). StreamingLLM places them at positions
``0, 1, ..., m - 1`` in that order, the query itself at ``m - 1``, whatever their text
positions: RoPE rotates them there (and ALiBi measures those distances), so no distance
exceeds ``sinks + window - 1``, however long the text. The first tokens' keys are used at
other positions than they were made at, so the cache keeps keys before RoPE and they are
rotated anew at every step.

RoPE and ALiBi see only the distance between a query and a key. A recent key's distance
to its query in the slots is its distance in the cache's columns (the recent keys fill
the slots in column order, up to the query's own), so the recent keys are rotated once,
at their columns, for every query, as in full attention. A sink's distance is the
query's slot minus the sink's, ``min(c, sinks + window - 1) - s`` for the query in column
``c``; so the sinks are attended as extra key columns, with the query rotated at its slot.
One product gives both: each query's features are ``[q at its column | q at its slot]``,
a recent key's ``[k at its column | 0]`` and a sink's ``[0 | k at its slot]``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..core.masks import causal_mask, check_mask
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
    tables: tuple[torch.Tensor, torch.Tensor] | None = None,
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
        tables: RoPE's ``(cos, sin)`` of the positions ``0 .. N - 1`` or more (``(>= N,
            w)``), or ``None`` without RoPE.
        alibi: an :class:`mhbook.ALiBi`, or ``None``.
        need_weights: also return the weights ``(B, h, T, N)``.

    Returns:
        ``(heads, weights or None)``: heads ``(B, h, T, d_v)``.
    """
    B, h, T, N = *q.shape[:3], k.size(2)
    S = min(sinks, N)  # the sink columns there are
    columns = torch.arange(N, device=q.device)
    q_columns = columns[N - T :]  # (T,): the queries' own columns (bottom-right)
    q_slots = q_columns.clamp(max=sinks + window - 1)  # (T,): the query's last slot
    recent = causal_mask(T, N, q.device, window=window) & (columns >= sinks)  # (T, N)
    seen_sinks = columns[:S] <= q_columns[:, None]  # (T, S): the sinks before the query
    keys, values = torch.cat([k[:, :, :S], k], dim=2), torch.cat([v[:, :, :S], v], dim=2)
    if tables is not None:
        cos, sin = tables
        if cos.size(-2) < N:
            raise ValueError(
                f"tables: a layer with sinks={sinks} needs RoPE's tables of the positions "
                f"0 .. {N - 1} ({N} rows: the kept keys and the new ones), got {cos.size(-2)}"
            )
        cos, sin = cos[..., :N, :], sin[..., :N, :]
        at_column = apply_rope(q, cos[..., q_columns, :], sin[..., q_columns, :])
        at_slot = apply_rope(q, cos[..., q_slots, :], sin[..., q_slots, :])
        # attend divides by sqrt(2 d_head); the scores are each half's q.k / sqrt(d_head)
        q = torch.cat([at_column, at_slot], dim=-1) * math.sqrt(2)
        sink_keys = apply_rope(k[:, :, :S], cos[..., :S, :], sin[..., :S, :])
        recent_keys = apply_rope(k, cos, sin)
        keys = torch.cat(
            [
                torch.cat([torch.zeros_like(sink_keys), sink_keys], dim=-1),
                torch.cat([recent_keys, torch.zeros_like(recent_keys)], dim=-1),
            ],
            dim=2,
        )  # (B, h_kv, S + N, 2 d_head)
    bias = None
    if alibi is not None:  # the same distances: the sinks' from the query's slot
        bias = torch.cat(
            [alibi(q_slots, columns[:S], q.dtype), alibi(q_columns, columns, q.dtype)], dim=-1
        )  # (h, T, S + N)
    allowed = torch.cat([seen_sinks, recent], dim=-1)  # (T, S + N)
    if mask is not None:  # the mask's columns: the sinks' again, then all
        check_mask(mask, (B, h, T, N), q.device)
        mask = mask.expand(*mask.shape[:-1], N)
        allowed = allowed & torch.cat([mask[..., :S], mask], dim=-1)
    heads, weights = attend(q, keys, values, allowed, need_weights=need_weights, bias=bias)
    if weights is not None:  # back to the N columns (the recent part's first S are masked)
        weights = torch.cat([weights[..., :S], weights[..., 2 * S :]], dim=-1)
    return heads, weights
