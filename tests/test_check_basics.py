"""The grader's own tests for ``mhbook.check.basics``: the softmax and attention checks."""

from __future__ import annotations

import math

import torch
from grading import assert_every_bug_named, assert_passes, assert_rejects_corruptions

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


def test_every_bug_is_caught_and_named():
    assert_every_bug_named(check.softmax)
    assert_every_bug_named(check.attention)


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
