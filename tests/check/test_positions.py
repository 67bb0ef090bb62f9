"""The grader's own tests for ``mhbook.check.positions``: RoPE in both layouts and ALiBi (the
other correct implementations, run by ``test_catalogue.py``, and what is special here)."""

from __future__ import annotations

import math

import torch
from grading import assert_named, by_transformers

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


@by_transformers
def rope_gptj(x, positions, base=10000.0):
    """transformers' own GPT-J ``apply_rotary_pos_emb`` (the paper's pairs, its
    ``rotate_every_two``), with sin and cos made in float32 as its
    ``create_sinusoidal_positions`` makes them."""
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb

    d = x.size(-1)
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64) / d))
    angles = positions.float()[:, None] * inv_freq.float()
    sin, cos = angles.sin().to(x.dtype), angles.cos().to(x.dtype)
    x4 = x.reshape(-1, *x.shape[-2:]).unsqueeze(2)  # (batch, T, heads = 1, d)
    rotated = apply_rotary_pos_emb(x4, sin[None], cos[None])
    return rotated.squeeze(2).reshape(x.shape)


@by_transformers
def rotate_half_llama(x, positions, base=10000.0):
    """transformers' own ``LlamaRotaryEmbedding`` (float32 angles) and
    ``apply_rotary_pos_emb``, built from a config."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    d = x.size(-1)
    config = LlamaConfig(
        hidden_size=2 * d,
        num_attention_heads=2,
        head_dim=d,
        rope_parameters={"rope_type": "default", "rope_theta": base},
    )
    cos, sin = LlamaRotaryEmbedding(config)(x, positions[None])
    rotated, _ = apply_rotary_pos_emb(x, x, cos[0], sin[0], unsqueeze_dim=0)
    return rotated.reshape(x.shape)  # (1, T, d) for x without a head axis


@by_transformers
def slopes_bloom(n):
    """transformers' own BLOOM slopes (``_get_alibi_slopes``)."""
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    return _get_alibi_slopes(n, torch.device("cpu"))


@by_transformers
def alibi_bias_bloom(num_heads, L):
    """transformers' own BLOOM ``build_alibi_tensor``: m_h times the key's position, the same
    for every query; minus the query's own, it is -m_h (i - j)."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    by_key = build_alibi_tensor(torch.ones(1, L, dtype=torch.long), num_heads, torch.float32)
    by_key = by_key.view(num_heads, L)
    return by_key[:, None, :] - by_key[:, :, None]


ALTERNATIVES = {
    "rope": (rope_by_hand, rope_complex, rope_gptj),
    "rope_rotate_half": (rotate_half_by_hand, rotate_half_by_permutation, rotate_half_llama),
    "alibi_slopes": (slopes_paper, slopes_logspace, slopes_bloom),
    "alibi_bias": (alibi_bias_by_hand, alibi_bias_signed, alibi_bias_bloom),
}


def test_a_rope_without_base_skips_that_case():
    def no_base(x, positions):
        return rope_by_hand(x, positions)

    result = check.rope(no_base)
    assert result and "takes no base" in result.report()


def test_the_layouts_are_not_confused():
    assert not check.rope(rotate_half_by_hand) and not check.rope_rotate_half(rope_by_hand)


# --- wide enough cases, names right (issue 38) ------------------------------------------------


def test_rope_with_its_angles_in_float16_is_caught_and_named():
    def angles_in_x_dtype(x, positions, base=10000.0):
        d = x.size(-1)
        theta = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
        angle = positions.to(x.dtype)[:, None] * theta
        a, b = x[..., 0::2], x[..., 1::2]
        out = torch.stack([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()])
        return out.movedim(0, -1).flatten(-2)

    (bug,) = [b for b in check.rope.spec.bugs if "x's dtype" in b.name]
    assert_named(check.rope, angles_in_x_dtype, bug)


def test_rope_with_the_plus_sign_exponent_is_named_when_computed_in_float32():
    """Issue 38: theta_i = base^(+2i/d) turns by 1e5 radians at position 60, where float32
    rounding moves the angles by hundredths: still named."""

    def plus_sign(x, positions, base=10000.0):
        d = x.size(-1)
        theta = base ** (torch.arange(0, d, 2).float() / d)
        angle = positions.float()[:, None] * theta
        z = torch.view_as_complex(x.float().unflatten(-1, (d // 2, 2)).contiguous())
        rotated = z * torch.polar(torch.ones_like(angle), angle)
        return torch.view_as_real(rotated).flatten(-2).to(x.dtype)

    (bug,) = [b for b in check.rope.spec.bugs if "+2i/d" in b.name]
    assert_named(check.rope, plus_sign, bug)
