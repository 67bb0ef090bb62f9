"""What every test of a check (``mhbook.check``) asserts, written once: the reference passes,
each catalogued bug is caught and named, and NaN, a wrong shape or a wrong dtype never pass.

``corrupt(fn, how)`` wraps a function implementation so that its first tensor output is
corrupted; the checks of modules corrupt their own way.
"""

from __future__ import annotations

import torch


def assert_passes(check_fn, impl) -> None:
    result = check_fn(impl)
    assert result, result.report()
    assert result.bug is None


def assert_every_bug_named(check_fn) -> None:
    """Each catalogued bug, run as the reader's code, fails the check and is named."""
    spec = check_fn.spec
    assert spec.bugs, f"check.{spec.name} catalogues no bug"
    for bug in spec.bugs:
        result = check_fn(bug.impl)
        assert not result, f"check.{spec.name} passed the bug {bug.name!r}"
        assert result.bug is bug, (
            f"check.{spec.name}: {bug.name!r} was reported as "
            f"{result.bug.name if result.bug else 'no known bug'}:\n{result.report()}"
        )
        assert bug.name in result.report() and bug.fix in result.report()


def _first_tensor(out, change):
    if isinstance(out, torch.Tensor):
        return change(out)
    if isinstance(out, (tuple, list)):
        done, new = False, []
        for x in out:
            if not done and isinstance(x, torch.Tensor):
                x, done = change(x), True
            new.append(x)
        return type(out)(new)
    raise TypeError(f"no tensor among the outputs: {type(out).__name__}")


CORRUPTIONS = {
    "nan": lambda t: (
        t.clone().flatten().index_fill(0, torch.tensor([0]), float("nan")).view_as(t)
        if t.is_floating_point()
        else t
    ),
    "shape": lambda t: t.unsqueeze(0),
    "dtype": lambda t: t.double() if t.dtype != torch.float64 else t.float(),
}


def corrupt(impl, how: str):
    """``impl`` with its first tensor output corrupted: a NaN, an extra dimension, or another
    dtype."""

    def corrupted(*args, **kwargs):
        return _first_tensor(impl(*args, **kwargs), CORRUPTIONS[how])

    corrupted.__signature__ = __import__("inspect").signature(impl)
    return corrupted


def assert_rejects_corruptions(check_fn, impl=None) -> None:
    """NaN, a wrong shape and a wrong dtype never pass, and the report names the problem."""
    impl = impl or check_fn.spec.reference
    words = {"nan": "NaN", "shape": "wrong shape", "dtype": "wrong dtype"}
    for how, word in words.items():
        result = check_fn(corrupt(impl, how))
        assert not result, f"check.{check_fn.spec.name} passed an output with {how} corrupted"
        assert word in result.report(), result.report()
