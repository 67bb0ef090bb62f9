"""Checks of chapter 15's scores of heads: the previous-token score and the induction score,
written by hand.

The reader's function gets the weights as a NumPy array ``(P, ..., T, T)``, as
``mhbook.viz.attention_records.passage_attention`` returns them (passages first, then any head
dimensions such as layers and heads, then queries and keys), and may return a NumPy array,
a tensor or a float: the check reads it with ``numpy.asarray``. ``mhbook`` has no function
for these scores, so the expected values come from a second implementation written another
way (a loop over the queries, in float64), not the reference the bugs mutate.
"""

from __future__ import annotations

import numpy as np
import torch

from .grader import Bug, Case, define, seeded

__all__ = ["previous_token_score", "induction_score"]

CHAPTER = "15-heads-in-a-language-model"


def causal_weights(*shape, seed: int, sharp: float = 2.0) -> torch.Tensor:
    """Seeded attention weights ``(..., T, T)``: a causal softmax of random scores."""
    T = shape[-1]
    scores = seeded(*shape, seed=seed, scale=sharp)
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    return scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)


def _as_tensor(value):
    """The reader's scores as a tensor (a stub's ``None`` or ``...`` left as it is)."""
    if value is None or value is Ellipsis:
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    return torch.from_numpy(np.array(value))


def _call(impl, case: Case):
    weights, *rest = case.args
    return _as_tensor(impl(weights.numpy(), *rest))


def _dims(lead: tuple) -> dict:
    return {"output": lead}


# --- previous-token score --------------------------------------------------------------------


def _previous_cases() -> list[Case]:
    T = 7
    perfect = torch.eye(T, dtype=torch.float64).roll(-1, dims=1).tril()  # query i on key i - 1
    perfect[0, 0] = 1.0  # query 0 has no previous token: it attends to itself
    uniform = torch.ones(T, T, dtype=torch.float64).tril() / torch.arange(1, T + 1)[:, None]
    return [
        Case(
            "one passage, one head, T = 5 (the score is a number)",
            (causal_weights(1, 5, 5, seed=100),),
            dims=_dims(()),
        ),
        Case(
            "a perfect previous-token head and uniform attention, 2 passages, T = 7",
            (torch.stack([perfect, uniform]).expand(2, 2, T, T).clone(),),
            dims=_dims(("head",)),
        ),
        Case(
            "3 passages, 2 layers of 3 heads, T = 6",
            (causal_weights(3, 2, 3, 6, 6, seed=101),),
            dims=_dims(("layer", "head")),
        ),
        Case(
            "2 passages, 4 heads, T = 9, sharp weights",
            (causal_weights(2, 4, 9, 9, seed=102, sharp=5.0),),
            dims=_dims(("head",)),
        ),
    ]


def _previous_expected(case: Case) -> torch.Tensor:
    """A loop over the queries 1 .. T-1, then the mean over them and over the passages."""
    w = case.args[0].double()
    T = w.size(-1)
    per_query = torch.stack([w[..., i, i - 1] for i in range(1, T)], dim=-1)
    return per_query.mean(dim=-1).mean(dim=0)


def _previous_reference(weights):
    """Written for teaching (and mutated for the bugs): the mean of the diagonal below the
    main one, over the queries 1 .. T-1 and the passages."""
    w = np.asarray(weights)
    return w.diagonal(offset=-1, axis1=-2, axis2=-1).mean(axis=(0, -1))


def _previous_above(weights):
    w = np.asarray(weights)
    return w.diagonal(offset=1, axis1=-2, axis2=-1).mean(axis=(0, -1))


def _previous_main(weights):
    w = np.asarray(weights)
    return w.diagonal(offset=0, axis1=-2, axis2=-1).mean(axis=(0, -1))


def _previous_with_query_0(weights):
    w = np.asarray(weights)
    return w.diagonal(offset=-1, axis1=-2, axis2=-1).sum(axis=-1).mean(axis=0) / w.shape[-1]


def _previous_per_passage(weights):
    w = np.asarray(weights)
    return w.diagonal(offset=-1, axis1=-2, axis2=-1).mean(axis=-1)


@define(
    title="the previous-token score, the mean weight from query i on key i - 1",
    cases=_previous_cases,
    expected=_previous_expected,
    reference=_previous_reference,
    call=_call,
    params=("weights",),
    why="A mean in float32 passes as well as one in float64.",
    bugs=[
        Bug(
            "the diagonal above the main one (key i + 1, a future key: always 0)",
            "the previous token of query i is key i - 1: the diagonal below the main one, "
            "w.diagonal(offset=-1, axis1=-2, axis2=-1).",
            _previous_above,
        ),
        Bug(
            "the main diagonal (each query on itself)",
            "take the weights on key i - 1: diagonal(offset=-1, axis1=-2, axis2=-1).",
            _previous_main,
        ),
        Bug(
            "query 0 counted too (it has no previous token): divided by T instead of T - 1",
            "average over the queries 1 .. T-1 only: the mean of the T - 1 weights of the "
            "diagonal below the main one.",
            _previous_with_query_0,
        ),
        Bug(
            "not averaged over the passages (the first axis)",
            "take the mean over axis 0 (the passages) as well as over the queries.",
            _previous_per_passage,
        ),
    ],
    chapter=CHAPTER,
)
def previous_token_score(impl):
    """The previous-token score of every head: the mean weight from query ``i`` on key
    ``i - 1``.

    Contract: ``impl(weights) -> scores``, with ``weights`` a NumPy float64 array ``(P,
    ..., T, T)`` (passages, then any head dimensions such as layers and heads, then queries
    and keys), as ``passage_attention`` returns; ``scores`` ``(...)``, the mean of
    ``weights[p, ..., i, i - 1]`` over the queries ``i = 1 .. T-1`` and the passages ``p``,
    in float64 (a NumPy array, a tensor, or a float when there is no head dimension).
    Compared with a loop over the queries.
    """


# --- induction score --------------------------------------------------------------------------


def _induction_cases() -> list[Case]:
    return [
        Case(
            "one passage, one head, T = 6, period 3 (the score is a number)",
            (causal_weights(1, 6, 6, seed=110), 3),
            dims=_dims(()),
        ),
        Case(
            "2 passages, 3 heads, T = 8, period 4",
            (causal_weights(2, 3, 8, 8, seed=111), 4),
            dims=_dims(("head",)),
        ),
        Case(
            "3 passages, 2 layers of 2 heads, T = 11, period 4 (almost three copies)",
            (causal_weights(3, 2, 2, 11, 11, seed=112), 4),
            dims=_dims(("layer", "head")),
        ),
        Case(
            "2 passages, 2 heads, T = 9, period 5 (a second copy of 4), sharp weights",
            (causal_weights(2, 2, 9, 9, seed=113, sharp=5.0), 5),
            dims=_dims(("head",)),
        ),
    ]


def _induction_expected(case: Case) -> torch.Tensor:
    """A loop over the queries of the repeats, ``period .. T-1``, each on the key after the
    earlier occurrence of its token, ``i - period + 1``."""
    weights, period = case.args
    w = weights.double()
    T = w.size(-1)
    per_query = torch.stack([w[..., i, i - (period - 1)] for i in range(period, T)], dim=-1)
    return per_query.mean(dim=-1).mean(dim=0)


def _induction_reference(
    weights, period, *, back=None, first=None, divide_by_T=False, passages=True
):
    """Written for teaching (and mutated for the bugs): the mean weight from query ``i``
    of the repeats on key ``i - period + 1``."""
    w = np.asarray(weights)
    T = w.shape[-1]
    i = np.arange(period if first is None else first, T)
    per_query = w[..., i, i - (period - 1 if back is None else back)]
    total = per_query.sum(axis=-1) / (T if divide_by_T else len(i))
    return total.mean(axis=0) if passages else total


@define(
    title="the induction score, the mean weight from query i on key i - period + 1",
    cases=_induction_cases,
    expected=_induction_expected,
    reference=_induction_reference,
    call=_call,
    params=("weights", "period"),
    why="A mean in float32 passes as well as one in float64.",
    bugs=[
        Bug(
            "key i - period (the earlier occurrence itself) instead of i - period + 1",
            "an induction head looks at the token after the earlier occurrence of the "
            "query's token: key i - period + 1.",
            lambda weights, period: _induction_reference(weights, period, back=period),
        ),
        Bug(
            "query period - 1 counted too (the last token of the first copy)",
            "average over the queries of the repeats, i = period .. T-1: np.arange(period, T).",
            lambda weights, period: _induction_reference(weights, period, first=period - 1),
        ),
        Bug(
            "the sum over the queries divided by T instead of by their number, T - period",
            "take the mean over the T - period queries of the repeats.",
            lambda weights, period: _induction_reference(weights, period, divide_by_T=True),
        ),
        Bug(
            "not averaged over the passages (the first axis)",
            "take the mean over axis 0 (the passages) as well as over the queries.",
            lambda weights, period: _induction_reference(weights, period, passages=False),
        ),
    ],
    chapter=CHAPTER,
)
def induction_score(impl):
    """The induction score of every head on a block of ``period`` tokens repeated: the mean
    weight from query ``i`` of the repeats on key ``i - period + 1``, the token after the
    earlier occurrence of the query's token.

    Contract: ``impl(weights, period) -> scores``, with ``weights`` a NumPy float64 array
    ``(P, ..., T, T)`` (passages, then any head dimensions, then queries and keys) of
    sequences that repeat a block of ``period`` tokens, and ``period`` an int; ``scores``
    ``(...)``, the mean of ``weights[p, ..., i, i - period + 1]`` over the queries ``i =
    period .. T-1`` and the passages ``p``, in float64 (a NumPy array, a tensor, or a float
    when there is no head dimension). Compared with a loop over the queries.
    """
