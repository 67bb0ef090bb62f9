"""The grader's own tests for ``mhbook.check.circuits``: chapter 15's previous-token and
induction scores."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from grading import assert_passes, assert_rejects_corruptions

from mhbook import check

CHECKS = [check.previous_token_score, check.induction_score]


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


OTHERS = {
    "previous_token_score": (previous_mask, previous_torch),
    "induction_score": (induction_mask, induction_loop),
}


def as_tensor(impl):
    """``impl`` with a tensor output, so that grading's corruptions can reach it."""

    def wrapped(*args):
        return torch.from_numpy(np.array(impl(*args)))

    wrapped.__signature__ = inspect.signature(impl)
    return wrapped


@pytest.mark.parametrize("check_fn", CHECKS, ids=lambda c: c.spec.name)
def test_references_and_other_implementations_pass(check_fn):
    for impl in (check_fn.spec.reference, *OTHERS[check_fn.spec.name]):
        assert_passes(check_fn, impl)


@pytest.mark.parametrize("check_fn", CHECKS, ids=lambda c: c.spec.name)
def test_nan_wrong_shape_and_dtype_never_pass(check_fn):
    assert_rejects_corruptions(check_fn, as_tensor(check_fn.spec.reference))


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
    assert "differs first at head 1" in report
