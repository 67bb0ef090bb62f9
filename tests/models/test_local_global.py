"""Interleaved local and global layers (Gemma 2 and Gemma 3): with `global_every`, every
`global_every`-th layer attends to every earlier token and the others to their window;
each layer's cache follows its layer."""

from __future__ import annotations

import pytest
import torch
from helpers import ANGLES, CLOSE, EXACT
from helpers import stepped as _stepped

import mhbook
from mhbook import DecoderOnlyLM, KVCache, LayerCache, ModelConfig, make_attention

VOCAB, D_MODEL, NUM_KV_HEADS, D_HEAD = 23, 16, 2, 4


def _lm(seed=0, **kwargs):
    base = dict(d_model=D_MODEL, num_heads=4, num_layers=4, d_ff=32, norm_first=True)
    torch.manual_seed(seed)
    return DecoderOnlyLM(ModelConfig(**{**base, **kwargs}), VOCAB).double().eval()


def _tokens(batch=2, length=12, seed=0):
    return torch.randint(4, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_which_layers_are_global():
    gemma2 = ModelConfig(num_layers=4, window=8, global_every=2)
    assert gemma2.layer_windows == (8, None, 8, None)
    gemma3 = ModelConfig(num_layers=12, window=8, global_every=6)
    assert gemma3.layer_windows == (8,) * 5 + (None,) + (8,) * 5 + (None,)
    assert ModelConfig(num_layers=3, window=8).layer_windows == (8, 8, 8)
    assert ModelConfig(num_layers=3).layer_windows == (None, None, None)
    assert ModelConfig(num_layers=3, window=8, global_every=6).layer_windows == (8, 8, 8)


def test_each_layer_uses_its_own_mask():
    """The model's forward is its blocks under causal_mask(T, window=layer's window)."""
    lm = _lm(position="rope", window=3, global_every=2)
    tokens = _tokens()
    x = lm.embedding(tokens) * 4.0  # sqrt(d_model)
    tables = lm.rope.tables(torch.arange(12), x.dtype)
    for block, window in zip(lm.blocks, lm.config.layer_windows):
        x = block(x, mhbook.causal_mask(12, window=window), rope_tables=tables)
    torch.testing.assert_close(lm(tokens), lm.output(lm.norm(x)), **EXACT)
    for other in (_lm(position="rope", window=3), _lm(position="rope")):
        assert not torch.allclose(lm(tokens), other(tokens))  # neither all local nor global


@pytest.mark.parametrize("position", ["rope", "alibi", "none", "sinusoidal"])
@pytest.mark.parametrize("global_every, sinks", [(2, 0), (3, 0), (2, 1)])
def test_full_forward_equals_cached_decoding(position, global_every, sinks):
    lm = _lm(
        position=position, num_kv_heads=NUM_KV_HEADS, window=3, global_every=global_every,
        sinks=sinks,
    )  # fmt: skip
    tokens = _tokens(length=14)
    full = lm(tokens)
    for chunks in ((1,), (4, 1, 3)):
        stepped, cache = _stepped(lm, tokens, chunks)
        torch.testing.assert_close(stepped, full, **(ANGLES if position == "rope" else CLOSE))
    prompt = tokens[:, :3]
    assert torch.equal(lm.generate(prompt, 10), lm.generate(prompt, 10, use_cache=False))


def test_local_caches_roll_and_global_ones_keep_everything():
    lm = _lm(position="rope", num_kv_heads=NUM_KV_HEADS, window=3, global_every=2, sinks=1)
    _, cache = _stepped(lm, _tokens(length=10))
    # Each layer is told its kind at construction; the cache holds only tensors.
    attentions = [block.self_attn for block in lm.blocks]
    assert [a.window for a in attentions] == [3, None, 3, None]
    assert [a.sinks for a in attentions] == [1, 0, 1, 0]  # sinks: local layers
    assert [layer.num_kept for layer in cache.layers] == [4, 10, 4, 10]
    assert [layer.length for layer in cache.layers] == [10] * 4
    per_token = 2 * 2 * NUM_KV_HEADS * D_HEAD * 8  # (keys and values) x batch x heads x d x 8
    assert cache.nbytes == per_token * (4 + 10 + 4 + 10)
    # The saving: between all local (4 kept per layer) and all global (10 per layer).
    _, local = _stepped(
        _lm(position="rope", num_kv_heads=NUM_KV_HEADS, window=3, sinks=1), _tokens()
    )
    _, full = _stepped(_lm(position="rope", num_kv_heads=NUM_KV_HEADS), _tokens(length=10))
    assert local.nbytes == per_token * 4 * 4 < cache.nbytes < full.nbytes == per_token * 10 * 4


def test_each_layer_tells_its_cache_what_to_keep():
    cache = KVCache(3)
    k = torch.arange(7.0).view(1, 1, 7, 1)
    for layer, (window, sinks) in zip(cache.layers, [(2, 1), (None, 0), (4, 1)]):
        layer.update(k, k, window=window, sinks=sinks)
    assert [layer.keys.flatten().tolist() for layer in cache.layers] == [
        [0.0, 5.0, 6.0],
        list(range(7)),
        [0.0, 3.0, 4.0, 5.0, 6.0],
    ]
    assert isinstance(cache.layers[1], LayerCache) and not hasattr(cache.layers[1], "window")
    config = ModelConfig(num_layers=4, window=3, global_every=2, sinks=1, position="rope")
    kinds = [make_attention(config, layer=i) for i in range(4)]
    assert [(a.window, a.sinks, a.streaming) for a in kinds] == [
        (3, 1, True), (None, 0, False), (3, 1, True), (None, 0, False),
    ]  # fmt: skip


def test_meta_device():
    config = ModelConfig(
        d_model=16, num_heads=4, num_layers=4, d_ff=32, position="rope", window=3,
        global_every=2, sinks=1,
    )  # fmt: skip
    with torch.device("meta"):
        lm = DecoderOnlyLM(config, VOCAB)
    tokens = torch.zeros(2, 9, dtype=torch.long, device="meta")
    logits = lm(tokens)
    assert logits.device.type == "meta" and logits.shape == (2, 9, VOCAB)
    cache = lm.new_cache()
    lm(tokens, cache=cache)
    assert lm(tokens[:, :1], cache=cache).shape == (2, 1, VOCAB)


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="ModelConfig.global_every=2 needs a sliding window"):
        ModelConfig(global_every=2)
    for bad in (1, 0, -2, True, 2.0):
        with pytest.raises(ValueError, match=r"ModelConfig.global_every must be an int >= 2"):
            ModelConfig(window=4, global_every=bad)
    with pytest.raises(ValueError, match=r"layer must be below ModelConfig.num_layers=2, got 2"):
        make_attention(ModelConfig(window=4, global_every=2), layer=2)
    lm = _lm(window=3, global_every=2)
    with pytest.raises(ValueError, match=r"the model has 4 layers but the cache has 3"):
        lm(_tokens(), cache=KVCache(3))
    config = ModelConfig(
        norm="rms", ffn="swiglu", bias=False, position="rope", norm_first=True,
        scale_embeddings=False, window=4, global_every=2,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"global_every=2 .* needs one kind of attention"):
        mhbook.models.hf.hf_config(config, 20)


# -- a RoPE base per layer type (Gemma 3) -------------------------------------------------
def test_the_global_layers_get_their_own_rope_base():
    """One rotary embedding per kind of layer, on the model; the layers hold none, and the
    layers of one kind get the same tables, made once."""
    lm = _lm(num_layers=4, window=4, global_every=2, global_rope_theta=1e6, position="rope")
    assert lm.global_rope.rope_theta == 1e6 and lm.rope.rope_theta == 10000.0
    assert sum(isinstance(m, mhbook.RotaryEmbedding) for m in lm.modules()) == 2
    assert all(block.self_attn.rope is None and block.self_attn.rotary for block in lm.blocks)
    x = lm.embed(_tokens(length=6), "tokens")
    tables = lm.rope_tables(None, 0, x)
    assert tables[0] is tables[2] and tables[1] is tables[3] and tables[0] is not tables[1]
    for ours, rope in zip(tables[:2], (lm.rope, lm.global_rope)):
        for a, b in zip(ours, rope.tables(torch.arange(6), x.dtype)):
            assert torch.equal(a, b)


def test_the_model_hands_each_layer_the_tables_of_its_base():
    """The model's forward (tables once per kind of layer) equals its blocks rotated by
    tables made apart, from each layer's base in the config; and a global base equal to
    rope_theta changes nothing."""
    lm = _lm(num_layers=4, window=4, global_every=2, global_rope_theta=1e6, position="rope").eval()
    tokens = _tokens(length=12)
    with torch.no_grad():
        x = lm.embed(tokens, "tokens")
        for i, block in enumerate(lm.blocks):
            rope = mhbook.RotaryEmbedding(lm.config.d_head, lm.config.layer_rope_theta(i))
            x = block(x, is_causal=True, rope_tables=rope.tables(torch.arange(12), x.dtype))
        by_layer = lm.output(lm.norm(x))
        torch.testing.assert_close(lm(tokens), by_layer, **EXACT)
        plain = _lm(num_layers=4, window=4, global_every=2, position="rope").eval()
        same = _lm(
            num_layers=4, window=4, global_every=2, global_rope_theta=10000.0, position="rope"
        ).eval()
        torch.testing.assert_close(same(tokens), plain(tokens), **EXACT)
        assert not torch.allclose(lm(tokens), plain(tokens))  # the base is obeyed


@pytest.mark.parametrize(
    "changes, named",
    [({"window": 4}, "needs global_every"),
     ({"window": 4, "global_every": 2, "position": "alibi"}, "position='alibi'"),
     ({"num_layers": 3, "window": 4, "global_every": 6}, "makes none"),
     ({"window": 4, "global_every": 2, "global_rope_theta": 0.5}, "global_rope_theta")],
)  # fmt: skip
def test_a_global_rope_base_without_global_rope_layers_is_refused(changes, named):
    with pytest.raises(ValueError, match=named):
        ModelConfig(**{"position": "rope", "global_rope_theta": 1e6, **changes})
