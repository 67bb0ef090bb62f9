"""Scaled dot-product attention, written out explicitly.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d)) V

This is the version to read. :class:`mhbook.MultiHeadAttention` runs PyTorch's
fused kernel when it does not need the weights; the tests check the two agree.
"""

from __future__ import annotations

import math

import torch

from .masks import check_mask

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attend from each query to the keys and average the values.

    Args:
        query: ``(..., Lq, d)``.
        key: ``(..., Lk, d)``.
        value: ``(..., Lk, dv)``.
        mask: optional bool mask broadcastable to ``(..., Lq, Lk)``;
            ``True`` = may attend.

    Returns:
        ``(output, weights)``: output ``(..., Lq, dv)`` and attention weights
        ``(..., Lq, Lk)``. Each row of the weights sums to one, except a row whose
        keys are all masked: its weights and its output are zero, never NaN.
    """
    _check_qkv(query, key, value)
    d = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d)  # (..., Lq, Lk)
    if mask is not None:
        check_mask(mask, scores.shape)
        # Masked scores become -inf, so exp() gives them exactly zero weight.
        scores = scores.masked_fill(~mask, float("-inf"))
        # A row with no key left would be softmax(-inf, ..., -inf) = 0/0 = NaN.
        # Give such rows finite scores first, then zero their weights below.
        has_key = mask.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~has_key, 0.0)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ value, weights


def _check_qkv(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(
                f"{name} must have shape (..., length, features), got {tuple(t.shape)}"
            )
    if query.size(-1) != key.size(-1):
        raise ValueError(
            f"query and key need the same feature size d: query {tuple(query.shape)} is "
            f"(..., Lq, {query.size(-1)}), key {tuple(key.shape)} is (..., Lk, {key.size(-1)})"
        )
    if key.size(-2) != value.size(-2):
        raise ValueError(
            f"key and value need the same length Lk: key {tuple(key.shape)}, "
            f"value {tuple(value.shape)}"
        )
    try:
        torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"batch dimensions do not match: query {tuple(query.shape)}, "
            f"key {tuple(key.shape)}, value {tuple(value.shape)}"
        ) from None
