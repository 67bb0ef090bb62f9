"""What every check must do, for every check of ``mhbook.check`` (a new one is covered by
being registered): its reference and the other correct implementations of its group's test
file pass (one of them written as ``transformers`` writes the mechanism, where it has it);
each catalogued bug, run as the reader's code, fails and is named with its fix, also when it
returns only the outputs the contract requires; each bug fails a case by far more than the
tolerance; NaN, a wrong shape, a wrong dtype and an input edited in place never pass; every
case names the axes of its outputs; the contract states the tolerance."""

from __future__ import annotations

import math

import pytest
import torch
from grading import (
    WORDS,
    alternatives,
    assert_named,
    assert_passes,
    corrupt,
    floating_inputs,
    in_place,
    required_only,
)

from mhbook import check
from mhbook.check.grader import compare

pytestmark = pytest.mark.slow(seconds=60)

NAMES = sorted(check.CHECKS)

#: The checks whose mechanism ``transformers`` does not ship, and what it has instead.
NOT_IN_TRANSFORMERS = {
    "tiled_attention": "its attention kernels are PyTorch's or FlashAttention's, in C++",
    "tensor_parallel": "its tensor parallelism shards nn.Linear layers by a plan",
    "previous_token_score": "scores of heads are TransformerLens's, not transformers'",
    "induction_score": "scores of heads are TransformerLens's, not transformers'",
}

#: By how much (a multiple of the tolerance) each bug must fail at least one case, so that
#: no reasonable tolerance lets a catalogued bug pass.
SEPARATION = 10.0


@pytest.mark.parametrize("name", NAMES)
def test_the_reference_and_other_correct_implementations_pass(name):
    checker = check.CHECKS[name]
    others = alternatives(checker)
    assert len(others) >= 2, f"check.{name}: fewer than two other correct implementations"
    for impl in (checker.spec.reference, *others):
        assert_passes(checker, impl)
    by_transformers = [impl for impl in others if getattr(impl, "transformers", False)]
    if name in NOT_IN_TRANSFORMERS:
        assert not by_transformers
    else:
        assert by_transformers, f"check.{name}: no implementation as transformers writes it"


@pytest.mark.parametrize("name", NAMES)
def test_every_catalogued_bug_is_named_also_from_the_required_outputs_alone(name):
    checker = check.CHECKS[name]
    assert checker.spec.bugs, f"check.{name} catalogues no bug"
    for bug in checker.spec.bugs:
        assert_named(checker, bug.impl, bug)
        if checker.spec.optional:
            assert_named(checker, required_only(bug.impl, checker), bug)


@pytest.mark.parametrize("name", NAMES)
def test_every_bug_fails_a_case_by_far_more_than_the_tolerance(name):
    spec = check.CHECKS[name].spec
    if spec.tolerances is None:
        pytest.skip("compared exactly: any difference fails")
    for bug in spec.bugs:
        excess = 0.0
        for case, want in spec.prepared():
            try:
                got = spec.run_impl(bug.impl, case.fresh())
            except Exception:
                excess = math.inf
                break
            excess = max(excess, compare(want, got, case, spec)[2])
        assert excess >= SEPARATION, f"check.{name}: {bug.name!r} fails by {excess:.3g}x only"


@pytest.mark.parametrize("name", NAMES)
def test_nan_a_wrong_shape_or_dtype_and_inputs_edited_in_place_never_pass(name):
    checker = check.CHECKS[name]
    reference = checker.spec.reference
    for how, word in WORDS.items():
        if how == "nan" and checker.spec.tolerances is None:
            continue  # masks and copies: no NaN to make
        result = checker(corrupt(reference, how))
        assert not result, f"check.{name} passed an output with {how} corrupted"
        assert word in result.report(), result.report()
    if floating_inputs(checker):
        result = checker(in_place(reference))
        assert not result and "edited its input" in result.report(), result.report()
        assert result.bug is None


@pytest.mark.parametrize("name", NAMES)
def test_every_case_names_the_axes_of_its_outputs(name):
    spec = check.CHECKS[name].spec
    for case, want in spec.prepared():
        for key, value in want.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                dims = case.dims.get(key)
                assert dims is not None, f"check.{name}: {case.name!r} names no axes of {key!r}"
                assert len(dims) == value.dim(), f"check.{name}: {case.name!r}: {dims} for {key}"


@pytest.mark.parametrize("name", NAMES)
def test_the_contract_states_the_tolerance(name):
    checker = check.CHECKS[name]
    assert "Tolerance:" in checker.__doc__ and "Tolerance:" in checker.spec.contract
    if checker.spec.tolerances is not None:
        rtol, atol = checker.spec.tolerance(torch.float64)
        assert f"rtol {rtol:.0e}".replace("e-0", "e-") in checker.__doc__
