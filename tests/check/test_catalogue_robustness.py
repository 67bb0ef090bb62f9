"""What every check must also withstand, for every check of ``mhbook.check`` (the longer
half of ``test_catalogue.py``): each catalogued bug is named from the outputs the contract
requires alone; each bug fails a case by far more than the tolerance; NaN, a wrong shape,
a wrong dtype and inputs edited in place never pass."""

from __future__ import annotations

import math

import pytest
from grading import WORDS, assert_named, corrupt, floating_inputs, in_place, required_only

from mhbook import check
from mhbook.check.grader import compare

pytestmark = pytest.mark.slow(seconds=45)

NAMES = sorted(check.CHECKS)

#: By how much (a multiple of the tolerance) each bug must fail at least one case, so that
#: no reasonable tolerance lets a catalogued bug pass.
SEPARATION = 10.0


@pytest.mark.parametrize("name", [n for n in NAMES if check.CHECKS[n].spec.optional])
def test_every_catalogued_bug_is_named_from_the_required_outputs_alone(name):
    """The contracts allow the output alone where the weights are optional."""
    checker = check.CHECKS[name]
    for bug in checker.spec.bugs:
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
