"""What the tests of the checks (``mhbook.check``) share, written once: an implementation
passes, each catalogued bug is caught and named, NaN, a wrong shape or a wrong dtype never
pass, and the tables of other correct implementations that ``tests/check/test_<module>.py``
keep for the checks of ``mhbook/check/<module>.py``.

``corrupt(impl, how)`` wraps an implementation (a function, or a class whose ``forward`` or
``update`` returns the outputs) so that its first tensor output is corrupted;
``in_place(impl)`` so that it edits its first floating-point input in place after computing
a correct answer; ``required_only(impl, check)`` so that it returns only the outputs the
check's contract requires.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent


def assert_passes(check_fn, impl) -> None:
    result = check_fn(impl)
    assert result, result.report()
    assert result.bug is None


def assert_named(check_fn, impl, bug) -> None:
    """``impl`` fails ``check_fn`` and is named ``bug`` (``None``: named no bug)."""
    result = check_fn(impl)
    name = check_fn.spec.name
    assert not result, f"check.{name} passed {getattr(impl, '__name__', impl)}"
    assert result.bug is bug, (
        f"check.{name}: expected {bug.name if bug else 'no known bug'!r}, reported "
        f"{result.bug.name if result.bug else 'no known bug'!r}:\n{result.report()}"
    )
    if bug is not None:
        assert bug.name in result.report() and bug.fix in result.report()


def assert_every_bug_named(check_fn) -> None:
    """Each catalogued bug, run as the reader's code, fails the check and is named."""
    spec = check_fn.spec
    assert spec.bugs, f"check.{spec.name} catalogues no bug"
    for bug in spec.bugs:
        assert_named(check_fn, bug.impl, bug)


# --- wrapping an implementation ------------------------------------------------------------


def _wrap(impl, change_outputs=None, before=None):
    """``impl`` (a function, or a class whose ``forward`` or ``update`` returns the outputs)
    with ``before(args, kwargs)`` run on its arguments and ``change_outputs`` on its
    outputs, after the call."""

    def wrapped_call(fn, *args, **kwargs):
        out = fn(*args, **kwargs)
        if before is not None:
            before(args, kwargs)
        return change_outputs(out) if change_outputs else out

    if isinstance(impl, type):

        def wrap_method(original):
            def method(self, *args, **kwargs):
                return wrapped_call(original, self, *args, **kwargs)

            return method

        methods = {
            n: wrap_method(getattr(impl, n)) for n in ("forward", "update") if hasattr(impl, n)
        }
        return type(impl.__name__, (impl,), methods)

    @functools.wraps(impl)
    def wrapped(*args, **kwargs):
        return wrapped_call(impl, *args, **kwargs)

    wrapped.__signature__ = inspect.signature(impl)
    return wrapped


def _first_tensor(out, change):
    if isinstance(out, (float, np.floating)):  # a score of one head
        out = np.asarray(out)
    if isinstance(out, (torch.Tensor, np.ndarray)):
        return change(out)
    if isinstance(out, (tuple, list)):
        done, new = False, []
        for x in out:
            if not done and isinstance(x, (torch.Tensor, np.ndarray)):
                x, done = change(x), True
            new.append(x)
        return type(out)(new)
    raise TypeError(f"no tensor among the outputs: {type(out).__name__}")


def _nan(t):
    if isinstance(t, np.ndarray):
        t = t.astype(float).copy()
        t.flat[0] = np.nan
        return t
    if not t.is_floating_point():
        return t
    return t.clone().flatten().index_fill(0, torch.tensor([0]), float("nan")).view_as(t)


def _other_dtype(t):
    if isinstance(t, np.ndarray):
        return t.astype(np.float16)
    return t.to(torch.float32 if t.dtype == torch.float16 else torch.float16)


CORRUPTIONS = {
    "nan": _nan,
    "shape": lambda t: t[None],
    "dtype": _other_dtype,
}
WORDS = {"nan": "NaN", "shape": "wrong shape", "dtype": "wrong dtype"}


def corrupt(impl, how: str):
    """``impl`` with its first tensor output corrupted: a NaN, an extra dimension, or another
    dtype (float16, or float32 for float16)."""
    return _wrap(impl, change_outputs=lambda out: _first_tensor(out, CORRUPTIONS[how]))


def in_place(impl):
    """``impl``, then its first floating-point tensor (or NumPy array) argument doubled in
    place: a correct answer from a function that changes its caller's tensors."""

    def edit(args, kwargs):
        for value in list(args) + list(kwargs.values()):
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                value.mul_(2.0)
                return
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                value *= 2.0  # the checks of chapter 15 hand NumPy arrays
                return

    return _wrap(impl, before=edit)


def required_only(impl, check_fn):
    """``impl`` returning only the outputs its check requires (the weights dropped, for
    instance), as the contracts allow."""
    spec = check_fn.spec
    if not spec.optional:
        return impl

    def keep(out):
        if isinstance(out, (tuple, list)):
            out = out[: len(spec.outputs)]
            return out[0] if len(out) == 1 else out
        return out

    return _wrap(impl, change_outputs=keep)


def floating_inputs(check_fn) -> bool:
    """Whether the check's cases hand the reader a floating-point tensor it could edit."""
    for case in check_fn.spec.cases():
        for value in list(case.args) + list(case.kwargs.values()):
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                return True
    return False


# --- the tables of other correct implementations ---------------------------------------------


def by_transformers(fn):
    """Mark ``fn`` as written the way ``transformers`` writes the mechanism, or built on
    ``transformers`` itself."""
    fn.transformers = True
    return fn


@functools.cache
def _group(module: str):
    """``tests/check/test_<module>.py``, loaded once for its ``ALTERNATIVES``."""
    path = HERE / "check" / f"test_{module}.py"
    name = f"_grading_alternatives_{module}"
    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded
    spec.loader.exec_module(loaded)
    return loaded


def alternatives(check_fn) -> tuple:
    """The other correct implementations of ``check_fn`` in its group's test file."""
    module = check_fn.__module__.rsplit(".", 1)[-1]
    return tuple(_group(module).ALTERNATIVES.get(check_fn.spec.name, ()))
