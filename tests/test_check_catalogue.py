"""What every check must do, for every check of ``mhbook.check`` (a new one is covered by
being registered): its reference passes, and each catalogued bug, run as the reader's code,
fails the check and is named with its fix. The per-group files (``test_check_*.py``) add the
correct implementations written otherwise and the corruptions that must never pass."""

from __future__ import annotations

import pytest
from grading import assert_every_bug_named, assert_passes

from mhbook import check


@pytest.mark.parametrize("name", sorted(check.CHECKS))
def test_the_reference_passes_and_every_catalogued_bug_is_named(name):
    checker = check.CHECKS[name]
    assert_passes(checker, checker.spec.reference)
    assert_every_bug_named(checker)
