"""The grader behind every check: run the reader's code on hard cases, compare it with a
reference within a stated tolerance, show where and by how much it differs, and name the bug
when it is a known one.

A :class:`Check` holds

* ``cases``: small, seeded inputs, hard on purpose (a fully masked row, ``T_q < T_k``,
  batch 1, odd sizes, float16 with large scores, positions that do not start at 0), each
  naming the axes of its outputs (``dims``);
* ``expected``: what the reader's code must return for a case, computed with code we did
  not write where it exists (PyTorch's built-ins, ``transformers``), else with mhbook's
  own tested code;
* ``outputs`` and ``optional``: the outputs the contract requires (graded, and missing one
  fails) and those it allows (graded when returned, such as attention weights);
* ``tolerances``: ``(rtol, atol)`` by dtype, chosen per check from what the mechanism needs
  and stated in its contract (``exact`` for masks and copies);
* ``reference``: a plain implementation of the contract, written for teaching, from which
  each catalogued :class:`Bug` is one mutation. The tests check that ``reference`` passes
  and that each bug is caught and named;
* ``call``: how a case is handed to the reader's function or module.

How a check runs the reader's code (:func:`run`):

* every call gets fresh copies of the case's inputs, so nothing one call does reaches the
  next; a call that edits its inputs in place fails, and the report says which input (that
  breaks autograd and changes the caller's tensors);
* every call has :data:`TIME_LIMIT` seconds to return: on the main thread (a notebook, a
  script) a ``SIGALRM`` timer stops a call that runs longer, where the platform has one;
  elsewhere the call runs in a daemon thread that the check stops waiting for (it cannot be
  stopped, and may go on running in the background). Either way the report says which case
  ran out of time, and the check runs no further case;
* a function whose body is still ``...`` or ``pass`` (or that raises
  ``NotImplementedError``) is "not written yet"; one that returns ``None`` otherwise is
  asked whether it forgot ``return``.

When the reader's outputs (those it returned) equal a bug's outputs on every case, the
report names the bug and its fix. Every failure shows the size of the difference against the
tolerance, with digits enough to see it, at the worst value of the smallest failing case and
of the case that fails by most.

Written by hand for the book: no test library grades a reader's function against
mutants and explains which one it matched.
"""

from __future__ import annotations

import copy
import dis
import functools
import inspect
import math
import signal
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "Case",
    "Bug",
    "Check",
    "Result",
    "Outcome",
    "define",
    "run",
    "seeded",
    "TOLERANCES",
    "TIME_LIMIT",
]

#: The default tolerances by dtype, ``(rtol, atol)``: a value passes when
#: ``|got - expected| <= atol + rtol * |expected|``. float64 cases admit code that computes
#: in float32 inside (as Hugging Face's models do), a few hundred float32 roundings away from
#: the exact value; a check states its own where its mechanism needs other ones.
TOLERANCES = {
    torch.float64: (1e-5, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}

#: Seconds each call of the reader's code may take before the check stops it (or stops
#: waiting for it). The cases are small: a correct implementation needs milliseconds.
TIME_LIMIT = 30.0

#: How close the reader's outputs must be to a bug's to be named after it: within the
#: tolerance, plus this share of how far the bug's own outputs are from the expected ones on
#: that case. Code that makes a bug while computing in another precision (RoPE's angles in
#: float32, far from 0) is then still named; two bugs far apart are never confused.
NAMING_SLACK = 0.01


def seeded(*shape, seed: int, dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    """A seeded standard normal tensor (times ``scale``), the same on every machine: drawn in
    float64, then cast, so that a case's values do not depend on its dtype's generator."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


@dataclass
class Case:
    """One input of a check.

    Attributes:
        name: what makes it hard, e.g. ``"a fully masked row"``.
        args: the positional arguments handed to the reader's callable.
        kwargs: its keyword arguments.
        dims: for each tensor output, the names of its dimensions (``("batch", "query",
            "key")``), used to say where a difference is. Every case names them (the
            grader's tests refuse a case that does not).
        needs: keyword arguments the case needs the reader's callable to accept; a callable
            without them skips the case, and the report says so.
    """

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    dims: dict = field(default_factory=dict)
    needs: tuple = ()

    @property
    def size(self) -> int:
        """How big the case is to read: the number of input elements."""
        return sum(t.numel() for t in _tensors(self.args) + _tensors(list(self.kwargs.values())))

    def fresh(self) -> Case:
        """A copy whose inputs are copies (tensors and modules included): what one call of
        the reader's code gets, so that nothing it does reaches another call."""
        args, kwargs = copy.deepcopy((self.args, self.kwargs))
        return Case(self.name, args, kwargs, self.dims, self.needs)


@dataclass
class Bug:
    """A common mistake, as a mutation of the check's reference.

    Attributes:
        name: the mistake in a few words, e.g. ``"scores scaled by sqrt(d_model)"``.
        fix: one sentence that says what to change.
        impl: an implementation of the check's contract that makes exactly this mistake.
    """

    name: str
    fix: str
    impl: Any


@dataclass
class Check:
    """A check of one mechanism (see the module's docstring)."""

    name: str
    title: str
    contract: str
    cases: Callable[[], list[Case]]
    expected: Callable[[Case], Any]
    reference: Any
    bugs: list[Bug] = field(default_factory=list)
    call: Callable[[Any, Case], Any] | None = None
    outputs: tuple[str, ...] = ("output",)
    optional: tuple[str, ...] = ()
    chapter: str = ""
    params: tuple[str, ...] = ()
    tolerances: dict | None = None  # None: compared exactly
    _prepared: list | None = field(default=None, repr=False)

    def __call__(self, impl) -> Result:
        return run(self, impl)

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        """``(rtol, atol)`` for outputs of ``dtype`` (``(0, 0)``: exactly)."""
        if self.tolerances is None or not dtype.is_floating_point:
            return 0.0, 0.0
        return self.tolerances.get(dtype, (0.0, 0.0))

    def prepared(self) -> list[tuple[Case, dict]]:
        """The cases with their expected outputs, built once (on first use)."""
        if self._prepared is None:
            with torch.no_grad():
                cases = self.cases()
                self._prepared = [(c, self._named(self.expected(c.fresh()))) for c in cases]
        return self._prepared

    def run_impl(self, impl, case: Case) -> dict:
        """The outputs of ``impl`` on ``case``, as a dict ``name -> value``."""
        got = self.call(impl, case) if self.call else impl(*case.args, **case.kwargs)
        return self._named(got)

    def _named(self, got) -> dict:
        if isinstance(got, dict):
            return got
        names = self.outputs + self.optional
        if isinstance(got, (tuple, list)) and len(names) > 1:
            return dict(zip(names, got))
        return {names[0]: got}


def define(
    *,
    title: str,
    cases: Callable[[], list[Case]],
    expected: Callable[[Case], Any],
    reference: Any,
    bugs: Sequence[Bug] = (),
    call: Callable[[Any, Case], Any] | None = None,
    outputs: tuple[str, ...] = ("output",),
    optional: tuple[str, ...] = (),
    chapter: str = "",
    params: tuple[str, ...] = (),
    tolerances: dict | str | None = None,
    why: str = "",
):
    """Make a check from a function whose docstring is the contract (its body is unused).

    ``outputs`` names the outputs the contract requires, in the order a tuple returns them;
    ``optional`` those it allows after them (graded when returned). ``params`` names the
    positional arguments in reports (``("q", "k", "v")``). ``tolerances`` is ``"exact"``, or
    ``(rtol, atol)`` by dtype replacing :data:`TOLERANCES`' (``None``: the defaults); ``why``
    says why they suit the mechanism. The tolerance is added to the contract. The check is
    the decorated name, called on the reader's implementation:
    ``check.attention(my_attention) -> Result``; ``check.attention.spec`` is its
    :class:`Check`. The cases are built once, on first use.
    """
    if tolerances == "exact":
        table = None
    else:
        table = {**TOLERANCES, **(tolerances or {})}

    def wrap(fn):
        contract = (inspect.getdoc(fn) or "") + "\n\n" + _tolerance_text(table, why)
        spec = Check(
            name=fn.__name__,
            title=title,
            contract=contract,
            cases=cases,
            expected=expected,
            reference=reference,
            bugs=list(bugs),
            call=call,
            outputs=tuple(outputs),
            optional=tuple(optional),
            chapter=chapter,
            params=params,
            tolerances=table,
        )

        @functools.wraps(fn)
        def checker(impl) -> Result:
            return run(spec, impl)

        checker.__doc__ = contract
        checker.spec = spec
        return checker

    return wrap


def _tolerance_text(table: dict | None, why: str) -> str:
    if table is None:
        text = "Tolerance: none; compared exactly."
    else:
        shown = [torch.float64, torch.float32, torch.float16]
        each = ", ".join(
            f"rtol {_g(table[d][0])}, atol {_g(table[d][1])} for {str(d).removeprefix('torch.')}"
            for d in shown
        )
        text = f"Tolerance: each value within atol + rtol * abs(expected): {each}."
    return textwrap.fill(f"{text} {why}".strip(), width=92)


def _g(x: float) -> str:
    return f"{x:.0e}".replace("e-0", "e-").replace("e+00", "") if x else "0"


@dataclass
class Outcome:
    """What happened on one case: ``problem`` is ``None`` when the case passed.

    ``excess`` says by how much it failed: the largest ``|got - expected|`` relative to what
    the tolerance allows there (``inf`` for NaN, a wrong shape or an error; for exact
    comparisons, the number of values that differ)."""

    case: Case
    problem: str | None = None
    detail: str = ""
    got: dict | None = None
    skipped: str = ""
    excess: float = 0.0


@dataclass
class Result:
    """The verdict of a check: truthy when every case passed.

    ``repr()`` is the report a notebook shows; ``bug`` is the catalogued bug the reader's
    code matched, if any.
    """

    check: Check
    impl_name: str
    outcomes: list[Outcome]
    bug: Bug | None = None
    stub: str = ""

    @property
    def passed(self) -> bool:
        return not self.stub and all(o.problem is None for o in self.outcomes)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.problem is not None]

    def __repr__(self) -> str:
        return self.report()

    def report(self) -> str:
        head = f"check.{self.check.name}({self.impl_name})"
        ran = [o for o in self.outcomes if not o.skipped]
        skipped = [o for o in self.outcomes if o.skipped]
        if self.stub:
            return f"{head}: not written yet.\n{self.stub}"
        lines = []
        if self.passed:
            lines.append(f"{head}: passed all {len(ran)} cases ({self.check.title}).")
            lines += [f"  - {o.case.name}" for o in ran]
        else:
            failed = self.failed
            lines.append(f"{head}: FAILED {len(failed)} of {len(ran)} cases ({self.check.title}).")
            if self.bug is not None:
                lines.append(f"Likely bug: {self.bug.name}.")
                lines.append(f"  Fix: {self.bug.fix}")
            first = min(failed, key=lambda o: o.case.size)
            worst = max(failed, key=lambda o: (o.excess, -o.case.size))
            lines += _described("Smallest failing case", first)
            if worst is not first and worst.excess > first.excess:
                lines += _described("Largest difference (relative to the tolerance)", worst)
            others = [o.case.name for o in failed if o is not first and o is not worst]
            if others:
                lines.append("Also failing: " + "; ".join(others) + ".")
        for o in skipped:
            lines.append(f"Skipped: {o.case.name} ({o.skipped}).")
        return "\n".join(lines)

    def raise_for_failure(self) -> None:
        """Raise ``AssertionError`` with the report unless the check passed."""
        if not self.passed:
            raise AssertionError(self.report())


def _described(title: str, o: Outcome) -> list[str]:
    lines = [f'{title}: "{o.case.name}"', _indent(o.problem, "  ")]
    if o.detail:
        lines.append(_indent(o.detail, "  "))
    return lines


# --- running the reader's code ---------------------------------------------------------------


class TimeLimitExceeded(BaseException):
    """A call of the reader's code ran past :data:`TIME_LIMIT` (a ``BaseException``, so that
    the reader's own ``except Exception`` does not swallow it)."""


def run(check: Check, impl) -> Result:
    """Run ``impl`` on every case of ``check`` and compare it with the expected values."""
    name = getattr(impl, "__qualname__", None) or type(impl).__name__
    accepted = _keywords(impl, check)
    outcomes: list[Outcome] = []
    stopped = ""
    for case, want in check.prepared():
        missing = [k for k in case.needs if accepted is not None and k not in accepted]
        if stopped or missing:
            why = stopped or f"{name} takes no {', '.join(missing)}"
            outcomes.append(Outcome(case, skipped=why))
            continue
        fresh = case.fresh()
        try:
            call = functools.partial(check.run_impl, impl, fresh)
            got = _within_time_limit(call, TIME_LIMIT)
        except NotImplementedError:
            return Result(check, name, [], stub=_stub_message(check, name))
        except TimeLimitExceeded as error:
            outcomes.append(Outcome(case, str(error), _inputs(case, check.params), excess=math.inf))
            stopped = "not run: an earlier call ran out of time"
            continue
        except Exception as error:  # the reader's code raised: say what and where
            problem = f"raised {type(error).__name__}: {error}"
            outcomes.append(Outcome(case, problem, _inputs(case, check.params), excess=math.inf))
            continue
        if all(v is None or v is Ellipsis for v in got.values()):
            if _is_stub(impl):
                return Result(check, name, [], stub=_stub_message(check, name))
            problem = f"returned None: did you forget `return` at the end of {name}?"
            outcomes.append(Outcome(case, problem, "", got, excess=math.inf))
            continue
        problem, detail, excess = compare(want, got, case, check)
        edited = _edited_inputs(case, fresh, check.params)
        if edited:
            problem, excess = edited + ("" if problem is None else "\n" + problem), math.inf
        outcomes.append(Outcome(case, problem, detail, got, excess=excess))
    result = Result(check, name, outcomes)
    if not result.passed:
        result.bug = _recognise(check, result)
    return result


def _within_time_limit(call: Callable[[], Any], seconds: float):
    """``call()`` under ``torch.no_grad()``, stopped (``TimeLimitExceeded``) after
    ``seconds``: by a ``SIGALRM`` timer on the main thread where the platform has one, which
    interrupts the call, else in a daemon thread that is waited for ``seconds`` (the call
    cannot be interrupted there, and keeps running in the background)."""
    message = f"did not return within {seconds:g} s (an endless loop?)"
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        return _with_alarm(call, seconds, message)
    box: dict = {}

    def target():
        try:
            with torch.no_grad():
                box["value"] = call()
        except BaseException as error:  # handed back to the check's thread
            box["error"] = error

    thread = threading.Thread(target=target, daemon=True, name="mhbook.check call")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeLimitExceeded(message + "; it may still be running in the background")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _with_alarm(call, seconds: float, message: str):
    def stop(signum, frame):
        raise TimeLimitExceeded(message)

    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, stop)
    outer, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with torch.no_grad():
            return call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # someone else's timer (pytest-timeout's, say): set it going again
            left = max(outer - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, interval)


def _is_stub(impl) -> bool:
    """Whether ``impl`` is still an empty stub: a function whose body is only a docstring and
    ``...`` or ``pass`` (as the practice copies leave it), or a class whose ``forward``,
    ``update`` or ``__call__`` is one. Read from the compiled code, so it needs no source."""
    if isinstance(impl, type):
        methods = [vars(impl)[m] for m in ("forward", "update", "__call__") if m in vars(impl)]
        return any(_is_stub(m) for m in methods)
    code = getattr(inspect.unwrap(impl), "__code__", None)
    if code is None:
        return False
    ops = [(i.opname, i.argval) for i in dis.get_instructions(code)]
    ops = [op for op in ops if op[0] not in ("RESUME", "NOP", "CACHE")]
    return ops in ([("RETURN_CONST", None)], [("LOAD_CONST", None), ("RETURN_VALUE", None)])


def _edited_inputs(case: Case, fresh: Case, params: Sequence[str]) -> str:
    """What the reader's code changed in its inputs, in words (``""``: nothing)."""
    changed = []
    named = _named_inputs(case, params)
    for (name, before), (_, after) in zip(named, _named_inputs(fresh, params)):
        change = _change(before, after)
        if change is not None:
            changed.append(f"{name}{change}")
    if not changed:
        return ""
    return (
        f"edited its input {', '.join(changed)} in place: the caller's tensors change, and "
        "autograd fails or gives wrong gradients. Compute into new tensors (z = z - m, not "
        "z -= m; x.masked_fill, not x.masked_fill_)."
    )


def _change(before, after) -> str | None:
    """``None`` if ``after`` equals ``before``, else a few words on what changed."""
    if isinstance(before, torch.Tensor):
        same = before.shape == after.shape and before.dtype == after.dtype
        if same and bool(((before == after) | (before.isnan() & after.isnan())).all()):
            return None
        if not same or not before.is_floating_point():
            return ""
        return f" (changed by up to {_g3((after - before).abs().nan_to_num(math.inf).max())})"
    if isinstance(before, torch.nn.Module):
        for key, tensor in before.state_dict().items():
            if _change(tensor, after.state_dict()[key]) is not None:
                return f".{key}"
        return None
    if isinstance(before, (tuple, list)):
        for i, (b, a) in enumerate(zip(before, after)):
            change = _change(b, a)
            if change is not None:
                return f"[{i}]{change}"
    return None


def _named_inputs(case: Case, params: Sequence[str]) -> list[tuple[str, Any]]:
    named = [params[i] if i < len(params) else f"argument {i}" for i in range(len(case.args))]
    return list(zip(named, case.args)) + list(case.kwargs.items())


# --- comparing --------------------------------------------------------------------------------


def compare(want: dict, got: dict, case: Case, check: Check) -> tuple[str | None, str, float]:
    """``(problem, detail, excess)`` for the first output that differs (``(None, "", e)`` when
    none does, ``e`` the largest difference relative to the tolerance). A required output
    that is missing fails; an optional one is compared when returned."""
    excess = 0.0
    for key, expected in want.items():
        if key not in got:
            if key in check.optional:
                continue
            problem = f"returned no {key!r}"
            if key in check.outputs and len(check.outputs) > 1:
                problem += f": the contract asks for ({', '.join(check.outputs)})"
            return problem, "", math.inf
        problem, detail, ratio = _difference(key, expected, got[key], case, check)
        if problem:
            return problem, detail, ratio
        excess = max(excess, ratio)
    return None, "", excess


def _difference(key, expected, got, case: Case, check: Check):
    inputs = _inputs(case, check.params)
    if not isinstance(expected, torch.Tensor):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if _same_value(expected, got, *check.tolerance(torch.float64)):
            return None, "", 0.0
        if isinstance(expected, float) and isinstance(got, (int, float)):
            e, g = _digits(expected, float(got))
            rtol, atol = check.tolerance(torch.float64)
            diff, allowed = abs(float(got) - expected), atol + rtol * abs(expected)
            problem = (
                f"{key}: expected {e}, got {g}: |got - expected| = {_g3(diff)} > allowed "
                f"{_g3(allowed)} (rtol {_g(rtol)}, atol {_g(atol)})"
            )
            return problem, inputs, diff / allowed if allowed else math.inf
        return f"{key}: expected {expected!r}, got {got!r}", inputs, math.inf
    if not isinstance(got, torch.Tensor):
        what = type(got).__name__
        return (
            f"{key}: expected a tensor of shape {tuple(expected.shape)}, got a {what}",
            "",
            math.inf,
        )
    if got.shape != expected.shape:
        return (
            f"{key} has the wrong shape: expected {tuple(expected.shape)}, got {tuple(got.shape)}",
            inputs,
            math.inf,
        )
    if got.dtype != expected.dtype:
        return (
            f"{key} has the wrong dtype: expected {expected.dtype}, got {got.dtype} "
            "(keep the inputs' dtype)",
            inputs,
            math.inf,
        )
    got, expected = got.detach().cpu(), expected.detach().cpu()
    dims = case.dims.get(key)
    if expected.is_floating_point():
        bad_nan = torch.isnan(got) & ~torch.isnan(expected)
        if bad_nan.any():
            i = _index(bad_nan)
            problem = (
                f"{key} holds NaN at {_where(i, dims)}, where {_num(expected[i])} is expected "
                f"({int(bad_nan.sum())} of {bad_nan.numel()} values are NaN)"
            )
            return problem, inputs + "\n" + _side_by_side(key, expected, got, i), math.inf
    rtol, atol = check.tolerance(expected.dtype)
    ratio = _ratios(expected, got, rtol, atol)
    wrong = ratio > 1
    if not bool(wrong.any()):
        return None, "", float(ratio.max()) if ratio.numel() else 0.0
    if rtol == 0 and atol == 0:
        i = _index(wrong)
        e, g = _digits(expected[i].item(), got[i].item())
        problem = (
            f"{key} differs at {int(wrong.sum())} of {wrong.numel()} values (compared exactly); "
            f"the first is at {_where(i, dims)}: expected {e}, got {g}"
        )
        excess = float(wrong.sum())
    else:
        i = _index(ratio == ratio.max())
        e, g = _digits(expected[i].item(), got[i].item())
        diff = abs(got[i].item() - expected[i].item())
        allowed = atol + rtol * abs(expected[i].item())
        problem = (
            f"{key} is outside the tolerance at {int(wrong.sum())} of {wrong.numel()} values; "
            f"the worst is at {_where(i, dims)}:\n"
            f"  expected {e}, got {g}: |got - expected| = {_g3(diff)} > allowed {_g3(allowed)} "
            f"(rtol {_g(rtol)}, atol {_g(atol)})"
        )
        excess = float(ratio[i])
    return problem, inputs + "\n" + _side_by_side(key, expected, got, i), excess


def _ratios(expected: torch.Tensor, got: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """``|got - expected| / (atol + rtol |expected|)`` elementwise: above 1 is outside the
    tolerance (``inf`` where an exact comparison differs, or an infinity is not matched;
    0 where both are NaN or the same infinity)."""
    if not expected.is_floating_point():
        return torch.where(expected == got, 0.0, math.inf)
    if rtol == 0 and atol == 0:
        return torch.where((expected == got) | (expected.isnan() & got.isnan()), 0.0, math.inf)
    e, g = expected.double(), got.double()
    same = (e == g) | (e.isnan() & g.isnan())
    ratio = (g - e).abs() / (atol + rtol * e.abs())
    return torch.where(same, 0.0, ratio.nan_to_num(math.inf))


def _same_value(a, b, rtol: float = 0.0, atol: float = 0.0) -> bool:
    """Whether two numbers (or sequences of them) agree within ``rtol`` and ``atol``."""
    if isinstance(a, float) or isinstance(b, float):
        try:
            return abs(float(a) - float(b)) <= atol + rtol * abs(float(a))
        except (TypeError, ValueError):
            return False
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        return all(_same_value(x, y, rtol, atol) for x, y in zip(a, b))
    return a == b


# --- naming the bug ---------------------------------------------------------------------------


def _recognise(check: Check, result: Result) -> Bug | None:
    """The first catalogued bug whose outputs match the reader's on every case that ran,
    compared on the outputs the reader returned (see :data:`NAMING_SLACK`), or ``None``."""
    ran = [o for o in result.outcomes if not o.skipped]
    if not ran or any(o.got is None for o in ran):
        return None  # the reader's code raised or hung on some case: no catalogued mutant
    expected = {id(case): want for case, want in check.prepared()}
    for bug in check.bugs:
        if all(_looks_like(check, bug, o, expected[id(o.case)]) for o in ran):
            return bug
    return None


def _looks_like(check: Check, bug: Bug, outcome: Outcome, want: dict) -> bool:
    try:
        with torch.no_grad():
            mutant = check.run_impl(bug.impl, outcome.case.fresh())
    except Exception:
        return False
    keys = [k for k in outcome.got if k in want]
    if not any(k not in check.optional for k in keys):
        return False
    return all(k in mutant and _near(mutant[k], outcome.got[k], want[k], check) for k in keys)


def _near(mutant, got, expected, check: Check) -> bool:
    """Whether ``got`` is ``mutant`` within the tolerance plus :data:`NAMING_SLACK` of the
    mutant's own distance from ``expected``."""
    if not isinstance(mutant, torch.Tensor) or not isinstance(got, torch.Tensor):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        scalar = not isinstance(mutant, torch.Tensor)
        return scalar and _same_value(mutant, got, *check.tolerance(torch.float64))
    if mutant.shape != got.shape or mutant.dtype != got.dtype:
        return False
    m, g = mutant.detach().cpu(), got.detach().cpu()
    rtol, atol = check.tolerance(m.dtype)
    if check.tolerances is None or not m.is_floating_point():
        return bool((_ratios(m, g, 0.0, 0.0) == 0).all())
    finite = m.isfinite()
    if not bool(((m == g) | (m.isnan() & g.isnan()) | finite).all()):
        return False  # NaN or an infinity where the other has none, or another one
    gap = 0.0
    if isinstance(expected, torch.Tensor) and expected.shape == m.shape:
        both = finite & expected.isfinite()
        if both.any():
            gap = (m.double() - expected.double())[both].abs().max().item()
    slack = atol + rtol * m.double().abs() + NAMING_SLACK * gap
    close = (g.double() - m.double()).abs() <= slack
    return bool((close | ~finite).all())


# --- the words of a report ------------------------------------------------------------------


def _keywords(impl, check: Check) -> set[str] | None:
    """The keyword arguments a function accepts (``None``: anything, or not a function)."""
    if check.call is not None:
        return None
    try:
        params = inspect.signature(impl).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _stub_message(check: Check, name: str) -> str:
    return (
        f"{name} has no body yet (only `...`, `pass` or `raise NotImplementedError`). Write it "
        f"to keep this contract, then run the check again.\n{_indent(check.contract.strip(), '  ')}"
    )


def _tensors(values) -> list[torch.Tensor]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            out += _tensors(v)
        elif isinstance(v, dict):
            out += _tensors(list(v.values()))
    return out


def _index(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0]) if mask.dim() else ()


def _where(index: tuple[int, ...], dims: Sequence[str] | None) -> str:
    if not index:
        return "the value"
    if not dims or len(dims) != len(index):
        return f"index {index}"
    return ", ".join(f"{n} {i}" for n, i in zip(dims, index))


def _num(x: torch.Tensor) -> str:
    v = x.item()
    return f"{v:.8g}" if isinstance(v, float) else str(v)


def _digits(expected, got) -> tuple[str, str]:
    """Both numbers with the fewest significant digits (at least 8) that tell them apart."""
    if not isinstance(expected, float) or not isinstance(got, float):
        return str(expected), str(got)
    for p in range(8, 18):
        e, g = f"{expected:.{p}g}", f"{got:.{p}g}"
        if e != g:
            return e, g
    return repr(expected), repr(got)


def _g3(x) -> str:
    return f"{float(x):.2g}" if math.isfinite(float(x)) else str(float(x))


class _printoptions:
    """PyTorch's print options for a report, then the reader's own again."""

    def __enter__(self):
        self.saved = dict(vars(torch._tensor_str.PRINT_OPTS))
        torch.set_printoptions(precision=4, sci_mode=False, linewidth=100, threshold=200)

    def __exit__(self, *exc):
        for name, value in self.saved.items():
            setattr(torch._tensor_str.PRINT_OPTS, name, value)


def _fmt(t: torch.Tensor, **options) -> str:
    with _printoptions():
        if options:
            torch.set_printoptions(**options)
        return str(t.detach().cpu())


def _inputs(case: Case, names: Sequence[str] = ()) -> str:
    lines = ["inputs:"]
    for name, value in _named_inputs(case, names):
        if isinstance(value, torch.Tensor):
            lines.append(f"  {name}: {tuple(value.shape)} {value.dtype}")
            if value.numel() <= 48:
                lines.append(_indent(_fmt(value), "    "))
        elif isinstance(value, torch.nn.Module):
            lines.append(f"  {name}: {type(value).__name__}")
        else:
            lines.append(f"  {name}: {value!r}")
    return "\n".join(lines)


def _side_by_side(key: str, expected: torch.Tensor, got: torch.Tensor, i: tuple) -> str:
    """The last two dimensions around the value at ``i``: expected, the reader's, and the
    difference."""
    head = i[:-2] if len(i) >= 2 else ()
    e, g = expected[head], got[head]
    at = f"{key}[{', '.join(map(str, head))}]" if head else key
    if e.numel() > 64 and e.dim() >= 1:  # keep it readable: the row of the difference
        row = i[-2] if len(i) >= 2 else None
        if row is not None:
            e, g, at = e[row], g[row], f"{at}[{row}]" if head else f"{key}[{row}]"
    lines = [f"expected {at}:", _indent(_fmt(e), "  "), "got:", _indent(_fmt(g), "  ")]
    if e.is_floating_point():
        diff = (g.double() - e.double()).to(e.dtype)
        lines += ["got - expected:", _indent(_fmt(diff, precision=1, sci_mode=True), "  ")]
    return "\n".join(lines)


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines())
