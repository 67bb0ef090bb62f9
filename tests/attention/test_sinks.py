"""Attention sinks (StreamingLLM, Xiao et al., 2023): every query of a sliding window also
sees the first `sinks` tokens; the cache keeps them for good; the keys are positioned
within the cache, not at their text positions."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import ANGLES, CLOSE, EXACT, seeded
from helpers import stepped as _stepped

import mhbook
from mhbook import DecoderOnlyLM, KVCache, LayerCache, ModelConfig, MultiHeadAttention

VOCAB, D_MODEL, NUM_HEADS, NUM_KV_HEADS, D_HEAD = 23, 16, 4, 2, 4


def _lm(seed=0, **kwargs):
    base = dict(d_model=D_MODEL, num_heads=NUM_HEADS, num_layers=2, d_ff=32, norm_first=True)
    torch.manual_seed(seed)
    return DecoderOnlyLM(ModelConfig(**{**base, **kwargs}), VOCAB).double().eval()


def _tokens(batch=2, length=9, seed=0):
    return torch.randint(4, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# -- the mask -------------------------------------------------------------------------------
def test_the_mask_is_the_window_band_plus_the_first_columns():
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0],
            [1, 1, 0, 1, 1, 0, 0],
            [1, 1, 0, 0, 1, 1, 0],
            [1, 1, 0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mhbook.causal_mask(7, window=2, sinks=2), expected)
    # Bottom-right, as with a cache: 2 new queries over 5 kept keys.
    assert torch.equal(mhbook.causal_mask(2, 7, window=2, sinks=2), expected[-2:])
    assert torch.equal(mhbook.causal_mask(7, window=2, sinks=0), mhbook.causal_mask(7, window=2))
    # Sinks beyond the sequence, or a window that covers it: the plain causal mask.
    assert torch.equal(mhbook.causal_mask(4, window=2, sinks=9), mhbook.causal_mask(4))
    assert torch.equal(mhbook.causal_mask(4, window=4, sinks=1), mhbook.causal_mask(4))


@pytest.mark.parametrize("window, sinks", [(1, 1), (2, 3), (3, 1)])
def test_the_mask_in_pytorchs_attention_and_mhbooks(window, sinks):
    q, k, v = seeded(2, 4, 9, 8, seed=1), seeded(2, 4, 9, 8, seed=2), seeded(2, 4, 9, 8, seed=3)
    mask = mhbook.causal_mask(9, window=window, sinks=sinks)
    torch_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    explicit, weights = mhbook.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(mhbook.attend(q, k, v, mask)[0], torch_out, **EXACT)
    torch.testing.assert_close(explicit, torch_out, **EXACT)
    assert torch.all(weights[..., ~mask] == 0)
    assert torch.all(weights[..., :sinks].sum(-1)[..., sinks:] > 0)  # the sinks are seen


@pytest.mark.parametrize(
    "num_queries, num_keys, window, sinks",
    [(7, 7, 2, 2), (10, 10, 3, 1), (3, 9, 2, 2), (5, 5, 4, 0), (6, 6, 1, 3), (1, 12, 4, 4)],
)
def test_window_slots_list_each_querys_keys_in_order(num_queries, num_keys, window, sinks):
    mask = mhbook.causal_mask(num_queries, num_keys, window=window, sinks=sinks)
    index, valid = mhbook.window_slots(num_queries, num_keys, window, sinks)
    assert index.shape == valid.shape == (num_queries, sinks + window)
    for i in range(num_queries):
        assert index[i, valid[i]].tolist() == mask[i].nonzero().flatten().tolist()
        assert valid[i].tolist() == sorted(valid[i].tolist(), reverse=True)  # a prefix


# -- the cache ------------------------------------------------------------------------------
def _numbered(start, stop):
    """Keys whose every entry is the token's position: (1, 1, T, 2)."""
    return torch.arange(start, stop, dtype=torch.float64).view(1, 1, -1, 1).expand(1, 1, -1, 2)


@pytest.mark.parametrize("chunks", [(1,), (3, 1, 4)], ids=["one-by-one", "chunks"])
def test_the_cache_keeps_the_sinks_and_the_last_window(chunks):
    cache, start, i = LayerCache(), 0, 0
    while start < 13:
        size = min(chunks[i % len(chunks)], 13 - start)
        k = _numbered(start, start + size)
        keys, _, _ = cache.update(k, k, window=3, sinks=2)  # as a layer with sinks updates it
        seen = list(range(start + size))
        kept = seen if len(seen) <= 5 else seen[:2] + seen[-3:]
        assert cache.keys[0, 0, :, 0].tolist() == kept
        returned = seen if start <= 5 else seen[:2] + seen[start - 3 :]
        assert keys[0, 0, :, 0].tolist() == returned  # the kept ones, then the new ones
        start, i = start + size, i + 1
    assert cache.length == 13 and cache.num_kept == 5
    assert cache.nbytes == 2 * 5 * 2 * 8  # keys and values, 5 tokens, 2 features, float64
    assert "window" not in repr(cache)  # the cache holds tensors, not the layer's kind


def test_the_cache_of_a_model_keeps_sinks_plus_window_tokens():
    lm = _lm(position="rope", num_kv_heads=NUM_KV_HEADS, window=3, sinks=2)
    _, cache = _stepped(lm, _tokens(length=11))
    assert all((b.self_attn.window, b.self_attn.sinks) == (3, 2) for b in lm.blocks)
    assert all(layer.num_kept == 5 and layer.length == 11 for layer in cache.layers)
    # 2 layers x (keys and values) x batch 2 x 2 key/value heads x 5 tokens x 4 x 8 bytes
    assert cache.nbytes == 2 * 2 * 2 * NUM_KV_HEADS * 5 * D_HEAD * 8
    _, plain = _stepped(_lm(position="rope", num_kv_heads=NUM_KV_HEADS, window=3), _tokens())
    assert plain.nbytes == cache.nbytes * 3 // 5


# -- positions within the cache --------------------------------------------------------------
def _reference(layer, x, window, sinks):
    """StreamingLLM written out, one query at a time: query t sees the first `sinks`
    tokens and its last `window` ones, placed at positions 0..m-1, itself at m-1."""
    h, h_kv, d = layer.num_heads, layer.num_kv_heads, layer.d_head
    q = layer.split_heads(layer.W_q(x))  # (B, h, T, d), not rotated
    k = layer.split_heads(layer.W_k(x), h_kv).repeat_interleave(h // h_kv, dim=1)
    v = layer.split_heads(layer.W_v(x), h_kv).repeat_interleave(h // h_kv, dim=1)
    outputs = []
    for t in range(x.size(1)):
        seen = sorted(set(range(min(sinks, t + 1))) | set(range(max(0, t - window + 1), t + 1)))
        m = len(seen)
        kt, vt, qt = k[:, :, seen], v[:, :, seen], q[:, :, t : t + 1]
        scores = torch.zeros(x.size(0), h, 1, m, dtype=x.dtype)
        if layer.rope is not None:
            qt, kt = layer.rope(qt, torch.tensor([m - 1])), layer.rope(kt, torch.arange(m))
        if layer.alibi is not None:
            slopes = mhbook.alibi_slopes(h, dtype=x.dtype)
            scores = scores - slopes.view(h, 1, 1) * (m - 1 - torch.arange(m, dtype=x.dtype))
        scores = scores + qt @ kt.transpose(-1, -2) / math.sqrt(d)
        outputs.append(scores.softmax(-1) @ vt)
    return layer.W_o(layer.merge_heads(torch.cat(outputs, dim=2)))


@pytest.mark.parametrize("position", ["rope", "alibi"])
@pytest.mark.parametrize("chunks", [(1,), (4, 1, 3)], ids=["one-by-one", "chunks"])
def test_one_layer_equals_streamingllm_written_out(position, chunks):
    window, sinks, length = 3, 2, 17
    extra = {"rope": mhbook.RotaryEmbedding(D_HEAD), "alibi": mhbook.ALiBi(NUM_HEADS)}
    torch.manual_seed(0)
    layer = MultiHeadAttention(
        D_MODEL, NUM_HEADS, num_kv_heads=NUM_KV_HEADS, bias=False, **{position: extra[position]},
        window=window, sinks=sinks,
    ).double()  # fmt: skip
    assert layer.streaming
    x = seeded(2, length, D_MODEL, seed=4)
    expected = _reference(layer, x, window, sinks)
    same = ANGLES if position == "rope" else EXACT  # the recent keys at their columns
    torch.testing.assert_close(layer(x)[0], expected, **same)  # no cache: the same
    cache, outputs, start, i = LayerCache(), [], 0, 0
    while start < length:
        size = min(chunks[i % len(chunks)], length - start)
        outputs.append(layer(x[:, start : start + size], cache=cache)[0])
        start, i = start + size, i + 1
    torch.testing.assert_close(torch.cat(outputs, dim=1), expected, **same)
    assert cache.num_kept == sinks + window
    # The text positions give another output (the sinks are farther than sinks + window).
    at_text = copy.deepcopy(layer)
    at_text.window, at_text.sinks = None, 0
    at_text_positions, _ = at_text(x, mask=mhbook.causal_mask(length, window=window, sinks=sinks))
    assert not torch.allclose(at_text_positions[:, -1], expected[:, -1])
    torch.testing.assert_close(at_text_positions[:, :5], expected[:, :5], **EXACT)


@pytest.mark.parametrize("position", ["rope", "alibi", "none", "sinusoidal"])
@pytest.mark.parametrize("window, sinks", [(2, 1), (3, 2), (1, 4)])
def test_full_forward_equals_cached_decoding(position, window, sinks):
    """For T up to 4 x (sinks + window): token by token, in chunks, and generating."""
    lm = _lm(position=position, num_kv_heads=NUM_KV_HEADS, window=window, sinks=sinks)
    tokens = _tokens(length=4 * (sinks + window))
    full = lm(tokens)
    for chunks in ((1,), (3, 1, 5)):
        stepped, cache = _stepped(lm, tokens, chunks)
        torch.testing.assert_close(stepped, full, **(ANGLES if position == "rope" else CLOSE))
        assert all(layer.num_kept == sinks + window for layer in cache.layers)
    assert not torch.allclose(full, _lm(position=position, window=window)(tokens))  # sinks count
    prompt = tokens[:, :3]
    assert torch.equal(lm.generate(prompt, 12), lm.generate(prompt, 12, use_cache=False))


def test_the_last_token_sees_only_its_sinks_and_its_window():
    """One layer, RoPE: the sinks and the last window tokens give the same last logits
    whatever lies between them and however long the text; at text positions, the
    sinks' distances would change them."""
    lm = _lm(position="rope", num_layers=1, window=3, sinks=2)
    short, long = _tokens(length=8, seed=1), _tokens(length=20, seed=2)
    long[:, :2], long[:, -3:] = short[:, :2], short[:, -3:]
    torch.testing.assert_close(lm(long)[:, -1], lm(short)[:, -1], **ANGLES)
    x = lm.embedding(long)
    layer = lm.blocks[0].self_attn
    within, _ = layer(x, rope_tables=lm.rope_tables(None, 0, x)[0])  # the slots' tables
    at_text = copy.deepcopy(layer)
    at_text.window, at_text.sinks = None, 0
    tables = lm.rope.tables(torch.arange(20), x.dtype)  # the text positions'
    text, _ = at_text(x, mask=mhbook.causal_mask(20, window=3, sinks=2), rope_tables=tables)
    assert not torch.allclose(text[:, -1], within[:, -1])


def test_weights_padding_and_gradients():
    lm = _lm(position="rope", window=2, sinks=1)
    tokens = _tokens(length=8)
    with mhbook.record_attention(lm) as weights:
        lm(tokens)
    w = weights()["blocks.0.self_attn"]
    mask = mhbook.causal_mask(8, window=2, sinks=1)
    assert w.shape == (2, NUM_HEADS, 8, 8) and torch.all(w[..., ~mask] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, NUM_HEADS, 8, dtype=w.dtype), **EXACT)
    # Padding: what a shorter row gives on its real tokens.
    padded = lm(tokens, valid_lens=torch.tensor([8, 5]))
    torch.testing.assert_close(padded[1, :5], lm(tokens[1:, :5])[0], **EXACT)
    lm.train()
    lm(tokens).sum().backward()
    grads = [p.grad for p in lm.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_meta_device():
    config = ModelConfig(d_model=16, num_heads=4, d_ff=32, position="rope", window=3, sinks=2)
    with torch.device("meta"):
        lm = DecoderOnlyLM(config, VOCAB)
    tokens = torch.zeros(2, 11, dtype=torch.long, device="meta")
    logits = lm(tokens)
    assert logits.device.type == "meta" and logits.shape == (2, 11, VOCAB)
    cache = lm.new_cache()
    assert lm(tokens[:, :1], cache=cache).shape == (2, 1, VOCAB)
    logits.sum().backward()


# -- refused ---------------------------------------------------------------------------------
def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="ModelConfig.sinks=2 needs a sliding window"):
        ModelConfig(sinks=2)
    with pytest.raises(ValueError, match=r"ModelConfig.sinks must be an int >= 0, got -1"):
        ModelConfig(window=4, sinks=-1)
    with pytest.raises(ValueError, match="ModelConfig.sinks must be an int >= 0, got True"):
        ModelConfig(window=4, sinks=True)
    k = torch.zeros(1, 1, 1, 2)
    # One rule, one message, wherever it is checked.
    for refuse in (
        lambda: LayerCache().update(k, k, sinks=1),
        lambda: mhbook.causal_mask(4, sinks=1),
        lambda: MultiHeadAttention(8, 2, sinks=1),
    ):
        with pytest.raises(ValueError, match="^sinks=1 needs a sliding window"):
            refuse()
    with pytest.raises(ValueError, match="sinks must be an int >= 0, got -1"):
        LayerCache().update(k, k, window=4, sinks=-1)
    with pytest.raises(ValueError, match="ModelConfig.sinks=1 with d_latent=8 and position='rope'"):
        _lm(window=4, sinks=1, d_latent=8, position="rope")
    lm = _lm(position="rope", window=2, sinks=1)
    with pytest.raises(ValueError, match="positions: with sinks"):
        lm(_tokens(), positions=torch.arange(9))
    with pytest.raises(ValueError, match=r"the model has 2 layers but the cache has 1"):
        lm(_tokens(), cache=KVCache(1))


def test_hugging_face_has_no_sinks():
    config = ModelConfig(
        norm="rms", ffn="swiglu", bias=False, position="rope", norm_first=True,
        scale_embeddings=False, window=4, sinks=2,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"sinks=2 .* needs no attention sinks: sinks=0\)"):
        mhbook.models.hf.hf_config(config, 20)
