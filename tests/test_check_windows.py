"""The grader's own tests for ``mhbook.check.windows``: the sliding-window mask and the
rolling cache."""

from __future__ import annotations

import torch
from grading import assert_passes

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


def test_the_expected_mask_is_mhbooks():
    spec = check.window_mask.spec
    for case in spec.cases():
        assert torch.equal(
            spec.expected(case), mhbook.causal_mask(*case.args[:2], window=case.args[2])
        )


def test_references_and_other_implementations_pass():
    for impl in (check.window_mask.spec.reference, window_by_band, window_mhbook):
        assert_passes(check.window_mask, impl)
    for impl in (check.rolling_cache.spec.reference, RollingCacheByHand, RollingCacheOfTokens):
        assert_passes(check.rolling_cache, impl)


def test_wrong_shape_and_dtype_never_pass():
    reference = check.window_mask.spec.reference
    for corrupted, word in [
        (lambda *a: reference(*a)[None], "wrong shape"),
        (lambda *a: reference(*a).float(), "wrong dtype"),
    ]:
        result = check.window_mask(corrupted)
        assert not result and word in result.report(), result.report()


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
