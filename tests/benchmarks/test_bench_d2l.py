"""The benchmark's Dive into Deep Learning reference (benchmarks/bench_d2l.py) computes what
mhbook computes: its attention with valid lengths equals mhbook's with the same masks, so
the training-speed ratio of ``python -m benchmarks.bench`` compares like with like. And the
KV-cache table (f) fills its caches as a forward pass would and reports their bytes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mhbook
from benchmarks import bench_d2l
from benchmarks.bench import (
    D2L_CONFIG,
    cache_bytes,
    fill_cache,
    kv_cache_variants,
    random_translation_batch,
)

pytestmark = pytest.mark.slow(seconds=40)  # trains D2L's model and the book's

ROOT = Path(__file__).resolve().parents[2]


def _pair(num_hiddens=16, num_heads=4):
    """D2L's multi-head attention (no biases) and mhbook's with the same weights."""
    torch.manual_seed(0)
    theirs = bench_d2l.MultiHeadAttention(
        num_hiddens, num_hiddens, num_hiddens, num_hiddens, num_heads, 0.0
    ).eval()
    ours = mhbook.MultiHeadAttention(num_hiddens, num_heads, bias=False).eval()
    with torch.no_grad():
        for name in ("W_q", "W_k", "W_v", "W_o"):
            getattr(ours, name).weight.copy_(getattr(theirs, name).weight)
    return theirs, ours


def test_d2l_attention_with_valid_lens_is_mhbooks_with_a_padding_mask():
    theirs, ours = _pair()
    q, kv = torch.randn(3, 4, 16), torch.randn(3, 6, 16)
    valid_lens = torch.tensor([6, 2, 5])
    expected, _ = ours(q, kv, kv, mhbook.padding_mask(valid_lens, 6))
    torch.testing.assert_close(theirs(q, kv, kv, valid_lens), expected)


def test_d2l_decoder_valid_lens_are_the_causal_mask():
    """In training D2L's decoder masks its self-attention with dec_valid_lens = 1..T."""
    theirs, ours = _pair()
    x = torch.randn(2, 5, 16)
    dec_valid_lens = torch.arange(1, 6).repeat(2, 1)
    expected, _ = ours(x, x, x, is_causal=True)
    torch.testing.assert_close(theirs(x, x, x, dec_valid_lens), expected)


def test_d2l_train_step_trains():
    """A few of D2L's training steps on one batch lower its masked loss."""
    batch = random_translation_batch(8, 10, 50, torch.device("cpu"), torch.Generator())
    torch.manual_seed(0)
    net = bench_d2l.d2l_transformer(50, 50).train()
    optimizer = torch.optim.Adam(net.parameters(), lr=D2L_CONFIG.train.lr)
    loss = bench_d2l.MaskedSoftmaxCELoss()
    args = (batch.src, batch.src_valid_lens, batch.tgt_out, batch.tgt_valid_lens)
    first, n_tokens = bench_d2l.train_step(net, optimizer, loss, *args, bos_id=1)
    for _ in range(20):
        last, _ = bench_d2l.train_step(net, optimizer, loss, *args, bos_id=1)
    assert n_tokens == float(batch.tgt_valid_lens.sum())
    assert last < 0.5 * first


def test_random_batches_are_padded_after_their_lengths():
    batch = random_translation_batch(16, 10, 50, torch.device("cpu"), torch.Generator())
    for tokens, lens in ((batch.src, batch.src_valid_lens), (batch.tgt_out, batch.tgt_valid_lens)):
        assert ((5 <= lens) & (lens <= 10)).all()
        positions = torch.arange(10)
        assert ((tokens == 0) == (positions >= lens[:, None])).all()  # 0 = <pad>, words >= 2
    assert (batch.tgt_in[:, 0] == 1).all() and torch.equal(
        batch.tgt_in[:, 1:], batch.tgt_out[:, :-1]
    )


def test_bench_only_training_vs_d2l():
    """``--only training-vs-d2l`` prints table (e) alone, with its ratio."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench", "--quick", "--threads", "1", "--only",
         "training-vs-d2l"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "\n(e) " in result.stdout and "mhbook/D2L = " in result.stdout
    table = result.stdout[result.stdout.index("\n(e) ") :].splitlines()
    assert [row.split("  ")[0] for row in table[4:8]] == [
        "mhbook.Transformer, fit's step",
        "the same model flat, no checks",
        "torch.nn.Transformer, fit's step",
        "D2L's code, train_seq2seq's step",
    ]
    assert table[7].endswith(" 1.00")  # D2L over itself
    assert all(f"\n({t}) " not in result.stdout for t in "abcd")


def test_bench_only_kv_cache():
    """``--only kv-cache --quick`` prints table (f) alone: five variants at three contexts,
    with bytes that scale as the variants' caches do (d_model 64, 8 heads of 8, W = 32)."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench", "--quick", "--threads", "1", "--only",
         "kv-cache"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "\n(f) " in out and all(f"\n({t}) " not in out for t in "abcde")
    lines = out[out.index("\n(f) ") :].splitlines()
    header = lines[2].split()
    assert header == ["context", "variant", "KV", "bytes", "bytes/MHA", "ms/token", "time/MHA"]
    rows = [line.split() for line in lines[4:19]]
    assert lines[19].startswith("  note:")
    table, ratios = {}, {}
    for context, *variant, nbytes, bytes_ratio, ms, time_ratio in rows:
        key = int(context), " ".join(variant)
        table[key], ratios[key] = int(nbytes.replace(",", "")), float(bytes_ratio)
        assert float(ms) > 0 and float(time_ratio) > 0
    d_head, window = 8, 32
    for L in (32, 128, 512):
        mha = table[L, "MHA h_kv=8"]
        assert mha == L * 2 * 8 * d_head * 4  # keys and values, 8 heads, float32
        assert table[L, "GQA h_kv=2"] == mha // 4
        assert table[L, "MQA h_kv=1"] == mha // 8
        assert table[L, "MLA d_c=28+4"] == L * (28 + 4) * 4  # one latent per token
        assert table[L, f"window W={window}"] == min(L, window) * 2 * 8 * d_head * 4
    for (L, variant), nbytes in table.items():
        assert ratios[L, variant] == round(nbytes / table[L, "MHA h_kv=8"], 3)


def test_kv_cache_fill_is_what_a_forward_pass_caches():
    """Table (f)'s caches hold the keys and values (or latents) the layer itself caches in
    a prefill, and their bytes are their storages' (a view counts its whole storage)."""
    length = 40
    for name, config in kv_cache_variants(d_model=32, num_heads=4, window=16).items():
        torch.manual_seed(0)
        layer = mhbook.make_attention(config).eval()
        x = torch.randn(1, length, 32)
        w = config.window
        assert layer.window == w, name  # the layer knows its window and masks by it
        rope = mhbook.make_rope(config)  # the model's, which rotates the layer
        tables = rope.tables(torch.arange(length))
        prefilled = mhbook.LayerCache()
        with torch.no_grad():
            layer(x, is_causal=True, cache=prefilled, rope_tables=tables)
            filled = fill_cache(layer, x, w, rope)
        assert filled.length == prefilled.length == length, name
        assert len(filled.tensors()) == len(prefilled.tensors()), name
        for ours, theirs in zip(filled.tensors(), prefilled.tensors()):
            torch.testing.assert_close(ours, theirs, msg=name)
        assert cache_bytes(filled) == filled.nbytes == prefilled.nbytes, name
    cache = mhbook.LayerCache()
    cache.latent = torch.zeros(1, 10, 4)[:, :5]  # a view of twice its size
    assert cache.nbytes == 5 * 4 * 4 and cache_bytes(cache) == 10 * 4 * 4
