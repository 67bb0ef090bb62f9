"""Multi-head latent attention: equal to Hugging Face's DeepseekV3Attention (weights
copied), the absorbed form equal to the naive one, cached decoding equal to the full
causal forward, on the meta device, and clear errors."""

from __future__ import annotations

import pytest
import torch
from helpers import CLOSE, EXACT, additive_mask, head_zeroed, seeded
from torch import nn

import mhbook
from mhbook.attention.mla import MultiHeadLatentAttention

D_MODEL, NUM_HEADS, D_LATENT = 32, 4, 12  # hf_deepseek_attention's (conftest.py)


@pytest.mark.parametrize("q_lora_rank", [None, 16], ids=["q-direct", "q-latent"])
@pytest.mark.parametrize("rope_interleave", [True, False], ids=["interleaved", "halves"])
@pytest.mark.parametrize("attention_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
def test_equals_hugging_face_deepseek_v3_float64(
    q_lora_rank, rope_interleave, attention_bias, absorb, hf_deepseek_attention
):
    _, theirs, rotary = hf_deepseek_attention(
        torch.float64,
        q_lora_rank=q_lora_rank,
        rope_interleave=rope_interleave,
        attention_bias=attention_bias,
    )
    ours = mhbook.mla_from_hf(theirs)
    ours.absorb = absorb
    # Hugging Face's RMSNorm computes in float32 even for float64 inputs; PyTorch's
    # nn.RMSNorm (the same formula) keeps float64, so that the comparison can be tight.
    for name in ("kv_a_layernorm", "q_a_layernorm"):
        norm = getattr(theirs, name)
        if norm is not None:
            torch_norm = nn.RMSNorm(norm.weight.numel(), eps=norm.variance_epsilon)
            torch_norm = torch_norm.to(torch.float64)
            with torch.no_grad():
                torch_norm.weight.copy_(norm.weight)
            setattr(theirs, name, torch_norm)
    assert (ours.d_head, ours.d_rope, ours.d_v, ours.d_q_latent) == (8, 6, 10, q_lora_rank)
    x = torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    positions = torch.arange(7)
    # Its rotary embedding computes the angles in float32, as mhbook.RotaryEmbedding does.
    cos_sin = rotary(x, positions[None])
    mask = mhbook.causal_mask(7)
    expected, _ = theirs(x, cos_sin, additive_mask(mask, torch.float64))
    actual, _ = ours(x, mask=mask, positions=positions)
    torch.testing.assert_close(actual, expected, **CLOSE)
    # is_causal=True and (batch, T) positions are the same.
    actual, _ = ours(x, is_causal=True, positions=positions.expand(2, -1))
    torch.testing.assert_close(actual, expected, **CLOSE)


def test_equals_hugging_face_float32_with_its_own_rotary_and_norms(hf_deepseek_attention):
    _, theirs, rotary = hf_deepseek_attention(torch.float32, q_lora_rank=16)
    ours = mhbook.mla_from_hf(theirs)
    x = torch.randn(2, 9, D_MODEL)
    positions = torch.arange(9)[None]
    cos_sin = rotary(x, positions)
    mask = mhbook.causal_mask(9)
    expected, _ = theirs(x, cos_sin, additive_mask(mask, torch.float32))
    actual, _ = ours(x, mask=mask)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def _mla(interleaved=True, **kwargs):
    """A latent attention that stands alone: with ``d_rope``, its own rotary embedding."""
    torch.manual_seed(0)
    kwargs = {**dict(d_head=8, d_rope=4, d_v=6, d_q_latent=10), **kwargs}
    if kwargs["d_rope"] > 0:
        kwargs["rope"] = mhbook.RotaryEmbedding(kwargs["d_rope"], interleaved=interleaved)
    return MultiHeadLatentAttention(D_MODEL, NUM_HEADS, D_LATENT, **kwargs).double()


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"d_rope": 0}, {"d_q_latent": None}, {"bias": True}, {"interleaved": False}],
    ids=["default", "no-rope", "q-direct", "bias", "halves"],
)
def test_absorbed_equals_naive(kwargs):
    mla = _mla(**kwargs)
    x = torch.randn(3, 6, D_MODEL, dtype=torch.float64)
    mask = mhbook.causal_mask(6)
    naive, w_naive = mla(x, mask=mask, need_weights=True)
    mla.absorb = True
    absorbed, w_absorbed = mla(x, mask=mask, need_weights=True)
    assert w_absorbed.shape == (3, NUM_HEADS, 6, 6)
    torch.testing.assert_close(absorbed, naive, **EXACT)
    torch.testing.assert_close(w_absorbed, w_naive, **EXACT)
    fused, none = mla(x, mask=mask)  # the fused kernel gives the same
    assert none is None
    torch.testing.assert_close(fused, naive, **EXACT)
    for absorb in (False, True):  # is_causal=True is the causal mask, in both forms
        mla.absorb = absorb
        torch.testing.assert_close(mla(x, is_causal=True)[0], naive, **EXACT)


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
def test_absorbed_equals_naive_with_every_mask_shape(need_weights):
    """Padding (batch, 1, 1, S), per-head (batch, h, T, S), a key row (1, S), and a query
    with no key at all (zero output, never NaN)."""
    mla = _mla()
    x = torch.randn(2, 5, D_MODEL, dtype=torch.float64)
    per_head = torch.rand(2, NUM_HEADS, 5, 5) > 0.4
    per_head[1, 2, 3] = False  # head 2 of sequence 1: query 3 sees nothing
    masks = [
        mhbook.padding_mask(torch.tensor([5, 3]), 5),
        per_head,
        torch.tensor([[True, False, True, True, False]]),  # (1, S): one row for all
        mhbook.causal_mask(5) & mhbook.padding_mask(torch.tensor([4, 2]), 5),
    ]
    for mask in masks:
        mla.absorb = False
        naive = mla(x, mask=mask, need_weights=need_weights)
        mla.absorb = True
        absorbed = mla(x, mask=mask, need_weights=need_weights)
        assert (absorbed[1] is None) == (naive[1] is None) == (not need_weights)
        torch.testing.assert_close(absorbed, naive, **EXACT)  # output and weights
    assert not torch.isnan(absorbed[0]).any()


def test_absorbed_equals_folded_matrices():
    """Multiply the folds out: W_uk_i^T W_q_i on the query side, W_o_i W_uv_i on the output."""
    mla = _mla(d_rope=0, d_q_latent=None).eval()
    x = torch.randn(2, 5, D_MODEL, dtype=torch.float64)
    h, d, d_v = NUM_HEADS, mla.d_head, mla.d_v
    W_q = mla.W_q.weight.view(h, d, D_MODEL)
    W_uk = mla.W_uk.weight.view(h, d, D_LATENT)
    W_uv = mla.W_uv.weight.view(h, d_v, D_LATENT)
    W_o = mla.W_o.weight.view(D_MODEL, h, d_v)
    W_qk = W_uk.transpose(1, 2) @ W_q  # (h, d_latent, d_model)
    W_ov = torch.einsum("mhv,hvc->hmc", W_o, W_uv)  # (h, d_model, d_latent)
    c = mla.kv_norm(mla.W_dkv(x))  # (B, S, d_latent)
    q = torch.einsum("hcm,btm->bhtc", W_qk, x)
    weights = torch.softmax(q @ c.unsqueeze(1).transpose(-2, -1) / d**0.5, dim=-1)
    out = torch.einsum("hmc,bhtc->btm", W_ov, weights @ c.unsqueeze(1))
    torch.testing.assert_close(out, mla(x)[0], **EXACT)


@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
def test_cached_decoding_equals_full_causal_forward(absorb):
    mla = _mla(absorb=absorb).eval()
    x = torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    full, _ = mla(x, mask=mhbook.causal_mask(7))
    cache = mhbook.LayerCache()
    steps = [mla(x[:, :3], mask=mhbook.causal_mask(3), cache=cache)[0]]  # a prompt of 3,
    for t in range(3, 7):  # then one by one
        steps.append(mla(x[:, t : t + 1], cache=cache)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **EXACT)
    assert cache.length == 7 and cache.keys is None and cache.values is None
    assert cache.latent.shape == (2, 7, D_LATENT + 4)  # [c ; k_rope] per token, nothing else
    assert cache.nbytes == 2 * 7 * (D_LATENT + 4) * 8


def test_positions_default_to_the_cache_length():
    mla = _mla().eval()
    x = torch.randn(1, 4, D_MODEL, dtype=torch.float64)
    cache = mhbook.LayerCache()
    mla(x, cache=cache)
    y = torch.randn(1, 2, D_MODEL, dtype=torch.float64)
    implicit, _ = mla(y, cache=cache.copy())
    explicit, _ = mla(y, cache=cache.copy(), positions=torch.tensor([4, 5]))
    torch.testing.assert_close(implicit, explicit, rtol=0, atol=0)
    other, _ = mla(y, cache=cache.copy(), positions=torch.tensor([0, 1]))
    assert not torch.allclose(other, implicit)


def test_scores_depend_on_relative_position_only():
    """Shifting every position by the same amount leaves the output unchanged (RoPE)."""
    mla = _mla().eval()
    x = torch.randn(1, 5, D_MODEL, dtype=torch.float64)
    a, _ = mla(x, mask=mhbook.causal_mask(5), positions=torch.arange(5))
    b, _ = mla(x, mask=mhbook.causal_mask(5), positions=torch.arange(5) + 11)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # RoPE's angles are float32


def test_positions_per_sequence():
    """(batch, T) positions: each sequence as if it ran alone with its (T,) positions."""
    mla = _mla().eval()
    x = seeded(2, 5, D_MODEL, seed=3)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    both, _ = mla(x, mask=mhbook.causal_mask(5), positions=positions)
    for b in range(2):
        alone, _ = mla(x[b : b + 1], mask=mhbook.causal_mask(5), positions=positions[b])
        torch.testing.assert_close(both[b : b + 1], alone, **EXACT)


@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
def test_on_meta_device(absorb):
    meta = torch.device("meta")
    with meta:
        rope = mhbook.RotaryEmbedding(4, interleaved=True)
        mla = MultiHeadLatentAttention(
            D_MODEL, NUM_HEADS, D_LATENT, d_rope=4, d_q_latent=10, rope=rope
        )
    mla.absorb = absorb
    x = torch.randn(2, 5, D_MODEL, device=meta)
    out, _ = mla(x, mask=mhbook.causal_mask(5, device=meta))
    assert out.device.type == "meta" and out.shape == (2, 5, D_MODEL)
    out.sum().backward()
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in mla.parameters())
    cache = mhbook.LayerCache()
    mla(x, mask=mhbook.causal_mask(5, device=meta), cache=cache)
    step, weights = mla(x[:, :1], cache=cache, need_weights=True)
    assert step.shape == (2, 1, D_MODEL) and weights.shape == (2, NUM_HEADS, 1, 6)
    assert cache.latent.device.type == "meta" and cache.latent.shape == (2, 6, D_LATENT + 4)


def test_parameter_count():
    mla = MultiHeadLatentAttention(64, 4, 16, d_rope=8, d_q_latent=32)
    d_head = 16
    expected = (
        64 * 32
        + 32  # W_dq, q_norm
        + 32 * 4 * d_head
        + 32 * 4 * 8  # W_q, W_qr
        + 64 * 16
        + 16
        + 64 * 8  # W_dkv, kv_norm, W_kr
        + 16 * 4 * d_head * 2  # W_uk, W_uv
        + 4 * d_head * 64  # W_o
    )
    assert sum(p.numel() for p in mla.parameters()) == expected


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"d_latent": 40}, r"d_latent must be at most d_model=32 .*got d_latent=40"),
        ({"d_rope": 3}, r"d_rope must be even"),
        ({"d_rope": -2}, r"d_rope must be an int >= 0"),
        ({"num_heads": 0}, r"num_heads must be an int >= 1"),
        ({"num_heads": 5}, r"divisible by num_heads"),
        ({"d_q_latent": 33}, r"d_q_latent must be at most d_model=32"),
        ({"dropout": 1.0}, r"dropout must be a number in \[0.0, 1.0\), got 1.0"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"d_model": D_MODEL, "num_heads": NUM_HEADS, "d_latent": D_LATENT, **kwargs}
    with pytest.raises(ValueError, match=match):
        MultiHeadLatentAttention(**args)


def test_bad_inputs():
    mla = _mla()
    x = torch.randn(2, 3, D_MODEL, dtype=torch.float64)
    with pytest.raises(
        ValueError, match=r"query must have shape \(batch, length, d_model=32\), got \(2, 3, 31\)"
    ):
        mla(x[..., :31])
    with pytest.raises(TypeError, match=r"query has dtype torch.float32 but the module's weights"):
        mla(x.float())
    with pytest.raises(ValueError, match=r"positions must have shape \(T,\) = \(3,\) .*got \(4,\)"):
        mla(x, positions=torch.arange(4))
    with pytest.raises(TypeError, match=r"positions must hold integers, got dtype torch.float32"):
        mla(x, positions=torch.arange(3.0))
    with pytest.raises(ValueError, match=r"self-attention: call it with key=None and value=None"):
        mla(x, x)
    with pytest.raises(ValueError, match=r"mask"):
        mla(x, mask=torch.ones(3, 4, dtype=torch.bool))
    cache = mhbook.LayerCache()
    mla(x, cache=cache)
    other = _mla(d_rope=0)
    with pytest.raises(ValueError, match=r"does not fit the cached"):
        other(x, cache=cache)
    with pytest.raises(TypeError, match=r"cache must be None or a mhbook.LayerCache"):
        mla(x, cache=mhbook.KVCache(1))
    # A cache of keys and values (multi-head attention's) cannot take a latent.
    keys_and_values = mhbook.LayerCache()
    keys_and_values.update(torch.zeros(2, 4, 3, 8), torch.zeros(2, 4, 3, 8))
    with pytest.raises(
        ValueError, match=r"holds keys and values of 3 tokens; it cannot take a latent"
    ):
        mla(x, cache=keys_and_values)


def test_record_attention_sees_the_weights():
    mla = _mla().eval()
    x = torch.randn(2, 5, D_MODEL, dtype=torch.float64)
    with mhbook.record_attention(mla) as weights:
        out, _ = mla(x, mask=mhbook.causal_mask(5))
    (w,) = weights().values()
    assert w.shape == (2, NUM_HEADS, 5, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, NUM_HEADS, 5, dtype=torch.float64))
    torch.testing.assert_close(out, mla(x, mask=mhbook.causal_mask(5))[0], **EXACT)


@pytest.mark.parametrize("absorb", [False, True], ids=["naive", "absorbed"])
def test_head_mask_zero_equals_zeroing_that_heads_slice(absorb):
    """As in MultiHeadAttention: head_mask scales each head's output before W_o."""
    mla = _mla(absorb=absorb).eval()
    x, mask = seeded(2, 5, D_MODEL, seed=4), mhbook.causal_mask(5)
    head, d_v = 1, mla.d_v

    with head_zeroed(mla, head, d_v):
        expected, _ = mla(x, mask=mask)
    mla.head_mask = torch.ones(NUM_HEADS, dtype=torch.float64)
    mla.head_mask[head] = 0
    for need_weights in (False, True):
        torch.testing.assert_close(
            mla(x, mask=mask, need_weights=need_weights)[0], expected, **EXACT
        )
    mla.head_mask = None
    assert not torch.allclose(mla(x, mask=mask)[0], expected)
