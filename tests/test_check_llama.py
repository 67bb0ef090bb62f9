"""The grader's own tests for ``mhbook.check.llama``: chapter 14's RMSNorm, SwiGLU,
rotate_half, RoPE from its tables and grouped-query attention."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from grading import assert_passes, assert_rejects_corruptions

import mhbook
from mhbook import check

pytest.importorskip("transformers")

CHECKS = [
    check.rms_norm,
    check.swiglu,
    check.rotate_half,
    check.rope_cos_sin,
    check.llama_attention,
]


# --- other correct implementations, written otherwise than the book's ----------------------


def rms_norm_rsqrt(x, g, eps):
    """rsqrt of the mean of x * x, the gain last."""
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * g


def rms_norm_float64_norm(x, g, eps):
    """In float64, through the vector's length: ||x|| / sqrt(d) is the root mean square."""
    y = x.double()
    rms = torch.sqrt(y.norm(dim=-1, keepdim=True) ** 2 / y.size(-1) + eps)
    return (g.double() * y / rms).to(x.dtype)


def rms_norm_module(x, g, eps):
    """mhbook.RMSNorm with the gain loaded."""
    norm = mhbook.RMSNorm(x.size(-1), eps).to(x.dtype)
    norm.weight.data.copy_(g)
    return norm(x)


def swiglu_einsum(x, W_gate, W_up, W_down):
    gate = torch.einsum("...d,fd->...f", x, W_gate)
    up = torch.einsum("...d,fd->...f", x, W_up)
    return torch.einsum("...f,df->...d", gate * torch.sigmoid(gate) * up, W_down)


def swiglu_module(x, W_gate, W_up, W_down):
    """mhbook.SwiGLU with the weights loaded, computed in float32 for float16."""
    d_ff, d_model = W_gate.shape
    compute = torch.promote_types(x.dtype, torch.float32)
    ffn = mhbook.SwiGLU(d_model, d_ff).to(compute)
    for name, w in (("W_gate", W_gate), ("W_up", W_up), ("W_down", W_down)):
        getattr(ffn, name).weight.data.copy_(w)
    return ffn(x.to(compute)).to(x.dtype)


def rotate_half_index(x):
    d = x.size(-1)
    perm = torch.cat([torch.arange(d // 2, d), torch.arange(d // 2)])
    sign = torch.cat([-torch.ones(d // 2), torch.ones(d // 2)]).to(x.dtype)
    return x[..., perm] * sign


def rotate_half_flip(x):
    a, b = x[..., : x.size(-1) // 2], x[..., x.size(-1) // 2 :]
    return torch.cat([b.neg(), a], dim=-1)


def rope_pairs(x, cos, sin):
    """Pair by pair: (a, b) -> (a cos - b sin, b cos + a sin) with half the table."""
    h = x.size(-1) // 2
    a, b, c, s = x[..., :h], x[..., h:], cos[..., :h], sin[..., :h]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def rope_complex(x, cos, sin):
    """As complex numbers (a + ib) e^{i angle}, in float64."""
    h = x.size(-1) // 2
    z = torch.complex(x[..., :h].double(), x[..., h:].double())
    z = z * torch.complex(cos[..., :h].double(), sin[..., :h].double())
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


def attention_einsum(x, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, cos, sin):
    """Heads indexed by einsum, key/value head g = head // group, a -1e30 fill."""
    B, T, _ = x.shape
    d = W_q.size(0) // num_heads
    q = torch.einsum("btm,hdm->bhtd", x, W_q.view(num_heads, d, -1))
    k = torch.einsum("btm,hdm->bhtd", x, W_k.view(num_kv_heads, d, -1))
    v = torch.einsum("btm,hdm->bhtd", x, W_v.view(num_kv_heads, d, -1))
    q, k = rope_pairs(q, cos, sin), rope_pairs(k, cos, sin)
    kv = torch.arange(num_heads) // (num_heads // num_kv_heads)
    k, v = k[:, kv], v[:, kv]
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(d)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    weights = scores.masked_fill(future, -1e30).softmax(-1)
    out = torch.einsum("bhij,bhjd->bihd", weights, v).reshape(B, T, -1)
    return out @ W_o.T, weights


def attention_sdpa_heads(x, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, cos, sin):
    """One head at a time through PyTorch's fused attention; the output only."""
    B, T, _ = x.shape
    d = W_q.size(0) // num_heads
    group = num_heads // num_kv_heads
    outs = []
    for h in range(num_heads):
        g = h // group
        q = rope_complex(x @ W_q[h * d : (h + 1) * d].T, cos, sin)
        k = rope_complex(x @ W_k[g * d : (g + 1) * d].T, cos, sin)
        v = x @ W_v[g * d : (g + 1) * d].T
        outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True))
    return torch.cat(outs, dim=-1) @ W_o.T


OTHERS = {
    "rms_norm": (rms_norm_rsqrt, rms_norm_float64_norm, rms_norm_module),
    "swiglu": (swiglu_einsum, swiglu_module),
    "rotate_half": (rotate_half_index, rotate_half_flip),
    "rope_cos_sin": (rope_pairs, rope_complex),
    "llama_attention": (attention_einsum, attention_sdpa_heads),
}


@pytest.mark.parametrize("check_fn", CHECKS, ids=lambda c: c.spec.name)
def test_references_and_other_implementations_pass(check_fn):
    for impl in (check_fn.spec.reference, *OTHERS[check_fn.spec.name]):
        assert_passes(check_fn, impl)


@pytest.mark.parametrize("check_fn", CHECKS, ids=lambda c: c.spec.name)
def test_nan_wrong_shape_and_dtype_never_pass(check_fn):
    assert_rejects_corruptions(check_fn)


def test_attention_that_returns_only_the_output_is_graded_on_it():
    result = check.llama_attention(attention_sdpa_heads)
    assert result and "passed all 4 cases" in result.report()


def test_a_failure_names_the_smallest_case_and_where_it_differs():
    def scaled_twice(x, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, cos, sin):
        out, weights = attention_einsum(x, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, cos, sin)
        return out * 2, weights

    report = check.llama_attention(scaled_twice).report()
    assert "Likely bug" not in report
    assert 'Smallest failing case: "batch 1, T = 3' in report
    assert "output differs first at batch 0, position 0, feature 0" in report
