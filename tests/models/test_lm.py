"""mhbook.DecoderOnlyLM, its generation with and without the KV cache, and the
prompt/completion task (mhbook.tasks.number_prompts): the loss counts the completion only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import CLOSE, EXACT
from torch import nn

import mhbook
from mhbook import DecoderOnlyLM, ModelConfig

VOCAB = 23


def _config(**kwargs):
    base = dict(d_model=16, num_heads=4, num_layers=2, d_ff=32, norm_first=True)
    return ModelConfig(**{**base, **kwargs})


def _lm(seed=0, dtype=torch.float64, **kwargs):
    torch.manual_seed(seed)
    return DecoderOnlyLM(_config(**kwargs), VOCAB).to(dtype).eval()


def _tokens(batch=3, length=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, VOCAB, (batch, length), generator=g)


POSITION_CONFIGS = {
    "sinusoidal": {},
    "none": {"position": "none"},
    "post-norm": {"norm_first": False},
    "gqa": {"num_kv_heads": 2},
    "mqa": {"num_kv_heads": 1},
    "rope": {"position": "rope", "num_kv_heads": 2},
    "alibi": {"position": "alibi"},
    "mla": {"d_latent": 8},
}


def _stepwise_logits(lm, tokens, chunks=(1,)):
    """Feed ``tokens`` through a KV cache in pieces of the sizes in ``chunks`` (cycled)."""
    cache = lm.new_cache()
    out, start, i = [], 0, 0
    while start < tokens.size(1):
        size = chunks[i % len(chunks)]
        out.append(lm(tokens[:, start : start + size], cache=cache))
        start, i = start + size, i + 1
    assert cache.length == tokens.size(1)
    return torch.cat(out, dim=1), cache


# -- the model ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(POSITION_CONFIGS))
def test_cache_gives_the_full_causal_forward(name):
    lm = _lm(**POSITION_CONFIGS[name])
    tokens = _tokens()
    full = lm(tokens)
    assert full.shape == (3, 9, VOCAB)
    for chunks in ((1,), (4, 1, 2)):
        stepped, _ = _stepwise_logits(lm, tokens, chunks)
        torch.testing.assert_close(stepped, full, **CLOSE)


def test_the_future_does_not_change_the_past():
    lm = _lm()
    tokens = _tokens()
    changed = tokens.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % VOCAB
    torch.testing.assert_close(lm(changed)[:, :5], lm(tokens)[:, :5], rtol=0, atol=0)
    assert not torch.allclose(lm(changed)[:, 5:], lm(tokens)[:, 5:])


@pytest.mark.parametrize("name", ["sinusoidal", "gqa", "rope", "alibi", "mla"])
def test_cached_generation_equals_uncached_greedy(name):
    lm = _lm(**POSITION_CONFIGS[name])
    prompt = _tokens(length=4)
    cached = lm.generate(prompt, 8, use_cache=True)
    uncached = lm.generate(prompt, 8, use_cache=False)
    assert cached.shape == (3, 8)
    assert torch.equal(cached, uncached)
    # Greedy: each new token is the argmax of the full forward over the sequence so far.
    sequence = torch.cat([prompt, cached], dim=1)
    assert torch.equal(lm(sequence[:, :-1])[:, 3:].argmax(-1), cached)


@pytest.mark.parametrize("name", ["sinusoidal", "rope", "alibi"])
def test_window_uses_a_rolling_cache_equal_to_the_window_mask(name):
    window = 3
    lm = _lm(window=window, **POSITION_CONFIGS[name])
    tokens = _tokens(length=10)
    full = lm(tokens)
    # The full forward uses the sliding-window mask: compare with the mask written out.
    explicit = _lm(**POSITION_CONFIGS[name])
    explicit.load_state_dict(lm.state_dict())
    x = explicit.embedding(tokens) * 4.0  # sqrt(d_model)
    if explicit.pos_encoding is not None:
        x = explicit.pos_encoding(x)
    mask = mhbook.causal_mask(10, window=window)
    for block, tables in zip(explicit.blocks, explicit.rope_tables(None, 0, x)):
        x = block(x, mask, rope_tables=tables)
    torch.testing.assert_close(full, explicit.output(explicit.norm(x)), **EXACT)
    assert not torch.allclose(full, explicit(tokens))  # the window matters
    stepped, cache = _stepwise_logits(lm, tokens, (1,))
    torch.testing.assert_close(stepped, full, **CLOSE)
    assert all(block.self_attn.window == window for block in lm.blocks)  # the layer's
    assert all(layer.num_kept == window for layer in cache.layers)
    assert torch.equal(
        lm.generate(tokens[:, :2], 9), lm.generate(tokens[:, :2], 9, use_cache=False)
    )


def test_eos_stops_and_fills():
    lm = _lm()
    prompt = _tokens(length=3)
    free = lm.generate(prompt, 6)
    eos = int(free[0, 1])  # make row 0's second token the end
    out = lm.generate(prompt, 6, eos_id=eos)
    row = out[0].tolist()
    assert row[1] == eos and all(t == eos for t in row[1:])
    for r in range(3):  # up to its first eos, every row is as without eos_id
        tokens = free[r].tolist()
        stop = tokens.index(eos) + 1 if eos in tokens else len(tokens)
        assert out[r, :stop].tolist() == tokens[:stop]


def test_sampling_is_reproducible_with_a_generator():
    lm = _lm()
    prompt = _tokens(length=3)

    def sample(seed, **kwargs):
        g = torch.Generator().manual_seed(seed)
        return lm.generate(prompt, 12, temperature=1.5, generator=g, **kwargs)

    assert torch.equal(sample(0), sample(0))
    assert torch.equal(sample(0, top_k=5), sample(0, top_k=5))
    assert not torch.equal(sample(0), sample(1))
    # top_k=1 keeps only the most likely token: greedy, at any temperature.
    assert torch.equal(sample(3, top_k=1), lm.generate(prompt, 12))
    # A high temperature with top_k=2 picks among the two most likely tokens only.
    out = sample(0, top_k=2)
    logits = lm(torch.cat([prompt, out], 1)[:, :-1])[:, 2:]
    top2 = logits.topk(2, dim=-1).indices
    assert (top2 == out[..., None]).any(-1).all()


def test_sampling_cached_equals_uncached():
    lm = _lm(num_kv_heads=2)
    prompt = _tokens(length=3)
    a = lm.generate(
        prompt, 10, temperature=0.8, top_k=6, generator=torch.Generator().manual_seed(7)
    )
    b = lm.generate(
        prompt,
        10,
        temperature=0.8,
        top_k=6,
        generator=torch.Generator().manual_seed(7),
        use_cache=False,
    )
    assert torch.equal(a, b)


def test_valid_lens_masks_the_padding():
    lm = _lm()
    tokens = _tokens(length=6)
    padded = torch.cat([tokens, torch.zeros(3, 2, dtype=torch.long)], dim=1)
    valid_lens = torch.full((3,), 6)
    out = lm(padded, valid_lens=valid_lens)
    torch.testing.assert_close(out[:, :6], lm(tokens), **EXACT)


def test_parameter_count_and_attention_kind():
    lm = DecoderOnlyLM(_config(num_kv_heads=2), VOCAB)
    assert isinstance(lm.blocks[0].self_attn, mhbook.MultiHeadAttention)
    assert lm.blocks[0].self_attn.num_kv_heads == 2
    d, ff = 16, 32
    attn = 2 * d * d + 2 * d * 8 + 2 * d + 2 * 8  # W_q, W_o; W_k, W_v with 2 heads of 4
    block = attn + (d * ff + ff + ff * d + d) + 2 * 2 * d
    expected = VOCAB * d + 2 * block + 2 * d + (d * VOCAB + VOCAB)
    assert sum(p.numel() for p in lm.parameters()) == expected


def test_record_attention_on_the_lm():
    lm = _lm()
    tokens = _tokens(length=5)
    with mhbook.record_attention(lm) as weights:
        lm(tokens)
    w = weights()
    assert sorted(w) == ["blocks.0.self_attn", "blocks.1.self_attn"]
    assert w["blocks.0.self_attn"].shape == (3, 4, 5, 5)
    assert (w["blocks.0.self_attn"].triu(1) == 0).all()


# -- errors and the meta device ----------------------------------------------------------------
def test_bad_inputs():
    lm = _lm(dtype=torch.float32)
    with pytest.raises(ValueError, match=r"tokens must have shape \(batch, length\), got \(4,\)"):
        lm(torch.zeros(4, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"tokens holds token ids from 0 to 23, but the vocabulary has 23 tokens"
    ):
        lm(torch.tensor([[0, 23]]))
    with pytest.raises(TypeError, match="integer token ids"):
        lm(torch.zeros(1, 3))
    with pytest.raises(TypeError, match="cache must be None or a mhbook.KVCache"):
        lm(torch.zeros(1, 3, dtype=torch.long), cache=mhbook.LayerCache())
    with pytest.raises(ValueError, match="the model has 2 layers but the cache has 3"):
        lm(torch.zeros(1, 3, dtype=torch.long), cache=mhbook.KVCache(3))
    prompt = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"temperature must be a number in \[0.0, inf\), got -1.0"):
        lm.generate(prompt, 3, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k must be an int >= 1 or None, got 0"):
        lm.generate(prompt, 3, temperature=1.0, top_k=0)
    with pytest.raises(ValueError, match="prompt must hold at least one token"):
        lm.generate(torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"valid_lens must have shape \(1,\)"):
        lm(prompt, valid_lens=torch.tensor([2, 2]))
    with pytest.raises(TypeError, match="config must be a mhbook.ModelConfig"):
        DecoderOnlyLM({"d_model": 16}, VOCAB)


def test_config_errors_name_the_fields():
    with pytest.raises(ValueError, match="num_heads must be divisible by num_kv_heads"):
        ModelConfig(d_model=16, num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        ModelConfig(window=0)


@pytest.mark.parametrize("name", ["sinusoidal", "gqa", "rope", "alibi", "mla"])
def test_meta_device(name):
    meta = torch.device("meta")
    with meta:
        lm = DecoderOnlyLM(_config(dropout=0.1, window=4, **POSITION_CONFIGS[name]), VOCAB)
    tokens = torch.randint(0, VOCAB, (2, 6), device=meta)
    logits = lm.train()(tokens)
    assert logits.device.type == "meta" and logits.shape == (2, 6, VOCAB)
    logits.sum().backward()
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in lm.parameters())
    out = lm.generate(tokens[:, :3], 5, eos_id=2)
    assert out.device.type == "meta" and out.shape == (2, 5)
    out = lm.generate(tokens[:, :3], 3, temperature=0.7, top_k=4)
    assert out.shape == (2, 3)
    batch = mhbook.LMBatch(
        tokens, torch.full((2,), 2, device=meta), torch.full((2,), 6, device=meta)
    )
    loss, n = mhbook.completion_loss(lm, batch)
    assert loss.device.type == "meta"


# -- the prompt/completion task -------------------------------------------------------------
@pytest.fixture(scope="module")
def task():
    return mhbook.PromptCompletion(max_number=999, num_train=200, num_valid=20, num_test=30)


def test_sequences_are_prompt_separator_completion(task):
    ids = task.encode_prompt(71) + task.encode_completion("soixante et onze")
    assert task.vocab.decode(ids) == ["seventy", "-", "one", "=", "soixante", "et", "onze", "<eos>"]
    # One vocabulary: English and French words and "=".
    assert {"seventy", "soixante", "="} <= set(task.vocab.id_to_token)
    batch = next(task.batches("train", 8, shuffle=False))
    for row, p, n in zip(batch.tokens, batch.prompt_lens, batch.valid_lens):
        tokens = task.vocab.decode(row)
        assert tokens[p - 1] == "=" and tokens.count("=") == 1
        assert tokens[n - 1] == "<eos>" and set(tokens[n:]) <= {"<pad>"}
    en, fr = task.pairs("train")[0]
    assert task.decode_completion(task.encode_completion(fr)) == fr


def test_splits_and_batches_are_those_of_number_translation(task):
    """The same split, checks, errors and batch order (shuffled too) as mhbook.tasks.numbers's."""
    from mhbook.tasks import number_prompts as lm_data
    from mhbook.tasks import numbers as data

    translation = task.translation
    assert lm_data.SPLITS is data.SPLITS
    for args, message in [
        (("bogus", 4), "split must be one of ('train', 'valid', 'test'), got 'bogus'"),
        (("train", 0), "batch_size must be an int >= 1, got 0 (int)"),
    ]:
        for source in (task, translation):
            with pytest.raises(ValueError) as error:
                next(source.batches(*args))
            assert str(error.value) == message
    with pytest.raises(ValueError, match="split must be one of"):
        mhbook.evaluate_lm(nn.Linear(1, 1), task, "bogus")
    for split, shuffle in [("train", None), ("test", True), ("valid", None)]:
        lm_batches, tr_batches = (
            list(source.batches(split, 7, shuffle, generator=torch.Generator().manual_seed(3)))
            for source in (task, translation)
        )
        assert len(lm_batches) == len(tr_batches)
        for lm_batch, tr_batch in zip(lm_batches, tr_batches):
            # the prompt without "=", the source without <eos>: the same English numbers
            lm_rows = zip(lm_batch.tokens, lm_batch.prompt_lens)
            tr_rows = zip(tr_batch.src, tr_batch.src_valid_lens)
            prompts = [task.vocab.decode(row[: p - 1]) for row, p in lm_rows]
            sources = [translation.src_vocab.decode(row[: n - 1]) for row, n in tr_rows]
            assert prompts == sources


def test_completion_loss_counts_the_completion_only(task):
    """The loss's gradient reaches the logits of the completion's predictions only."""
    batch = next(task.batches("train", 4, shuffle=False))
    length = batch.tokens.size(1) - 1
    logits = torch.randn(4, length, len(task.vocab), requires_grad=True)

    class Fixed(nn.Module):
        def forward(self, tokens):
            assert tokens.shape == (4, length)
            return logits

    loss, n_tokens = mhbook.completion_loss(Fixed(), batch)
    assert int(n_tokens) == int((batch.valid_lens - batch.prompt_lens).sum())
    loss.backward()
    touched = logits.grad.abs().sum(-1) > 0  # (batch, L - 1)
    # prediction t is of token t + 1: counted when prompt_len <= t + 1 < valid_len
    target_position = torch.arange(1, length + 1)
    expected = (target_position >= batch.prompt_lens[:, None]) & (
        target_position < batch.valid_lens[:, None]
    )
    assert torch.equal(touched, expected)
    # and it is the mean cross-entropy of those predictions
    targets = batch.tokens[:, 1:]
    manual = F.cross_entropy(logits[expected], targets[expected])
    torch.testing.assert_close(loss, manual)


def test_complete_keeps_the_order_across_prompt_lengths(task):
    """Prompts are generated in groups of one length; the answers come back in order."""
    answers = {
        tuple(task.encode_prompt(en)): task.encode_completion(fr) for en, fr in task.pairs("test")
    }

    class Oracle(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.zeros(1))

        def generate(self, prompt, max_new_tokens, *, eos_id, **kwargs):
            rows = [answers[tuple(p.tolist())] for p in prompt]
            width = max(map(len, rows))
            return torch.tensor([r + [eos_id] * (width - len(r)) for r in rows])

    result = mhbook.evaluate_lm(Oracle(), task, "test")
    assert result["exact_match"] == 1.0 and result["hypotheses"] == result["references"]
    assert len({len(task.encode_prompt(en)) for en in result["sources"]}) > 1


def test_fit_trains_the_lm_with_completion_loss(task):
    mhbook.set_seed(0)
    lm = DecoderOnlyLM(_config(d_model=32, d_ff=64), len(task.vocab))
    history = mhbook.fit(
        lm,
        task,
        mhbook.TrainConfig(num_steps=60, batch_size=32, lr=5e-3, warmup_steps=10, eval_every=30),
        loss_fn=mhbook.completion_loss,
        progress=False,
    )
    assert history["loss"][-1] < 0.6 * history["loss"][0]
    assert history["valid_step"] == [30, 60]
    result = mhbook.evaluate_lm(lm, task, "valid")
    assert 0.0 <= result["exact_match"] <= 1.0 and len(result["hypotheses"]) == 20


# -- the training pairs as one stream (chapter 11) ------------------------------------------
def test_prompt_stream_is_the_pairs_one_after_another(task):
    stream = mhbook.PromptStream(task, 16)
    pairs = [task.encode_pair(en, fr) for en, fr in task.pairs("train")]
    assert stream.ids.tolist() == [i for ids, _ in pairs for i in ids]
    assert stream.completion.tolist() == [c for _, counted in pairs for c in counted]
    first = len(pairs[0][0])
    assert stream.pair_start[:first].tolist() == [0] * first and stream.pair_start[first] == first
    assert repr(stream) == f"PromptStream({stream.ids.numel():,} tokens, windows of 16)"


def test_prompt_stream_windows_count_the_completions_of_whole_pairs(task):
    stream = mhbook.PromptStream(task, 16)
    generator = torch.Generator().manual_seed(1)
    windows = list(stream.batches("train", 8, generator=generator))
    tokens = torch.cat([w.tokens for w in windows])
    assert tokens.shape[1] == 17 and all(w.tokens.size(0) <= 8 for w in windows)
    # one epoch: every window once, cut from one offset below the window's length
    starts = sorted(int(_find(stream.ids, row)) for row in tokens)
    offset = starts[0]
    assert offset < 16 and starts == list(range(offset, offset + 16 * len(starts), 16))
    for window in windows:
        for row, counted in zip(*window):
            start = _find(stream.ids, row)
            index = torch.arange(start, start + 17)
            whole = stream.pair_start[index] >= start  # the pair begins inside the window
            assert torch.equal(counted, stream.completion[index] & whole)
    assert list(stream.batches("valid")) == [] and list(stream.batches("test")) == []
    with pytest.raises(ValueError, match="split must be one of"):
        next(stream.batches("bogus"))


def test_prompt_stream_obeys_shuffle_and_drop_last(task):
    """shuffle=False: the windows in stream order from offset 0; drop_last leaves out the
    smaller last batch. Training's order (shuffle None or True) is one and the same."""
    stream = mhbook.PromptStream(task, 16)
    n = (stream.ids.numel() - 1) // 16
    assert n % 8, "pick a batch size that leaves a smaller last batch"
    ordered = list(stream.batches("train", 8, shuffle=False))
    tokens = torch.cat([w.tokens for w in ordered])
    assert tokens.shape == (n, 17) and ordered[-1].tokens.size(0) == n % 8
    assert torch.equal(tokens, stream.ids[torch.arange(n)[:, None] * 16 + torch.arange(17)])
    dropped = list(stream.batches("train", 8, shuffle=False, drop_last=True))
    assert len(dropped) == n // 8 and all(w.tokens.size(0) == 8 for w in dropped)
    runs = [
        torch.cat([w.tokens for w in stream.batches("train", 8, shuffle=s, generator=g)])
        for s in (None, True)
        for g in [torch.Generator().manual_seed(3)]
    ]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], tokens)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        next(stream.batches("train", 0))


def _find(ids, row):
    """Where ``row`` starts in ``ids`` (the first match)."""
    n = row.numel()
    for start in range(ids.numel() - n + 1):
        if torch.equal(ids[start : start + n], row):
            return start
    raise AssertionError("window not in the stream")


def test_stream_loss_counts_the_counted_targets_only(task):
    stream = mhbook.PromptStream(task, 16)
    batch = next(stream.batches("train", 4, generator=torch.Generator().manual_seed(0)))
    logits = torch.randn(4, 16, len(task.vocab), requires_grad=True)

    class Fixed(nn.Module):
        def forward(self, tokens):
            assert tokens.shape == (4, 16)
            return logits

    loss, n_tokens = mhbook.stream_loss(Fixed(), batch)
    expected = batch.counted[:, 1:]
    assert int(n_tokens) == int(expected.sum()) > 0
    loss.backward()
    assert torch.equal(logits.grad.abs().sum(-1) > 0, expected)
    manual = F.cross_entropy(logits[expected], batch.tokens[:, 1:][expected])
    torch.testing.assert_close(loss, manual)
    assert stream.loss_fn(Fixed(), batch)[0] == loss


def test_prompt_stream_and_the_number_lms_name_bad_arguments(task):
    with pytest.raises(TypeError, match="data must be a PromptCompletion, got list"):
        mhbook.PromptStream([], 16)
    with pytest.raises(ValueError, match="length must be an int >= 1, got 0"):
        mhbook.PromptStream(task, 0)
    with pytest.raises(ValueError, match=r"position must be one of \('sinusoidal', 'rope'"):
        mhbook.position_model("learned")
    with pytest.raises(ValueError, match="window"):
        mhbook.window_model(0)
