"""Check of chapter 13: one rank's share of a tensor-parallel attention layer.

The reference is
``mhbook.distributed.tensor_parallel.TensorParallelMultiHeadAttention.partial_forward``
(tested against the single-process layer on real process groups).
"""

from __future__ import annotations

import math

import torch

from ..attention.multihead import MultiHeadAttention
from ..distributed.tensor_parallel import TensorParallelMultiHeadAttention
from .grader import Bug, Case, define, seeded

__all__ = ["tensor_parallel"]


def _layer(d_model: int, num_heads: int, seed: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    mha = MultiHeadAttention(d_model, num_heads)
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(d_model))
    return mha.to(dtype).eval()


def _tp_cases() -> list[Case]:
    dims = {"output": ("batch", "position", "feature")}
    mask5 = torch.ones(5, 5, dtype=torch.bool).tril()
    mha4 = _layer(8, 4, seed=140)
    mha6 = _layer(12, 6, seed=141)
    return [
        Case(
            "rank 0 of 2: heads [0, 1] of 4, d_model = 8",
            (mha4, [0, 1], seeded(2, 3, 8, seed=142)),
            dims=dims,
        ),
        Case(
            "rank 1 of 2: heads [2, 3] of 4, a causal mask",
            (mha4, [2, 3], seeded(2, 5, 8, seed=143)),
            {"mask": mask5},
            dims=dims,
            needs=("mask",),
        ),
        Case(
            "rank 2 of 3: heads [4, 5] of 6, d_model = 12, batch 1",
            (mha6, [4, 5], seeded(1, 4, 12, seed=144)),
            dims=dims,
        ),
        Case(
            "rank 1 of 6: one head, [1], a causal mask",
            (mha6, [1], seeded(2, 5, 12, seed=145)),
            {"mask": mask5},
            dims=dims,
            needs=("mask",),
        ),
        Case(
            "one rank holds every head: [0, 1, 2, 3] (the layer without b_o)",
            (mha4, [0, 1, 2, 3], seeded(1, 3, 8, seed=146)),
            dims=dims,
        ),
        Case(
            "float32, rank 0 of 2: heads [0, 1, 2] of 6",
            (
                _layer(12, 6, seed=147, dtype=torch.float32),
                [0, 1, 2],
                seeded(2, 4, 12, seed=148, dtype=torch.float32),
            ),
            dims=dims,
        ),
    ]


def _tp_expected(case: Case) -> torch.Tensor:
    """Rank ``heads[0] // len(heads)`` of ``num_heads // len(heads)`` (every case's heads are
    a rank's equal, contiguous share)."""
    mha, heads, x = case.args
    n = len(heads)
    share = TensorParallelMultiHeadAttention.from_module(mha, heads[0] // n, mha.num_heads // n)
    return share.partial_forward(x, x, x, case.kwargs.get("mask"))


def _tp_reference(
    mha,
    heads,
    x,
    mask=None,
    *,
    out_bias=False,
    qkv_bias=True,
    local_w_o=False,
    transpose=True,
    width_scale=False,
):
    """Written for teaching (and mutated for the bugs): the features of these heads are
    ``d_head`` columns each of ``W_q``, ``W_k``, ``W_v`` (rows of ``.weight``) and rows of
    ``W_o`` (columns of ``.weight``); ``W_o``'s bias is left to after the sum."""
    B, L, _ = x.shape
    d_head = mha.d_head
    cols = torch.cat([torch.arange(i * d_head, (i + 1) * d_head) for i in heads])

    def project(W):
        out = x @ W.weight[cols].T + (W.bias[cols] if qkv_bias else 0)
        if transpose:
            return out.view(B, L, len(heads), d_head).transpose(1, 2)
        return out.view(B, len(heads), L, d_head)

    q, k, v = project(mha.W_q), project(mha.W_k), project(mha.W_v)
    scale = math.sqrt(len(cols) if width_scale else d_head)
    scores = q @ k.transpose(-2, -1) / scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    H = torch.softmax(scores, dim=-1) @ v
    H = H.transpose(1, 2).reshape(B, L, len(cols))
    rows = torch.arange(len(cols)) if local_w_o else cols
    out = H @ mha.W_o.weight[:, rows].T
    return out + mha.W_o.bias if out_bias else out


def _tp_bias_every_rank(mha, heads, x, mask=None):
    return _tp_reference(mha, heads, x, mask, out_bias=True)


def _tp_no_qkv_bias(mha, heads, x, mask=None):
    return _tp_reference(mha, heads, x, mask, qkv_bias=False)


def _tp_local_w_o(mha, heads, x, mask=None):
    return _tp_reference(mha, heads, x, mask, local_w_o=True)


def _tp_no_transpose(mha, heads, x, mask=None):
    return _tp_reference(mha, heads, x, mask, transpose=False)


def _tp_width_scale(mha, heads, x, mask=None):
    return _tp_reference(mha, heads, x, mask, width_scale=True)


@define(
    title="one rank's partial output of a tensor-parallel attention layer",
    cases=_tp_cases,
    expected=_tp_expected,
    reference=_tp_reference,
    params=("mha", "heads", "x"),
    why="Float32 arithmetic inside is fine for float64 inputs.",
    bugs=[
        Bug(
            "W_o's bias is added on every rank",
            "leave b_o out of the partial output: it is added once, after the sum over the "
            "ranks (the all-reduce), or it would be counted world_size times.",
            _tp_bias_every_rank,
        ),
        Bug(
            "the biases of W_q, W_k, W_v are left out",
            "each rank adds its slices of the projections' biases: x @ W.weight[cols].T + "
            "W.bias[cols].",
            _tp_no_qkv_bias,
        ),
        Bug(
            "W_o's rows of heads 0, 1, ... are used on every rank, not those of the rank's heads",
            "slice W_o with the same global features as W_q, W_k, W_v: W_o.weight[:, cols], "
            "not the first len(cols) columns.",
            _tp_local_w_o,
        ),
        Bug(
            "the projections are split into heads by view(B, h, L, d_head) without a transpose",
            "view as (B, L, h, d_head), then transpose(1, 2): the features of one token are "
            "consecutive, its heads side by side.",
            _tp_no_transpose,
        ),
        Bug(
            "the scores are scaled by sqrt(len(heads) * d_head), the rank's width",
            "each head's scores are scaled by sqrt(d_head), however many heads the rank holds.",
            _tp_width_scale,
        ),
    ],
    chapter="13-heads-across-devices",
)
def tensor_parallel(impl):
    """One rank's share of a Megatron-style tensor-parallel attention layer (chapter 13).

    Contract: ``impl(mha, heads, x, mask=None) -> partial``, with ``mha`` a
    ``mhbook.MultiHeadAttention`` (with biases), ``heads`` the list of the heads this rank
    holds, ``x`` ``(batch, L, d_model)`` (self-attention) and ``partial`` ``(batch, L,
    d_model)`` in ``x``'s dtype: these heads' attention through their slices of ``W_q``,
    ``W_k``, ``W_v`` (columns, with their biases) and of ``W_o`` (rows), without ``W_o``'s
    bias, so that the sum over the ranks plus ``b_o`` is the layer's output. ``mask`` is
    optional: bool ``(L, L)``, ``True`` = may attend. Compared with
    ``mhbook.distributed.tensor_parallel.TensorParallelMultiHeadAttention.partial_forward``.
    """
