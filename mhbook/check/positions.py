"""Checks of chapter 11: position inside attention, RoPE in both layouts and ALiBi.

The references are Hugging Face ``transformers``' ``apply_rotary_pos_emb`` of Llama (the
rotate-half layout) and of GPT-J (the paper's interleaved pairs), ``mhbook.alibi_slopes``
(the paper's code, written out) and ``mhbook.ALiBi``.
"""

from __future__ import annotations

import math

import torch

from ..attention.alibi import ALiBi
from ..attention.alibi import alibi_slopes as book_alibi_slopes
from .grader import Bug, Case, define, seeded

__all__ = ["rope", "rope_rotate_half", "alibi_slopes", "alibi_bias"]

HEADS = ("batch", "head", "position", "feature")


# --- RoPE, both layouts ---------------------------------------------------------------------


def _rope_cases() -> list[Case]:
    f32 = torch.float32
    return [
        Case(
            "positions 0..4, d = 4 (batch, heads) = (2, 3)",
            (seeded(2, 3, 5, 4, seed=120, dtype=f32), torch.arange(5)),
            dims={"output": HEADS},
        ),
        Case(
            "positions 37..42 (after a cache of 37 tokens), batch 1, d = 8",
            (seeded(1, 2, 6, 8, seed=121, dtype=f32), torch.arange(37, 43)),
            dims={"output": HEADS},
        ),
        Case(
            "one token at position 60 (a decoding step), batch 3, d = 16",
            (seeded(3, 1, 1, 16, seed=122, dtype=f32), torch.tensor([60])),
            dims={"output": HEADS},
        ),
        Case(
            "no head axis: x (T, d) = (4, 6), positions 3..6",
            (seeded(4, 6, seed=123, dtype=f32), torch.arange(3, 7)),
            dims={"output": ("position", "feature")},
        ),
        Case(
            "base 100 instead of 10,000, positions 5..9",
            (seeded(2, 1, 5, 8, seed=124, dtype=f32), torch.arange(5, 10)),
            {"base": 100.0},
            dims={"output": HEADS},
            needs=("base",),
        ),
        Case(
            "float16, positions 10..13, d = 8",
            (seeded(1, 2, 4, 8, seed=125, dtype=torch.float16), torch.arange(10, 14)),
            dims={"output": HEADS},
        ),
        Case(
            "float16, positions 1998..2003 (far into a long context), d = 8",
            (seeded(1, 2, 6, 8, seed=126, dtype=torch.float16), torch.arange(1998, 2004)),
            dims={"output": HEADS},
        ),
    ]


def _angles(x, positions, base, exponent=2.0, sign=-1.0, dtype=torch.float64):
    d = x.size(-1)
    theta = base ** (sign * exponent * torch.arange(d // 2, dtype=dtype) / d)
    return positions.to(dtype)[:, None] * theta  # (T, d/2)


def _rope_expected(case: Case) -> torch.Tensor:
    """``transformers``' GPT-J ``apply_rotary_pos_emb`` (its ``rotate_every_two`` pairs
    neighbours), with the angles' sin and cos computed in float64."""
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb

    x, positions = case.args
    angle = _angles(x, positions, case.kwargs.get("base", 10000.0))
    x4 = x.reshape(-1, *x.shape[-2:]).unsqueeze(2)  # (batch, T, heads = 1, d), as GPT-J has it
    sin, cos = angle.sin().to(x.dtype)[None], angle.cos().to(x.dtype)[None]
    return apply_rotary_pos_emb(x4, sin, cos).squeeze(2).reshape(x.shape)


def _half_expected(case: Case) -> torch.Tensor:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    x, positions = case.args
    angle = _angles(x, positions, case.kwargs.get("base", 10000.0))
    cos = torch.cat([angle.cos(), angle.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angle.sin(), angle.sin()], dim=-1).to(x.dtype)
    return apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=0)[0].reshape(x.shape)


def _rotate(x, cos, sin, layout, sin_sign=1.0):
    """Rotate the pairs of ``x`` (interleaved or rotate-half) by angles with ``cos``/``sin``
    ``(T, d/2)``, computed in float32 at least."""
    compute = torch.promote_types(x.dtype, torch.float32)
    xc, cos, sin = x.to(compute), cos.to(compute), sin_sign * sin.to(compute)
    if layout == "interleaved":
        a, b = xc[..., 0::2], xc[..., 1::2]
        out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    elif layout == "half":
        half = x.size(-1) // 2
        a, b = xc[..., :half], xc[..., half:]
        out = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    else:  # rotate-half applied with cos and sin repeated pairwise (the interleaved tables)
        cos2, sin2 = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        half = x.size(-1) // 2
        rotated = torch.cat([-xc[..., half:], xc[..., :half]], dim=-1)
        out = xc * cos2 + rotated * sin2
    return out.to(x.dtype)


def _rope_impl(
    layout, *, own_positions=True, exponent=2.0, sign=-1.0, sin_sign=1.0, low_precision=False
):
    def impl(x, positions, base=10000.0):
        if not own_positions:
            positions = torch.arange(x.size(-2))
        dtype = x.dtype if low_precision else torch.float64
        angle = _angles(x, positions, base, exponent, sign, dtype)
        return _rotate(x, angle.cos(), angle.sin(), layout, sin_sign)

    return impl


_rope_reference = _rope_impl("interleaved")
_rope_reference.__doc__ = """Written for teaching (and mutated for the bugs): pair
``(x[2i], x[2i+1])`` at position ``m`` rotated by ``m * base^(-2i/d)``."""
_half_reference = _rope_impl("half")
_half_reference.__doc__ = """Written for teaching (and mutated for the bugs): pair
``(x[i], x[i + d/2])`` at position ``m`` rotated by ``m * base^(-2i/d)``."""


def _rope_bugs(layout: str) -> list[Bug]:
    other = "half" if layout == "interleaved" else "interleaved"
    swapped = (
        Bug(
            "Llama's rotate-half pairs (x[i], x[i + d/2]) instead of the paper's (x[2i], x[2i+1])",
            "rotate the neighbours: a, b = x[..., 0::2], x[..., 1::2], and write the rotated "
            "pair back to the even and odd features.",
            _rope_impl(other),
        )
        if layout == "interleaved"
        else Bug(
            "the paper's interleaved pairs (x[2i], x[2i+1]) instead of Llama's (x[i], x[i + d/2])",
            "pair feature i with feature i + d/2: first, second = x[..., :d//2], x[..., d//2:], "
            "and rotated_half = torch.cat([-second, first], dim=-1).",
            _rope_impl(other),
        )
    )
    bugs = [
        swapped,
        Bug(
            "the positions given are ignored (torch.arange(T) is used)",
            "rotate by the positions passed in: after a cache of t tokens the new ones are at "
            "t, t + 1, ..., not at 0, 1, ...",
            _rope_impl(layout, own_positions=False),
        ),
        Bug(
            "theta_i = base^(-i/d) instead of base^(-2i/d)",
            "the pair index i runs over d/2 pairs: theta = base ** (-torch.arange(0, d, 2) / d).",
            _rope_impl(layout, exponent=1.0),
        ),
        Bug(
            "theta_i = base^(+2i/d): the exponent's minus sign is missing",
            "the wavelengths grow with i: theta = base ** (-torch.arange(0, d, 2) / d), "
            "1 for the first pair down to about 1/base for the last.",
            _rope_impl(layout, sign=1.0),
        ),
        Bug(
            "the pairs are rotated the wrong way (the sin terms' signs flipped)",
            "rotate (a, b) by +angle: (a cos - b sin, a sin + b cos)."
            + ("" if layout == "interleaved" else " rotate_half(x) is cat([-second, first])."),
            _rope_impl(layout, sin_sign=-1.0),
        ),
    ]
    bugs.append(
        Bug(
            "the angles computed in x's dtype: in float16, m * theta_i is off by up to a tenth "
            "of a radian at position 2,000",
            "compute theta and the angles in float32 at least (positions.float()[:, None] * "
            "theta), and cast only cos and sin to x's dtype, as transformers does.",
            _rope_impl(layout, low_precision=True),
        )
    )
    if layout == "half":
        bugs.append(
            Bug(
                "cos and sin repeated pairwise (repeat_interleave) with rotate_half",
                "with the rotate-half layout, repeat the d/2 angles over both halves: "
                "cos = torch.cat([cos, cos], dim=-1), not cos.repeat_interleave(2, dim=-1).",
                _rope_impl("mixed"),
            )
        )
    return bugs


@define(
    title="rotary position embedding, the paper's interleaved pairs",
    cases=_rope_cases,
    expected=_rope_expected,
    reference=_rope_reference,
    params=("x", "positions"),
    bugs=_rope_bugs("interleaved"),
    why="Angles computed in float32, as transformers computes them, stay inside at the "
    "cases' positions (up to 2,003).",
    chapter="11-position-inside-attention",
)
def rope(impl):
    """RoPE in the paper's layout: pair ``i`` is ``(x[2i], x[2i+1])`` (chapter 11).

    Contract: ``impl(x, positions, base=10000.0) -> rotated``, with ``x`` ``(..., T, d)``
    (``d`` even), ``positions`` an integer tensor ``(T,)`` of the vectors' absolute
    positions (they start after the cache, not always at 0) and ``rotated`` the same shape
    and dtype as ``x``: the pair at position ``m`` rotated by the angle ``m * theta_i``,
    ``theta_i = base^(-2i/d)``. Compared with Hugging Face ``transformers``' GPT-J
    ``apply_rotary_pos_emb``, which pairs neighbours the same way.
    """


@define(
    title="rotary position embedding, Llama's rotate-half layout",
    cases=_rope_cases,
    expected=_half_expected,
    reference=_half_reference,
    params=("x", "positions"),
    bugs=_rope_bugs("half"),
    why="Angles computed in float32, as transformers computes them, stay inside at the "
    "cases' positions (up to 2,003).",
    chapter="11-position-inside-attention",
)
def rope_rotate_half(impl):
    """RoPE in Llama's layout: pair ``i`` is ``(x[i], x[i + d/2])`` (chapter 11).

    Contract: ``impl(x, positions, base=10000.0) -> rotated``, with ``x`` ``(..., T, d)``
    (``d`` even), ``positions`` an integer tensor ``(T,)`` of the vectors' absolute
    positions (they start after the cache, not always at 0) and ``rotated`` the same shape
    and dtype as ``x``: the pair at position ``m`` rotated by the angle ``m * theta_i``,
    ``theta_i = base^(-2i/d)``, written as ``x * cos + rotate_half(x) * sin``. Compared with
    Hugging Face ``transformers``' ``apply_rotary_pos_emb``.
    """


# --- ALiBi ----------------------------------------------------------------------------------


def _slopes_cases() -> list[Case]:
    cases = [
        Case(f"{n} heads (a power of two)", (n,), dims={"output": ("head",)})
        for n in (1, 2, 4, 8, 16)
    ]
    cases += [
        Case(f"{n} heads (not a power of two)", (n,), dims={"output": ("head",)})
        for n in (3, 6, 12)
    ]
    return cases


def _call_slopes(impl, case: Case):
    out = impl(*case.args)
    if isinstance(out, (list, tuple)) and all(isinstance(s, (int, float)) for s in out):
        out = torch.tensor(out, dtype=torch.float32)
    return out


def _pow2_slopes(n: int, offset: int = 1) -> list[float]:
    return [2 ** (-8 * (h + offset) / n) for h in range(n)]


def _slopes_reference(num_heads, *, every_other=True, offset=1, order=1, general=True):
    """Written for teaching (and mutated for the bugs): the paper's slopes, with the
    slopes of the next power of two filling in when ``num_heads`` is not one."""
    p = 2 ** math.floor(math.log2(num_heads))
    if not general:
        p = num_heads
    slopes = _pow2_slopes(p, offset)
    if p < num_heads:
        extra = _pow2_slopes(2 * p, offset)
        extra = extra[0::2] if every_other else extra
        slopes += extra[: num_heads - p]
    return torch.tensor(slopes[::order], dtype=torch.float32)


def _slopes_reversed(num_heads):
    return _slopes_reference(num_heads, order=-1)


def _slopes_from_zero(num_heads):
    return _slopes_reference(num_heads, offset=0)


def _slopes_power_formula(num_heads):
    return _slopes_reference(num_heads, general=False)


def _slopes_consecutive(num_heads):
    return _slopes_reference(num_heads, every_other=False)


@define(
    title="ALiBi's slopes, one per head",
    cases=_slopes_cases,
    expected=lambda case: book_alibi_slopes(*case.args),
    reference=_slopes_reference,
    call=_call_slopes,
    params=("num_heads",),
    why="Slopes computed in float32 or float64 (a list of Python floats) both pass.",
    bugs=[
        Bug(
            "the slopes are in the wrong order (head 0 gets the smallest)",
            "head h gets 2^(-8 (h + 1) / n): the slopes fall from the first head to the last.",
            _slopes_reversed,
        ),
        Bug(
            "the exponent counts heads from 0: 2^(-8 h / n), so head 0's slope is 1",
            "count from 1: m_h = 2^(-8 (h + 1) / n); the first slope of 8 heads is 1/2.",
            _slopes_from_zero,
        ),
        Bug(
            "the power-of-two formula 2^(-8 (h + 1) / n) for a number of heads that is not one",
            "for n heads with p the power of two below n, take p's slopes, then every other "
            "slope of 2p heads (the 1st, 3rd, ...) until there are n.",
            _slopes_power_formula,
        ),
        Bug(
            "the extra slopes are 2p heads' first ones, not every other one",
            "take the extra slopes from 2p heads' slopes[0::2] (those between p's), not "
            "slopes[:n - p].",
            _slopes_consecutive,
        ),
    ],
    chapter="11-position-inside-attention",
)
def alibi_slopes(impl):
    """ALiBi's head slopes (chapter 11).

    Contract: ``impl(num_heads) -> slopes``, a float32 tensor ``(num_heads,)`` (a list of
    numbers is accepted): ``2^(-8 (h + 1) / n)`` for ``n`` a power of two; otherwise the
    slopes of the power of two ``p`` just below ``n``, followed by every other slope of
    ``2p`` heads until there are ``n``, as in the paper's code. Compared with
    ``mhbook.alibi_slopes``.
    """


def _bias_cases() -> list[Case]:
    dims = {"output": ("head", "query", "key")}
    return [
        Case(f"{n} heads, L = {L}", (n, L), dims=dims)
        for n, L in ((1, 3), (2, 5), (4, 8), (8, 4), (4, 1))
    ]


def _below_diagonal(bias: torch.Tensor) -> torch.Tensor:
    """Zero the bias of keys after their query: the causal mask removes them, so either
    sign there is right."""
    if not isinstance(bias, torch.Tensor) or bias.dim() < 2:
        return bias
    L = bias.size(-1)
    return bias.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), 0.0)


def _call_bias(impl, case: Case):
    return _below_diagonal(impl(*case.args))


def _bias_expected(case: Case) -> torch.Tensor:
    n, L = case.args
    return _below_diagonal(ALiBi(n)(torch.arange(L), torch.arange(L)))


def _bias_reference(num_heads, L, *, slopes=None, sign=-1.0):
    """Written for teaching (and mutated for the bugs): ``-m_h * |i - j|``."""
    slopes = _slopes_reference(num_heads) if slopes is None else slopes
    distance = (torch.arange(L)[:, None] - torch.arange(L)[None, :]).abs()
    return sign * slopes[:, None, None] * distance


def _bias_reversed(num_heads, L):
    return _bias_reference(num_heads, L, slopes=_slopes_reversed(num_heads))


def _bias_positive(num_heads, L):
    return _bias_reference(num_heads, L, sign=1.0)


def _bias_from_zero(num_heads, L):
    return _bias_reference(num_heads, L, slopes=_slopes_from_zero(num_heads))


@define(
    title="ALiBi's distance bias for every head",
    cases=_bias_cases,
    expected=_bias_expected,
    reference=_bias_reference,
    call=_call_bias,
    params=("num_heads", "L"),
    bugs=[
        Bug(
            "the slopes are in the wrong order (head 0 gets the smallest)",
            "head h gets 2^(-8 (h + 1) / n): the first head looks the least far.",
            _bias_reversed,
        ),
        Bug(
            "the bias has the wrong sign (+m |i - j| favours the farthest keys)",
            "subtract: bias = -m_h * |i - j|, a penalty that grows with the distance.",
            _bias_positive,
        ),
        Bug(
            "the exponent counts heads from 0: head 0's slope is 1",
            "count from 1: m_h = 2^(-8 (h + 1) / n).",
            _bias_from_zero,
        ),
    ],
    chapter="11-position-inside-attention",
)
def alibi_bias(impl):
    """ALiBi's bias for every head, query and key (chapter 11).

    Contract: ``impl(num_heads, L) -> bias``, a float32 tensor ``(num_heads, L, L)`` with
    ``bias[h, i, j] = -m_h * (i - j)`` for key ``j <= i``, ``m_h = 2^(-8 (h + 1) /
    num_heads)`` (``num_heads`` a power of two). Only the keys at or before the query are
    compared: the causal mask removes the others, so ``-m_h * |i - j|`` or anything else
    there is fine. Compared with ``mhbook.ALiBi``.
    """
