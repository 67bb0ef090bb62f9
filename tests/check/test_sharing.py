"""The grader's own tests for ``mhbook.check.sharing``: repeat_kv and grouped-query
attention (the other correct implementations, run by ``test_catalogue.py``)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from grading import by_transformers


def repeat_kv_expand(t, n_rep):
    """The chapter's: a view expanded along a new axis, then merged into the heads."""
    B, g, T, d = t.shape
    return t[:, :, None].expand(B, g, n_rep, T, d).reshape(B, g * n_rep, T, d)


def repeat_kv_index(t, n_rep):
    """Another correct repeat_kv: index_select with head i -> i // n_rep."""
    return t.index_select(1, torch.arange(t.size(1) * n_rep) // n_rep)


def gqa_grouped(q, k, v, mask=None):
    """Another correct GQA: the query heads grouped (B, h_kv, group, T, d), einsum, a mask
    given its group axis, no repetition of k and v."""
    B, h, T, d = q.shape
    h_kv = k.size(1)
    compute = torch.promote_types(q.dtype, torch.float32)
    qg = q.to(compute).view(B, h_kv, h // h_kv, T, d)
    s = torch.einsum("bkgtd,bksd->bkgts", qg, k.to(compute)) / math.sqrt(d)
    if mask is not None:
        s = s.masked_fill(~(mask[:, :, None] if mask.dim() == 4 else mask), float("-inf"))
    out = torch.einsum("bkgts,bksd->bkgtd", torch.softmax(s, -1), v.to(compute))
    return out.reshape(B, h, T, d).to(q.dtype)


def gqa_loop(q, k, v, mask=None):
    """Another correct GQA: a loop over the query heads, in float64, a -1e9 fill."""
    h, h_kv = q.size(1), k.size(1)
    heads = []
    for i in range(h):
        j = i // (h // h_kv)
        s = q[:, i].double() @ k[:, j].double().transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            m = mask.expand(q.size(0), h, q.size(2), k.size(2))[:, i]
            s = s.masked_fill(~m, -1e9)
        heads.append(torch.softmax(s, -1) @ v[:, j].double())
    return torch.stack(heads, 1).to(q.dtype)


def gqa_loop_float32(q, k, v, mask=None):
    """A loop over the query heads in float32 (.float()), cast back."""
    h, h_kv = q.size(1), k.size(1)
    heads = []
    for i in range(h):
        j = i // (h // h_kv)
        s = q[:, i].float() @ k[:, j].float().transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            s = s.masked_fill(~mask.expand(q.size(0), h, q.size(2), k.size(2))[:, i], -1e9)
        heads.append(torch.softmax(s, -1) @ v[:, j].float())
    return torch.stack(heads, 1).to(q.dtype)


@by_transformers
def repeat_kv_transformers(t, n_rep):
    """transformers' own ``repeat_kv``."""
    from transformers.models.llama.modeling_llama import repeat_kv

    return repeat_kv(t, n_rep)


@by_transformers
def gqa_eager(q, k, v, mask=None):
    """transformers' own ``eager_attention_forward`` (``repeat_kv``, softmax in float32),
    with an additive mask of the dtype's minimum."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    module = SimpleNamespace(num_key_value_groups=q.size(1) // k.size(1), training=False)
    additive = None
    if mask is not None:
        additive = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(
            ~mask, torch.finfo(q.dtype).min
        )
    out, _ = eager_attention_forward(module, q, k, v, additive, q.size(-1) ** -0.5)
    return out.transpose(1, 2)


ALTERNATIVES = {
    "repeat_kv": (repeat_kv_expand, repeat_kv_index, repeat_kv_transformers),
    "gqa": (gqa_grouped, gqa_loop, gqa_loop_float32, gqa_eager),
}
