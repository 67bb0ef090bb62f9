"""The grader's own tests for ``mhbook.check.basics`` (chapters 1-6): the other correct
implementations of each check (``ALTERNATIVES``, run by ``test_catalogue.py``), and what is
special to these checks."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from grading import CORRUPTIONS, assert_named, assert_passes, by_transformers, corrupt
from torch import nn

import mhbook
from mhbook import check

# --- softmax ---------------------------------------------------------------------------------


def softmax_logsumexp(z):
    """exp(z - logsumexp(z))."""
    return torch.exp(z - torch.logsumexp(z, dim=-1, keepdim=True))


def softmax_loop(z):
    """One row at a time, in float64, cast back."""
    rows = z.reshape(-1, z.size(-1)).double()
    out = torch.stack([torch.exp(r - r.max()) / torch.exp(r - r.max()).sum() for r in rows])
    return out.to(z.dtype).view_as(z)


@by_transformers
def softmax_in_float32(z):
    """As Hugging Face's eager attention takes it: in float32, cast back."""
    return F.softmax(z, dim=-1, dtype=torch.float32).to(z.dtype)


# --- attention -------------------------------------------------------------------------------


def attention_einsum(q, k, v, mask=None):
    """einsum, a -1e30 fill and explicit zero rows."""
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
    """The output only, one query at a time."""
    out = []
    for i in range(q.size(-2)):
        s = (q[..., i : i + 1, :].double() @ k.double().transpose(-2, -1)) / math.sqrt(q.size(-1))
        if mask is not None:
            m = mask.expand(*s.shape[:-2], q.size(-2), k.size(-2))[..., i : i + 1, :]
            s = s.masked_fill(~m, float("-inf"))
        w = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out.append(w @ v.double())
    return torch.cat(out, dim=-2).to(v.dtype)


def _additive(mask, dtype):
    """transformers' additive mask: 0 where a key may be seen, the dtype's minimum where not."""
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)


@by_transformers
def attention_eager(q, k, v, mask=None):
    """transformers' own ``eager_attention_forward`` (softmax in float32, an additive mask of
    the dtype's minimum), on (batch, heads, T, d); rows with no key set to zero as the
    contract asks."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q4, k4, v4 = (t.expand(*lead, *t.shape[-2:]).reshape(-1, 1, *t.shape[-2:]) for t in (q, k, v))
    additive = None
    if mask is not None:
        full = mask.expand(*lead, q.size(-2), k.size(-2)).reshape(-1, 1, q.size(-2), k.size(-2))
        additive = _additive(full, q.dtype)
    module = SimpleNamespace(num_key_value_groups=1, training=False)
    out, weights = eager_attention_forward(module, q4, k4, v4, additive, q.size(-1) ** -0.5)
    out, weights = out.transpose(1, 2), weights  # back to (N, 1, T, d)
    if mask is not None:  # (in float64 the dtype's minimum becomes -inf in float32: NaN)
        keep = full.any(dim=-1, keepdim=True)
        out, weights = out.where(keep, 0.0), weights.where(keep, 0.0)
    return out.reshape(*lead, *out.shape[-2:]), weights.reshape(*lead, *weights.shape[-2:])


# --- masked softmax --------------------------------------------------------------------------


def masked_softmax_where(scores, mask):
    """A -1e30 fill in float32 or more, torch.where for the empty rows."""
    work = scores.float() if scores.dtype == torch.float16 else scores
    weights = torch.softmax(work.masked_fill(~mask, -1e30), dim=-1)
    weights = torch.where(mask.any(-1, keepdim=True), weights, torch.zeros_like(weights))
    return weights.to(scores.dtype)


def masked_softmax_by_hand(scores, mask):
    """exp of the shifted scores times the mask, divided by its sum (0 / 0 avoided with
    clamp_min)."""
    shifted = scores.double() - scores.double().max(dim=-1, keepdim=True).values
    e = torch.exp(shifted) * mask
    return (e / e.sum(dim=-1, keepdim=True).clamp_min(1e-300)).to(scores.dtype)


@by_transformers
def masked_softmax_additive(scores, mask):
    """As transformers masks: add the dtype's minimum to the masked scores, softmax in
    float32; the empty rows zeroed."""
    weights = F.softmax(scores + _additive(mask, scores.dtype), dim=-1, dtype=torch.float32)
    return weights.where(mask.any(-1, keepdim=True), 0.0).to(scores.dtype)


# --- masks -----------------------------------------------------------------------------------


def padding_mask_loop(valid_lens, num_keys):
    """One row at a time."""
    rows = [torch.tensor([j < int(n) for j in range(num_keys)]) for n in valid_lens]
    return torch.stack(rows).view(len(rows), 1, 1, num_keys)


def padding_mask_sequence(valid_lens, num_keys):
    """Ones, then zero the padding, as Dive into Deep Learning."""
    mask = torch.arange(num_keys)[None, :].expand(len(valid_lens), -1) >= valid_lens[:, None]
    return (~mask).unsqueeze(1).unsqueeze(1)


@by_transformers
def padding_mask_transformers(valid_lens, num_keys):
    """transformers' own ``padding_mask_function`` of the 2-D attention mask, evaluated for
    every sentence and key."""
    from transformers.masking_utils import padding_mask_function

    attention_mask = torch.arange(num_keys) < valid_lens[:, None]
    batch, keys = torch.arange(len(valid_lens))[:, None], torch.arange(num_keys)[None, :]
    return padding_mask_function(attention_mask)(batch, 0, 0, keys)[:, None, None, :]


def causal_mask_compare(num_queries, num_keys):
    """Compare the positions."""
    i = torch.arange(num_queries)[:, None] + (num_keys - num_queries)
    return torch.arange(num_keys)[None, :] <= i


def causal_mask_triu(num_queries, num_keys):
    """The complement of the future."""
    return ~torch.ones(num_queries, num_keys, dtype=torch.bool).triu(num_keys - num_queries + 1)


@by_transformers
def causal_mask_transformers(num_queries, num_keys):
    """transformers' ``causal_mask_function`` with the queries after the cached keys."""
    from transformers.masking_utils import causal_mask_function

    q_idx = torch.arange(num_queries)[:, None] + (num_keys - num_queries)
    return causal_mask_function(0, 0, q_idx, torch.arange(num_keys)[None, :])


# --- splitting and merging heads ------------------------------------------------------------


def split_einops_like(x, num_heads):
    """unflatten and permute."""
    return x.unflatten(-1, (num_heads, x.size(-1) // num_heads)).permute(0, 2, 1, 3)


def split_by_chunks(x, num_heads):
    """One chunk of features per head, stacked."""
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)


@by_transformers
def split_as_llama(x, num_heads):
    """As transformers' Llama writes it: view(*input_shape, -1, head_dim).transpose(1, 2)."""
    input_shape = x.shape[:-1]
    head_dim = x.size(-1) // num_heads
    return x.view(*input_shape, -1, head_dim).transpose(1, 2)


def merge_by_cat(x):
    """The heads concatenated along the features."""
    return torch.cat(x.unbind(dim=1), dim=-1)


def merge_with_heads(x, num_heads):
    """Takes num_heads: permute and flatten."""
    assert x.size(1) == num_heads
    return x.permute(0, 2, 1, 3).flatten(2)


@by_transformers
def merge_as_llama(x):
    """As transformers' Llama writes it: transpose(1, 2).contiguous(), reshape(*input_shape,
    -1)."""
    input_shape = (x.size(0), x.size(2))
    return x.transpose(1, 2).contiguous().reshape(*input_shape, -1).contiguous()


# --- multi-head attention --------------------------------------------------------------------


class HandMultiHead(nn.Module):
    """A class: a loop over the heads with einsum and a -1e9 fill; returns the output and the
    per-head weights."""

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
    """A function of the module: PyTorch's fused attention on (B, h, L, d_head), the output
    only."""
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


@by_transformers
def multihead_eager(m, X_q, X_kv, mask):
    """Projections as transformers' Llama writes them (view(hidden_shape).transpose(1, 2)),
    its ``eager_attention_forward`` with an additive mask, the output projection."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    def heads(layer, x):
        return layer(x).view(*x.shape[:-1], -1, m.d_head).transpose(1, 2)

    q, k, v = heads(m.W_q, X_q), heads(m.W_k, X_kv), heads(m.W_v, X_kv)
    module = SimpleNamespace(num_key_value_groups=1, training=False)
    out, weights = eager_attention_forward(
        module, q, k, v, _additive(mask, q.dtype), m.d_head**-0.5
    )
    return m.W_o(out.reshape(*X_q.shape[:-1], -1).contiguous()), weights


# --- one attention head ----------------------------------------------------------------------


class HeadWithBias(nn.Module):
    """einsum, the output only, biases (set to zero)."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        self.W_q, self.W_k = nn.Linear(d_in, d_k), nn.Linear(d_in, d_k)
        self.W_v = nn.Linear(d_in, d_v)

    def forward(self, x):
        q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)
        w = torch.softmax(torch.einsum("...id,...jd->...ij", q, k) * q.size(-1) ** -0.5, dim=-1)
        return torch.einsum("...ij,...jd->...id", w, v)


class HeadWithSdpa(nn.Module):
    """PyTorch's fused attention, the weights from softmax."""

    def __init__(self, d_in, d_k, d_v):
        super().__init__()
        self.W_q = nn.Linear(d_in, d_k, bias=False)
        self.W_k = nn.Linear(d_in, d_k, bias=False)
        self.W_v = nn.Linear(d_in, d_v, bias=False)

    def forward(self, x):
        q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.size(-1)), dim=-1)
        return F.scaled_dot_product_attention(q, k, v), w


@by_transformers
class HeadEager(HeadWithSdpa):
    """transformers' ``eager_attention_forward`` on one head (softmax in float32)."""

    def forward(self, x):
        from transformers.models.llama.modeling_llama import eager_attention_forward

        lead, T = x.shape[:-2], x.size(-2)
        q, k, v = (layer(x).reshape(-1, 1, T, layer.out_features) for layer in self.projections())
        module = SimpleNamespace(num_key_value_groups=1, training=False)
        out, w = eager_attention_forward(module, q, k, v, None, q.size(-1) ** -0.5)
        return out.reshape(*lead, T, -1), w.reshape(*lead, T, T)

    def projections(self):
        return self.W_q, self.W_k, self.W_v


# --- layer norm ------------------------------------------------------------------------------


def layer_norm_torch_var(x, eps=1e-5):
    """torch.var_mean and rsqrt."""
    var, mu = torch.var_mean(x, dim=-1, unbiased=False, keepdim=True)
    return (x - mu) * torch.rsqrt(var + eps)


def layer_norm_module(x):
    """nn.LayerNorm without its affine parameters (no eps argument: checked with the default
    only)."""
    return nn.LayerNorm(x.size(-1), elementwise_affine=False).to(x.dtype)(x)


@by_transformers
def layer_norm_deberta(x, eps=1e-5):
    """transformers' own ``DebertaLayerNorm`` (in float32 inside, its gain 1 and shift 0)."""
    from transformers.models.deberta.modeling_deberta import DebertaLayerNorm

    return DebertaLayerNorm(x.size(-1), eps=eps).to(x.dtype)(x)


ALTERNATIVES = {
    "softmax": (softmax_logsumexp, softmax_loop, softmax_in_float32),
    "attention": (attention_einsum, attention_loop, attention_eager),
    "masked_softmax": (masked_softmax_where, masked_softmax_by_hand, masked_softmax_additive),
    "padding_mask": (
        padding_mask_loop,
        padding_mask_sequence,
        mhbook.padding_mask,
        padding_mask_transformers,
    ),
    "causal_mask": (
        causal_mask_compare,
        causal_mask_triu,
        mhbook.causal_mask,
        causal_mask_transformers,
    ),
    "split_heads": (split_einops_like, split_by_chunks, split_as_llama),
    "merge_heads": (merge_by_cat, merge_with_heads, merge_as_llama),
    "multihead": (
        mhbook.MultiHeadAttention,
        HandMultiHead,
        multihead_with_sdpa,
        multi_head_by_the_formula,
        multihead_eager,
    ),
    "attention_head": (HeadWithBias, HeadWithSdpa, HeadEager),
    "layer_norm": (layer_norm_torch_var, layer_norm_module, layer_norm_deberta),
}


# --- what is special to these checks ---------------------------------------------------------


def test_a_function_without_mask_skips_the_masked_cases_and_says_so():
    def no_mask(q, k, v):
        return check.attention.spec.reference(q, k, v)

    result = check.attention(no_mask)
    assert result and "Skipped" in result.report() and "takes no mask" in result.report()


def test_an_error_in_the_readers_code_is_reported_not_raised():
    def broken(q, k, v, mask=None):
        return q @ k  # the wrong product: a shape error for most cases

    result = check.attention(broken)
    assert not result and "raised RuntimeError" in result.report()


def test_multihead_rejects_nan_shape_and_dtype_from_a_class():
    for how, word in {"nan": "NaN", "shape": "wrong shape", "dtype": "wrong dtype"}.items():

        class Corrupted(mhbook.MultiHeadAttention):
            change = staticmethod(CORRUPTIONS[how])

            def forward(self, query, key, value, mask):
                out, _ = super().forward(query, key, value, mask)
                return self.change(out)

        result = check.multihead(Corrupted)
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


def test_a_mask_of_the_wrong_dtype_is_named_even_as_floats():
    result = check.padding_mask(corrupt(check.padding_mask.spec.reference, "dtype"))
    assert not result and "wrong dtype" in result.report()


# --- names right or absent (issue 38) --------------------------------------------------------


def test_softmax_with_the_row_mean_subtracted_is_not_called_the_smallest_score():
    def softmax_mean(z):
        e = torch.exp(z - z.mean(dim=-1, keepdim=True))
        return e / e.sum(dim=-1, keepdim=True)

    bugs = {b.name: b for b in check.softmax.spec.bugs}
    assert_named(
        check.softmax, softmax_mean, bugs["each row's mean subtracted instead of its largest score"]
    )


def test_softmax_with_one_global_maximum_is_caught_and_named():
    def softmax_global(z):
        e = torch.exp(z - z.max())
        return e / e.sum(dim=-1, keepdim=True)

    (bug,) = [b for b in check.softmax.spec.bugs if "whole tensor" in b.name]
    assert_named(check.softmax, softmax_global, bug)


@pytest.mark.parametrize("way", ["mean and var", "F.layer_norm of the transpose"])
def test_layer_norm_over_one_sequences_tokens_is_the_wrong_axis(way):
    def over_tokens(x, eps=1e-5):
        if way == "mean and var":
            mu = x.mean(-2, keepdim=True)
            return (x - mu) / (x.var(-2, unbiased=False, keepdim=True) + eps).sqrt()
        t = x.transpose(-2, -1)
        return F.layer_norm(t, (t.size(-1),), eps=eps).transpose(-2, -1)

    (bug,) = [b for b in check.layer_norm.spec.bugs if "dim=-2" in b.name]
    assert_named(check.layer_norm, over_tokens, bug)
