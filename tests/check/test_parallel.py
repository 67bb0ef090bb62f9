"""The grader's own tests for ``mhbook.check.parallel``: one rank's partial output (the
other correct implementations, run by ``test_catalogue.py``, and what is special here)."""

from __future__ import annotations

import torch

import mhbook
from mhbook import check


def partial_output(mha, heads, x, mask=None):
    """The chapter's."""
    batch, length, _ = x.shape
    d_head = mha.d_head
    cols = torch.cat([torch.arange(i * d_head, (i + 1) * d_head, device=x.device) for i in heads])

    def project(W):
        out = x @ W.weight[cols].T + W.bias[cols]
        return out.view(batch, length, len(heads), d_head).transpose(1, 2)

    q, k, v = project(mha.W_q), project(mha.W_k), project(mha.W_v)
    H, _ = mhbook.scaled_dot_product_attention(q, k, v, mask)
    H = H.transpose(1, 2).reshape(batch, length, len(heads) * d_head)
    return H @ mha.W_o.weight[:, cols].T


def partial_by_loop(mha, heads, x, mask=None):
    """Another correct partial output: one head at a time with torch's attention, each
    head's output through its d_head rows of W_o, summed."""
    d = mha.d_head
    out = torch.zeros_like(x)
    for i in heads:
        rows = slice(i * d, (i + 1) * d)
        q, k, v = (
            torch.nn.functional.linear(x, W.weight[rows], W.bias[rows])
            for W in (mha.W_q, mha.W_k, mha.W_v)
        )
        head = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out + head @ mha.W_o.weight[:, rows].T
    return out


def partial_by_subtraction(mha, heads, x, mask=None):
    """Another correct partial output: the whole layer minus the other heads' share."""
    others = [i for i in range(mha.num_heads) if i not in heads]
    whole = mha(x, x, x, mask)[0] - mha.W_o.bias
    return whole - (partial_output(mha, others, x, mask) if others else 0)


ALTERNATIVES = {"tensor_parallel": (partial_output, partial_by_loop, partial_by_subtraction)}


def test_the_expected_partials_sum_to_the_layer():
    spec = check.tensor_parallel.spec
    for case in spec.cases():
        mha, heads, x = case.args
        if len(heads) == mha.num_heads or mha.num_heads % len(heads):
            continue
        mask = case.kwargs.get("mask")
        ranks = [list(range(r, r + len(heads))) for r in range(0, mha.num_heads, len(heads))]
        total = sum(spec.expected(type(case)("", (mha, r, x), case.kwargs)) for r in ranks)
        torch.testing.assert_close(total + mha.W_o.bias, mha(x, x, x, mask)[0])
