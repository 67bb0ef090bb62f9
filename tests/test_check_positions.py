"""The grader's own tests for ``mhbook.check.positions``: RoPE in both layouts and ALiBi."""

from __future__ import annotations

import math

import torch
from grading import assert_passes, assert_rejects_corruptions

from mhbook import check
from mhbook.attention.rope import interleaved_to_half


def rope_by_hand(x, positions, base=10000.0):
    """The chapter's."""
    d = x.size(-1)
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.to(torch.float64)[:, None] * theta
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def rope_complex(x, positions, base=10000.0):
    """Another correct RoPE: complex numbers, the angles in float32."""
    d = x.size(-1)
    theta = base ** (-torch.arange(0, d, 2).float() / d)
    angle = positions.float()[:, None] * theta
    z = torch.view_as_complex(x.float().unflatten(-1, (d // 2, 2)).contiguous())
    return (
        torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle)).flatten(-2).to(x.dtype)
    )


def rotate_half_by_hand(x, positions, base=10000.0):
    """The chapter's."""
    d = x.size(-1)
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.to(torch.float64)[:, None] * theta
    cos = torch.cat([angle.cos(), angle.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angle.sin(), angle.sin()], dim=-1).to(x.dtype)
    first, second = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def rotate_half_by_permutation(x, positions, base=10000.0):
    """Another correct rotate-half RoPE: the paper's layout on permuted features."""
    perm = interleaved_to_half(x.size(-1))  # paper(x)[perm] == llama(x[perm])
    return rope_complex(x[..., torch.argsort(perm)], positions, base)[..., perm]


def slopes_paper(n):
    """Another correct alibi_slopes: the paper's recursive code, a list of floats."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + slopes_paper(2 * closest)[0::2][: n - closest]


def slopes_logspace(n):
    """Another correct alibi_slopes: torch.logspace, then the extra heads interleaved."""
    p = 2 ** int(math.log2(n))
    slopes = torch.logspace(-8 / p, -8, p, base=2.0)
    if p < n:
        slopes = torch.cat([slopes, torch.logspace(-8 / (2 * p), -8, 2 * p, base=2.0)[0::2]])
    return slopes[:n].float()


def alibi_bias_by_hand(num_heads, L):
    """The chapter's."""
    slopes = torch.tensor([2 ** (-8 * (h + 1) / num_heads) for h in range(num_heads)])
    distance = torch.arange(L)[:, None] - torch.arange(L)[None, :]
    return -slopes[:, None, None] * distance.abs()


def alibi_bias_signed(num_heads, L):
    """Another correct bias: -m (i - j) without abs (positive after the query, masked)."""
    slopes = slopes_logspace(num_heads)
    i, j = torch.arange(L).float()[:, None], torch.arange(L).float()[None, :]
    return torch.stack([-m * (i - j) for m in slopes])


CHECKS = (check.rope, check.rope_rotate_half, check.alibi_slopes, check.alibi_bias)


def test_references_and_other_implementations_pass():
    for impl in (check.rope.spec.reference, rope_by_hand, rope_complex):
        assert_passes(check.rope, impl)
    for impl in (check.rope_rotate_half.spec.reference, rotate_half_by_hand):
        assert_passes(check.rope_rotate_half, impl)
    assert_passes(check.rope_rotate_half, rotate_half_by_permutation)
    for impl in (check.alibi_slopes.spec.reference, slopes_paper, slopes_logspace):
        assert_passes(check.alibi_slopes, impl)
    for impl in (check.alibi_bias.spec.reference, alibi_bias_by_hand, alibi_bias_signed):
        assert_passes(check.alibi_bias, impl)


def test_nan_wrong_shape_and_dtype_never_pass():
    for fn in CHECKS:
        assert_rejects_corruptions(fn)


def test_a_rope_without_base_skips_that_case():
    def no_base(x, positions):
        return rope_by_hand(x, positions)

    result = check.rope(no_base)
    assert result and "takes no base" in result.report()


def test_the_layouts_are_not_confused():
    assert not check.rope(rotate_half_by_hand) and not check.rope_rotate_half(rope_by_hand)
