"""Checks of the positional encodings: the sinusoidal table of chapter 5.

Each check's docstring is its contract; the sinusoidal table is compared with
``mhbook.sinusoidal_encoding`` (tested against the formula of Vaswani et al., 2017).
"""

from __future__ import annotations

import inspect

import torch

from .grader import Bug, Case, define

__all__ = ["sinusoidal"]


# --- the sinusoidal encoding ---------------------------------------------------------


def _sinusoidal_cases() -> list[Case]:
    dims = {"output": ("position", "dimension")}
    return [
        Case("one position, d_model = 2", (1, 2), dims=dims),
        Case("6 positions, d_model = 4", (6, 4), dims=dims),
        Case("7 positions, d_model = 10 (an odd number of pairs)", (7, 10), dims=dims),
        Case("50 positions, d_model = 16", (50, 16), dims=dims),
        Case("positions 3 to 7 (offset = 3), d_model = 8", (5, 8), {"offset": 3}, dims=dims),
    ]


def _sinusoidal_expected(case: Case) -> torch.Tensor:
    """mhbook's table, computed in float64 and returned in float32 (its default)."""
    from ..models.layers import sinusoidal_encoding

    return sinusoidal_encoding(*case.args, **case.kwargs)


def _call_sinusoidal(impl, case: Case):
    """``impl(num_positions, d_model)``; a case with an ``offset`` passes it when ``impl``
    takes one, else asks for ``offset`` more positions and drops the first ones. A float64
    table is compared in float32."""
    num_positions, d_model = case.args
    offset = case.kwargs.get("offset", 0)
    if offset and _takes(impl, "offset"):
        got = impl(num_positions, d_model, offset=offset)
    elif offset:
        got = impl(num_positions + offset, d_model)
        got = got[offset:] if isinstance(got, torch.Tensor) else got
    else:
        got = impl(num_positions, d_model)
    if isinstance(got, torch.Tensor) and got.dtype == torch.float64:
        got = got.float()
    return got


def _takes(fn, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def _sinusoidal_reference(
    num_positions, d_model, offset=0, *, first=0, exponent=None, dtype=torch.float64
):
    """Written for teaching (and mutated for the bugs): ``P[t, 2i] = sin(t / 10000^(2i/d))``,
    ``P[t, 2i+1] = cos(t / 10000^(2i/d))``, computed in float64."""
    t = torch.arange(offset + first, offset + first + num_positions, dtype=dtype)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=dtype)
    omega = 10000.0 ** (-(two_i if exponent is None else exponent(two_i)) / d_model)
    P = torch.zeros(num_positions, d_model, dtype=dtype)
    P[:, 0::2] = torch.sin(t * omega)
    P[:, 1::2] = torch.cos(t * omega)
    return P.to(torch.float64)


def _swapped(num_positions, d_model, offset=0):
    P = _sinusoidal_reference(num_positions, d_model, offset)
    return P.view(num_positions, -1, 2).flip(-1).reshape(num_positions, d_model)


def _i_over_d(num_positions, d_model, offset=0):
    return _sinusoidal_reference(num_positions, d_model, offset, exponent=lambda two_i: two_i / 2)


def _from_one(num_positions, d_model, offset=0):
    return _sinusoidal_reference(num_positions, d_model, offset, first=1)


def _halves(num_positions, d_model, offset=0):
    P = _sinusoidal_reference(num_positions, d_model, offset)
    return torch.cat([P[:, 0::2], P[:, 1::2]], dim=-1)


def _frequencies_multiplied(num_positions, d_model, offset=0):
    return _sinusoidal_reference(num_positions, d_model, offset, exponent=lambda two_i: -two_i)


def _column_exponent(num_positions, d_model, offset=0):
    t = torch.arange(offset, offset + num_positions, dtype=torch.float64)[:, None]
    j = torch.arange(d_model, dtype=torch.float64)
    angles = t / 10000.0 ** (j / d_model)  # column j with its own exponent j/d
    return torch.where(j.long() % 2 == 0, torch.sin(angles), torch.cos(angles))


@define(
    title="the sinusoidal positional encoding",
    cases=_sinusoidal_cases,
    expected=_sinusoidal_expected,
    reference=_sinusoidal_reference,
    call=_call_sinusoidal,
    params=("num_positions", "d_model"),
    why="The table is compared in float32: angles computed in float32 (as the Annotated "
    "Transformer and transformers' Marian compute them) pass.",
    bugs=[
        Bug(
            "sin and cos swapped: the even dimensions hold cos",
            "P[t, 2i] = sin(omega_i t) and P[t, 2i + 1] = cos(omega_i t): sin in the even "
            "columns (P[:, 0::2]), cos in the odd ones.",
            _swapped,
        ),
        Bug(
            "the exponent is i/d with i the pair's index, not 2i/d",
            "omega_i = 10000^(-2i/d): with torch.arange(0, d_model, 2) the 2i is already "
            "there; with torch.arange(d_model // 2) multiply it by 2.",
            _i_over_d,
        ),
        Bug(
            "the positions start at 1 instead of 0",
            "the first token is position 0: torch.arange(num_positions), so that P[0] is "
            "(0, 1, 0, 1, ...).",
            _from_one,
        ),
        Bug(
            "the sines fill the first half and the cosines the second, instead of alternating",
            "interleave them: P[:, 0::2] = sin(...), P[:, 1::2] = cos(...), so that dimensions "
            "2i and 2i + 1 share the frequency omega_i.",
            _halves,
        ),
        Bug(
            "the frequencies are multiplied by 10000^(2i/d) instead of divided",
            "omega_i = 10000^(-2i/d), one radian per position down to one per 10000: "
            "t / 10000 ** (2i / d_model).",
            _frequencies_multiplied,
        ),
        Bug(
            "each column j has its own exponent j/d: the cosine of pair i uses (2i + 1)/d",
            "both dimensions of a pair share one frequency: use (j - j % 2) / d_model, "
            "i.e. 2i/d, for columns 2i and 2i + 1.",
            _column_exponent,
        ),
    ],
    chapter="05-positional-encoding",
)
def sinusoidal(impl):
    """The sinusoidal positional encoding of Vaswani et al. (2017).

    Contract: ``impl(num_positions, d_model) -> P``, a float32 or float64 tensor
    ``(num_positions, d_model)`` (``d_model`` even) with ``P[t, 2i] = sin(t / 10000^(2i/d))``
    and ``P[t, 2i+1] = cos(t / 10000^(2i/d))`` for the positions ``t = 0, 1, ...``. A float64
    table (as chapter 5's ``sinusoidal_by_hand``) is compared in float32. With an ``offset``
    argument (``impl(num_positions, d_model, offset=3)``) the positions start at ``offset``;
    without one, the check drops the first rows of a longer table. Compared with
    ``mhbook.sinusoidal_encoding``.
    """
