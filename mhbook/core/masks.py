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

from .validate import check_int, check_window

__all__ = ["padding_mask", "causal_mask", "window_slots", "check_mask"]


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

    Raises:
        TypeError: ``valid_lens`` is not a tensor of integers.
        ValueError: a length is negative or above ``num_keys``. This check reads the
            values, so it runs only for CPU tensors, where it is cheap; on an
            accelerator it would wait for the device at every call, so it is skipped.
    """
    if not isinstance(valid_lens, torch.Tensor):
        raise TypeError(f"valid_lens must be a torch.Tensor, got {type(valid_lens).__name__}")
    if valid_lens.dim() not in (1, 2):
        raise ValueError(
            "valid_lens must have shape (batch,) or (batch, num_queries), "
            f"got shape {tuple(valid_lens.shape)}"
        )
    if valid_lens.is_floating_point() or valid_lens.is_complex() or valid_lens.dtype == torch.bool:
        raise TypeError(f"valid_lens must hold integer lengths, got dtype {valid_lens.dtype}")
    check_int("num_keys", num_keys, 0)
    if valid_lens.device.type == "cpu" and valid_lens.numel() > 0:
        low, high = (int(t) for t in torch.aminmax(valid_lens))
        if low < 0 or high > num_keys:
            raise ValueError(
                f"valid_lens must be between 0 and num_keys={num_keys}, "
                f"got values from {low} to {high}"
            )
    positions = torch.arange(num_keys, device=valid_lens.device)
    mask = positions < valid_lens.unsqueeze(-1)  # (B, Lk) or (B, Lq, Lk)
    return mask[:, None, None, :] if valid_lens.dim() == 1 else mask[:, None, :, :]


def causal_mask(
    num_queries: int,
    num_keys: int | None = None,
    device: torch.device | str | None = None,
    *,
    window: int | None = None,
    sinks: int = 0,
) -> torch.Tensor:
    """The look-ahead mask, aligned bottom-right.

    Query ``i`` may attend to key ``j`` when ``j <= i + (num_keys - num_queries)``:
    the *last* query sees every key. With ``num_keys == num_queries`` this is
    the usual lower triangle. With one query and ``t`` cached keys (a decoding
    step with a KV cache) the single row is all ``True``, so the same function
    serves training and decoding. (``is_causal=True`` in PyTorch aligns top-left
    instead, which is wrong for that decoding step.)

    With ``window`` each query also sees at most the ``window`` latest keys, its own
    included (sliding-window attention): ``0 <= i + (num_keys - num_queries) - j < window``.

    With ``sinks`` as well, each query also sees the first ``sinks`` keys, however far
    back (attention sinks, Xiao et al., 2023): the band of the last ``window`` keys plus
    the first ``sinks`` columns, below the diagonal. For ``causal_mask(6, window=2,
    sinks=1)``::

        1 . . . . .
        1 1 . . . .
        1 1 1 . . .
        1 . 1 1 . .
        1 . . 1 1 .
        1 . . . 1 1

    With a rolling cache (:class:`mhbook.LayerCache` ``(window, sinks)``) the keys are the
    kept ones followed by the new ones, and the first ``sinks`` of them are still the
    sequence's first tokens: ``causal_mask(T, kept + T, window=, sinks=)`` is the mask.

    Args:
        num_queries: ``Lq``.
        num_keys: ``Lk``; defaults to ``Lq``. Must be at least ``Lq``.
        device: where to create the mask (pass your inputs' ``.device``).
        window: ``None`` (see every earlier key) or the window's size, at least 1.
        sinks: how many first keys every query sees besides its window (0: none); only
            with a ``window``.

    Returns:
        A bool mask ``(Lq, Lk)``.
    """
    check_int("num_queries", num_queries, 0)
    if num_keys is None:
        num_keys = num_queries
    check_int("num_keys", num_keys, 0)
    check_window(window, sinks)
    if num_keys < num_queries:
        raise ValueError(
            f"a bottom-right causal mask needs num_keys >= num_queries, "
            f"got num_queries={num_queries}, num_keys={num_keys}"
        )
    ones = torch.ones(num_queries, num_keys, dtype=torch.bool, device=device)
    mask = ones.tril(diagonal=num_keys - num_queries)
    if window is not None:
        band = mask.triu(diagonal=num_keys - num_queries - window + 1)
        mask[:, sinks:] = band[:, sinks:]  # the first `sinks` columns stay causal only
    return mask


def window_slots(
    num_queries: int,
    num_keys: int,
    window: int,
    sinks: int = 0,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys each query may see under ``causal_mask(num_queries, num_keys, window=,
    sinks=)``, listed in order: at most ``sinks + window`` per query.

    Query ``i`` sees the first ``sinks`` keys (those before it) and then its last
    ``window`` keys, its own last; slot ``s`` of its row holds the ``s``-th of them.
    This is how attention with sinks places keys *within the cache* (StreamingLLM): the
    key in slot ``s`` is at position ``s``, and the query at its last slot.

    Args:
        num_queries, num_keys: ``Lq <= Lk``, aligned bottom-right as in
            :func:`causal_mask`.
        window: the window's size, at least 1.
        sinks: the number of first keys every query sees, at least 0.
        device: where to create the tensors.

    Returns:
        ``(index, valid)``, both ``(Lq, sinks + window)``: ``index`` the key (column of
        the mask) in each slot, ``valid`` whether the slot holds a key (a query near the
        start sees fewer than ``sinks + window``; its empty slots point at its own key).
        The valid slots of each row come first: ``mask[i, index[i, valid[i]]]`` is the
        row's ``True`` entries, in order.
    """
    check_int("num_queries", num_queries, 0)
    check_int("num_keys", num_keys, num_queries)
    check_int("window", window, 1)
    check_window(window, sinks)
    last = torch.arange(num_keys - num_queries, num_keys, device=device)[:, None]  # (Lq, 1)
    slot = torch.arange(sinks + window, device=device)  # (K,)
    num_sinks = (last + 1).clamp(max=sinks)  # sinks before the query (all, past the start)
    first_recent = (last - window + 1).clamp(min=sinks)  # the window's first key, past the sinks
    index = torch.where(slot < num_sinks, slot, first_recent + slot - num_sinks)  # (Lq, K)
    valid = index <= last
    return torch.minimum(index, last), valid


def check_mask(
    mask: torch.Tensor | None,
    scores_shape: Sequence[int],
    device: torch.device | None = None,
) -> None:
    """Raise a clear error unless ``mask`` is a bool tensor broadcastable to ``scores_shape``.

    Args:
        mask: the mask, or ``None`` (always accepted).
        scores_shape: the shape of the attention scores, ``(..., Lq, Lk)``.
        device: if given, the mask must be on this device (the queries' device).
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
    if device is not None and mask.device != device:
        raise ValueError(
            f"mask must be on the queries' device {device}, got a mask on {mask.device}"
        )
    expected = tuple(scores_shape)
    # Broadcasts to `expected`: no more dimensions, each (from the right) 1 or equal.
    # (Written out: torch.broadcast_shapes takes about ten times as long, at every call.)
    fits = mask.dim() <= len(expected) and all(
        m == 1 or m == e for m, e in zip(reversed(mask.shape), reversed(expected))
    )
    if not fits:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention "
            f"scores' shape {expected} (..., num_queries, num_keys)"
        )
