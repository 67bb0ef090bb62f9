"""mhbook.scaled_dot_product_attention and the masks against PyTorch's SDPA:
forward and gradients, float32 and float64."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

import mhbook


def _inputs(batch_shape, num_queries, num_keys, dtype, d=8, dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [
        (*batch_shape, num_queries, d),
        (*batch_shape, num_keys, d),
        (*batch_shape, num_keys, dv),
    ]
    return [torch.randn(s, generator=g, dtype=dtype, requires_grad=True) for s in shapes]


def _grads(output, inputs, seed=1):
    """Gradients of ``(output * upstream).sum()`` w.r.t. ``inputs``, for a random upstream."""
    g = torch.Generator().manual_seed(seed)
    upstream = torch.randn(output.shape, generator=g, dtype=output.dtype)
    return torch.autograd.grad((output * upstream).sum(), inputs)


def _check_against_torch(q, k, v, mask, torch_mask, assert_close):
    """Our forward, weights and gradients against F.scaled_dot_product_attention."""
    output, weights = mhbook.scaled_dot_product_attention(q, k, v, mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=torch_mask)
    assert output.shape == expected.shape
    assert weights.shape == (*q.shape[:-1], k.size(-2))
    assert_close(output, expected, "output")
    for name, ours, theirs in zip("qkv", _grads(output, (q, k, v)), _grads(expected, (q, k, v))):
        assert torch.isfinite(ours).all(), f"non-finite gradient w.r.t. {name}"
        assert_close(ours, theirs, f"gradient w.r.t. {name}")
    return output, weights


@pytest.mark.parametrize("batch_shape", [(3,), (2, 3)], ids=["3-D", "4-D"])
@pytest.mark.parametrize("num_queries,num_keys", [(5, 5), (4, 7)])
def test_no_mask(batch_shape, num_queries, num_keys, dtype, assert_close):
    q, k, v = _inputs(batch_shape, num_queries, num_keys, dtype)
    _check_against_torch(q, k, v, None, None, assert_close)


@pytest.mark.parametrize("num_queries,num_keys", [(5, 5), (4, 7)])
def test_padding_mask_4d(num_queries, num_keys, dtype, assert_close):
    q, k, v = _inputs((3, 2), num_queries, num_keys, dtype)
    mask = mhbook.padding_mask(torch.tensor([num_keys, 2, 1]), num_keys)  # (3, 1, 1, Lk)
    _check_against_torch(q, k, v, mask, mask, assert_close)


def test_padding_mask_3d(dtype, assert_close):
    q, k, v = _inputs((3,), 4, 6, dtype)
    mask = mhbook.padding_mask(torch.tensor([6, 3, 1]), 6)[:, 0]  # (3, 1, Lk)
    _check_against_torch(q, k, v, mask, mask, assert_close)


def test_padding_mask_per_query(dtype, assert_close):
    q, k, v = _inputs((2, 2), 3, 5, dtype)
    mask = mhbook.padding_mask(torch.tensor([[5, 2, 1], [3, 4, 5]]), 5)  # (2, 1, 3, 5)
    _check_against_torch(q, k, v, mask, mask, assert_close)


@pytest.mark.parametrize("num_queries,num_keys", [(5, 5), (4, 7), (1, 6)])
def test_causal_bottom_right(num_queries, num_keys, dtype, assert_close):
    """Our bottom-right causal mask equals PyTorch's ``causal_lower_right``."""
    q, k, v = _inputs((2, 3), num_queries, num_keys, dtype)
    mask = mhbook.causal_mask(num_queries, num_keys)
    _check_against_torch(q, k, v, mask, causal_lower_right(num_queries, num_keys), assert_close)


def test_causal_square_is_is_causal(dtype, assert_close):
    q, k, v = _inputs((2, 3), 5, 5, dtype)
    output, _ = mhbook.scaled_dot_product_attention(q, k, v, mhbook.causal_mask(5))
    assert_close(output, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_causal_and_padding(dtype, assert_close):
    q, k, v = _inputs((2, 3), 4, 6, dtype)
    mask = mhbook.causal_mask(4, 6) & mhbook.padding_mask(torch.tensor([6, 4]), 6)
    _check_against_torch(q, k, v, mask, mask, assert_close)


def test_fully_masked_rows_give_zero_not_nan(dtype, assert_close):
    """A query with no key to attend to: zero weights, zero output, finite gradients."""
    q, k, v = _inputs((3, 2), 3, 5, dtype)
    # batch 1 has no valid key at all; in batch 2 only the middle query has none.
    mask = mhbook.padding_mask(torch.tensor([[5, 5, 5], [0, 0, 0], [2, 0, 4]]), 5)
    output, weights = _check_against_torch(q, k, v, mask, mask, assert_close)
    assert not output.isnan().any() and not weights.isnan().any()
    empty = ~mask.any(dim=-1)  # (3, 1, 3)
    empty = empty.expand(3, 2, 3)
    assert empty.sum() == 2 * (3 + 1)
    assert (weights[empty] == 0).all()
    assert (output[empty] == 0).all()
    output, _ = mhbook.scaled_dot_product_attention(q, k, v, mask)
    grads = torch.autograd.grad(output.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[0][empty] == 0).all()  # an empty row's query gets no gradient


def test_weights_sum_to_one_on_rows_with_keys(dtype):
    q, k, v = _inputs((3, 2), 4, 6, dtype)
    mask = mhbook.causal_mask(4, 6) & mhbook.padding_mask(torch.tensor([6, 3, 0]), 6)
    _, weights = mhbook.scaled_dot_product_attention(q, k, v, mask)
    has_key = mask.expand(3, 2, 4, 6).any(dim=-1)
    sums = weights.sum(dim=-1)
    torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]))
    assert (sums[~has_key] == 0).all()
    assert (weights[~mask.expand_as(weights)] == 0).all()
    assert (weights >= 0).all()


def test_unmasked_weights_sum_to_one(dtype):
    q, k, v = _inputs((4,), 3, 9, dtype)
    _, weights = mhbook.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(weights.sum(-1), torch.ones(4, 3, dtype=dtype))


# -- masks -----------------------------------------------------------------------------
def test_padding_mask_1d_valid_lens():
    mask = mhbook.padding_mask(torch.tensor([3, 0, 5]), 5)
    assert mask.shape == (3, 1, 1, 5) and mask.dtype == torch.bool
    expected = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask[:, 0, 0], expected)


def test_padding_mask_2d_valid_lens():
    mask = mhbook.padding_mask(torch.tensor([[1, 2], [4, 0]]), 4)
    assert mask.shape == (2, 1, 2, 4) and mask.dtype == torch.bool
    expected = torch.tensor([[[1, 0, 0, 0], [1, 1, 0, 0]], [[1, 1, 1, 1], [0, 0, 0, 0]]])
    assert torch.equal(mask[:, 0], expected.bool())


def test_causal_mask_square_is_lower_triangle():
    mask = mhbook.causal_mask(4)
    assert mask.shape == (4, 4) and mask.dtype == torch.bool
    assert torch.equal(mask, torch.ones(4, 4).tril().bool())


@pytest.mark.parametrize("num_queries,num_keys", [(3, 3), (3, 7), (1, 1), (2, 9)])
def test_causal_mask_bottom_right(num_queries, num_keys):
    mask = mhbook.causal_mask(num_queries, num_keys)
    assert mask.shape == (num_queries, num_keys)
    assert mask[-1].all(), "the last query sees every key"
    for i in range(num_queries):  # query i sees keys 0 .. i + Lk - Lq
        assert mask[i].sum() == i + 1 + num_keys - num_queries
    assert torch.equal(mask, causal_lower_right(num_queries, num_keys)._materialize())


def test_causal_mask_one_query_step_sees_everything():
    assert mhbook.causal_mask(1, 6).all()


def test_causal_mask_fewer_keys_than_queries_raises():
    with pytest.raises(ValueError, match=r"num_queries=5, num_keys=3"):
        mhbook.causal_mask(5, 3)


# -- float16 -----------------------------------------------------------------------------
def test_float32_weights_are_exactly_the_formula():
    """Chapter 1 checks ``torch.equal`` against ``softmax(q k^T / sqrt(d))`` written by
    hand: in float32 and float64 the explicit path must round exactly as that does."""
    for dtype in (torch.float32, torch.float64):
        q, k, v = (t.detach() for t in _inputs((2,), 5, 5, dtype, d=3, dv=3))
        output, weights = mhbook.scaled_dot_product_attention(q, k, v)
        by_hand = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(3), dim=-1)
        assert torch.equal(weights, by_hand) and torch.equal(output, by_hand @ v)


def test_float16_large_inputs_stay_finite_and_match_the_fused_kernel():
    """Inputs around 300 give float16 scores far above its largest value (65504) unless
    they are scaled first and computed in float32, as PyTorch's kernel does."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 8, generator=g) * 300 for _ in range(3))
    mask = mhbook.causal_mask(4)
    half = [t.half() for t in (q, k, v)]
    output, weights = mhbook.scaled_dot_product_attention(*half, mask)
    assert output.dtype == weights.dtype == torch.float16
    assert torch.isfinite(output).all() and torch.isfinite(weights).all()
    fused = F.scaled_dot_product_attention(*half, attn_mask=mask)
    torch.testing.assert_close(output.float(), fused.float(), rtol=2e-3, atol=0.5)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    torch.testing.assert_close(output.double(), exact, rtol=2e-3, atol=1.0)


# -- attend: the core of every attention layer ------------------------------------------
def _heads(h, h_kv, num_queries, num_keys, dtype, d=8, dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, h, num_queries, d), (3, h_kv, num_keys, d), (3, h_kv, num_keys, dv)]
    return [torch.randn(s, generator=g, dtype=dtype, requires_grad=True) for s in shapes]


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("h_kv", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "causal+padding"])
def test_attend_matches_torch(h_kv, need_weights, masked, dtype, assert_close):
    """Forward and gradients against F.scaled_dot_product_attention(enable_gqa=True)."""
    q, k, v = _heads(4, h_kv, 4, 6, dtype)
    mask = mhbook.causal_mask(4, 6) & mhbook.padding_mask(torch.tensor([6, 3, 5]), 6)
    mask = mask if masked else None
    output, weights = mhbook.attend(q, k, v, mask, need_weights=need_weights)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert output.shape == (3, 4, 4, 6)
    assert_close(output, expected, "output")
    if need_weights:
        assert weights.shape == (3, 4, 4, 6)
        assert_close(weights @ v.repeat_interleave(4 // h_kv, dim=1), output, "weights @ v")
    else:
        assert weights is None
    for name, ours, theirs in zip("qkv", _grads(output, (q, k, v)), _grads(expected, (q, k, v))):
        assert_close(ours, theirs, f"gradient w.r.t. {name}")


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
def test_attend_query_head_i_uses_key_value_head_i_over_group(need_weights, dtype, assert_close):
    """Grouped-query attention: with h = 6 and h_kv = 2, heads 0-2 read key/value head 0
    and heads 3-5 key/value head 1 (not 0, 1, 0, 1, ...)."""
    q, k, v = _heads(6, 2, 3, 5, dtype)
    output, _ = mhbook.attend(q, k, v, need_weights=need_weights)
    for i in range(6):
        j = i // 3
        one_head = F.scaled_dot_product_attention(q[:, i : i + 1], k[:, j : j + 1], v[:, j : j + 1])
        assert_close(output[:, i : i + 1], one_head, f"query head {i}")


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
def test_attend_fully_masked_rows_give_zero_not_nan(need_weights, dtype):
    q, k, v = _heads(4, 2, 3, 5, dtype)
    mask = mhbook.padding_mask(torch.tensor([[5, 5, 5], [0, 0, 0], [2, 0, 4]]), 5)
    output, weights = mhbook.attend(q, k, v, mask, need_weights=need_weights)
    empty = (~mask.any(dim=-1)).expand(3, 4, 3)
    assert (output[empty] == 0).all() and torch.isfinite(output).all()
    if need_weights:
        assert (weights[empty] == 0).all()
    grads = torch.autograd.grad(output.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[0][empty] == 0).all()


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
def test_attend_dropout_keeps_the_expected_output(need_weights):
    """Dropout zeroes weights and scales the others by 1 / (1 - p): each call differs,
    their mean is the output without dropout."""
    q, k, v = (t.detach() for t in _heads(2, 2, 3, 5, torch.float64))
    plain, _ = mhbook.attend(q, k, v, need_weights=need_weights)
    torch.manual_seed(0)
    n = 4000  # independent dropout draws, as one batch of n copies
    copies = [t.repeat(n, 1, 1, 1) for t in (q, k, v)]
    runs, _ = mhbook.attend(*copies, need_weights=need_weights, dropout_p=0.5)
    runs = runs.view(n, *plain.shape)
    assert not torch.allclose(runs[0], plain)
    torch.testing.assert_close(runs.mean(0), plain, atol=0.08, rtol=0)  # seeded


# -- is_causal: the causal mask without building it ---------------------------------------
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("num_queries,num_keys", [(5, 5), (3, 6), (1, 4)])
@pytest.mark.parametrize("padded", [False, True], ids=["alone", "with-padding"])
def test_attend_is_causal_equals_the_causal_mask(
    num_queries, num_keys, padded, need_weights, dtype, assert_close
):
    """``is_causal=True`` is ``mask & causal_mask(L, S)`` (bottom-right), forward and
    gradients, whether or not the fused kernel can skip building the mask."""
    q, k, v = _heads(4, 2, num_queries, num_keys, dtype)
    padding = mhbook.padding_mask(torch.tensor([num_keys, 1, 2]), num_keys) if padded else None
    causal = mhbook.causal_mask(num_queries, num_keys)
    written = causal if padding is None else padding & causal
    ours, w1 = mhbook.attend(q, k, v, padding, need_weights=need_weights, is_causal=True)
    expected, w2 = mhbook.attend(q, k, v, written, need_weights=need_weights)
    assert_close(ours, expected, "output")
    if need_weights:
        assert_close(w1, w2, "weights")
    for name, a, b in zip("qkv", _grads(ours, (q, k, v)), _grads(expected, (q, k, v))):
        assert_close(a, b, f"gradient w.r.t. {name}")


def test_attend_is_causal_square_is_torchs_is_causal(dtype, assert_close):
    q, k, v = _heads(4, 4, 5, 5, dtype)
    ours, _ = mhbook.attend(q, k, v, is_causal=True)
    assert_close(ours, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_attend_is_causal_needs_as_many_keys_as_queries():
    q, k, v = _heads(2, 2, 4, 3, torch.float32)
    with pytest.raises(ValueError, match="num_keys >= num_queries"):
        mhbook.attend(q, k, v, is_causal=True)


def test_attend_with_padding_and_no_empty_row_is_the_fused_kernel(dtype, assert_close):
    """On the CPU the guard for queries without keys is skipped when there are none;
    the result is then PyTorch's kernel with the mask as it is."""
    q, k, v = _heads(4, 4, 3, 5, dtype)
    mask = mhbook.padding_mask(torch.tensor([5, 1, 3]), 5)
    ours, _ = mhbook.attend(q, k, v, mask)
    assert_close(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


@pytest.mark.parametrize("lens,guarded", [([5, 1, 3], False), ([5, 0, 3], True)])
def test_attend_guards_only_masks_with_an_empty_row_on_the_cpu(monkeypatch, lens, guarded):
    """The kernel gets the mask itself unless a query has no key; then it gets the mask
    with that row opened (and the row's output is zeroed after)."""
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, attn_mask=None, **kwargs):
        seen.append(attn_mask)
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(mhbook.attention.sdpa.F, "scaled_dot_product_attention", spy)
    q, k, v = _heads(4, 4, 3, 5, torch.float32)
    mask = mhbook.padding_mask(torch.tensor(lens), 5)
    output, _ = mhbook.attend(q, k, v, mask)
    assert (seen[0] is not mask) == guarded
    assert torch.isfinite(output).all() and (output[1] == 0).all() == guarded


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding"])
@pytest.mark.parametrize("num_queries", [3, 1], ids=["queries", "decoding-step"])
def test_attend_expands_shared_heads_where_no_kernel_takes_them(monkeypatch, masked, num_queries):
    """Where no fused kernel maps query heads to shared key/value heads (on a GPU in float32,
    or with a mask), attend copies each key/value head for its query heads rather than let
    PyTorch fall back to its math backend, except for one query (a decoding step), whose
    math path stores no L x S scores and reads each shared head once. Same result."""
    q, k, v = _heads(4, 2, num_queries, 5, torch.float64)
    mask = mhbook.padding_mask(torch.tensor([5, 2, 4]), 5) if masked else None
    shared, _ = mhbook.attend(q, k, v, mask)  # the CPU's kernel takes the shared heads
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.append((k.size(1), v.size(1), kwargs.get("enable_gqa", False)))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(mhbook.attention.sdpa.F, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(mhbook.attention.sdpa, "kernel_shares_kv_heads", lambda q, attn_mask: False)
    expanded, _ = mhbook.attend(q, k, v, mask)
    assert seen == ([(4, 4, False)] if num_queries > 1 else [(2, 2, True)])
    torch.testing.assert_close(expanded, shared)


def test_only_the_cpu_kernel_is_known_to_share_heads_in_every_case():
    q = torch.zeros(1, 4, 3, 8)
    assert mhbook.attention.sdpa.kernel_shares_kv_heads(q, None)
    assert mhbook.attention.sdpa.kernel_shares_kv_heads(q, torch.ones(3, 3, dtype=torch.bool))
    assert not mhbook.attention.sdpa.kernel_shares_kv_heads(q.to("meta"), None)
