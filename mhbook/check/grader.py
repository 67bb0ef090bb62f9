"""The grader behind every check: run the reader's code on hard cases, compare it with a
reference, find where it first differs, and name the bug when it is a known one.

A :class:`Check` holds

* ``cases``: small, seeded inputs, hard on purpose (a fully masked row, ``T_q < T_k``,
  batch 1, odd sizes, float16 with large scores, positions that do not start at 0);
* ``expected``: what the reader's code must return for a case, computed with code we did
  not write where it exists (PyTorch's built-ins, ``transformers``), else with mhbook's
  own tested code;
* ``reference``: a plain implementation of the contract, written for teaching, from which
  each catalogued :class:`Bug` is one mutation. The tests check that ``reference`` passes
  and that each bug is caught and named;
* ``call``: how a case is handed to the reader's function or module.

When the reader's outputs equal a bug's outputs on every case where the reference's
differ, the report names the bug and its fix. Otherwise it shows the smallest failing case:
its inputs, the expected and the reader's values, and the first index where they differ.

Written by hand for the book: no test library grades a reader's function against
mutants and explains which one it matched.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Case", "Bug", "Check", "Result", "Outcome", "define", "run", "seeded", "tolerance"]

#: Tolerances by dtype (rtol, atol): a correct implementation that computes in another
#: order (einsum, a loop over heads, another masking constant) stays well inside them.
TOLERANCES = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def seeded(*shape, seed: int, dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    """A seeded standard normal tensor (times ``scale``), the same on every machine: drawn in
    float64, then cast, so that a case's values do not depend on its dtype's generator."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing outputs of ``dtype``."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


@dataclass
class Case:
    """One input of a check.

    Attributes:
        name: what makes it hard, e.g. ``"a fully masked row"``.
        args: the positional arguments handed to the reader's callable.
        kwargs: its keyword arguments.
        dims: for each output, the names of its dimensions (``("batch", "query", "key")``),
            used to say where a difference starts.
        needs: keyword arguments the case needs the reader's callable to accept; a callable
            without them skips the case, and the report says so.
        exact: compare exactly (masks, integer results) rather than within a tolerance.
    """

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    dims: dict = field(default_factory=dict)
    needs: tuple = ()
    exact: bool = False

    @property
    def size(self) -> int:
        """How big the case is to read: the number of input elements."""
        return sum(t.numel() for t in _tensors(self.args) + _tensors(list(self.kwargs.values())))


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
    chapter: str = ""
    params: tuple[str, ...] = ()

    def __call__(self, impl) -> Result:
        return run(self, impl)

    def run_impl(self, impl, case: Case):
        """The outputs of ``impl`` on ``case``, as a dict ``name -> value``."""
        got = self.call(impl, case) if self.call else impl(*case.args, **case.kwargs)
        return self._named(got)

    def _named(self, got) -> dict:
        if isinstance(got, dict):
            return got
        if isinstance(got, (tuple, list)) and len(self.outputs) > 1:
            return dict(zip(self.outputs, got))
        return {self.outputs[0]: got}


def define(
    *,
    title: str,
    cases: Callable[[], list[Case]],
    expected: Callable[[Case], Any],
    reference: Any,
    bugs: Sequence[Bug] = (),
    call: Callable[[Any, Case], Any] | None = None,
    outputs: tuple[str, ...] = ("output",),
    chapter: str = "",
    params: tuple[str, ...] = (),
):
    """Make a check from a function whose docstring is the contract (its body is unused).

    ``params`` names the positional arguments in reports (``("q", "k", "v")``). The check
    is the decorated name, called on the reader's implementation:
    ``check.attention(my_attention) -> Result``; ``check.attention.spec`` is its
    :class:`Check`. The cases are built once, on first use.
    """

    def wrap(fn):
        spec = Check(
            name=fn.__name__,
            title=title,
            contract=inspect.getdoc(fn) or "",
            cases=functools.lru_cache(maxsize=1)(cases),
            expected=expected,
            reference=reference,
            bugs=list(bugs),
            call=call,
            outputs=outputs,
            chapter=chapter,
            params=params,
        )

        @functools.wraps(fn)
        def checker(impl) -> Result:
            return run(spec, impl)

        checker.spec = spec
        return checker

    return wrap


@dataclass
class Outcome:
    """What happened on one case: ``problem`` is ``None`` when the case passed."""

    case: Case
    problem: str | None = None
    detail: str = ""
    got: dict | None = None
    skipped: str = ""


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
            lines.append(f'Smallest failing case: "{first.case.name}"')
            lines.append(f"  {first.problem}")
            if first.detail:
                lines.append(_indent(first.detail, "  "))
            others = [o.case.name for o in failed if o is not first]
            if others:
                lines.append("Also failing: " + "; ".join(others) + ".")
        for o in skipped:
            lines.append(f"Skipped: {o.case.name} ({o.skipped}).")
        return "\n".join(lines)

    def raise_for_failure(self) -> None:
        """Raise ``AssertionError`` with the report unless the check passed."""
        if not self.passed:
            raise AssertionError(self.report())


def run(check: Check, impl) -> Result:
    """Run ``impl`` on every case of ``check`` and compare it with the expected values."""
    name = getattr(impl, "__qualname__", None) or type(impl).__name__
    accepted = _keywords(impl, check)
    outcomes: list[Outcome] = []
    with torch.no_grad():
        for case in check.cases():
            missing = [k for k in case.needs if accepted is not None and k not in accepted]
            if missing:
                outcomes.append(Outcome(case, skipped=f"{name} takes no {', '.join(missing)}"))
                continue
            want = check._named(check.expected(case))
            try:
                got = check.run_impl(impl, case)
            except NotImplementedError:
                return Result(check, name, outcomes, stub=_stub_message(check, name))
            except Exception as error:  # the reader's code raised: say what and where
                outcomes.append(
                    Outcome(
                        case, f"raised {type(error).__name__}: {error}", _inputs(case, check.params)
                    )
                )
                continue
            if all(v is None or v is Ellipsis for v in got.values()):
                return Result(check, name, outcomes, stub=_stub_message(check, name))
            problem, detail = compare(want, got, case, check)
            outcomes.append(Outcome(case, problem, detail, got))
    result = Result(check, name, outcomes)
    if not result.passed:
        result.bug = _recognise(check, result)
    return result


def compare(want: dict, got: dict, case: Case, check: Check) -> tuple[str | None, str]:
    """``(problem, detail)`` for the first output that differs, ``(None, "")`` if none."""
    for n, (key, expected) in enumerate(want.items()):
        if key not in got:
            if n == 0:
                return f"returned no {key!r}", ""
            continue  # the later outputs (the weights) are optional
        problem = _difference(key, expected, got[key], case, check)
        if problem:
            return problem
    return None, ""


def _difference(key, expected, got, case: Case, check):
    if not isinstance(expected, torch.Tensor):
        if _same_value(expected, got):
            return None
        return f"{key}: expected {expected!r}, got {got!r}", _inputs(case, check.params)
    if not isinstance(got, torch.Tensor):
        what = type(got).__name__
        return f"{key}: expected a tensor of shape {tuple(expected.shape)}, got a {what}", ""
    if got.shape != expected.shape:
        return (
            f"{key} has the wrong shape: expected {tuple(expected.shape)}, got {tuple(got.shape)}",
            _inputs(case, check.params),
        )
    if got.dtype != expected.dtype:
        return (
            f"{key} has the wrong dtype: expected {expected.dtype}, got {got.dtype} "
            "(keep the inputs' dtype)",
            _inputs(case, check.params),
        )
    got, expected = got.detach().cpu(), expected.detach().cpu()
    if expected.is_floating_point():
        bad_nan = torch.isnan(got) & ~torch.isnan(expected)
        if bad_nan.any():
            where = _where(bad_nan, case.dims.get(key))
            return (
                f"{key} holds NaN at {where}, where {expected[_index(bad_nan)].item():.4g} "
                "is expected",
                _inputs(case, check.params) + "\n" + _side_by_side(key, expected, got, bad_nan),
            )
    close = _close(expected, got, case.exact)
    if bool(close.all()):
        return None
    wrong = ~close
    where = _where(wrong, case.dims.get(key))
    i = _index(wrong)
    return (
        f"{key} differs first at {where}: expected {_num(expected[i])}, got {_num(got[i])}",
        _inputs(case, check.params) + "\n" + _side_by_side(key, expected, got, wrong),
    )


def _close(expected: torch.Tensor, got: torch.Tensor, exact: bool) -> torch.Tensor:
    if exact or not expected.is_floating_point():
        return (expected == got) | (torch.isnan(expected) & torch.isnan(got))
    rtol, atol = tolerance(expected.dtype)
    e, g = expected.double(), got.double()
    return torch.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)


def _same_value(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        return all(_same_value(x, y) for x, y in zip(a, b))
    return a == b


def same_outputs(a: dict, b: dict, case: Case) -> bool:
    """Whether two sets of outputs agree within the case's tolerance (NaN equals NaN)."""
    if a is None or b is None or a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if not isinstance(x, torch.Tensor):
            if not _same_value(x, y):
                return False
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not bool(_close(x.detach().cpu(), y.detach().cpu(), case.exact).all()):
            return False
    return True


def _recognise(check: Check, result: Result) -> Bug | None:
    """The catalogued bug whose outputs equal the reader's on every case that ran and on
    which the bug differs from the reference somewhere, or ``None``."""
    ran = [o for o in result.outcomes if not o.skipped and o.got is not None]
    if len(ran) < len([o for o in result.outcomes if not o.skipped]):
        return None  # the reader's code raised on some case: it is no catalogued mutant
    for bug in check.bugs:
        matches = True
        with torch.no_grad():
            for o in ran:
                try:
                    mutant = check.run_impl(bug.impl, o.case)
                except Exception:
                    mutant = None
                if mutant is None or not same_outputs(mutant, o.got, o.case):
                    matches = False
                    break
        if matches:
            return bug
    return None


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
        f"{name} returned nothing: its body is still `...`. Write it to keep this contract, "
        f"then run the check again.\n{_indent(check.contract.strip(), '  ')}"
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


def _where(mask: torch.Tensor, dims: Sequence[str] | None) -> str:
    index = _index(mask)
    if not index:
        return "the value"
    names = (
        list(dims) if dims and len(dims) == len(index) else [f"dim {d}" for d in range(len(index))]
    )
    return ", ".join(f"{n} {i}" for n, i in zip(names, index))


def _num(x: torch.Tensor) -> str:
    v = x.item()
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _fmt(t: torch.Tensor) -> str:
    with _printoptions():
        return str(t.detach().cpu())


class _printoptions:
    def __enter__(self):
        torch.set_printoptions(precision=4, sci_mode=False, linewidth=100, threshold=200)

    def __exit__(self, *exc):
        torch.set_printoptions(profile="default")


def _inputs(case: Case, names: Sequence[str] = ()) -> str:
    lines = ["inputs:"]
    named = [names[i] if i < len(names) else f"argument {i}" for i in range(len(case.args))]
    params = list(zip(named, case.args)) + list(case.kwargs.items())
    for name, value in params:
        if isinstance(value, torch.Tensor):
            lines.append(f"  {name}: {tuple(value.shape)} {value.dtype}")
            if value.numel() <= 48:
                lines.append(_indent(_fmt(value), "    "))
        elif isinstance(value, torch.nn.Module):
            lines.append(f"  {name}: {type(value).__name__}")
        else:
            lines.append(f"  {name}: {value!r}")
    return "\n".join(lines)


def _side_by_side(key: str, expected: torch.Tensor, got: torch.Tensor, wrong: torch.Tensor) -> str:
    """The last two dimensions around the first difference, expected then the reader's."""
    i = _index(wrong)
    head = i[:-2] if len(i) >= 2 else ()
    e, g = expected[head], got[head]
    at = f"{key}[{', '.join(map(str, head))}]" if head else key
    if e.numel() > 64 and e.dim() >= 1:  # keep it readable: the row of the difference
        row = i[-2] if len(i) >= 2 else None
        if row is not None:
            e, g, at = e[row], g[row], f"{at}[{row}]" if head else f"{key}[{row}]"
    return f"expected {at}:\n{_indent(_fmt(e), '  ')}\ngot:\n{_indent(_fmt(g), '  ')}"


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines())
