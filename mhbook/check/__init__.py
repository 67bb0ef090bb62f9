"""Checks of the reader's own code: every mechanism the book builds by hand, graded against
the book's references, with the common bugs named.

Write your own version of a mechanism, then hand it to its check::

    from mhbook import check

    def my_attention(q, k, v, mask=None):
        ...

    check.attention(my_attention)   # a report; truthy when every case passed

Each check's docstring is its contract: the signature your function or module must have,
and the tolerance it is held to. A check runs your code on small, hard cases (a fully masked
row, ``T_q < T_k``, batch 1, odd sizes, float16 with large scores, positions that do not
start at 0), compares it with code we did not write where it exists (PyTorch's built-ins,
Hugging Face ``transformers``), and when your outputs equal those of a known bug on every
case, it says which bug and how to fix it. A failure shows where your values differ, by how
much, and what the tolerance allows there.

Every call of your code gets fresh copies of the inputs; code that edits its inputs in place
fails, since that breaks autograd and changes the caller's tensors. Each call has
``mhbook.check.grader.TIME_LIMIT`` seconds (30) to return: a call that runs longer is
stopped where Python allows (on the main thread of a notebook or a script, by a ``SIGALRM``
timer; elsewhere the check stops waiting for it), and the report names the case.
``python -m mhbook.check`` lists the checks and runs one on any importable function.
"""

from __future__ import annotations

import importlib

from .grader import Bug, Case, Check, Result

#: The modules that hold the checks, in the book's order.
MODULES = (
    "basics",
    "encodings",
    "decoding",
    "sharing",
    "positions",
    "windows",
    "parallel",
    "llama",
    "scaling",
    "circuits",
)


def _collect(modules=MODULES) -> dict:
    """Every check of ``modules``, by name. A module that fails to import raises, naming it:
    a check missing from the registry would be skipped by every test that walks it."""
    found = {}
    for name in modules:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except Exception as error:
            raise ImportError(
                f"mhbook.check: the checks of {__name__}.{name} failed to import: "
                f"{type(error).__name__}: {error}"
            ) from error
        for attr in getattr(module, "__all__", ()):
            fn = getattr(module, attr)
            if hasattr(fn, "spec"):
                found[fn.spec.name] = fn
    return found


#: Every check, by name: ``CHECKS["attention"]`` is :func:`mhbook.check.basics.attention`.
CHECKS = _collect()
globals().update(CHECKS)

__all__ = ["CHECKS", "Bug", "Case", "Check", "Result", *CHECKS]
