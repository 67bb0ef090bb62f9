"""Sliding-window attention: the window mask, the rolling KV cache, and Hugging Face's
MistralAttention with its sliding-window mask and cache."""

from __future__ import annotations

import pytest
import torch

import mhbook

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache, MistralConfig  # noqa: E402
from transformers.masking_utils import create_sliding_window_causal_mask  # noqa: E402
from transformers.models.mistral.modeling_mistral import (  # noqa: E402
    MistralAttention,
    MistralRotaryEmbedding,
)

D_MODEL, NUM_HEADS, NUM_KV_HEADS, D_HEAD = 32, 4, 2, 8


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _config(window):
    config = MistralConfig(
        hidden_size=D_MODEL, num_attention_heads=NUM_HEADS, num_key_value_heads=NUM_KV_HEADS,
        head_dim=D_HEAD, sliding_window=window, num_hidden_layers=1, attention_dropout=0.0,
    )  # fmt: skip
    config._attn_implementation = "sdpa"  # "eager" takes the softmax in float32
    return config


def _mistral_pair(window):
    config = _config(window)
    torch.manual_seed(0)
    mistral = MistralAttention(config, layer_idx=0).double().eval()
    rope = mhbook.RotaryEmbedding(D_HEAD, base=config.rope_parameters["rope_theta"])
    ours = mhbook.GroupedQueryAttention(D_MODEL, NUM_HEADS, NUM_KV_HEADS, rope=rope).double()
    with torch.no_grad():
        for mine, theirs in zip(
            ("W_q", "W_k", "W_v", "W_o"), ("q_proj", "k_proj", "v_proj", "o_proj")
        ):
            getattr(ours, mine).weight.copy_(getattr(mistral, theirs).weight)
    return config, mistral, MistralRotaryEmbedding(config), ours.eval()


@pytest.mark.parametrize("window", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("length", [1, 4, 8])
def test_window_mask_equals_transformers(window, length):
    """The mask transformers builds for Mistral is mhbook's causal_mask(..., window=)."""
    config = _config(window)
    x = torch.zeros(2, length, D_MODEL)
    theirs = create_sliding_window_causal_mask(
        config, x, None, None, position_ids=torch.arange(length)[None], allow_is_causal_skip=False
    )
    assert theirs.dtype == torch.bool and theirs.shape == (2, 1, length, length)
    assert torch.equal(theirs[0, 0], mhbook.causal_mask(length, window=window))
    assert torch.equal(theirs[1, 0], theirs[0, 0])


@pytest.mark.parametrize("window", [2, 3, 16])
def test_gqa_with_window_equals_mistral_attention(window):
    config, mistral, mistral_rope, ours = _mistral_pair(window)
    x, length = _randn(2, 9, D_MODEL, seed=1), 9
    position_ids = torch.arange(length)[None]
    mask = create_sliding_window_causal_mask(
        config, x, None, None, position_ids=position_ids, allow_is_causal_skip=False
    )
    theirs, _ = mistral(x, position_embeddings=mistral_rope(x, position_ids), attention_mask=mask)
    mine = ours(x, mhbook.causal_mask(length, window=window))
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-10)


def test_rolling_cache_equals_mistral_with_its_sliding_cache():
    """Token by token, both with a cache of fixed size: the same outputs. transformers keeps
    the last window - 1 keys (the next query adds its own); mhbook's LayerCache keeps the
    last window (one more)."""
    window, length = 3, 10
    config, mistral, mistral_rope, ours = _mistral_pair(window)
    x = _randn(1, length, D_MODEL, seed=2)
    theirs_cache, our_cache = DynamicCache(config=config), mhbook.LayerCache(window)
    for t in range(length):
        step, position_ids = x[:, t : t + 1], torch.tensor([[t]])
        mask = create_sliding_window_causal_mask(
            config, step, None, theirs_cache, position_ids=position_ids, allow_is_causal_skip=False
        )
        theirs, _ = mistral(
            step, position_embeddings=mistral_rope(step, position_ids), attention_mask=mask,
            past_key_values=theirs_cache,
        )  # fmt: skip
        our_mask = mhbook.causal_mask(1, our_cache.num_kept + 1, window=window)
        mine = ours(step, our_mask, cache=our_cache)
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-10)
        assert our_cache.num_kept == min(t + 1, window)
        assert theirs_cache.layers[0].keys.size(2) == min(t + 1, window - 1)
    torch.testing.assert_close(
        our_cache.keys[:, :, 1:], theirs_cache.layers[0].keys, rtol=0, atol=1e-12
    )


def _step_by_step(gqa, x, window, chunks):
    cache, outputs, start, i = mhbook.LayerCache(window), [], 0, 0
    nbytes = []
    while start < x.size(1):
        size = min(chunks[i % len(chunks)], x.size(1) - start)
        mask = mhbook.causal_mask(size, cache.num_kept + size, window=window)
        outputs.append(gqa(x[:, start : start + size], mask, cache=cache))
        nbytes.append(cache.nbytes)
        start, i = start + size, i + 1
    return torch.cat(outputs, dim=1), cache, nbytes


@pytest.mark.parametrize("position", ["rope", "alibi", "none"])
@pytest.mark.parametrize("chunks", [(1,), (3, 1, 2)], ids=["one-by-one", "chunks"])
def test_rolling_cache_equals_full_attention_with_the_window_mask(position, chunks):
    """With the real RotaryEmbedding and ALiBi: a cache of fixed size gives the same as the
    whole sequence at once under the window mask, and its bytes stop growing."""
    window, length = 4, 13
    extra = {"rope": {"rope": mhbook.RotaryEmbedding(D_HEAD)}, "alibi": {"alibi": mhbook.ALiBi(4)}}
    torch.manual_seed(0)
    gqa = mhbook.GroupedQueryAttention(D_MODEL, NUM_HEADS, NUM_KV_HEADS, **extra.get(position, {}))
    gqa = gqa.double().eval()
    x = _randn(2, length, D_MODEL, seed=3)
    full = gqa(x, mhbook.causal_mask(length, window=window))
    stepped, cache, nbytes = _step_by_step(gqa, x, window, chunks)
    torch.testing.assert_close(stepped, full, rtol=0, atol=1e-12)
    # Full attention differs: the window matters on this input.
    assert not torch.allclose(stepped, gqa(x, mhbook.causal_mask(length)))
    # keys and values: 2 tensors x batch 2 x 2 heads x window 4 x d_head 8 x 8 bytes.
    flat = 2 * 2 * NUM_KV_HEADS * window * D_HEAD * 8
    assert cache.nbytes == flat == 2048 and cache.length == length
    assert max(nbytes) == flat and nbytes[-3:] == [flat] * 3


def test_without_a_window_the_cache_grows():
    torch.manual_seed(0)
    gqa = mhbook.GroupedQueryAttention(D_MODEL, NUM_HEADS, NUM_KV_HEADS).double().eval()
    _, cache, nbytes = _step_by_step(gqa, _randn(1, 6, D_MODEL), None, (1,))
    assert nbytes == [2 * NUM_KV_HEADS * t * D_HEAD * 8 for t in range(1, 7)]
