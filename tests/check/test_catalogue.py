"""What every check must do, for every check of ``mhbook.check`` (a new one is covered by
being registered): its reference and the other correct implementations of its group's test
file pass (one of them written as ``transformers`` writes the mechanism, where it has it);
each catalogued bug, run as the reader's code, fails and is named with its fix; every case
names the axes of its outputs; the contract states the tolerance.
``test_catalogue_robustness.py`` adds what takes longer."""

from __future__ import annotations

import pytest
import torch
from grading import alternatives, assert_named, assert_passes

from mhbook import check

NAMES = sorted(check.CHECKS)

#: The checks whose mechanism ``transformers`` does not ship, and what it has instead.
NOT_IN_TRANSFORMERS = {
    "tiled_attention": "its attention kernels are PyTorch's or FlashAttention's, in C++",
    "tensor_parallel": "its tensor parallelism shards nn.Linear layers by a plan",
    "previous_token_score": "scores of heads are TransformerLens's, not transformers'",
    "induction_score": "scores of heads are TransformerLens's, not transformers'",
}


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
def test_every_catalogued_bug_is_caught_and_named(name):
    checker = check.CHECKS[name]
    assert checker.spec.bugs, f"check.{name} catalogues no bug"
    for bug in checker.spec.bugs:
        assert_named(checker, bug.impl, bug)


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
