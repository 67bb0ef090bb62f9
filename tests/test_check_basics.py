"""The grader's own tests for ``mhbook.check.basics``: the checks of chapters 1-6."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from grading import (
    CORRUPTIONS,
    assert_passes,
    assert_rejects_corruptions,
    corrupt,
)
from torch import nn

import mhbook
from mhbook import check


def softmax_logsumexp(z):
    """Another correct softmax: exp(z - logsumexp(z))."""
    return torch.exp(z - torch.logsumexp(z, dim=-1, keepdim=True))


def softmax_loop(z):
    """Another correct softmax: one row at a time, in float64, cast back."""
    rows = z.reshape(-1, z.size(-1)).double()
    out = torch.stack([torch.exp(r - r.max()) / torch.exp(r - r.max()).sum() for r in rows])
    return out.to(z.dtype).view_as(z)


def attention_einsum(q, k, v, mask=None):
    """Another correct attention: einsum, a -1e30 fill and explicit zero rows."""
    scores = torch.einsum(
        "...id,...jd->...ij",
        q.float() if q.dtype == torch.float16 else q,
        k.to(torch.promote_types(k.dtype, torch.float32)),
    ) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e30)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * mask.any(dim=-1, keepdim=True)
    weights = weights.to(v.dtype)
    return torch.einsum("...ij,...jd->...id", weights, v), weights


def attention_loop(q, k, v, mask=None):
    """Another correct attention: the output only, one query at a time."""
    out = []
    for i in range(q.size(-2)):
        s = (q[..., i : i + 1, :].double() @ k.double().transpose(-2, -1)) / math.sqrt(q.size(-1))
        if mask is not None:
            m = mask.expand(*s.shape[:-2], q.size(-2), k.size(-2))[..., i : i + 1, :]
            s = s.masked_fill(~m, float("-inf"))
        w = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out.append(w @ v.double())
    return torch.cat(out, dim=-2).to(v.dtype)


def test_softmax_references_and_other_implementations_pass():
    for impl in (check.softmax.spec.reference, softmax_logsumexp, softmax_loop):
        assert_passes(check.softmax, impl)


def test_attention_references_and_other_implementations_pass():
    for impl in (check.attention.spec.reference, attention_einsum, attention_loop):
        assert_passes(check.attention, impl)


def test_nan_wrong_shape_and_dtype_never_pass():
    assert_rejects_corruptions(check.softmax)
    assert_rejects_corruptions(check.attention)


def test_a_function_without_mask_skips_the_masked_cases_and_says_so():
    def no_mask(q, k, v):
        return check.attention.spec.reference(q, k, v)

    result = check.attention(no_mask)
    assert result and "Skipped" in result.report() and "takes no mask" in result.report()


def test_an_empty_stub_says_what_to_write():
    def attention(q, k, v, mask=None):
        """Your attention."""
        ...

    result = check.attention(attention)
    assert not result
    assert "not written yet" in result.report() and "Contract:" in result.report()


def test_an_error_in_the_readers_code_is_reported_not_raised():
    def broken(q, k, v, mask=None):
        return q @ k  # the wrong product: a shape error for most cases

    result = check.attention(broken)
    assert not result and "raised RuntimeError" in result.report()


# --- masked softmax, masks, heads, multi-head attention, one head, layer norm ----------


def masked_softmax_where(scores, mask):
    """Another correct masked softmax: a -1e30 fill in float32 or more, torch.where for the
    empty rows."""
    work = scores.float() if scores.dtype == torch.float16 else scores
    weights = torch.softmax(work.masked_fill(~mask, -1e30), dim=-1)
    weights = torch.where(mask.any(-1, keepdim=True), weights, torch.zeros_like(weights))
    return weights.to(scores.dtype)


def masked_softmax_by_hand(scores, mask):
    """Another correct masked softmax: exp of the shifted scores times the mask, divided by
    its sum (0 / 0 avoided with clamp_min)."""
    shifted = scores.double() - scores.double().max(dim=-1, keepdim=True).values
    e = torch.exp(shifted) * mask
    return (e / e.sum(dim=-1, keepdim=True).clamp_min(1e-300)).to(scores.dtype)


def padding_mask_loop(valid_lens, num_keys):
    """Another correct padding mask: one row at a time."""
    rows = [torch.tensor([j < int(n) for j in range(num_keys)]) for n in valid_lens]
    return torch.stack(rows).view(len(rows), 1, 1, num_keys)


def padding_mask_sequence(valid_lens, num_keys):
    """Another correct padding mask: ones, then zero the padding, as Dive into Deep Learning."""
    mask = torch.arange(num_keys)[None, :].expand(len(valid_lens), -1) >= valid_lens[:, None]
    return (~mask).unsqueeze(1).unsqueeze(1)


def causal_mask_compare(num_queries, num_keys):
    """Another correct causal mask: compare the positions."""
    i = torch.arange(num_queries)[:, None] + (num_keys - num_queries)
    return torch.arange(num_keys)[None, :] <= i


def causal_mask_triu(num_queries, num_keys):
    """Another correct causal mask: the complement of the future."""
    return ~torch.ones(num_queries, num_keys, dtype=torch.bool).triu(num_keys - num_queries + 1)


def split_einops_like(x, num_heads):
    """Another correct split: unflatten and permute."""
    return x.unflatten(-1, (num_heads, x.size(-1) // num_heads)).permute(0, 2, 1, 3)


def split_by_chunks(x, num_heads):
    """Another correct split: one chunk of features per head, stacked."""
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)


def merge_by_cat(x):
    """Another correct merge: the heads concatenated along the features."""
    return torch.cat(x.unbind(dim=1), dim=-1)


def merge_with_heads(x, num_heads):
    """Another correct merge that takes num_heads: permute and flatten."""
    assert x.size(1) == num_heads
    return x.permute(0, 2, 1, 3).flatten(2)


class HandMultiHead(nn.Module):
    """Another correct multi-head attention, as a class: a loop over the heads with einsum and
    a -1e9 fill; returns the output and the per-head weights."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_head = num_heads, d_model // num_heads
        self.W_q, self.W_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.W_v, self.W_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        q, k, v = self.W_q(query), self.W_k(key), self.W_v(value)
        outs, weights = [], []
        for i in range(self.h):
            cols = slice(i * self.d_head, (i + 1) * self.d_head)
            s = torch.einsum("bqd,bkd->bqk", q[..., cols], k[..., cols]) / math.sqrt(self.d_head)
            if mask is not None:
                s = s.masked_fill(~mask[:, 0], -1e9)
            w = torch.softmax(s, dim=-1)
            outs.append(w @ v[..., cols])
            weights.append(w)
        return self.W_o(torch.cat(outs, dim=-1)), torch.stack(weights, dim=1)


def multihead_with_sdpa(m, X_q, X_kv, mask):
    """Another correct multi-head attention, as a function of the module: PyTorch's fused
    attention on (B, h, L, d_head), the output only."""
    q, k, v = (m.split_heads(layer(x)) for layer, x in ((m.W_q, X_q), (m.W_k, X_kv), (m.W_v, X_kv)))
    return m.W_o(m.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))


def multi_head_by_the_formula(m, X_q, X_k, X_v, mask):
    """Chapter 4's five-argument form: one head at a time."""
    heads = []
    for i in range(m.num_heads):
        rows = slice(i * m.d_head, (i + 1) * m.d_head)
        q = X_q @ m.W_q.weight[rows].T + m.W_q.bias[rows]
        k = X_k @ m.W_k.weight[rows].T + m.W_k.bias[rows]
        v = X_v @ m.W_v.weight[rows].T + m.W_v.bias[rows]
        heads.append(mhbook.scaled_dot_product_attention(q, k, v, mask[:, 0])[0])
    return torch.cat(heads, dim=-1) @ m.W_o.weight.T + m.W_o.bias


class HeadWithBias(nn.Module):
    """Another correct attention head: einsum, the output only, biases (set to zero)."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        self.W_q, self.W_k = nn.Linear(d_in, d_k), nn.Linear(d_in, d_k)
        self.W_v = nn.Linear(d_in, d_v)

    def forward(self, x):
        q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)
        w = torch.softmax(torch.einsum("...id,...jd->...ij", q, k) * q.size(-1) ** -0.5, dim=-1)
        return torch.einsum("...ij,...jd->...id", w, v)


def head_with_sdpa():
    class Head(nn.Module):
        """Another correct attention head: PyTorch's fused attention, weights from softmax."""

        def __init__(self, d_in, d_k, d_v):
            super().__init__()
            self.W_q = nn.Linear(d_in, d_k, bias=False)
            self.W_k = nn.Linear(d_in, d_k, bias=False)
            self.W_v = nn.Linear(d_in, d_v, bias=False)

        def forward(self, x):
            q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)
            w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.size(-1)), dim=-1)
            return F.scaled_dot_product_attention(q, k, v), w

    return Head


def layer_norm_torch_var(x, eps=1e-5):
    """Another correct layer norm: torch.var_mean and rsqrt."""
    var, mu = torch.var_mean(x, dim=-1, unbiased=False, keepdim=True)
    return (x - mu) * torch.rsqrt(var + eps)


def layer_norm_module(x):
    """Another correct layer norm: nn.LayerNorm without its affine parameters (no eps
    argument: checked with the default only)."""
    return nn.LayerNorm(x.size(-1), elementwise_affine=False).to(x.dtype)(x)


OTHER_WAYS = {
    "masked_softmax": (masked_softmax_where, masked_softmax_by_hand),
    "padding_mask": (padding_mask_loop, padding_mask_sequence, mhbook.padding_mask),
    "causal_mask": (causal_mask_compare, causal_mask_triu, mhbook.causal_mask),
    "split_heads": (split_einops_like, split_by_chunks),
    "merge_heads": (merge_by_cat, merge_with_heads),
    "multihead": (
        mhbook.MultiHeadAttention,
        HandMultiHead,
        multihead_with_sdpa,
        multi_head_by_the_formula,
    ),
    "attention_head": (HeadWithBias, head_with_sdpa()),
    "layer_norm": (layer_norm_torch_var, layer_norm_module),
}


@pytest.mark.parametrize("name", list(OTHER_WAYS))
def test_the_reference_and_other_correct_implementations_pass(name):
    checker = check.CHECKS[name]
    for impl in (checker.spec.reference, *OTHER_WAYS[name]):
        assert_passes(checker, impl)


@pytest.mark.parametrize("name", ["masked_softmax", "split_heads", "merge_heads", "layer_norm"])
def test_nan_shape_and_dtype_never_pass(name):
    assert_rejects_corruptions(check.CHECKS[name])


@pytest.mark.parametrize("name", ["padding_mask", "causal_mask"])
def test_a_mask_of_the_wrong_shape_or_dtype_never_passes(name):
    checker = check.CHECKS[name]
    for how, word in (("shape", "wrong shape"), ("dtype", "wrong dtype")):
        result = checker(corrupt(checker.spec.reference, how))
        assert not result and word in result.report(), result.report()


def test_multihead_rejects_nan_shape_and_dtype_from_a_function_and_a_class():
    assert_rejects_corruptions(check.multihead)
    words = {"nan": "NaN", "shape": "wrong shape", "dtype": "wrong dtype"}
    for how, word in words.items():

        class Corrupted(mhbook.MultiHeadAttention):
            change = staticmethod(CORRUPTIONS[how])

            def forward(self, query, key, value, mask):
                out, _ = super().forward(query, key, value, mask)
                return self.change(out)

        result = check.multihead(Corrupted)
        assert not result and word in result.report(), result.report()


def test_attention_head_rejects_nan_shape_and_dtype():
    reference = check.attention_head.spec.reference
    for how, word in {"nan": "NaN", "shape": "wrong shape", "dtype": "wrong dtype"}.items():

        class Corrupted(reference):
            change = staticmethod(CORRUPTIONS[how])

            def forward(self, x):
                out, weights = super().forward(x)
                return self.change(out), weights

        result = check.attention_head(Corrupted)
        assert not result and word in result.report(), result.report()


def test_the_chapters_multi_head_functions_pass():
    """Chapter 4's view and einsum layouts, taking the module m, pass as they are written."""

    def multi_head_view(m, X_q, X_kv, mask):
        B, Lq, d = X_q.shape
        Lk, h = X_kv.size(1), m.num_heads
        q = m.W_q(X_q).view(B, Lq, h, d // h).transpose(1, 2)
        k = m.W_k(X_kv).view(B, Lk, h, d // h).transpose(1, 2)
        v = m.W_v(X_kv).view(B, Lk, h, d // h).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return m.W_o((weights @ v).transpose(1, 2).reshape(B, Lq, d))

    def multi_head_einsum(m, X_q, X_kv, mask):
        h = m.num_heads
        q = m.W_q(X_q).unflatten(-1, (h, -1))
        k = m.W_k(X_kv).unflatten(-1, (h, -1))
        v = m.W_v(X_kv).unflatten(-1, (h, -1))
        scores = torch.einsum("nihd,njhd->nijh", q, k) / math.sqrt(q.size(-1))
        keep = mask.permute(0, 2, 3, 1)
        weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=2)
        return m.W_o(torch.einsum("nijh,njhd->nihd", weights, v).flatten(2))

    for fn in (multi_head_view, multi_head_einsum):
        assert_passes(check.multihead, fn)


def test_a_module_without_the_books_names_or_biases_is_told_what_to_name():
    class Unnamed(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            self.mha = nn.MultiheadAttention(d_model, num_heads, batch_first=True)

        def forward(self, query, key, value, mask=None):
            return self.mha(query, key, value, attn_mask=None)

    report = check.multihead(Unnamed).report()
    assert "has no W_q" in report

    class NoBias(HandMultiHead):
        def __init__(self, d_model, num_heads):
            super().__init__(d_model, num_heads)
            self.W_q = nn.Linear(d_model, d_model, bias=False)

    assert "has no bias" in check.multihead(NoBias).report()


def test_a_stub_class_and_a_stub_function_say_not_written_yet():
    class AttentionHead(nn.Module):
        def __init__(self, d_in, d_k, d_v):
            super().__init__()
            self.W_q = nn.Linear(d_in, d_k, bias=False)
            self.W_k = nn.Linear(d_in, d_k, bias=False)
            self.W_v = nn.Linear(d_in, d_v, bias=False)

        def forward(self, x):
            """Your head."""
            ...

    def multi_head_view(m, X_q, X_kv, mask):
        """Your multi-head attention."""
        ...

    for checker, stub in (
        (check.attention_head, AttentionHead),
        (check.multihead, multi_head_view),
    ):
        result = checker(stub)
        assert not result and "not written yet" in result.report()


def test_layer_norm_without_eps_skips_the_eps_case_and_says_so():
    result = check.layer_norm(layer_norm_module)
    assert result and "takes no eps" in result.report()
