"""The grader's own tests for ``mhbook.check.circuits``: chapter 15's previous-token and
induction scores (the other correct implementations, run by ``test_catalogue.py``, and what
is special here)."""

from __future__ import annotations

import numpy as np
import torch
from grading import assert_passes

from mhbook import check

# --- other correct implementations, written otherwise than the book's ----------------------


def previous_mask(weights):
    """A mask of the diagonal below the main one, summed, over the T - 1 queries."""
    w = np.asarray(weights)
    T = w.shape[-1]
    return (w * np.eye(T, k=-1)).sum(axis=(-2, -1)).mean(axis=0) / (T - 1)


def previous_torch(weights):
    """In torch, a tensor out: the weights on key i - 1 gathered for every query."""
    w = torch.as_tensor(weights)
    T = w.size(-1)
    rows = torch.arange(1, T)
    return w[..., rows, rows - 1].mean(dim=-1).mean(dim=0)


def induction_mask(weights, period):
    """A mask of the keys i - period + 1 for the queries of the repeats."""
    w = np.asarray(weights)
    T = w.shape[-1]
    mask = np.eye(T, k=-(period - 1))
    mask[:period] = 0
    return (w * mask).sum(axis=(-2, -1)).mean(axis=0) / (T - period)


def induction_loop(weights, period):
    """Head by head in Python floats."""
    w = np.asarray(weights)
    P, T = w.shape[0], w.shape[-1]
    heads = w.reshape(P, -1, T, T)
    scores = [
        sum(heads[p, h, i, i - period + 1] for p in range(P) for i in range(period, T))
        / (P * (T - period))
        for h in range(heads.shape[1])
    ]
    return np.array(scores).reshape(w.shape[1:-2])


ALTERNATIVES = {
    "previous_token_score": (previous_mask, previous_torch),
    "induction_score": (induction_mask, induction_loop),
}


def test_a_float_for_one_head_passes_and_a_stub_is_not_written_yet():
    def previous(weights):
        w = np.asarray(weights)
        if w.ndim == 3:  # one head: a Python float
            return float(w.diagonal(offset=-1, axis1=-2, axis2=-1).mean())
        return previous_mask(w)

    assert_passes(check.previous_token_score, previous)

    def stub(weights): ...

    assert "not written yet" in check.previous_token_score(stub).report()


def test_a_failure_says_which_head_differs_first():
    def wrong_second_head(weights):
        scores = previous_mask(weights)
        if np.ndim(scores) >= 1 and scores.shape[-1] > 1:
            scores = scores.copy()
            scores[..., 1] += 0.5
        return scores

    report = check.previous_token_score(wrong_second_head).report()
    assert "Likely bug" not in report
    assert "the worst is at head 1:" in report
