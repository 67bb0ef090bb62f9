"""mhbook.training.live_copier: the PyTorch side of chapter 15's Train panel (the page itself is
checked against it in tests/viz/test_browser_live_train.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mhbook.models.lm import DecoderOnlyLM
from mhbook.training.live_copier import (
    LIVE_COPIER_MODEL,
    LIVE_COPIER_TASK,
    live_copier_batches,
    live_copier_init,
    live_copier_test,
    look,
    mulberry32,
    phase_change,
)
from mhbook.viz.attention_records import passage_attention

V, T = LIVE_COPIER_TASK["vocab_size"], LIVE_COPIER_TASK["length"]


def test_mulberry32_is_a_uniform_stream_in_zero_one():
    draws = [mulberry32(7)() for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]  # a fresh generator of one seed starts the same
    random = mulberry32(7)
    u = np.array([random() for _ in range(20_000)])
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    assert len(set(u.tolist())) == len(u)


def test_batches_are_repeated_blocks_one_token_apart():
    x, y = next(live_copier_batches(3))
    assert x.shape == y.shape == (8, T) and int(x.max()) < V
    assert torch.equal(x[:, 1:], y[:, :-1])
    shortest, longest = LIVE_COPIER_TASK["periods"]
    s = torch.cat([x, y[:, -1:]], dim=1)
    for row in s:  # some period in the range repeats the whole sequence
        assert any(torch.equal(row[p:], row[:-p]) for p in range(shortest, longest + 1))
    test = live_copier_test()
    assert torch.equal(test[:, longest:], test[:, :-longest])  # the longest block, twice


def test_init_is_seeded_and_pytorchs_in_distribution():
    a = live_copier_init(DecoderOnlyLM(LIVE_COPIER_MODEL, V), 1)
    b = live_copier_init(DecoderOnlyLM(LIVE_COPIER_MODEL, V), 1)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    d = LIVE_COPIER_MODEL.d_model
    W = a.blocks[0].self_attn.W_q.weight
    assert W.abs().max() <= 1 / math.sqrt(d) and W.abs().max() > 0.9 / math.sqrt(d)
    assert abs(a.embedding.weight.std().item() - 1) < 0.1
    assert torch.equal(a.norm.weight, torch.ones(d))
    with pytest.raises(ValueError, match="seed"):
        live_copier_init(a, -1)


def test_look_is_chapter_15s_scores_and_losses():
    model = live_copier_init(DecoderOnlyLM(LIVE_COPIER_MODEL, V), 0)
    test, p = live_copier_test(), LIVE_COPIER_TASK["periods"][1]
    ours = look(model, test, p)
    w = passage_attention(model, test)  # (P, layers, heads, T, T)
    i = np.arange(p, T)
    assert np.allclose(ours["previous"], w.diagonal(offset=-1, axis1=-2, axis2=-1).mean((0, -1)))
    assert np.allclose(ours["induction"], w[..., i, i - p + 1].mean((0, -1)))
    with torch.no_grad():
        losses = F.cross_entropy(model(test)[:, :-1].transpose(1, 2), test[:, 1:], reduction="none")
    assert math.isclose(ours["first"], losses[:, : p - 1].mean().item(), rel_tol=1e-6)
    assert math.isclose(ours["second"], losses[:, p:].mean().item(), rel_tol=1e-6)


def test_phase_change_is_the_first_look_below_half_the_uniform_guess():
    half = math.log(V) / 2
    flat = [[0.1] * 4, [0.1] * 4]
    looks = [
        {"step": s, "second": v, "previous": flat, "induction": [[0.1] * 4, [0.1, 0.6, 0.1, 0.1]]}
        for s, v in [(0, 2 * half), (10, half + 0.01), (20, half - 0.01), (30, 0.1)]
    ]
    result = phase_change(looks)
    assert result["change"] == 20
    assert result["crossed"]["induction"][1] == [None, 0, None, None]
    assert phase_change(looks[:2])["change"] is None
