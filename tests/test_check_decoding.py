"""The grader's own tests for ``mhbook.check.decoding``: tiled attention, the KV cache and
top-p filtering."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from grading import assert_passes, assert_rejects_corruptions

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


def test_references_and_other_implementations_pass():
    for impl in (check.tiled_attention.spec.reference, tiled_normalised, tiled_logsumexp):
        assert_passes(check.tiled_attention, impl)
    for impl in (check.kv_cache.spec.reference, attend_step_list, attend_step_loop):
        assert_passes(check.kv_cache, impl)
    for impl in (check.top_p.spec.reference, top_p_filter, top_p_loop):
        assert_passes(check.top_p, impl)


def test_nan_wrong_shape_and_dtype_never_pass():
    for fn in (check.tiled_attention, check.kv_cache, check.top_p):
        assert_rejects_corruptions(fn)


def test_a_cache_that_forgets_is_not_a_false_pass():
    def no_cache(q, k, v, cache):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    result = check.kv_cache(no_cache)
    assert not result and "Smallest failing case" in result.report()
