"""The grader's own tests for ``mhbook.check.scaling``: chapter 16's position interpolation,
NTK-aware scaling and YaRN frequencies."""

from __future__ import annotations

import math

import pytest
import torch
from grading import assert_passes, assert_rejects_corruptions

from mhbook import check

pytest.importorskip("transformers")

CHECKS = [check.pi_frequencies, check.ntk_frequencies, check.yarn_frequencies]


# --- other correct implementations, written otherwise than the book's ----------------------


def pi_reciprocal(d, base, s):
    return 1.0 / (s * base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))


def pi_list(d, base, s):
    return torch.tensor(
        [math.pow(base, -2 * i / d) / s for i in range(d // 2)], dtype=torch.float64
    )


def ntk_log(d, base, s):
    new_base = math.exp(math.log(base) + d / (d - 2) * math.log(s))
    return torch.exp(-torch.arange(0, d, 2, dtype=torch.float64) / d * math.log(new_base)), new_base


def ntk_per_pair(d, base, s):
    """theta_i s^(-2i/(d-2)), pair by pair: the same frequencies without the new base's powers."""
    theta = [base ** (-2 * i / d) * s ** (-2 * i / (d - 2)) for i in range(d // 2)]
    return torch.tensor(theta, dtype=torch.float64), base * s ** (d / (d - 2))


def yarn_like_transformers(d, base, s, L, beta_fast=32.0, beta_slow=1.0):
    """As transformers writes it: an extrapolation factor 1 - ramp, in float64."""

    def dim(turns):
        return d * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(dim(beta_fast)), 0), min(math.ceil(dim(beta_slow)), d - 1)
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    powers = base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    theta = 1 / (s * powers) * (1 - extrapolation) + 1 / powers * extrapolation
    return theta, 0.1 * math.log(s) + 1


def yarn_by_turns(d, base, s, L, beta_fast=32.0, beta_slow=1.0):
    """Pair by pair from the turns r_i, the ramp over the pair index between the rounded
    indices where r_i is beta_fast and beta_slow; returns the ramp as a third output."""
    turns = [L * base ** (-2 * i / d) / (2 * math.pi) for i in range(d // 2)]
    where = [
        d / 2 * math.log(L / (2 * math.pi * r)) / math.log(base) for r in (beta_fast, beta_slow)
    ]
    low, high = max(math.floor(where[0]), 0), min(math.ceil(where[1]), d - 1)
    theta, keep = [], []
    for i, r in enumerate(turns):
        k = min(max((high - i) / (high - low), 0.0), 1.0)
        theta.append(2 * math.pi * r / L * (k + (1 - k) / s))
        keep.append(k)
    return torch.tensor(theta, dtype=torch.float64), 1 + math.log(s) / 10, keep


OTHERS = {
    "pi_frequencies": (pi_reciprocal, pi_list),
    "ntk_frequencies": (ntk_log, ntk_per_pair),
    "yarn_frequencies": (yarn_like_transformers, yarn_by_turns),
}


@pytest.mark.parametrize("check_fn", CHECKS, ids=lambda c: c.spec.name)
def test_references_and_other_implementations_pass(check_fn):
    for impl in (check_fn.spec.reference, *OTHERS[check_fn.spec.name]):
        assert_passes(check_fn, impl)


@pytest.mark.parametrize("check_fn", CHECKS, ids=lambda c: c.spec.name)
def test_nan_wrong_shape_and_dtype_never_pass(check_fn):
    assert_rejects_corruptions(check_fn)


def test_yarn_without_betas_is_checked_on_the_defaults_and_says_so():
    def yarn(d, base, s, L):
        return yarn_like_transformers(d, base, s, L)

    result = check.yarn_frequencies(yarn)
    assert result and "Skipped" in result.report() and "takes no beta_fast" in result.report()


def test_a_wrong_attention_factor_alone_is_reported_with_both_values():
    def yarn(d, base, s, L, beta_fast=32.0, beta_slow=1.0):
        return yarn_like_transformers(d, base, s, L, beta_fast, beta_slow)[0], math.log(s)

    report = check.yarn_frequencies(yarn).report()
    assert "Likely bug" not in report and "attention_factor: expected" in report


def test_float32_frequencies_are_named_as_the_wrong_dtype():
    report = check.pi_frequencies(lambda d, base, s: pi_reciprocal(d, base, s).float()).report()
    assert "wrong dtype: expected torch.float64, got torch.float32" in report
