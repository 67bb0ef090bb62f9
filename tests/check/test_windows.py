"""The grader's own tests for ``mhbook.check.windows``: the sliding-window mask and the
rolling cache (the other correct implementations, run by ``test_catalogue.py``, and what is
special here)."""

from __future__ import annotations

import torch
from grading import by_transformers

import mhbook
from mhbook import check


def window_by_band(T_q, T_k, window):
    """Another correct mask: a band between two diagonals of tril."""
    ones = torch.ones(T_q, T_k, dtype=torch.bool)
    return ones.tril(T_k - T_q) & ~ones.tril(T_k - T_q - window)


def window_mhbook(T_q, T_k, window):
    return mhbook.causal_mask(T_q, T_k, window=window)


class RollingCacheByHand:
    """The chapter's."""

    def __init__(self, W):
        self.W, self.keys, self.values = W, None, None

    def update(self, k, v):
        keys = k if self.keys is None else torch.cat([self.keys, k], dim=2)
        values = v if self.values is None else torch.cat([self.values, v], dim=2)
        self.keys, self.values = keys[:, :, -self.W :], values[:, :, -self.W :]
        return keys, values


class RollingCacheOfTokens:
    """Another correct rolling cache: a list of one-token slices."""

    def __init__(self, W):
        self.W, self.tokens = W, []

    def update(self, k, v):
        self.tokens += [(k[:, :, t : t + 1], v[:, :, t : t + 1]) for t in range(k.size(2))]
        keys = torch.cat([t[0] for t in self.tokens], dim=2)
        values = torch.cat([t[1] for t in self.tokens], dim=2)
        self.tokens = self.tokens[-self.W :]
        return keys, values


@by_transformers
def window_transformers(T_q, T_k, window):
    """transformers' own ``sliding_window_causal_mask_function``, the queries after the
    cached keys."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    q_idx = torch.arange(T_q)[:, None] + (T_k - T_q)
    return sliding_window_causal_mask_function(window)(0, 0, q_idx, torch.arange(T_k)[None, :])


class RollingCacheStatic:
    """A preallocated buffer, as transformers' StaticCache: update writes the new tokens after
    the kept ones and returns views of the buffer; the next update first moves the last W
    tokens to the buffer's front, in place, which changes what the previous one returned."""

    def __init__(self, W):
        self.W, self.end, self.keys, self.values = W, 0, None, None

    def update(self, k, v):
        kept = min(self.end, self.W)
        if self.keys is not None:  # the last W tokens to the front, in place
            old = slice(self.end - kept, self.end)
            self.keys[:, :, :kept] = self.keys[:, :, old].clone()
            self.values[:, :, :kept] = self.values[:, :, old].clone()
        end = kept + k.size(2)
        if self.keys is None or self.keys.size(2) < end:  # room for W more tokens
            B, h, _, d = k.shape
            keys, values = k.new_zeros(B, h, end + self.W, d), v.new_zeros(B, h, end + self.W, d)
            if self.keys is not None:
                keys[:, :, :kept] = self.keys[:, :, :kept]
                values[:, :, :kept] = self.values[:, :, :kept]
            self.keys, self.values = keys, values
        self.keys[:, :, kept:end], self.values[:, :, kept:end] = k, v
        self.end = end
        return self.keys[:, :, :end], self.values[:, :, :end]  # views of the buffer


@by_transformers
class RollingCacheTransformers:
    """transformers' own ``DynamicSlidingWindowLayer``. Its window counts the new query's own
    key, so it keeps sliding_window - 1 tokens: a window of W + 1 keeps the contract's W."""

    def __init__(self, W):
        from transformers.cache_utils import DynamicSlidingWindowLayer

        self.layer = DynamicSlidingWindowLayer(sliding_window=W + 1)

    def update(self, k, v):
        return self.layer.update(k, v)


ALTERNATIVES = {
    "window_mask": (window_by_band, window_mhbook, window_transformers),
    "rolling_cache": (
        RollingCacheByHand,
        RollingCacheOfTokens,
        RollingCacheStatic,
        RollingCacheTransformers,
    ),
}


def test_the_expected_mask_is_mhbooks():
    spec = check.window_mask.spec
    for case in spec.cases():
        assert torch.equal(
            spec.expected(case), mhbook.causal_mask(*case.args[:2], window=case.args[2])
        )


def test_nan_wrong_shape_and_dtype_in_a_cache_never_pass():
    changes = {
        "NaN": lambda t: t.clone().index_fill(-1, torch.tensor([0]), float("nan")),
        "wrong shape": lambda t: t[None],
        "wrong dtype": lambda t: t.float(),
    }
    for word, change in changes.items():

        class Corrupted(RollingCacheByHand):
            def update(self, k, v, change=change):
                keys, values = super().update(k, v)
                return change(keys), values

        result = check.rolling_cache(Corrupted)
        assert not result and word in result.report(), result.report()


def test_a_cache_that_returns_views_of_its_buffer_is_graded_when_each_update_returns():
    """Issue 38: the check kept each update's tensors and compared them after the last
    update, when a buffer's views hold other tokens."""
    cache = RollingCacheStatic(2)
    k = torch.arange(4.0).view(1, 1, 4, 1)
    first, _ = cache.update(k[:, :, :3], k[:, :, :3])
    before = first.clone()
    cache.update(k[:, :, 3:], k[:, :, 3:])
    assert not torch.equal(first, before)  # the view changed under the reader's feet
    result = check.rolling_cache(RollingCacheStatic)
    assert result, result.report()
