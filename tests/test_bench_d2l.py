"""The benchmark's Dive into Deep Learning reference (mhbook/bench_d2l.py) computes what
mhbook computes: its attention with valid lengths equals mhbook's with the same masks, so
the training-speed ratio of ``python -m mhbook.bench`` compares like with like."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

import mhbook
from mhbook import bench_d2l
from mhbook.bench import D2L_CONFIG, random_translation_batch

ROOT = Path(__file__).resolve().parents[1]


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
    expected = ours(q, kv, kv, mhbook.padding_mask(valid_lens, 6))
    torch.testing.assert_close(theirs(q, kv, kv, valid_lens), expected)


def test_d2l_decoder_valid_lens_are_the_causal_mask():
    """In training D2L's decoder masks its self-attention with dec_valid_lens = 1..T."""
    theirs, ours = _pair()
    x = torch.randn(2, 5, 16)
    dec_valid_lens = torch.arange(1, 6).repeat(2, 1)
    expected = ours(x, x, x, is_causal=True)
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
        [sys.executable, "-m", "mhbook.bench", "--quick", "--threads", "1", "--only",
         "training-vs-d2l"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "\n(e) " in result.stdout and "mhbook/D2L" in result.stdout
    assert all(f"\n({t}) " not in result.stdout for t in "abcd")
