"""mhbook.GroupedQueryAttention and attend(..., bias=): against MultiHeadAttention,
PyTorch's SDPA with enable_gqa, Hugging Face's LlamaAttention, explicit formulas, and
itself with a KV cache."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mhbook
from mhbook import GroupedQueryAttention

D_MODEL, NUM_HEADS = 16, 4


def _x(batch=2, length=6, dtype=torch.float64, seed=0, d_model=D_MODEL):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, length, d_model, generator=g, dtype=dtype)


def _gqa(num_kv_heads, dtype=torch.float64, seed=0, **kwargs):
    torch.manual_seed(seed)
    return GroupedQueryAttention(D_MODEL, NUM_HEADS, num_kv_heads, **kwargs).to(dtype).eval()


# -- stand-ins for mhbook.RotaryEmbedding and mhbook.ALiBi (same call signatures) --------
class _Rotate(nn.Module):
    """Rotate-half rotary embedding, written out here: ``x cos + rotate_half(x) sin``."""

    def forward(self, x, positions):
        d = x.size(-1)
        inv_freq = 10000.0 ** (-torch.arange(0, d, 2, device=x.device, dtype=x.dtype) / d)
        angles = positions.to(x.dtype)[:, None] * inv_freq  # (T, d/2)
        cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class _Distance(nn.Module):
    """An ALiBi-like bias: ``-slope_h * |i - j|``, ``(num_heads, T, S)``."""

    def __init__(self, num_heads):
        super().__init__()
        self.num_heads = num_heads

    def forward(self, q_positions, k_positions):
        slopes = 2.0 ** -torch.arange(1, self.num_heads + 1, device=q_positions.device)
        distance = (q_positions[:, None] - k_positions[None, :]).abs()
        return -slopes[:, None, None] * distance


# -- attend(..., bias=) -----------------------------------------------------------------------
def _explicit(q, k, v, mask=None, bias=None):
    """softmax(q k^T / sqrt(d) + bias) v, keys repeated for the groups, written out."""
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("use_mask", [False, True], ids=["no-mask", "causal"])
def test_attend_bias_equals_explicit_formula(need_weights, use_mask):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 7, 8, generator=g, dtype=torch.float64) for _ in range(2))
    bias = torch.randn(4, 5, 7, generator=g, dtype=torch.float64)
    mask = mhbook.causal_mask(5, 7) if use_mask else None
    out, weights = mhbook.attend(q, k, v, mask, need_weights=need_weights, bias=bias)
    torch.testing.assert_close(out, _explicit(q, k, v, mask, bias), rtol=1e-12, atol=1e-12)
    assert (weights is not None) == need_weights


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
def test_attend_bias_fully_masked_row_is_zero(need_weights):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=g, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 2, 3, 3, generator=g)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    out, _ = mhbook.attend(q, k, v, mask, need_weights=need_weights, bias=bias)
    assert torch.isfinite(out).all() and (out[:, :, 1] == 0).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_attend_bias_errors():
    q = k = v = torch.zeros(1, 2, 3, 4)
    with pytest.raises(TypeError, match="floating-point"):
        mhbook.attend(q, k, v, bias=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"bias of shape \(5, 3\) does not broadcast"):
        mhbook.attend(q, k, v, bias=torch.zeros(5, 3))


# -- GroupedQueryAttention --------------------------------------------------------------------
def test_equals_multi_head_attention_when_num_kv_heads_is_num_heads():
    gqa = _gqa(None, bias=True)
    assert gqa.num_kv_heads == NUM_HEADS and gqa.group_size == 1
    mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, bias=True).double().eval()
    for name in ("W_q", "W_k", "W_v", "W_o"):
        getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
    x, mask = _x(), mhbook.causal_mask(6)
    out, weights = gqa(x, mask, need_weights=True)
    out_mha, weights_mha = mha(x, x, x, mask, need_weights=True)
    torch.testing.assert_close(out, out_mha, rtol=0, atol=1e-12)
    torch.testing.assert_close(weights, weights_mha, rtol=0, atol=1e-12)


@pytest.mark.parametrize("num_kv_heads", [2, 1], ids=["GQA", "MQA"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_equals_torch_sdpa_with_enable_gqa(num_kv_heads, causal):
    gqa = _gqa(num_kv_heads)
    x = _x()
    B, T, _ = x.shape
    d = gqa.d_head
    q = gqa.W_q(x).view(B, T, NUM_HEADS, d).transpose(1, 2)
    k = gqa.W_k(x).view(B, T, num_kv_heads, d).transpose(1, 2)
    v = gqa.W_v(x).view(B, T, num_kv_heads, d).transpose(1, 2)
    assert k.shape == (B, num_kv_heads, T, d)
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    expected = gqa.W_o(heads.transpose(1, 2).reshape(B, T, NUM_HEADS * d))
    mask = mhbook.causal_mask(T) if causal else None
    for need_weights in (False, True):
        out = gqa(x, mask, need_weights=need_weights)
        out = out[0] if need_weights else out
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_parameter_counts():
    """W_k and W_v shrink with the key/value heads; W_q and W_o do not."""
    d_head = D_MODEL // NUM_HEADS
    for h_kv in (4, 2, 1):
        gqa = GroupedQueryAttention(D_MODEL, NUM_HEADS, h_kv)
        expected = 2 * D_MODEL * D_MODEL + 2 * D_MODEL * h_kv * d_head
        assert sum(p.numel() for p in gqa.parameters()) == expected


def test_fixed_head_size():
    gqa = GroupedQueryAttention(D_MODEL, 8, 2, d_head=6)
    assert gqa.W_q.weight.shape == (48, D_MODEL) and gqa.W_k.weight.shape == (12, D_MODEL)
    assert gqa.W_o.weight.shape == (D_MODEL, 48)
    assert gqa(torch.zeros(1, 3, D_MODEL)).shape == (1, 3, D_MODEL)


def _decode_step_by_step(gqa, x, window=None, chunks=(1,)):
    """Feed ``x`` in pieces of the sizes in ``chunks`` (cycled) through a LayerCache."""
    cache = mhbook.LayerCache(window)
    outputs, start, i = [], 0, 0
    while start < x.size(1):
        size = min(chunks[i % len(chunks)], x.size(1) - start)
        new = x[:, start : start + size]
        mask = mhbook.causal_mask(size, cache.num_kept + size, window=window)
        outputs.append(gqa(new, mask, cache=cache))
        start, i = start + size, i + 1
    assert cache.length == x.size(1)
    return torch.cat(outputs, dim=1), cache


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
@pytest.mark.parametrize("chunks", [(1,), (3, 1, 2)], ids=["one-by-one", "chunks"])
def test_cache_equals_full_causal_forward(num_kv_heads, position, chunks):
    extra = {"rope": {"rope": _Rotate()}, "alibi": {"alibi": _Distance(NUM_HEADS)}}
    gqa = _gqa(num_kv_heads, **extra.get(position, {}))
    x = _x(length=7)
    full = gqa(x, mhbook.causal_mask(7))
    stepped, cache = _decode_step_by_step(gqa, x, chunks=chunks)
    torch.testing.assert_close(stepped, full, rtol=0, atol=1e-12)
    # The cache holds num_kv_heads heads only: num_heads / num_kv_heads times fewer bytes.
    assert cache.keys.shape == (2, num_kv_heads, 7, D_MODEL // NUM_HEADS)


@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
def test_rolling_cache_equals_window_mask(position):
    extra = {"rope": {"rope": _Rotate()}, "alibi": {"alibi": _Distance(NUM_HEADS)}}
    gqa = _gqa(2, **extra.get(position, {}))
    x, window = _x(length=9), 3
    full = gqa(x, mhbook.causal_mask(9, window=window))
    for chunks in ((1,), (2, 4, 1)):
        stepped, cache = _decode_step_by_step(gqa, x, window=window, chunks=chunks)
        torch.testing.assert_close(stepped, full, rtol=0, atol=1e-12)
        assert cache.num_kept == window and cache.length == 9


def test_rope_and_alibi_are_applied():
    """The stand-ins change the output, and each equals the formula written out."""
    x, mask = _x(length=5), mhbook.causal_mask(5)
    plain = _gqa(2)
    B, T, _ = x.shape
    q = plain.W_q(x).view(B, T, NUM_HEADS, 4).transpose(1, 2)
    k = plain.W_k(x).view(B, T, 2, 4).transpose(1, 2)
    v = plain.W_v(x).view(B, T, 2, 4).transpose(1, 2)
    positions = torch.arange(T)

    def merge(heads):
        return plain.W_o(heads.transpose(1, 2).reshape(B, T, -1))

    rope = _Rotate()
    expected = merge(_explicit(rope(q, positions), rope(k, positions), v, mask))
    torch.testing.assert_close(_gqa(2, rope=rope)(x, mask), expected, rtol=0, atol=1e-12)
    alibi = _Distance(NUM_HEADS)
    expected = merge(_explicit(q, k, v, mask, alibi(positions, positions)))
    torch.testing.assert_close(_gqa(2, alibi=alibi)(x, mask), expected, rtol=0, atol=1e-12)
    assert not torch.allclose(plain(x, mask), expected)


def test_explicit_positions():
    """Given positions equal the default ones. Shifting every position leaves the scores
    as they are (rotary embedding is relative); spreading them out does not."""
    gqa = _gqa(2, rope=_Rotate())
    x, mask = _x(length=4), mhbook.causal_mask(4)
    torch.testing.assert_close(gqa(x, mask, positions=torch.arange(4)), gqa(x, mask))
    shifted = gqa(x, mask, positions=torch.arange(4) + 3)
    torch.testing.assert_close(shifted, gqa(x, mask), rtol=0, atol=1e-12)
    assert not torch.allclose(gqa(x, mask, positions=torch.tensor([0, 2, 5, 9])), gqa(x, mask))


def test_record_attention_sees_grouped_query_attention():
    gqa = _gqa(2)
    model = nn.ModuleDict({"attn": gqa})
    x, mask = _x(length=5), mhbook.causal_mask(5)
    with mhbook.record_attention(model) as weights:
        out = gqa(x, mask)
    w = weights()["attn"]
    assert w.shape == (2, NUM_HEADS, 5, 5)
    torch.testing.assert_close(gqa(x, mask), out)
    assert (w.masked_select(~mask) == 0).all()


def test_gradients_flow_to_every_parameter():
    gqa = _gqa(2, bias=True).train()
    gqa(_x(), mhbook.causal_mask(6)).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in gqa.parameters())


# -- against Hugging Face's LlamaAttention (random weights, nothing downloaded) ---------------
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_equals_llama_attention_without_rotation(num_kv_heads):
    """LlamaAttention takes the rotation as (cos, sin): cos = 1, sin = 0 is no rotation,
    so this checks the grouped heads alone (RoPE is checked in test_rope.py)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaAttention

    config = transformers.LlamaConfig(
        hidden_size=D_MODEL,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=num_kv_heads,
        attention_bias=False,
        attention_dropout=0.0,
    )
    # eager would take the softmax in float32; sdpa keeps float64
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    llama = LlamaAttention(config, layer_idx=0).double().eval()
    gqa = _gqa(num_kv_heads)
    with torch.no_grad():
        for ours, theirs in (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj")):
            getattr(gqa, ours).weight.copy_(getattr(llama, theirs).weight)
        gqa.W_o.weight.copy_(llama.o_proj.weight)
    x = _x(length=5)
    d_head = D_MODEL // NUM_HEADS
    cos = torch.ones(1, 5, d_head, dtype=torch.float64)
    sin = torch.zeros(1, 5, d_head, dtype=torch.float64)
    mask = mhbook.causal_mask(5)
    additive = torch.zeros(5, 5, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    theirs, _ = llama(x, position_embeddings=(cos, sin), attention_mask=additive[None, None])
    torch.testing.assert_close(gqa(x, mask), theirs, rtol=0, atol=1e-10)


# -- errors and the meta device ----------------------------------------------------------------
def test_num_heads_not_divisible_by_num_kv_heads():
    with pytest.raises(ValueError, match=r"num_heads=4, num_kv_heads=3 \(num_heads % num_kv"):
        GroupedQueryAttention(D_MODEL, 4, 3)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"d_model": 10, "num_heads": 4}, "d_model must be divisible by num_heads"),
        ({"num_kv_heads": 0}, "num_kv_heads must be a positive int or None, got 0"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"d_model": D_MODEL, "num_heads": NUM_HEADS, **kwargs}
    with pytest.raises(ValueError, match=match):
        GroupedQueryAttention(**args)


def test_bad_inputs():
    gqa = _gqa(2, dtype=torch.float32)
    with pytest.raises(
        ValueError, match=r"x must have shape \(batch, T, d_model=16\), got \(2, 5, 8\)"
    ):
        gqa(torch.zeros(2, 5, 8))
    with pytest.raises(TypeError, match="x has dtype torch.float64"):
        gqa(torch.zeros(2, 5, D_MODEL, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"positions must be a tensor of shape \(T,\) = \(5,\)"):
        gqa(torch.zeros(2, 5, D_MODEL), positions=torch.arange(4))
    with pytest.raises(TypeError, match="positions must hold integers"):
        gqa(torch.zeros(2, 5, D_MODEL), positions=torch.zeros(5))
    with pytest.raises(TypeError, match="cache must be None or a mhbook.LayerCache"):
        gqa(torch.zeros(2, 5, D_MODEL), cache=mhbook.KVCache(1))
    with pytest.raises(ValueError, match="does not broadcast"):
        gqa(torch.zeros(2, 5, D_MODEL), mhbook.causal_mask(5, 6))


@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
def test_meta_device(position):
    extra = {"rope": {"rope": _Rotate()}, "alibi": {"alibi": _Distance(NUM_HEADS)}}
    meta = torch.device("meta")
    with meta:
        gqa = GroupedQueryAttention(D_MODEL, NUM_HEADS, 2, dropout=0.1, **extra.get(position, {}))
    x = torch.randn(2, 5, D_MODEL, device=meta)
    out, weights = gqa(x, mhbook.causal_mask(5, device=meta), need_weights=True)
    assert out.device.type == "meta" and out.shape == (2, 5, D_MODEL)
    assert weights.shape == (2, NUM_HEADS, 5, 5)
    out.sum().backward()
    cache = mhbook.LayerCache(window=3)
    gqa.eval()
    for step in range(4):
        mask = mhbook.causal_mask(1, cache.num_kept + 1, device=meta, window=3)
        y = gqa(x[:, :1], mask, cache=cache)
        assert y.device.type == "meta" and cache.num_kept == min(step + 1, 3)
