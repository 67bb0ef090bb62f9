"""Attention masks, with one convention everywhere.

A mask is a ``torch.bool`` tensor in which ``True`` means *this query may attend
to this key*. That is the convention of
:func:`torch.nn.functional.scaled_dot_product_attention`, and the opposite of
``key_padding_mask`` and bool ``attn_mask`` in :class:`torch.nn.MultiheadAttention`.

Masks are combined with ``&`` and broadcast against the attention scores, whose
shape is ``(batch, num_heads, num_queries, num_keys)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["padding_mask", "causal_mask", "check_mask"]


def padding_mask(valid_lens: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Mask out the padding at the end of each sequence.

    Args:
        valid_lens: ``(batch,)`` number of real (non-padding) keys per sequence,
            or ``(batch, num_queries)`` for a different length per query.
        num_keys: ``Lk``, the padded length of the keys.

    Returns:
        A bool mask ``(batch, 1, 1, Lk)`` (or ``(batch, 1, Lq, Lk)`` for 2-D
        ``valid_lens``), broadcastable to ``(batch, num_heads, Lq, Lk)``:
        ``mask[b, ..., j]`` is ``True`` when ``j < valid_lens[b]``.
    """
    if not isinstance(valid_lens, torch.Tensor):
        raise TypeError(f"valid_lens must be a torch.Tensor, got {type(valid_lens).__name__}")
    if valid_lens.dim() not in (1, 2):
        raise ValueError(
            "valid_lens must have shape (batch,) or (batch, num_queries), "
            f"got shape {tuple(valid_lens.shape)}"
        )
    positions = torch.arange(num_keys, device=valid_lens.device)
    mask = positions < valid_lens.unsqueeze(-1)  # (B, Lk) or (B, Lq, Lk)
    return mask[:, None, None, :] if valid_lens.dim() == 1 else mask[:, None, :, :]


def causal_mask(
    num_queries: int, num_keys: int | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """The look-ahead mask, aligned bottom-right.

    Query ``i`` may attend to key ``j`` when ``j <= i + (num_keys - num_queries)``:
    the *last* query sees every key. With ``num_keys == num_queries`` this is
    the usual lower triangle. With one query and ``t`` cached keys (a decoding
    step with a KV cache) the single row is all ``True``, so the same function
    serves training and decoding. (``is_causal=True`` in PyTorch aligns top-left
    instead, which is wrong for that decoding step.)

    Args:
        num_queries: ``Lq``.
        num_keys: ``Lk``; defaults to ``Lq``. Must be at least ``Lq``.
        device: where to create the mask (pass your inputs' ``.device``).

    Returns:
        A bool mask ``(Lq, Lk)``.
    """
    if num_keys is None:
        num_keys = num_queries
    if num_keys < num_queries:
        raise ValueError(
            f"a bottom-right causal mask needs num_keys >= num_queries, "
            f"got num_queries={num_queries}, num_keys={num_keys}"
        )
    ones = torch.ones(num_queries, num_keys, dtype=torch.bool, device=device)
    return ones.tril(diagonal=num_keys - num_queries)


def check_mask(mask: torch.Tensor | None, scores_shape: Sequence[int]) -> None:
    """Raise a clear error unless ``mask`` is a bool tensor broadcastable to ``scores_shape``.

    Args:
        mask: the mask, or ``None`` (always accepted).
        scores_shape: the shape of the attention scores, ``(..., Lq, Lk)``.
    """
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise TypeError(
            f"mask must be a torch.Tensor of dtype torch.bool, got {type(mask).__name__}"
        )
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must have dtype torch.bool (True = may attend), got {mask.dtype}; "
            "mhbook does not take additive float masks"
        )
    expected = tuple(scores_shape)
    try:
        broadcast = torch.broadcast_shapes(mask.shape, expected)
    except RuntimeError:
        broadcast = None
    if broadcast != expected:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention "
            f"scores' shape {expected} (..., num_queries, num_keys)"
        )
