"""The grader's own tests for ``mhbook.check.scaling``: chapter 16's position interpolation,
NTK-aware scaling and YaRN frequencies (the other correct implementations, run by
``test_catalogue.py``, and what is special here)."""

from __future__ import annotations

import math

import pytest
import torch
from grading import assert_named, by_transformers

from mhbook import check

pytest.importorskip("transformers")

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


def _config(d, base, rope_parameters, max_position_embeddings):
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=2 * d,
        num_attention_heads=2,
        head_dim=d,
        max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_theta": base, **rope_parameters},
    )


@by_transformers
def pi_transformers(d, base, s):
    """transformers' own ``ROPE_INIT_FUNCTIONS["linear"]`` (float32), as float64."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = _config(d, base, {"rope_type": "linear", "factor": s}, 64)
    return ROPE_INIT_FUNCTIONS["linear"](config)[0].double()


@by_transformers
def ntk_transformers(d, base, s):
    """transformers' own ``ROPE_INIT_FUNCTIONS["dynamic"]`` (float32) at the length where
    its growing factor is s, L (2 - 1/s), as float64; the base by the formula."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    L = 64 * round(s * 2)  # so that L (2 - 1/s) is a whole number of positions
    config = _config(d, base, {"rope_type": "dynamic", "factor": s}, L)
    theta, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=round(L * (2 - 1 / s)))
    return theta.double(), base * s ** (d / (d - 2))


@by_transformers
def yarn_transformers(d, base, s, L, beta_fast=32.0, beta_slow=1.0):
    """transformers' own ``ROPE_INIT_FUNCTIONS["yarn"]`` (float32), as float64, with its
    attention factor."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    parameters = {
        "rope_type": "yarn",
        "factor": s,
        "original_max_position_embeddings": L,
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
    }
    theta, factor = ROPE_INIT_FUNCTIONS["yarn"](_config(d, base, parameters, round(s * L)))
    return theta.double(), factor


ALTERNATIVES = {
    "pi_frequencies": (pi_reciprocal, pi_list, pi_transformers),
    "ntk_frequencies": (ntk_log, ntk_per_pair, ntk_transformers),
    "yarn_frequencies": (yarn_like_transformers, yarn_by_turns, yarn_transformers),
}


def test_yarn_without_betas_is_checked_on_the_defaults_and_says_so():
    def yarn(d, base, s, L):
        return yarn_like_transformers(d, base, s, L)

    result = check.yarn_frequencies(yarn)
    assert result and "Skipped" in result.report() and "takes no beta_fast" in result.report()


def test_a_wrong_attention_factor_alone_is_reported_with_both_values():
    def yarn(d, base, s, L, beta_fast=32.0, beta_slow=1.0):
        return yarn_like_transformers(d, base, s, L, beta_fast, beta_slow)[0], math.log(s)

    report = check.yarn_frequencies(yarn).report()
    assert "Likely bug" not in report
    assert (
        "attention_factor: expected 1.2079442, got 2.0794415: |got - expected| = 0.87 > " in report
    )
    assert "(rtol 1e-5, atol 1e-7)" in report


def test_float32_frequencies_are_named_as_the_wrong_dtype():
    report = check.pi_frequencies(lambda d, base, s: pi_reciprocal(d, base, s).float()).report()
    assert "wrong dtype: expected torch.float64, got torch.float32" in report


# --- required outputs are required (issue 38) ------------------------------------------------


def test_the_frequencies_alone_fail_where_the_contract_asks_for_more():
    """NTK's new base and YaRN's attention factor are required outputs: theta alone fails."""
    ntk = check.ntk_frequencies(lambda d, base, s: ntk_log(d, base, s)[0])
    assert not ntk and "returned no 'new_base'" in ntk.report()
    assert "the contract asks for (theta, new_base)" in ntk.report()

    def theta_only(d, base, s, L, beta_fast=32.0, beta_slow=1.0):
        return yarn_like_transformers(d, base, s, L, beta_fast, beta_slow)[0]

    yarn = check.yarn_frequencies(theta_only)
    assert not yarn and "returned no 'attention_factor'" in yarn.report()


def test_yarn_with_high_clamped_to_the_last_pair_is_caught_and_named():
    def clamped(d, base, s, L, beta_fast=32.0, beta_slow=1.0):
        def dim(turns):
            return d * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = max(math.floor(dim(beta_fast)), 0), min(math.ceil(dim(beta_slow)), d // 2 - 1)
        ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        return theta / s * ramp + theta * (1 - ramp), 0.1 * math.log(s) + 1

    (bug,) = [b for b in check.yarn_frequencies.spec.bugs if "d/2 - 1" in b.name]
    assert_named(check.yarn_frequencies, clamped, bug)
