"""Sliding-window attention: the window mask, the rolling KV cache, and Hugging Face's
MistralAttention with its sliding-window mask and cache."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import CLOSE, EXACT, seeded

import mhbook

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache  # noqa: E402
from transformers.masking_utils import create_sliding_window_causal_mask  # noqa: E402

# hf_mistral_attention's (conftest.py): 4 query heads of 8 features, 2 key/value heads.
D_MODEL, NUM_HEADS, NUM_KV_HEADS, D_HEAD = 32, 4, 2, 8


@pytest.mark.parametrize("window", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("length", [1, 4, 8])
def test_window_mask_equals_transformers(window, length, hf_mistral_attention):
    """The mask transformers builds for Mistral is mhbook's causal_mask(..., window=)."""
    config, _, _ = hf_mistral_attention(window)
    x = torch.zeros(2, length, D_MODEL)
    theirs = create_sliding_window_causal_mask(
        config, x, None, None, position_ids=torch.arange(length)[None], allow_is_causal_skip=False
    )
    assert theirs.dtype == torch.bool and theirs.shape == (2, 1, length, length)
    assert torch.equal(theirs[0, 0], mhbook.causal_mask(length, window=window))
    assert torch.equal(theirs[1, 0], theirs[0, 0])


@pytest.mark.parametrize("window", [2, 3, 16])
def test_gqa_with_window_equals_mistral_attention(window, hf_mistral_attention):
    config, mistral, mistral_rope = hf_mistral_attention(window)
    ours = mhbook.attention_from_hf(mistral)
    x, length = seeded(2, 9, D_MODEL, seed=1), 9
    position_ids = torch.arange(length)[None]
    mask = create_sliding_window_causal_mask(
        config, x, None, None, position_ids=position_ids, allow_is_causal_skip=False
    )
    theirs, _ = mistral(x, position_embeddings=mistral_rope(x, position_ids), attention_mask=mask)
    mine, _ = ours(x, mask=mhbook.causal_mask(length, window=window))
    torch.testing.assert_close(mine, theirs, **CLOSE)


def test_rolling_cache_equals_mistral_with_its_sliding_cache(hf_mistral_attention):
    """Token by token, both with a cache of fixed size: the same outputs. transformers keeps
    the last window - 1 keys (the next query adds its own); mhbook's LayerCache keeps the
    last window (one more)."""
    window, length = 3, 10
    config, mistral, mistral_rope = hf_mistral_attention(window)
    ours = mhbook.attention_from_hf(mistral)
    ours.window = window  # a local layer, as make_attention(config, layer=i) builds it
    x = seeded(1, length, D_MODEL, seed=2)
    theirs_cache, our_cache = DynamicCache(config=config), mhbook.LayerCache()
    for t in range(length):
        step, position_ids = x[:, t : t + 1], torch.tensor([[t]])
        mask = create_sliding_window_causal_mask(
            config, step, None, theirs_cache, position_ids=position_ids, allow_is_causal_skip=False
        )
        theirs, _ = mistral(
            step, position_embeddings=mistral_rope(step, position_ids), attention_mask=mask,
            past_key_values=theirs_cache,
        )  # fmt: skip
        mine, _ = ours(step, cache=our_cache)  # the layer masks by its window itself
        torch.testing.assert_close(mine, theirs, **CLOSE)
        assert our_cache.num_kept == min(t + 1, window)
        assert theirs_cache.layers[0].keys.size(2) == min(t + 1, window - 1)
    torch.testing.assert_close(our_cache.keys[:, :, 1:], theirs_cache.layers[0].keys, **EXACT)


def _step_by_step(gqa, x, chunks):
    """Through a LayerCache; the causal mask (a layer with a window adds its own)."""
    cache, outputs, start, i = mhbook.LayerCache(), [], 0, 0
    nbytes = []
    while start < x.size(1):
        size = min(chunks[i % len(chunks)], x.size(1) - start)
        mask = mhbook.causal_mask(size, cache.num_kept + size)
        outputs.append(gqa(x[:, start : start + size], mask=mask, cache=cache)[0])
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
    gqa = mhbook.MultiHeadAttention(
        D_MODEL, NUM_HEADS, num_kv_heads=NUM_KV_HEADS, bias=False, **extra.get(position, {})
    )
    gqa = gqa.double().eval()
    local = copy.deepcopy(gqa)
    local.window = window  # told its kind: a local layer of window 4
    x = seeded(2, length, D_MODEL, seed=3)
    full, _ = gqa(x, mask=mhbook.causal_mask(length, window=window))
    torch.testing.assert_close(local(x)[0], full, **EXACT)
    stepped, cache, nbytes = _step_by_step(local, x, chunks)
    torch.testing.assert_close(stepped, full, **EXACT)
    # Full attention differs: the window matters on this input.
    assert not torch.allclose(stepped, gqa(x, mask=mhbook.causal_mask(length))[0])
    # keys and values: 2 tensors x batch 2 x 2 heads x window 4 x d_head 8 x 8 bytes.
    flat = 2 * 2 * NUM_KV_HEADS * window * D_HEAD * 8
    assert cache.nbytes == flat == 2048 and cache.length == length
    assert max(nbytes) == flat and nbytes[-3:] == [flat] * 3


def test_without_a_window_the_cache_grows():
    torch.manual_seed(0)
    gqa = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, num_kv_heads=NUM_KV_HEADS, bias=False)
    gqa = gqa.double().eval()
    _, cache, nbytes = _step_by_step(gqa, seeded(1, 6, D_MODEL), (1,))
    assert nbytes == [2 * NUM_KV_HEADS * t * D_HEAD * 8 for t in range(1, 7)]
