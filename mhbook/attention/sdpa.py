"""Scaled dot-product attention: the explicit version to read, and the one core that
every attention layer of mhbook runs.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d)) V

:func:`scaled_dot_product_attention` writes the formula out and returns the weights.
:func:`attend` is what :class:`mhbook.MultiHeadAttention` calls: it takes heads
``(batch, h, L, d)``, allows fewer key/value heads than query heads (grouped-query
attention), checks its inputs once, and runs PyTorch's fused kernel unless the weights
are wanted. The tests check that the two paths agree.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..core.masks import causal_mask, check_mask
from ..core.validate import check_heads

__all__ = ["scaled_dot_product_attention", "attend"]


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
        value: ``(..., Lk, dv)``. The leading dimensions of the three broadcast.
        mask: optional bool mask broadcastable to ``(..., Lq, Lk)``;
            ``True`` = may attend.

    Returns:
        ``(output, weights)``: output ``(..., Lq, dv)`` and attention weights
        ``(..., Lq, Lk)``. Each row of the weights sums to one, except a row whose
        keys are all masked: its weights and its output are zero, never NaN.

    In float16 and bfloat16 the scores and the softmax are computed in float32 and the
    weights cast back, as PyTorch's CPU kernel does: the scores of inputs around 300
    overflow float16 (whose largest value is 65504), even when ``q`` is scaled first.
    In float32 and float64 this is exactly ``softmax(q @ k^T / sqrt(d)) @ v``.
    """
    _check_qkv(query, key, value)
    batch_shape = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    check_mask(mask, (*batch_shape, query.size(-2), key.size(-2)), query.device)
    return _explicit_attention(query, key, value, mask)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    need_weights: bool = False,
    dropout_p: float = 0.0,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of ``h`` query heads over ``h_kv`` key/value heads.

    With ``h_kv == h`` this is multi-head attention; with ``h_kv < h`` grouped-query
    attention (``h_kv == 1``: multi-query attention): query head ``i`` uses key/value
    head ``i // (h // h_kv)``, as if each key/value head were repeated ``h // h_kv``
    times (Hugging Face's ``repeat_kv``).

    Args:
        q: ``(batch, h, L, d)`` queries, already projected and split into heads.
        k: ``(batch, h_kv, S, d)`` keys; ``h_kv`` must divide ``h``.
        v: ``(batch, h_kv, S, d_v)`` values.
        mask: bool, broadcastable to ``(batch, h, L, S)``; ``True`` = may attend.
        need_weights: compute the weights explicitly and return them. Otherwise
            PyTorch's fused kernel runs and never stores the ``(L, S)`` weights.
        dropout_p: dropout on the attention weights; pass ``0.0`` in eval mode.
        bias: an optional float tensor broadcastable to ``(batch, h, L, S)``, added to
            the scaled scores before the softmax (e.g. ALiBi's distance penalty):
            ``softmax(q k^T / sqrt(d) + bias)``. It is combined with ``mask``: masked
            scores stay masked whatever their bias. It must be finite where the mask
            allows (it is not checked, to check no values).
        is_causal: also apply :func:`~mhbook.causal_mask` ``(L, S)`` (bottom-right
            aligned, so ``S >= L``), as if ``mask & causal_mask(L, S)`` were passed.
            Without another mask and with ``L == S`` the fused kernel then skips the
            masked blocks and no mask is built.

    Returns:
        ``(output, weights)``: output ``(batch, h, L, d_v)``; weights
        ``(batch, h, L, S)`` (before dropout) when ``need_weights``, else ``None``.
        A query that may attend to no key gets zero output, zero weights and zero
        gradient on both paths, never NaN.

    Only shapes, dtypes and devices are checked, never values, so no check waits for
    an accelerator.
    """
    _check_heads(q, k, v)
    batch, h, length, num_keys = *q.shape[:3], k.size(2)
    check_mask(mask, (batch, h, length, num_keys), q.device)
    _check_bias(bias, (batch, h, length, num_keys), q)
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p must be in [0, 1], got {dropout_p!r}")
    group = h // k.size(1)
    if is_causal and length == 1:  # one query, aligned bottom-right: it sees every key
        is_causal = False
    if is_causal and (mask is not None or bias is not None or need_weights or length != num_keys):
        # PyTorch's is_causal aligns top-left: only for L == S is it our causal mask.
        causal = causal_mask(length, num_keys, device=q.device)
        mask = causal if mask is None else mask & causal
        is_causal = False
    if need_weights:
        if group > 1:  # grouped-query attention: each key/value head serves `group` query heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return _explicit_attention(q, k, v, mask, dropout_p, bias)
    if mask is None:  # no query lacks a key, not even with is_causal (its diagonal is kept)
        attn_mask = None if bias is None else bias.to(q.dtype)
        return _fused(q, k, v, attn_mask, dropout_p, is_causal, group), None
    # A query with no key to attend to must give zero output and zero gradient on every
    # backend: let the kernel see all keys for such rows (so no backend meets an empty
    # row), then zero them. On the CPU, where reading a value waits for nothing, this is
    # skipped when every query has a key (the usual case); elsewhere it always runs.
    has_key = mask.any(dim=-1, keepdim=True)
    if mask.device.type == "cpu" and bool(has_key.all()):
        return _fused(q, k, v, _with_bias(mask, bias, q), dropout_p, False, group), None
    attn_mask = _with_bias(mask | ~has_key, bias, q)
    output = _fused(q, k, v, attn_mask, dropout_p, False, group)
    return output.masked_fill(~has_key, 0.0), None


def _fused(q, k, v, attn_mask, dropout_p, is_causal, group):
    """PyTorch's fused attention; ``group`` query heads share each key/value head."""
    if group > 1 and q.size(2) > 1 and not kernel_shares_kv_heads(q, attn_mask):
        # Several queries, and no fused kernel is sure to take shared heads here (cuDNN may,
        # but PyTorch's default order tries its math backend first on most GPUs): the math
        # backend would store the (L, S) scores of every query head as the explicit path
        # does. Copy each key/value head for its `group` query heads instead, so that a
        # fused kernel runs. A decoding step (one query) keeps the shared
        # heads: there are no L x S scores to avoid, and reading each cached key and value
        # once is what sharing them is for (timed on a GPU: benchmarks/README.md).
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        group = 1
    # Query head i uses key/value head i // group; the kernel maps them itself
    # (enable_gqa), with no copy of the keys and values per query head.
    gqa = {"enable_gqa": True} if group > 1 else {}
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **gqa
    )


def kernel_shares_kv_heads(q: torch.Tensor, attn_mask: torch.Tensor | None) -> bool:
    """Whether a fused kernel of PyTorch attends with fewer key/value heads than query
    heads itself (``enable_gqa=True``), rather than falling back to its math backend.

    The CPU's kernel always can. On a CUDA GPU, PyTorch's dispatcher lets FlashAttention
    and the cuDNN kernel take fewer key/value heads (both need float16 or bfloat16 and a GPU
    of compute capability 8.0 or later, not the T4 of Colab's free tier; cuDNN takes a mask
    too), while the memory-efficient kernel needs as many key/value heads as query heads in
    PyTorch 2.13 (``can_use_cudnn_attention`` and ``can_use_flash_attention`` in PyTorch's
    ``sdp_utils.cpp``; later versions add shared heads to it, pytorch#191085). By default
    the dispatcher tries cuDNN before its math backend only on Hopper and Blackwell GPUs.
    This function answers ``True`` only where FlashAttention applies (no mask tensor, heads
    of at most 256): which of the other kernels runs depends on PyTorch's order of
    backends, so there the keys and values are repeated rather than risk the math backend.
    """
    if q.device.type == "cpu":
        return True
    if q.device.type != "cuda":
        return False
    return (
        q.dtype in (torch.float16, torch.bfloat16)
        and attn_mask is None
        and q.size(-1) <= 256
        and torch.cuda.get_device_capability(q.device) >= (8, 0)
    )


def _with_bias(mask: torch.Tensor, bias: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """The bool ``mask`` as SDPA's float mask with ``bias`` added: the bias where allowed,
    ``-inf`` where masked (masked scores stay masked whatever their bias)."""
    if bias is None:
        return mask
    return bias.to(q.dtype).masked_fill(~mask, float("-inf"))


def _explicit_attention(q, k, v, mask, dropout_p=0.0, bias=None):
    """``softmax(q k^T / sqrt(d) + bias) v`` with the weights materialised; inputs already
    checked."""
    # float16 and bfloat16 scores are computed in float32 (float32 and float64 stay as
    # they are): large scores then neither overflow nor lose their precision.
    compute = torch.promote_types(q.dtype, torch.float32)
    scores = q.to(compute) @ k.to(compute).transpose(-2, -1) / math.sqrt(q.size(-1))
    if bias is not None:
        scores = scores + bias.to(compute)
    if mask is not None:
        # Masked scores become -inf, so exp() gives them exactly zero weight.
        scores = scores.masked_fill(~mask, float("-inf"))
        # A row with no key left would be softmax(-inf, ..., -inf) = 0/0 = NaN.
        # Give such rows finite scores first, then zero their weights below.
        has_key = mask.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~has_key, 0.0)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    weights = weights.to(v.dtype)
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return dropped @ v, weights


def _check_same_dtype_and_device(**tensors: torch.Tensor) -> None:
    (first, t0), *rest = tensors.items()
    for name, t in rest:
        if t.device != t0.device:
            raise ValueError(
                f"{first} and {name} must be on the same device, got {first} on {t0.device} "
                f"and {name} on {t.device}"
            )
        if t.dtype != t0.dtype:
            raise TypeError(
                f"{first} and {name} must have the same dtype, got {first} {t0.dtype} "
                f"and {name} {t.dtype}"
            )


def _check_qkv(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(
                f"{name} must have shape (..., length, features), got {tuple(t.shape)}"
            )
    _check_same_dtype_and_device(query=query, key=key, value=value)
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


def _check_bias(bias, scores_shape: tuple[int, ...], q: torch.Tensor) -> None:
    """``bias`` is ``None`` or a floating tensor on ``q``'s device that broadcasts to the
    scores' shape ``(batch, h, L, S)``."""
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
        got = f"dtype {bias.dtype}" if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise TypeError(
            f"bias must be a floating-point tensor added to the scores, got {got}; "
            "a bool tensor goes to mask="
        )
    if bias.device != q.device:
        raise ValueError(f"bias must be on the queries' device {q.device}, got {bias.device}")
    try:
        broadcast = torch.broadcast_shapes(bias.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != tuple(scores_shape):
        raise ValueError(
            f"bias of shape {tuple(bias.shape)} does not broadcast to the attention scores' "
            f"shape {tuple(scores_shape)} (batch, h, L, S)"
        )


_HEAD_LAYOUTS = {"q": "(batch, h, L, d)", "k": "(batch, h_kv, S, d)", "v": "(batch, h_kv, S, d_v)"}


def _check_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must have 4 dimensions {_HEAD_LAYOUTS[name]}, got shape {tuple(t.shape)}"
            )
    _check_same_dtype_and_device(q=q, k=k, v=v)
    (batch, h, _, d), (batch_k, h_kv, length_k, d_k) = q.shape, k.shape
    same = batch == batch_k == v.size(0) and (h_kv, length_k) == v.shape[1:3] and d == d_k
    if same and h_kv > 0 and h % h_kv == 0:
        return  # the usual case, checked without building a message
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if not batch == batch_k == v.size(0):
        raise ValueError(f"q, k and v need the same batch size, got {shapes}")
    if k.shape[1:3] != v.shape[1:3]:
        raise ValueError(f"k and v need the same (h_kv, S): heads and length, got {shapes}")
    if d != d_k:
        raise ValueError(f"q and k need the same feature size d, got {shapes}")
    if h_kv == 0:
        raise ValueError(f"k and v need at least one key/value head, got {shapes}")
    check_heads(h, h_kv)  # the heads are q's and k's dimension 1
