"""The grader's own tests for ``mhbook.check.decoding``: tiled attention, the KV cache and
top-p filtering (the other correct implementations, run by ``test_catalogue.py``, and what
is special here)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from grading import assert_named, by_transformers

import mhbook
from mhbook import check


def tiled_normalised(q, k, v, block_size):
    """Another correct tiled attention: the running output kept normalised, with einsum."""
    scale = 1 / math.sqrt(q.size(-1))
    compute = torch.promote_types(q.dtype, torch.float32)
    m = l = o = None
    for start in range(0, k.size(-2), block_size):
        kb, vb = k[..., start : start + block_size, :], v[..., start : start + block_size, :]
        s = torch.einsum("...id,...jd->...ij", q.to(compute), kb.to(compute)) * scale
        m_new = s.amax(-1, keepdim=True) if m is None else torch.maximum(m, s.amax(-1, True))
        p = torch.exp(s - m_new)
        l_new = p.sum(-1, keepdim=True) + (0 if l is None else torch.exp(m - m_new) * l)
        pv = torch.einsum("...ij,...jd->...id", p, vb.to(compute))
        o = pv / l_new if o is None else (torch.exp(m - m_new) * l * o + pv) / l_new
        m, l = m_new, l_new
    return o.to(q.dtype)


def tiled_logsumexp(q, k, v, block_size):
    """Another correct tiled attention: each block's attention and log-sum-exp, merged."""
    outs, lses = [], []
    for start in range(0, k.size(-2), block_size):
        s = q.double() @ k[..., start : start + block_size, :].double().transpose(-2, -1)
        s = s / math.sqrt(q.size(-1))
        outs.append(torch.softmax(s, -1) @ v[..., start : start + block_size, :].double())
        lses.append(torch.logsumexp(s, -1, keepdim=True))
    weights = torch.softmax(torch.stack(lses), dim=0)  # each block's share of the mass
    return (weights * torch.stack(outs)).sum(0).to(q.dtype)


def attend_step_list(q, k, v, cache):
    """Another correct cached step: lists of chunks, PyTorch's attention, mhbook's mask."""
    cache.setdefault("k", []).append(k)
    cache.setdefault("v", []).append(v)
    keys, values = torch.cat(cache["k"], dim=-2), torch.cat(cache["v"], dim=-2)
    mask = mhbook.causal_mask(q.size(-2), keys.size(-2))
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


def attend_step_loop(q, k, v, cache):
    """Another correct cached step: one query at a time, a -1e30 fill, in float64."""
    cache["k"] = torch.cat([cache["k"], k], dim=-2) if "k" in cache else k
    cache["v"] = torch.cat([cache["v"], v], dim=-2) if "v" in cache else v
    T_k, T_q = cache["k"].size(-2), q.size(-2)
    rows = []
    for i in range(T_q):
        s = torch.einsum("bhd,bhjd->bhj", q[:, :, i].double(), cache["k"].double())
        s = s / math.sqrt(q.size(-1))
        s[..., T_k - T_q + i + 1 :] = -1e30
        rows.append(torch.einsum("bhj,bhjd->bhd", torch.softmax(s, -1), cache["v"].double()))
    return torch.stack(rows, dim=2).to(v.dtype)


def top_p_filter(logits, p):
    """The chapter's."""
    probs, order = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)
    before = probs.cumsum(dim=-1) - probs
    keep_sorted = before < p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


@by_transformers
def top_p_transformers(logits, p):
    """transformers' own ``TopPLogitsWarper``, on the rows of logits."""
    from transformers.generation.logits_process import TopPLogitsWarper

    flat = logits.reshape(-1, logits.size(-1))
    return TopPLogitsWarper(p)(None, flat).view_as(logits)


def top_p_loop(logits, p):
    """Another correct top-p: one row at a time, adding tokens until the mass reaches p."""
    rows = logits.reshape(-1, logits.size(-1))
    out = torch.full_like(rows, float("-inf"))
    for r, row in enumerate(rows):
        probs = torch.softmax(row.double(), -1)
        mass = 0.0
        for i in torch.argsort(probs, descending=True).tolist():
            out[r, i] = row[i]
            mass += probs[i].item()
            if mass >= p:
                break
    return out.view_as(logits)


@by_transformers
def attend_step_dynamic_cache(q, k, v, cache):
    """transformers' own ``DynamicCache`` holds the keys and values; the attention as its
    eager attention computes it (softmax in float32, an additive mask)."""
    from transformers import DynamicCache

    store = cache.setdefault("hf", DynamicCache())
    keys, values = store.update(k, v, layer_idx=0)
    T_q, T_k = q.size(-2), keys.size(-2)
    scores = q @ keys.transpose(-2, -1) * q.size(-1) ** -0.5
    future = torch.ones(T_q, T_k, dtype=torch.bool).triu(T_k - T_q + 1)
    scores = scores + torch.zeros_like(scores).masked_fill(future, torch.finfo(q.dtype).min)
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return weights @ values


class StaticStep:
    """A cached step whose cache is a preallocated buffer, as transformers' StaticCache: the
    keys and values it attends to are views of the buffer (the check's cases hold 7 tokens
    at most)."""

    def __call__(self, q, k, v, cache):
        if "k" not in cache:
            B, h, _, d = k.shape
            cache["k"], cache["v"] = k.new_zeros(B, h, 8, d), v.new_zeros(B, h, 8, d)
            cache["length"] = 0
        start, end = cache["length"], cache["length"] + k.size(-2)
        cache["k"][..., start:end, :], cache["v"][..., start:end, :] = k, v
        cache["length"] = end
        mask = mhbook.causal_mask(q.size(-2), end)
        return F.scaled_dot_product_attention(
            q, cache["k"][..., :end, :], cache["v"][..., :end, :], attn_mask=mask
        )


ALTERNATIVES = {
    "tiled_attention": (tiled_normalised, tiled_logsumexp),
    "kv_cache": (attend_step_list, attend_step_loop, attend_step_dynamic_cache, StaticStep()),
    "top_p": (top_p_filter, top_p_loop, top_p_transformers),
}


def test_a_cache_that_attends_to_the_new_chunk_only_is_named():
    """Issue 38: a step that ignores its cache was left unnamed."""

    def no_cache(q, k, v, cache):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def overwritten(q, k, v, cache):
        cache["k"], cache["v"] = k, v
        return F.scaled_dot_product_attention(q, cache["k"], cache["v"], is_causal=True)

    (bug,) = [b for b in check.kv_cache.spec.bugs if "own chunk" in b.name]
    for impl in (no_cache, overwritten):
        assert_named(check.kv_cache, impl, bug)


def test_tiled_attention_with_a_running_maximum_from_zero_is_caught_and_named():
    """Issue 38: no case had every score far below 0."""

    def from_zero(q, k, v, block_size):
        m = torch.zeros(*q.shape[:-1], 1, dtype=torch.float32)
        l = torch.zeros_like(m)
        o = torch.zeros(*q.shape[:-1], v.size(-1), dtype=torch.float32)
        for start in range(0, k.size(-2), block_size):
            s = q.float() @ k[..., start : start + block_size, :].float().transpose(-2, -1)
            s = s / math.sqrt(q.size(-1))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            l = torch.exp(m - m_new) * l + p.sum(-1, keepdim=True)
            o = torch.exp(m - m_new) * o + p @ v[..., start : start + block_size, :].float()
            m = m_new
        return (o / l).to(q.dtype)

    (bug,) = [b for b in check.tiled_attention.spec.bugs if "starts at 0" in b.name]
    assert_named(check.tiled_attention, from_zero, bug)
