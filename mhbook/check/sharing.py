"""Checks of chapter 10: key/value heads shared by groups of query heads.

The references are Hugging Face ``transformers``' ``repeat_kv`` (Llama's) and PyTorch's
``F.scaled_dot_product_attention(..., enable_gqa=True)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .grader import Bug, Case, define, seeded

__all__ = ["repeat_kv", "gqa"]

HEADS = ("batch", "head", "position", "feature")


# --- repeat_kv ----------------------------------------------------------------------------


def _repeat_cases() -> list[Case]:
    return [
        Case(
            "2 key/value heads, each repeated twice",
            (seeded(2, 2, 3, 4, seed=80), 2),
            dims={"output": HEADS},
        ),
        Case(
            "3 key/value heads, each repeated 3 times (odd sizes)",
            (seeded(2, 3, 5, 3, seed=81), 3),
            dims={"output": HEADS},
        ),
        Case(
            "multi-query: 1 key/value head for 4 query heads, batch 1",
            (seeded(1, 1, 4, 2, seed=82), 4),
            dims={"output": HEADS},
        ),
        Case(
            "n_rep = 1: nothing to repeat", (seeded(2, 2, 3, 2, seed=83), 1), dims={"output": HEADS}
        ),
        Case(
            "float16, 4 key/value heads repeated twice",
            (seeded(1, 4, 2, 4, seed=84, dtype=torch.float16), 2),
            dims={"output": HEADS},
        ),
    ]


def _repeat_expected(case: Case) -> torch.Tensor:
    from transformers.models.llama.modeling_llama import repeat_kv

    return repeat_kv(*case.args)


def _repeat_reference(t, n_rep):
    """Written for teaching: key/value head ``j`` becomes heads ``j * n_rep`` to
    ``(j + 1) * n_rep - 1``."""
    return t.repeat_interleave(n_rep, dim=1)


def _repeat_tiled(t, n_rep):
    return t.repeat(1, n_rep, 1, 1)


def _repeat_time(t, n_rep):
    return t.repeat_interleave(n_rep, dim=2)


@define(
    title="repeating key/value heads for their groups of query heads",
    cases=_repeat_cases,
    expected=_repeat_expected,
    reference=_repeat_reference,
    params=("t", "n_rep"),
    tolerances="exact",
    bugs=[
        Bug(
            "the heads are tiled (0, 1, 0, 1) instead of repeated in place (0, 0, 1, 1)",
            "use t.repeat_interleave(n_rep, dim=1), or t[:, :, None].expand(B, g, n_rep, T, d)"
            ".reshape(B, g * n_rep, T, d): t.repeat(1, n_rep, 1, 1) gives query head i the "
            "key/value head i % g instead of i // n_rep.",
            _repeat_tiled,
        ),
        Bug(
            "the positions are repeated (dim=2) instead of the heads (dim=1)",
            "repeat along the head axis, dim=1: (B, g, T, d) -> (B, g * n_rep, T, d).",
            _repeat_time,
        ),
    ],
    chapter="10-sharing-keys-and-values",
)
def repeat_kv(impl):
    """Repeat each key/value head for its group of query heads (chapter 10).

    Contract: ``impl(t, n_rep) -> repeated``, with ``t`` ``(batch, g, T, d)`` and
    ``repeated`` ``(batch, g * n_rep, T, d)``, same dtype: key/value head ``j`` serves query
    heads ``j * n_rep`` to ``(j + 1) * n_rep - 1``. Compared exactly with Hugging Face
    ``transformers``' ``repeat_kv``.
    """


# --- grouped-query attention -------------------------------------------------------------


def _gqa_cases() -> list[Case]:
    def qkv(B, h, h_kv, T, S, d, seed, dtype=torch.float64, scale=1.0):
        return (
            seeded(B, h, T, d, seed=seed, dtype=dtype, scale=scale),
            seeded(B, h_kv, S, d, seed=seed + 1, dtype=dtype, scale=scale),
            seeded(B, h_kv, S, d, seed=seed + 2, dtype=dtype),
        )

    dims = {"output": ("batch", "head", "query", "feature")}
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    padding = torch.tensor([[True] * 5, [True, True, True, False, False]])[:, None, None, :]
    return [
        Case(
            "4 query heads, 2 key/value heads, no mask", qkv(2, 4, 2, 3, 3, 4, seed=90), dims=dims
        ),
        Case(
            "6 query heads, 3 key/value heads (groups of 2), a causal mask",
            qkv(1, 6, 3, 5, 5, 4, seed=93),
            {"mask": causal},
            dims=dims,
            needs=("mask",),
        ),
        Case(
            "multi-query: 4 query heads, 1 key/value head, 2 new queries after 4 cached keys",
            qkv(2, 4, 1, 2, 6, 3, seed=96),
            {"mask": torch.ones(2, 6, dtype=torch.bool).tril(diagonal=4)},
            dims=dims,
            needs=("mask",),
        ),
        Case(
            "a padding mask (batch, 1, 1, S): the second sequence has 3 keys",
            qkv(2, 4, 2, 5, 5, 4, seed=99),
            {"mask": padding},
            dims=dims,
            needs=("mask",),
        ),
        Case(
            "as many key/value heads as query heads (multi-head attention)",
            qkv(1, 3, 3, 4, 4, 2, seed=102),
            dims=dims,
        ),
        Case(
            "float32, 8 query heads, 2 key/value heads (groups of 4), d = 16",
            qkv(1, 8, 2, 3, 4, 16, seed=105, dtype=torch.float32),
            dims=dims,
        ),
        Case(
            "float16 with larger scores, 4 query heads, 2 key/value heads",
            qkv(2, 4, 2, 3, 5, 8, seed=108, dtype=torch.float16, scale=2.0),
            dims=dims,
        ),
    ]


def _gqa_expected(case: Case) -> torch.Tensor:
    q, k, v = case.args
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=case.kwargs.get("mask"), enable_gqa=True
    )


def _gqa_reference(q, k, v, mask=None, *, tiled=False, grouped_mask=False):
    """Written for teaching (and mutated for the bugs): query head ``i`` reads key/value
    head ``i // (h / h_kv)``; softmax in float32 for float16 inputs."""
    h, h_kv = q.size(1), k.size(1)
    group = h // h_kv
    if tiled:
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    else:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    compute = torch.promote_types(q.dtype, torch.float32)
    scores = q.to(compute) @ k.to(compute).transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        if grouped_mask:  # scores seen as (B, h_kv, group, T, S), the mask not given an axis
            B, _, T, S = scores.shape
            scores = scores.view(B, h_kv, group, T, S).masked_fill(~mask, float("-inf"))
            scores = scores.view(B, h, T, S)
        else:
            scores = scores.masked_fill(~mask, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v.to(compute)).to(v.dtype)


def _gqa_tiled(q, k, v, mask=None):
    return _gqa_reference(q, k, v, mask, tiled=True)


def _gqa_grouped_mask(q, k, v, mask=None):
    return _gqa_reference(q, k, v, mask, grouped_mask=True)


@define(
    title="grouped-query attention",
    cases=_gqa_cases,
    expected=_gqa_expected,
    reference=_gqa_reference,
    params=("q", "k", "v"),
    why="Float32 arithmetic inside is fine for float64 inputs (Hugging Face's eager "
    "attention takes the softmax in float32).",
    bugs=[
        Bug(
            "query head i reads key/value head i % h_kv instead of i // (h / h_kv)",
            "the query heads of a group are neighbours: repeat each key/value head in place "
            "with repeat_interleave(h // h_kv, dim=1), not with .repeat (which tiles them).",
            _gqa_tiled,
        ),
        Bug(
            "a (batch, 1, 1, S) padding mask lands on the key/value heads of the grouped "
            "(B, h_kv, group, T, S) scores",
            "give the mask an axis for the group before broadcasting, mask[:, :, None] "
            "(or mask the (B, h, T, S) scores): otherwise batch b's mask is applied to "
            "key/value head b.",
            _gqa_grouped_mask,
        ),
    ],
    chapter="10-sharing-keys-and-values",
)
def gqa(impl):
    """Grouped-query attention (chapter 10).

    Contract: ``impl(q, k, v, mask=None) -> output``, with ``q`` ``(batch, h, T, d)``, ``k``
    and ``v`` ``(batch, h_kv, S, d)`` (``h`` a multiple of ``h_kv``) and ``output``
    ``(batch, h, T, d)`` in the inputs' dtype: query head ``i`` attends with key/value head
    ``i // (h / h_kv)``. ``mask`` is optional: a bool tensor broadcast against the scores
    ``(batch, h, T, S)``, ``True`` = may attend (no row of the cases is fully masked). A
    function without ``mask`` is checked on the unmasked cases only. Compared with
    ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)``.
    """
