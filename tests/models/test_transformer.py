"""The Transformer: shapes, causality, padding, record_attention, greedy decoding with
and without the KV cache (same tokens, projections really cached); utils: seeds and
checkpoints."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import mhbook

SRC_VOCAB, TGT_VOCAB, D_MODEL, NUM_HEADS, NUM_LAYERS, D_FF = 11, 13, 16, 4, 2, 32
BOS, EOS = 1, 2


def _model(dtype=torch.float64, norm_first=False, seed=0) -> mhbook.Transformer:
    torch.manual_seed(seed)
    config = mhbook.ModelConfig(
        d_model=D_MODEL,
        num_heads=NUM_HEADS,
        num_layers=NUM_LAYERS,
        d_ff=D_FF,
        dropout=0.0,
        norm_first=norm_first,
    )
    model = mhbook.Transformer(config, SRC_VOCAB, TGT_VOCAB)
    return model.to(dtype).eval()


def _batch(seed=0, batch=3, src_len=6, tgt_len=5):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, SRC_VOCAB, (batch, src_len), generator=g)
    tgt_in = torch.randint(3, TGT_VOCAB, (batch, tgt_len), generator=g)
    tgt_in[:, 0] = BOS
    valid_lens = torch.tensor([src_len, 3, 1][:batch])
    return src, tgt_in, valid_lens


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def norm_first(request) -> bool:
    return request.param


def test_forward_shape_and_backward(norm_first, dtype):
    model = _model(dtype, norm_first).train()
    src, tgt_in, valid_lens = _batch()
    logits = model(src, tgt_in, valid_lens)
    assert logits.shape == (3, 5, TGT_VOCAB) and logits.dtype == dtype
    logits.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_decoder_is_causal(norm_first, dtype, assert_close):
    """Changing the target token at position t changes no logits before t."""
    model = _model(dtype, norm_first)
    src, tgt_in, valid_lens = _batch()
    logits = model(src, tgt_in, valid_lens)
    for t in range(1, tgt_in.size(1)):
        changed = tgt_in.clone()
        changed[:, t] = (changed[:, t] + 1) % TGT_VOCAB
        new = model(src, changed, valid_lens)
        assert_close(new[:, :t], logits[:, :t], f"logits before position {t}")
        assert not torch.allclose(new[:, t:], logits[:, t:])


def test_source_padding_is_ignored(norm_first, dtype, assert_close):
    """Changing source tokens beyond ``src_valid_lens`` changes no logits."""
    model = _model(dtype, norm_first)
    src, tgt_in, valid_lens = _batch()
    changed = src.clone()
    for b, n in enumerate(valid_lens.tolist()):
        changed[b, n:] = torch.arange(changed.size(1) - n) % SRC_VOCAB
    assert not torch.equal(changed, src)
    assert_close(model(changed, tgt_in, valid_lens), model(src, tgt_in, valid_lens))
    changed[0, 0] = (changed[0, 0] + 1) % SRC_VOCAB  # a real token does matter
    assert not torch.allclose(
        model(changed, tgt_in, valid_lens)[0], model(src, tgt_in, valid_lens)[0]
    )


def test_record_attention_shapes_and_same_logits(norm_first, dtype, assert_close):
    model = _model(dtype, norm_first)
    src, tgt_in, valid_lens = _batch()
    plain = model(src, tgt_in, valid_lens)
    with mhbook.record_attention(model) as weights:
        recorded = model(src, tgt_in, valid_lens)
    assert_close(recorded, plain)
    w = weights()
    expected = {}
    for i in range(NUM_LAYERS):
        expected[f"encoder.blocks.{i}.self_attn"] = (3, NUM_HEADS, 6, 6)
        expected[f"decoder.blocks.{i}.self_attn"] = (3, NUM_HEADS, 5, 5)
        expected[f"decoder.blocks.{i}.cross_attn"] = (3, NUM_HEADS, 5, 6)
    assert {name: tuple(t.shape) for name, t in w.items()} == expected
    for name, t in w.items():
        assert not t.requires_grad
        torch.testing.assert_close(t.sum(-1), torch.ones_like(t.sum(-1)), msg=name)
    # Padding: no weight on source keys beyond valid_lens; causal: none on future tokens.
    assert (w["decoder.blocks.0.cross_attn"][1, :, :, 3:] == 0).all()
    assert (w["decoder.blocks.1.self_attn"][..., ~mhbook.causal_mask(5)] == 0).all()
    assert not any(
        m.keep_weights for m in model.modules() if isinstance(m, mhbook.MultiHeadAttention)
    )


def test_record_attention_forgets_earlier_recordings():
    """A recording that runs only the encoder returns only the encoder's weights."""
    model = _model()
    src, tgt_in, valid_lens = _batch()
    with mhbook.record_attention(model) as weights:
        model(src, tgt_in, valid_lens)
    assert any(name.startswith("decoder") for name in weights())
    with mhbook.record_attention(model) as weights:
        model.encoder(src, valid_lens)
    assert sorted(weights()) == [f"encoder.blocks.{i}.self_attn" for i in range(NUM_LAYERS)]


def test_float16_model_records_attention_without_nan():
    """Large queries and keys (here: W_q and W_k scaled by 30) overflow float16 scores
    unless they are scaled first and computed in float32; the fused path never overflows,
    and record_attention must not change that."""
    torch.manual_seed(0)
    config = mhbook.ModelConfig(d_model=64, num_heads=4, num_layers=2, d_ff=128)
    model = mhbook.Transformer(config, SRC_VOCAB, TGT_VOCAB)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, mhbook.MultiHeadAttention):
                m.W_q.weight.mul_(30)
                m.W_k.weight.mul_(30)
    model = model.half().eval()
    src, tgt_in, valid_lens = _batch()
    with torch.no_grad():
        plain = model(src, tgt_in, valid_lens)
        with mhbook.record_attention(model) as weights:
            recorded = model(src, tgt_in, valid_lens)
    assert torch.isfinite(plain).all()
    assert torch.isfinite(recorded).all()
    assert all(torch.isfinite(w).all() for w in weights().values())
    torch.testing.assert_close(recorded.float(), plain.float(), atol=0.05, rtol=0.01)


# -- greedy decoding ---------------------------------------------------------------------
def _free(model, src, valid_lens, max_len, use_cache=True):
    """Greedy decoding with no <eos> (eos_id=None): exactly ``max_len`` tokens."""
    return model.generate(src, valid_lens, max_len, bos_id=BOS, use_cache=use_cache)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_decode_cache_gives_identical_tokens(seed, norm_first, dtype):
    model = _model(dtype, norm_first, seed)
    src, _, valid_lens = _batch(seed)
    cached = _free(model, src, valid_lens, 8, use_cache=True)
    uncached = _free(model, src, valid_lens, 8, use_cache=False)
    assert cached.shape == (3, 8) and cached.dtype == torch.long
    assert torch.equal(cached, uncached)
    # ... and both are what teacher forcing on their own output predicts.
    tgt_in = torch.cat([torch.full((3, 1), BOS), cached[:, :-1]], dim=1)
    assert torch.equal(model(src, tgt_in, valid_lens).argmax(-1), cached)
    # With an <eos>: the same tokens up to each sequence's <eos>, then <eos>, cache or not.
    eos = int(cached[0, 3])
    for use_cache in (True, False):
        out = model.generate(src, valid_lens, 8, bos_id=BOS, eos_id=eos, use_cache=use_cache)
        assert torch.equal(out, model.generate(src, valid_lens, 8, bos_id=BOS, eos_id=eos))
        for b in range(3):
            hits = (cached[b] == eos).nonzero()
            end = int(hits[0]) + 1 if len(hits) else 8
            assert torch.equal(out[b, :end], cached[b, :end]) and (out[b, end:] == eos).all()


def test_greedy_decode_respects_max_len_and_restores_mode():
    model = _model().train()
    src, _, valid_lens = _batch()
    for max_len in (1, 5):
        out = _free(model, src, valid_lens, max_len)
        assert out.shape == (3, max_len)
        assert model.training
        out = model.generate(src, valid_lens, max_len, bos_id=BOS, eos_id=EOS)
        assert out.size(0) == 3 and 1 <= out.size(1) <= max_len
        assert model.training


def test_greedy_decode_stops_when_every_sequence_ended():
    model = _model()
    src, _, valid_lens = _batch()
    with torch.no_grad():
        model.decoder.output.bias[EOS] = 1e3  # <eos> always wins
    for use_cache in (True, False):
        out = model.generate(src, valid_lens, 10, bos_id=BOS, eos_id=EOS, use_cache=use_cache)
        assert torch.equal(out, torch.full((3, 1), EOS))


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_decode_fills_after_eos(use_cache):
    """Pick as <eos> a token that sequence 0 emits first: sequence 0 stops at once and
    is filled with <eos>; the others go on unchanged until their own <eos>."""
    model = _model()
    src, _, valid_lens = _batch()
    free = _free(model, src, valid_lens, 8, use_cache=use_cache)
    eos = int(free[0, 0])
    out = model.generate(src, valid_lens, 8, bos_id=BOS, eos_id=eos, use_cache=use_cache)
    ends = []
    for b in range(3):
        hits = (free[b] == eos).nonzero()
        end = int(hits[0]) + 1 if len(hits) else 8  # tokens up to and including <eos>
        ends.append(end)
        assert torch.equal(out[b, :end], free[b, :end])
        assert (out[b, end:] == eos).all()
    assert out.size(1) == max(ends)


def test_kv_cache_projects_only_new_tokens():
    """Count the rows that the decoder's K/V projections see: with the cache, the
    memory is projected once per call and self-attention projects one token per step."""
    model = _model()
    src, _, valid_lens = _batch()
    max_len = 6
    seen: dict[str, list[tuple[int, ...]]] = {}

    def record(name):
        def hook(module, args, output):
            seen.setdefault(name, []).append(tuple(args[0].shape))

        return hook

    handles = []
    for i, block in enumerate(model.decoder.blocks):
        for attn in ("self_attn", "cross_attn"):
            for proj in ("W_q", "W_k", "W_v"):
                name = f"{i}.{attn}.{proj}"
                handles.append(
                    getattr(getattr(block, attn), proj).register_forward_hook(record(name))
                )

    _free(model, src, valid_lens, max_len, use_cache=True)
    for i in range(NUM_LAYERS):
        for proj in ("W_k", "W_v"):
            assert seen[f"{i}.cross_attn.{proj}"] == [(3, 6, D_MODEL)]  # the memory, once
            assert seen[f"{i}.self_attn.{proj}"] == [(3, 1, D_MODEL)] * max_len
        for attn in ("self_attn", "cross_attn"):
            assert seen[f"{i}.{attn}.W_q"] == [(3, 1, D_MODEL)] * max_len

    seen.clear()
    _free(model, src, valid_lens, max_len, use_cache=False)
    for i in range(NUM_LAYERS):
        for proj in ("W_k", "W_v"):
            assert seen[f"{i}.cross_attn.{proj}"] == [(3, 6, D_MODEL)] * max_len
            assert seen[f"{i}.self_attn.{proj}"] == [(3, t, D_MODEL) for t in range(1, max_len + 1)]
    for h in handles:
        h.remove()


@pytest.mark.parametrize("sizes", [(2, 2, 1), (1, 3, 1), (1, 1, 1, 1, 1)])
def test_decoder_with_cache_equals_full_pass(sizes, norm_first, dtype, assert_close):
    """Chunks of several tokens, also into a cache that already holds some: the new
    keys must come after the cached ones, in time order."""
    model = _model(dtype, norm_first)
    src, tgt_in, valid_lens = _batch()
    memory = model.encoder(src, valid_lens)
    memory_mask = mhbook.padding_mask(valid_lens, src.size(1))
    full = model.decoder(tgt_in, memory, memory_mask)
    cache = model.decoder.new_cache()
    steps = [model.decoder(chunk, memory, memory_mask, cache) for chunk in tgt_in.split(sizes, 1)]
    assert_close(torch.cat(steps, dim=1), full)
    assert cache.length == tgt_in.size(1)
    at_once = model.decoder.new_cache()
    model.decoder(tgt_in, memory, memory_mask, at_once)
    for chunked, whole in zip(cache.layers, at_once.layers):
        assert_close(chunked.keys, whole.keys, "cached keys, in time order")
        assert_close(chunked.values, whole.values, "cached values, in time order")


# -- utils ---------------------------------------------------------------------------------
def test_set_seed_reproduces_python_numpy_and_torch():
    def draw():
        model = mhbook.Transformer(
            mhbook.ModelConfig(d_model=D_MODEL, num_heads=NUM_HEADS, num_layers=1, d_ff=D_FF),
            SRC_VOCAB,
            TGT_VOCAB,
        )
        return random.random(), np.random.rand(3).tolist(), torch.rand(3), model.state_dict()

    mhbook.set_seed(123)
    a = draw()
    mhbook.set_seed(123)
    b = draw()
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])
    assert all(torch.equal(a[3][k], b[3][k]) for k in a[3])
    mhbook.set_seed(124)
    assert not torch.equal(draw()[2], a[2])


def test_checkpoint_round_trip(tmp_path):
    model = _model(torch.float32, seed=0)
    path = tmp_path / "model.pt"
    mhbook.save_checkpoint(path, model, epoch=3, history={"loss": [2.5, 1.25]}, note="hi")
    other = _model(torch.float32, seed=1)
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    extra = mhbook.load_checkpoint(path, other)
    assert extra == {"epoch": 3, "history": {"loss": [2.5, 1.25]}, "note": "hi"}
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    src, tgt_in, valid_lens = _batch()
    assert torch.equal(model(src, tgt_in, valid_lens), other(src, tgt_in, valid_lens))


class _Evil:
    def __reduce__(self):
        return (print, ("this must not run",))


def test_load_checkpoint_refuses_pickled_code(tmp_path):
    """``weights_only=True``: a checkpoint holding an arbitrary object is refused."""
    model = _model(torch.float32)
    path = tmp_path / "evil.pt"
    mhbook.save_checkpoint(path, model, payload=_Evil())
    with pytest.raises(Exception, match="(?i)weights_only"):
        mhbook.load_checkpoint(path, model)


# -- the training step's dropout and masks ----------------------------------------------------
def test_dropout_masks_drawn_per_step_are_the_papers(monkeypatch):
    """One (batch, L, d_model) dropout mask per sublayer output and one per embedding sum:
    2 + 2 * num_layers (encoder) + 3 * num_layers (decoder); none with dropout 0."""
    config = mhbook.ModelConfig(D_MODEL, NUM_HEADS, NUM_LAYERS, D_FF, dropout=0.1)
    model = mhbook.Transformer(config, SRC_VOCAB, TGT_VOCAB).train()
    src, tgt_in, valid_lens = _batch(src_len=6, tgt_len=5)
    shapes = []
    rand_like = torch.rand_like

    def counting(x, *args, **kwargs):
        shapes.append(tuple(x.shape))
        return rand_like(x, *args, **kwargs)

    monkeypatch.setattr(torch, "rand_like", counting)
    model(src, tgt_in, valid_lens).sum().backward()
    expected = [(3, 6, D_MODEL)] * (1 + 2 * NUM_LAYERS) + [(3, 5, D_MODEL)] * (1 + 3 * NUM_LAYERS)
    assert sorted(shapes) == sorted(expected)


def test_training_without_dropout_draws_no_random_number():
    model = _model(torch.float32).train()
    state = torch.get_rng_state()
    model(*_batch()).sum().backward()
    assert torch.equal(torch.get_rng_state(), state)


def test_fit_with_dropout_is_deterministic():
    """Same seed, same weights: the dropout masks come from the seeded global generator."""
    data = mhbook.NumberTranslation(max_number=99, num_train=40, num_valid=0, num_test=0)
    config = mhbook.ModelConfig(d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.2)
    runs = []
    for _ in range(2):
        mhbook.set_seed(0)
        model = mhbook.Transformer(config, len(data.src_vocab), len(data.tgt_vocab))
        mhbook.fit(model, data, num_steps=5, batch_size=8, progress=False, eval_every=0)
        runs.append(model.state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
