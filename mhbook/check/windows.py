"""Checks of chapter 12: the sliding-window causal mask and the rolling KV cache.

The references are PyTorch's FlexAttention ``create_mask`` (the mask its ``mask_mod``
says, with the cache's offset) and ``mhbook.LayerCache().update(k, v, window=W)``.
"""

from __future__ import annotations

import torch

from ..attention.cache import LayerCache
from .grader import Bug, Case, define, seeded

__all__ = ["window_mask", "rolling_cache"]


# --- the sliding-window mask -----------------------------------------------------------------


def _window_cases() -> list[Case]:
    dims = {"output": ("query", "key")}
    sizes = [
        ("T = 5, window 2", 5, 5, 2),
        ("T = 7, window 3", 7, 7, 3),
        ("window 1: each query sees itself only", 4, 4, 1),
        ("window 10 > T = 6: the causal mask", 6, 6, 10),
        ("T_q = 3 new queries after 5 cached keys, window 4", 3, 8, 4),
        ("one query after 5 cached keys (a decoding step), window 3", 1, 6, 3),
    ]
    return [Case(name, (T_q, T_k, W), dims=dims) for name, T_q, T_k, W in sizes]


def _window_expected(case: Case) -> torch.Tensor:
    from torch.nn.attention.flex_attention import create_mask

    T_q, T_k, window = case.args
    offset = T_k - T_q  # the queries are the last T_q positions

    def sliding_window(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx + offset) & (q_idx + offset - kv_idx < window)

    return create_mask(sliding_window, None, None, T_q, T_k, device="cpu")[0, 0]


def _window_reference(T_q, T_k, window, *, keys=None, aligned=True, causal=True):
    """Written for teaching (and mutated for the bugs): query ``i`` is at position
    ``i + T_k - T_q`` and sees key ``j`` when ``0 <= i + T_k - T_q - j < window``."""
    keys = window if keys is None else keys
    i = torch.arange(T_q)[:, None] + (T_k - T_q if aligned else 0)
    j = torch.arange(T_k)[None, :]
    distance = i - j
    if not causal:
        distance = distance.abs()
    return (distance >= 0) & (distance < keys)


def _window_plus_one(T_q, T_k, window):
    return _window_reference(T_q, T_k, window, keys=window + 1)


def _window_minus_one(T_q, T_k, window):
    return _window_reference(T_q, T_k, window, keys=window - 1)


def _window_top_left(T_q, T_k, window):
    return _window_reference(T_q, T_k, window, aligned=False)


def _window_both_sides(T_q, T_k, window):
    return _window_reference(T_q, T_k, window, causal=False)


@define(
    title="the sliding-window causal mask",
    cases=_window_cases,
    expected=_window_expected,
    reference=_window_reference,
    params=("T_q", "T_k", "window"),
    tolerances="exact",
    bugs=[
        Bug(
            "the window is one key too wide: i - j <= window",
            "a window of W keeps W keys, the query's own included: i - j < window.",
            _window_plus_one,
        ),
        Bug(
            "the window is one key too narrow: W - 1 keys",
            "the query's own key counts: keep 0 <= i - j < window, W keys in all.",
            _window_minus_one,
        ),
        Bug(
            "the mask is aligned top-left: with T_q < T_k the queries are taken for the first "
            "positions",
            "the T_q queries are the last positions: query i is at i + (T_k - T_q), as in "
            "mhbook.causal_mask(T_q, T_k, window=W).",
            _window_top_left,
        ),
        Bug(
            "the window is not causal: |i - j| < W lets a query see the next keys",
            "keep only keys at or before the query: 0 <= i - j < window.",
            _window_both_sides,
        ),
    ],
    chapter="12-sliding-windows",
)
def window_mask(impl):
    """The sliding-window causal mask (chapter 12).

    Contract: ``impl(T_q, T_k, window) -> mask``, a bool tensor ``(T_q, T_k)``, ``True`` =
    may attend, aligned bottom-right: the ``T_q`` queries are the last ``T_q`` of ``T_k``
    positions, and query ``i`` (at position ``i + T_k - T_q``) sees key ``j`` when ``0 <=
    i + T_k - T_q - j < window``, its own included. Compared exactly with FlexAttention's
    ``create_mask`` (and ``mhbook.causal_mask(T_q, T_k, window=window)``).
    """


# --- the rolling KV cache ------------------------------------------------------------------


def _rolling_cases() -> list[Case]:
    def kv(B, h, T, d, seed, dtype=torch.float64):
        return seeded(B, h, T, d, seed=seed, dtype=dtype), seeded(B, h, T, d, seed=seed + 1)

    cases = [
        Case(
            "window 4: a prompt of 3, then steps of 1, 1, 2, 1 tokens",
            kv(1, 2, 8, 3, seed=130),
            {"window": 4, "chunks": (3, 1, 1, 2, 1)},
        ),
        Case(
            "window 2, one token at a time, batch 2",
            kv(2, 1, 5, 2, seed=132),
            {"window": 2, "chunks": (1, 1, 1, 1, 1)},
        ),
        Case(
            "window 3: a prompt of 5 (longer than the window), then 2 steps",
            kv(1, 1, 7, 2, seed=134),
            {"window": 3, "chunks": (5, 1, 1)},
        ),
        Case(
            "window 1: only the last token is kept",
            kv(1, 2, 4, 2, seed=136),
            {"window": 1, "chunks": (2, 1, 1)},
        ),
    ]
    for case in cases:
        dims = ("batch", "head", "token", "feature")
        case.dims = {key: dims for key in _step_keys(case.kwargs["chunks"])}
    return cases


def _step_keys(chunks) -> list[str]:
    """The names of the outputs: the keys and the values each update returns."""
    keys = []
    for n, size in enumerate(chunks, 1):
        keys += [f"keys of update {n} (+{size})", f"values of update {n} (+{size})"]
    return keys


def _call_rolling(impl, case: Case) -> dict:
    """Make ``impl(window)``, feed it the chunks; the outputs are what each update
    returns, named by the update, each copied when its update returns (a cache may return
    views of a buffer that the next update overwrites, as ``transformers``' StaticCache
    does)."""
    k, v = case.args
    cache, outputs, start = impl(case.kwargs["window"]), {}, 0
    names = iter(_step_keys(case.kwargs["chunks"]))
    for size in case.kwargs["chunks"]:
        part = slice(start, start + size)
        got = cache.update(k[:, :, part], v[:, :, part])
        keys, values = (got[0], got[1]) if isinstance(got, (tuple, list)) else (got, None)
        for name, t in ((next(names), keys), (next(names), values)):
            outputs[name] = t.clone() if isinstance(t, torch.Tensor) else t
        start += size
    return outputs


def _rolling_expected(case: Case) -> dict:
    return _call_rolling(_WindowedLayerCache, case)


class _WindowedLayerCache:
    """mhbook's cache as a layer of window ``W`` uses it: told the window at every update."""

    def __init__(self, window: int):
        self.cache, self.window = LayerCache(), window

    def update(self, k, v):
        return self.cache.update(k, v, window=self.window)


class _RollingReference:
    """Written for teaching (and mutated for the bugs): keep the last ``W`` tokens' keys
    and values; ``update`` returns the kept ones followed by the new ones."""

    keep_offset = 0
    trim_first = False
    keep_first = False
    trim = True
    new_first = False

    def __init__(self, W):
        self.W, self.keys, self.values = W, None, None

    def update(self, k, v):
        if self.keys is None:
            keys, values = k, v
        elif self.new_first:
            keys, values = torch.cat([k, self.keys], dim=2), torch.cat([v, self.values], dim=2)
        else:
            keys, values = torch.cat([self.keys, k], dim=2), torch.cat([self.values, v], dim=2)
        n = self.W + self.keep_offset
        if not self.trim:
            kept = keys, values
        elif self.keep_first:
            kept = keys[:, :, :n], values[:, :, :n]
        else:
            start = max(keys.size(2) - n, 0)
            kept = keys[:, :, start:], values[:, :, start:]
        self.keys, self.values = kept
        return kept if self.trim_first else (keys, values)


class _RollingTrimFirst(_RollingReference):
    trim_first = True


class _RollingKeepsOneLess(_RollingReference):
    keep_offset = -1


class _RollingKeepsFirst(_RollingReference):
    keep_first = True


class _RollingNoTrim(_RollingReference):
    trim = False


class _RollingNewFirst(_RollingReference):
    new_first = True


@define(
    title="a rolling KV cache that keeps the last W tokens",
    cases=_rolling_cases,
    expected=_rolling_expected,
    reference=_RollingReference,
    call=_call_rolling,
    params=("k", "v"),
    tolerances="exact",
    why="A cache copies keys and values: what it returns is the inputs' values, unchanged.",
    bugs=[
        Bug(
            "update returns the keys after trimming them to the window",
            "return all kept + new keys and values (the first new query needs older keys than "
            "the last), and keep only the last W of them for the next update.",
            _RollingTrimFirst,
        ),
        Bug(
            "the cache keeps W - 1 tokens",
            "keep the last W, keys[:, :, -W:], as the contract and mhbook.LayerCache do (W - 1 "
            "also serves the next query, whose own key is the W-th: exercise 1, but then every "
            "step's mask must count one key fewer).",
            _RollingKeepsOneLess,
        ),
        Bug(
            "the cache keeps the first W tokens instead of the last W",
            "keep the newest: keys[:, :, -W:], not keys[:, :, :W].",
            _RollingKeepsFirst,
        ),
        Bug(
            "the cache is never trimmed (it keeps every token)",
            "after concatenating, keep only the last W tokens: self.keys = keys[:, :, -W:].",
            _RollingNoTrim,
        ),
        Bug(
            "the new keys are put before the kept ones",
            "keep time order: torch.cat([self.keys, k], dim=2), the old ones first.",
            _RollingNewFirst,
        ),
    ],
    chapter="12-sliding-windows",
)
def rolling_cache(impl):
    """A rolling KV cache for sliding-window attention (chapter 12).

    Contract: a class ``impl(W)`` whose ``update(k, v) -> (keys, values)`` takes the new
    tokens' keys and values ``(batch, h_kv, T_new, d)`` and returns what the new queries
    attend to: the kept keys and values followed by the new ones, in time order, ``(batch,
    h_kv, S + T_new, d)``; it then keeps only the last ``W`` tokens for the next update.
    The check feeds a prompt and steps and compares every update's return with
    ``mhbook.LayerCache().update(k, v, window=W)``.
    """
