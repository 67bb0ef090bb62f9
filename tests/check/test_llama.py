"""The grader's own tests for ``mhbook.check.llama``: chapter 14's RMSNorm, SwiGLU,
rotate_half, RoPE from its tables and grouped-query attention (the other correct
implementations, run by ``test_catalogue.py``, and what is special here)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from grading import by_transformers

import mhbook
from mhbook import check

pytest.importorskip("transformers")

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


@by_transformers
def rms_norm_llama(x, g, eps):
    """transformers' own ``LlamaRMSNorm`` (in float32 inside) with the gain loaded."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(x.size(-1), eps).to(x.dtype)
    norm.weight.data.copy_(g)
    return norm(x)


@by_transformers
def swiglu_llama(x, W_gate, W_up, W_down):
    """transformers' own ``LlamaMLP`` with the weights loaded."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    d_ff, d_model = W_gate.shape
    config = LlamaConfig(
        hidden_size=d_model,
        intermediate_size=d_ff,
        num_attention_heads=1,
        head_dim=d_model,
        mlp_bias=False,
    )
    mlp = LlamaMLP(config)
    mlp = mlp.to(x.dtype)
    for layer, w in ((mlp.gate_proj, W_gate), (mlp.up_proj, W_up), (mlp.down_proj, W_down)):
        layer.weight.data.copy_(w)
    return mlp(x)


@by_transformers
def rotate_half_llama(x):
    """transformers' own ``rotate_half``."""
    from transformers.models.llama.modeling_llama import rotate_half

    return rotate_half(x)


@by_transformers
def rope_llama(x, cos, sin):
    """transformers' own ``apply_rotary_pos_emb``, queries and keys alike."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rotated, _ = apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=0)
    return rotated.reshape(x.shape)  # (1, T, d_head) for a single vector


@by_transformers
def attention_llama(x, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, cos, sin):
    """transformers' own ``LlamaAttention`` (eager), built from a config, the weights loaded,
    with a causal additive mask."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    T, d_model = x.shape[-2:]
    config = LlamaConfig(
        hidden_size=d_model,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=W_q.size(0) // num_heads,
        attention_bias=False,
    )
    config._attn_implementation = "eager"
    layer = LlamaAttention(config, layer_idx=0).to(x.dtype).eval()
    for name, w in zip("qkvo", (W_q, W_k, W_v, W_o)):
        getattr(layer, f"{name}_proj").weight.data.copy_(w)
    mask = torch.full((T, T), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)
    return layer(x, position_embeddings=(cos[None], sin[None]), attention_mask=mask)


ALTERNATIVES = {
    "rms_norm": (rms_norm_rsqrt, rms_norm_float64_norm, rms_norm_module, rms_norm_llama),
    "swiglu": (swiglu_einsum, swiglu_module, swiglu_llama),
    "rotate_half": (rotate_half_index, rotate_half_flip, rotate_half_llama),
    "rope_cos_sin": (rope_pairs, rope_complex, rope_llama),
    "llama_attention": (attention_einsum, attention_sdpa_heads, attention_llama),
}


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
    assert "output is outside the tolerance at" in report
    assert "the worst is at batch 0, position " in report and "(rtol 1e-4, atol 1e-5)" in report
