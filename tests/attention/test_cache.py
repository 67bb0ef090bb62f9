"""The KV cache: what a chapter reads from it (length, shapes, nbytes), cheap copies,
grouped-query heads, latents, and a rolling window that still attends correctly."""

from __future__ import annotations

import pytest
import torch
from helpers import seeded

import mhbook

SRC_VOCAB, TGT_VOCAB, D_MODEL, NUM_HEADS, NUM_LAYERS = 11, 13, 16, 4, 2
D_HEAD = D_MODEL // NUM_HEADS


@pytest.fixture
def model():
    torch.manual_seed(0)
    config = mhbook.ModelConfig(D_MODEL, NUM_HEADS, NUM_LAYERS, 32)
    return mhbook.Transformer(config, SRC_VOCAB, TGT_VOCAB).double().eval()


@pytest.fixture
def source(model):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, SRC_VOCAB, (3, 6), generator=g)
    valid_lens = torch.tensor([6, 4, 2])
    memory = model.encoder(src, valid_lens)
    return memory, mhbook.padding_mask(valid_lens, 6)


def test_a_chapter_reads_length_shapes_and_nbytes(model, source):
    memory, memory_mask = source
    cache = model.decoder.new_cache()
    assert isinstance(cache, mhbook.KVCache) and len(cache.layers) == NUM_LAYERS
    assert cache.length == 0 and cache.nbytes == 0
    tokens = torch.ones(3, 1, dtype=torch.long)
    for step in range(1, 5):
        logits = model.decoder(tokens, memory, memory_mask, cache)
        tokens = logits[:, -1:].argmax(-1)
        assert cache.length == step
        for layer in cache.layers:
            assert layer.length == step
            assert layer.keys.shape == layer.values.shape == (3, NUM_HEADS, step, D_HEAD)
            assert layer.memory_keys.shape == layer.memory_values.shape == (3, NUM_HEADS, 6, D_HEAD)
    # keys and values of 4 tokens and of the 6 memory positions, float64, every layer
    assert cache.nbytes == 2 * NUM_LAYERS * 3 * (4 + 6) * D_MODEL * 8
    assert "length=4" in repr(cache) and "keys=(3, 4, 4, 4)" in repr(cache.layers[0])


def test_copy_shares_tensors_and_leaves_the_original_unchanged(model, source):
    """Chapter 8 times one step again and again from the same cache."""
    memory, memory_mask = source
    cache = model.decoder.new_cache()
    prefix = torch.randint(3, TGT_VOCAB, (3, 5), generator=torch.Generator().manual_seed(2))
    model.decoder(prefix[:, :-1], memory, memory_mask, cache)
    keys_before = [layer.keys for layer in cache.layers]
    fresh = cache.copy()
    assert all(a.keys is b.keys for a, b in zip(fresh.layers, cache.layers))  # no tensor copied
    first = model.decoder(prefix[:, -1:], memory, memory_mask, fresh)
    assert fresh.length == 5 and cache.length == 4
    assert all(layer.keys is k for layer, k in zip(cache.layers, keys_before))
    again = model.decoder(prefix[:, -1:], memory, memory_mask, cache.copy())
    assert torch.equal(first, again)
    torch.testing.assert_close(first[:, -1], model.decoder(prefix, memory, memory_mask)[:, -1])


def test_grouped_query_keys_and_values():
    """A layer cache holds whatever number of key/value heads it is given."""
    h, h_kv, steps = 8, 2, [3, 1, 2]
    q = seeded(2, h, sum(steps), D_HEAD, seed=3)
    k, v = seeded(2, h_kv, sum(steps), D_HEAD, seed=4), seeded(2, h_kv, sum(steps), D_HEAD, seed=5)
    full, _ = mhbook.attend(q, k, v, mhbook.causal_mask(sum(steps)))
    cache, outputs, start = mhbook.LayerCache(), [], 0
    for n in steps:
        new = slice(start, start + n)
        keys, values, _ = cache.update(k[:, :, new], v[:, :, new])
        outputs.append(
            mhbook.attend(q[:, :, new], keys, values, mhbook.causal_mask(n, start + n))[0]
        )
        start += n
    assert cache.keys.shape == (2, h_kv, 6, D_HEAD) and cache.length == 6
    assert cache.nbytes == 2 * 2 * h_kv * 6 * D_HEAD * 8
    torch.testing.assert_close(torch.cat(outputs, dim=2), full)


@pytest.mark.parametrize("steps", [[1] * 7, [3, 2, 2], [2, 5]])
def test_rolling_window_keeps_the_last_tokens_and_attends_like_a_sliding_window(steps):
    """Updated with window=3 (as a local layer updates it) the cache holds the last 3
    tokens' keys and values; length counts all. Fed in chunks, with
    causal_mask(..., window=3), it gives sliding-window attention over the whole
    sequence."""
    window, total = 3, sum(steps)
    q, k, v = (seeded(2, 4, total, D_HEAD, seed=s) for s in (6, 7, 8))
    full, _ = mhbook.attend(q, k, v, mhbook.causal_mask(total, window=window))
    cache, outputs, start = mhbook.LayerCache(), [], 0
    for n in steps:
        new = slice(start, start + n)
        kept = cache.num_kept
        keys, values, _ = cache.update(k[:, :, new], v[:, :, new], window=window)
        assert keys.size(2) == kept + n
        mask = mhbook.causal_mask(n, kept + n, window=window)
        outputs.append(mhbook.attend(q[:, :, new], keys, values, mask)[0])
        start += n
        assert cache.length == start and cache.num_kept == min(start, window)
        assert torch.equal(cache.keys, k[:, :, max(0, start - window) : start])
        assert torch.equal(cache.values, v[:, :, max(0, start - window) : start])
    torch.testing.assert_close(torch.cat(outputs, dim=2), full)
    assert cache.nbytes == 2 * 2 * 4 * window * D_HEAD * 8


def test_causal_mask_window_is_a_band():
    for num_queries, num_keys, window in [(5, 5, 2), (3, 7, 3), (1, 4, 2), (4, 4, 9)]:
        mask = mhbook.causal_mask(num_queries, num_keys, window=window)
        for i in range(num_queries):
            for j in range(num_keys):
                distance = i + num_keys - num_queries - j  # how far key j lies behind query i
                assert mask[i, j] == (0 <= distance < window), (num_queries, num_keys, i, j)


def test_latent_instead_of_keys_and_values():
    """Multi-head latent attention caches one (batch, S, d_latent) tensor per layer."""
    cache = mhbook.KVCache(2)
    layer = cache.layers[0]
    c = seeded(3, 6, 5, seed=9)
    assert torch.equal(layer.update_latent(c[:, :2], window=4), c[:, :2])
    assert torch.equal(layer.update_latent(c[:, 2:], window=4), c)  # all kept, then the new
    assert layer.keys is None and torch.equal(layer.latent, c[:, 2:])
    assert layer.length == 6 and layer.num_kept == 4
    assert cache.nbytes == 3 * 4 * 5 * 8


def test_the_cache_holds_no_attention_configuration(model, source):
    """The window is the layer's, not the cache's: a cache takes no window, and the
    encoder-decoder's layers (no window) keep every token in theirs."""
    memory, memory_mask = source
    with pytest.raises(TypeError):
        mhbook.KVCache(2, 4)
    with pytest.raises(TypeError):
        mhbook.LayerCache(window=4)
    cache = model.decoder.new_cache()
    for _ in range(5):
        model.decoder(torch.ones(3, 1, dtype=torch.long), memory, memory_mask, cache)
    assert all(layer.num_kept == 5 for layer in cache.layers)
    assert not hasattr(cache, "window") and not hasattr(cache.layers[0], "window")


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_sizes(bad):
    with pytest.raises(ValueError, match=rf"num_layers must be an int >= 1, got {bad!r}"):
        mhbook.KVCache(bad)
    with pytest.raises(ValueError, match=rf"window must be an int >= 1 or None, got {bad!r}"):
        mhbook.LayerCache().update(seeded(1, 1, 1, D_HEAD), seeded(1, 1, 1, D_HEAD), window=bad)


def test_keys_and_values_or_a_latent_never_both():
    """One cache per kind of attention: each refuses what the other filled, naming both."""
    cache = mhbook.LayerCache()
    cache.update(seeded(2, 4, 3, D_HEAD, seed=10), seeded(2, 4, 3, D_HEAD, seed=11))
    with pytest.raises(
        ValueError, match="holds keys and values of 3 tokens; it cannot take a latent"
    ):
        cache.update_latent(seeded(2, 1, 5, seed=12))
    latent = mhbook.LayerCache()
    latent.update_latent(seeded(2, 2, 5, seed=13))
    with pytest.raises(
        ValueError, match="holds a latent of 2 tokens; it cannot take keys and values"
    ):
        latent.update(seeded(2, 4, 1, D_HEAD, seed=14), seeded(2, 4, 1, D_HEAD, seed=15))
    assert (cache.length, cache.latent, latent.length, latent.keys) == (3, None, 2, None)


def test_positions_are_kept_beside_the_keys_for_alibi():
    """update(k, v, positions) keeps the positions of the kept keys, trimmed with them."""
    cache = mhbook.LayerCache()
    for start, n in ((0, 2), (2, 1), (3, 2)):
        k = seeded(2, 4, n, D_HEAD, seed=start)
        cache.update(k, k, torch.arange(start, start + n), window=3)
        assert torch.equal(cache.positions, torch.arange(max(0, start + n - 3), start + n))
    with pytest.raises(ValueError, match="positions must be passed at every update"):
        cache.update(k, k)


def test_memory_is_projected_once():
    cache, calls = mhbook.LayerCache(), []
    k, v = seeded(2, 4, 6, D_HEAD, seed=16), seeded(2, 4, 6, D_HEAD, seed=17)

    def project():
        calls.append(1)
        return k, v

    for _ in range(3):
        keys, values = cache.memory(project)
        assert keys is k and values is v
    assert len(calls) == 1 and cache.memory_keys is k and cache.memory_values is v
