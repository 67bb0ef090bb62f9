"""mhbook.MultiHeadAttention against nn.MultiheadAttention(batch_first=True):
weights copied both ways, forward, per-head weights and gradients; the fused and the
explicit paths; head_mask."""

from __future__ import annotations

import pytest
import torch
from helpers import randn as _randn
from helpers import upstream as _upstream
from torch import nn

import mhbook

D_MODEL, NUM_HEADS = 16, 4


def _torch_mha(dtype, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.MultiheadAttention(D_MODEL, NUM_HEADS, bias=bias, batch_first=True, dtype=dtype)


def _inputs(kind, dtype):
    """``(query, key, value)``: one tensor three times, or different tensors with Lq != Lk."""
    if kind == "self":
        x = _randn(3, 5, D_MODEL, dtype=dtype, seed=1)
        return x, x, x
    query = _randn(3, 4, D_MODEL, dtype=dtype, seed=1)
    # Different keys and values, so that swapping W_k and W_v would show.
    return (
        query,
        _randn(3, 7, D_MODEL, dtype=dtype, seed=2),
        _randn(3, 7, D_MODEL, dtype=dtype, seed=3),
    )


def test_from_torch_copies_every_weight(dtype, torch_layout):
    theirs = _torch_mha(dtype)
    ours = mhbook.MultiHeadAttention.from_torch(theirs)
    assert all(p.dtype == dtype for p in ours.parameters())
    mine = torch_layout(dict(ours.named_parameters()))
    reference = dict(theirs.named_parameters())
    assert mine.keys() == reference.keys()
    for name, p in reference.items():
        assert torch.equal(mine[name], p), name


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("kind", ["self", "cross"])
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding"])
def test_matches_torch_forward_weights_and_grads(
    kind, bias, masked, dtype, assert_close, assert_same_grads
):
    theirs = _torch_mha(dtype, bias)
    ours = mhbook.MultiHeadAttention.from_torch(theirs)
    query, key, value = _inputs(kind, dtype)
    num_keys = key.size(1)
    mask = mhbook.padding_mask(torch.tensor([num_keys, 2, 1]), num_keys) if masked else None
    key_padding_mask = None if mask is None else ~mask[:, 0, 0]  # (batch, Lk), True = ignore

    out, weights = ours(query, key, value, mask, need_weights=True)
    expected, expected_weights = theirs(
        query, key, value, key_padding_mask=key_padding_mask, average_attn_weights=False
    )
    assert weights.shape == (3, NUM_HEADS, query.size(1), num_keys)
    assert_close(out, expected, "output")
    assert_close(weights, expected_weights, "per-head weights")

    g = _upstream(out)
    inputs = tuple({id(t): t for t in (query, key, value)}.values())
    ours_grads = torch.autograd.grad((out * g).sum(), inputs + tuple(ours.parameters()))
    for p, grad in zip(ours.parameters(), ours_grads[len(inputs) :]):
        p.grad = grad
    theirs_grads = torch.autograd.grad((expected * g).sum(), inputs, retain_graph=True)
    (expected * g).sum().backward()
    for a, b in zip(ours_grads[: len(inputs)], theirs_grads):
        assert_close(a, b, "input gradient")
    assert_same_grads(ours, theirs)


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_matches_torch_fused_path(kind, dtype, assert_close):
    """``need_weights=False`` on both sides (PyTorch runs SDPA then, and so do we)."""
    theirs = _torch_mha(dtype)
    ours = mhbook.MultiHeadAttention.from_torch(theirs)
    query, key, value = _inputs(kind, dtype)
    mask = mhbook.padding_mask(torch.tensor([key.size(1), 3, 2]), key.size(1))
    out = ours(query, key, value, mask)
    expected, none = theirs(query, key, value, key_padding_mask=~mask[:, 0, 0], need_weights=False)
    assert none is None
    assert_close(out, expected)


def test_matches_torch_eval_fast_path(dtype, assert_close):
    """In eval mode without grad PyTorch takes its native fast path."""
    theirs = _torch_mha(dtype).eval()
    ours = mhbook.MultiHeadAttention.from_torch(theirs).eval()
    x = _randn(3, 5, D_MODEL, dtype=dtype, seed=4).detach()
    mask = mhbook.padding_mask(torch.tensor([5, 3, 1]), 5)
    with torch.no_grad():
        assert_close(ours(x, x, x, mask), theirs(x, x, x, key_padding_mask=~mask[:, 0, 0])[0])


def test_causal_self_attention_matches_torch_attn_mask(dtype, assert_close):
    theirs = _torch_mha(dtype)
    ours = mhbook.MultiHeadAttention.from_torch(theirs)
    x, _, _ = _inputs("self", dtype)
    causal = mhbook.causal_mask(5)
    out, weights = ours(x, x, x, causal, need_weights=True)
    # nn.MultiheadAttention's bool attn_mask is the inverse: True = not allowed.
    expected, expected_weights = theirs(x, x, x, attn_mask=~causal, average_attn_weights=False)
    assert_close(out, expected)
    assert_close(weights, expected_weights)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_to_torch_round_trip(bias, dtype, assert_close):
    torch.manual_seed(5)
    ours = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, bias=bias).to(dtype)
    theirs = ours.to_torch()
    assert isinstance(theirs, nn.MultiheadAttention) and theirs.batch_first
    assert theirs.in_proj_weight.dtype == dtype
    assert (theirs.in_proj_bias is not None) == bias
    query, key, value = _inputs("cross", dtype)
    mask = mhbook.padding_mask(torch.tensor([7, 4, 2]), 7)
    expected, _ = theirs(query, key, value, key_padding_mask=~mask[:, 0, 0])
    assert_close(ours(query, key, value, mask), expected)
    again = mhbook.MultiHeadAttention.from_torch(theirs)
    for a, b in zip(ours.parameters(), again.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_fused_path_equals_explicit_path(kind, dtype, assert_close):
    """``need_weights=False`` (PyTorch's fused kernel) and ``True`` (mhbook's explicit
    attention) give the same outputs and gradients, even with a query that sees no key."""
    torch.manual_seed(6)
    mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS).to(dtype)
    query, key, value = _inputs(kind, dtype)
    lq, lk = query.size(1), key.size(1)
    # Per-query key counts; batch 2's second query has no key at all.
    valid = torch.tensor([[lk] * lq, [1] * lq, [lk - 1, 0] + [2] * (lq - 2)])
    mask = mhbook.padding_mask(valid, lk)
    inputs = tuple({id(t): t for t in (query, key, value)}.values()) + tuple(mha.parameters())

    fused = mha(query, key, value, mask)
    explicit, _ = mha(query, key, value, mask, need_weights=True)
    assert not fused.isnan().any()
    assert_close(fused, explicit, "output")
    g = _upstream(fused)
    grads_fused = torch.autograd.grad((fused * g).sum(), inputs)
    grads_explicit = torch.autograd.grad((explicit * g).sum(), inputs)
    for a, b in zip(grads_fused, grads_explicit):
        assert torch.isfinite(a).all()
        assert_close(a, b, "gradient")


# -- head_mask ---------------------------------------------------------------------------
def test_head_mask_zero_equals_zeroing_that_heads_slice(dtype, assert_close):
    torch.manual_seed(7)
    mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS).to(dtype)
    x, key, value = _inputs("cross", dtype)
    head, d_head = 2, D_MODEL // NUM_HEADS

    def zero_head(module, args):  # runs just before W_o, on the merged heads
        (merged,) = args
        merged = merged.clone()
        merged[..., head * d_head : (head + 1) * d_head] = 0
        return (merged,)

    handle = mha.W_o.register_forward_pre_hook(zero_head)
    expected = mha(x, key, value)
    handle.remove()
    mha.head_mask = torch.ones(NUM_HEADS, dtype=dtype)
    mha.head_mask[head] = 0
    for need_weights in (False, True):
        out = mha(x, key, value, need_weights=need_weights)
        out = out[0] if need_weights else out
        assert_close(out, expected)
    mha.head_mask = None
    assert not torch.allclose(mha(x, key, value), expected)


def test_head_mask_gradient(dtype, assert_close):
    """The output is affine in the head mask, so d loss / d m_i = loss(1) - loss(1 - e_i)."""
    torch.manual_seed(8)
    mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS).to(dtype)
    x, key, value = _inputs("cross", dtype)
    g = _upstream(mha(x, key, value))

    def loss(head_mask):
        mha.head_mask = head_mask
        return (mha(x, key, value) * g).sum()

    head_mask = torch.ones(NUM_HEADS, dtype=dtype, requires_grad=True)
    loss(head_mask).backward()
    assert head_mask.grad is not None and head_mask.grad.shape == (NUM_HEADS,)
    with torch.no_grad():
        full = loss(torch.ones(NUM_HEADS, dtype=dtype))
        expected = torch.stack(
            [full - loss(1 - torch.eye(NUM_HEADS, dtype=dtype)[i]) for i in range(NUM_HEADS)]
        )
    assert_close(head_mask.grad, expected)


def test_head_mask_is_a_buffer_that_moves_with_the_module():
    """``.double()``, ``.to("meta")`` and ``state_dict`` see the head mask."""
    torch.manual_seed(9)
    mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS)
    mha.head_mask = torch.tensor([1.0, 0.0, 1.0, 1.0])
    assert "head_mask" in dict(mha.named_buffers())
    mha = mha.double()
    assert mha.head_mask.dtype == torch.float64
    x = _randn(2, 3, D_MODEL, dtype=torch.float64, seed=10)
    assert mha(x, x, x).dtype == torch.float64
    on_meta = mha.to("meta")
    assert on_meta.head_mask.device.type == "meta"
    out = on_meta(*[x.detach().to("meta")] * 3)
    assert out.device.type == "meta" and out.shape == (2, 3, D_MODEL)


def test_head_mask_is_saved_and_loaded_with_the_state_dict():
    torch.manual_seed(11)
    mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS)
    mha.head_mask = torch.tensor([1.0, 0.0, 1.0, 0.0])
    state = mha.state_dict()
    assert torch.equal(state["head_mask"], mha.head_mask)
    fresh = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS)
    fresh.load_state_dict(state)  # strict: the key is expected
    assert torch.equal(fresh.head_mask, mha.head_mask)
    x = _randn(2, 3, D_MODEL, dtype=torch.float32, seed=12)
    assert torch.equal(fresh(x, x, x), mha(x, x, x))
    mha.head_mask = None  # a state without a head mask removes it
    assert "head_mask" not in mha.state_dict()
    fresh.load_state_dict(mha.state_dict())
    assert fresh.head_mask is None


def test_head_mask_with_requires_grad_stays_the_same_tensor():
    """Chapter 7 assigns a leaf that requires grad and reads its ``.grad``."""
    mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS)
    head_mask = torch.ones(NUM_HEADS, requires_grad=True)
    mha.head_mask = head_mask
    assert mha.head_mask is head_mask
    x = _randn(2, 3, D_MODEL, dtype=torch.float32, seed=13)
    mha(x, x, x).sum().backward()
    assert head_mask.grad is not None and torch.isfinite(head_mask.grad).all()


def test_subclass_that_sets_its_own_attributes_still_runs():
    """Chapter 7's PrunedMultiHeadAttention skips MultiHeadAttention.__init__ and sets
    d_model, d_head, num_heads, dropout, keep_weights, weights, head_mask and the
    projections itself: forward must need nothing else."""

    class Pruned(mhbook.MultiHeadAttention):
        def __init__(self, layer, keep):
            nn.Module.__init__(self)
            self.d_model, self.d_head, self.num_heads = layer.d_model, layer.d_head, len(keep)
            self.dropout, self.keep_weights, self.weights, self.head_mask = 0.0, False, None, None
            rows = torch.cat([torch.arange(i * self.d_head, (i + 1) * self.d_head) for i in keep])
            for name in ("W_q", "W_k", "W_v"):
                new = nn.Linear(self.d_model, len(rows))
                new.weight.data.copy_(getattr(layer, name).weight[rows])
                new.bias.data.copy_(getattr(layer, name).bias[rows])
                setattr(self, name, new)
            self.W_o = nn.Linear(len(rows), self.d_model)
            self.W_o.weight.data.copy_(layer.W_o.weight[:, rows])
            self.W_o.bias.data.copy_(layer.W_o.bias)

        def merge_heads(self, x):
            batch, _, length, _ = x.shape
            return x.transpose(1, 2).reshape(batch, length, self.num_heads * self.d_head)

    torch.manual_seed(14)
    full = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS)
    x = _randn(2, 3, D_MODEL, dtype=torch.float32, seed=15).detach()
    pruned = Pruned(full, keep=[0, 2])
    full.head_mask = torch.tensor([1.0, 0.0, 1.0, 0.0])
    torch.testing.assert_close(pruned(x, x, x), full(x, x, x))
    with mhbook.record_attention(pruned) as weights:
        pruned(x, x, x)
    assert weights()[""].shape == (2, 2, 3, 3)


def test_autocast_takes_inputs_of_another_dtype():
    """Under autocast PyTorch casts for the products itself: no dtype error then."""
    torch.manual_seed(16)
    mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS)
    x = torch.randn(2, 3, D_MODEL, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for need_weights in (False, True):
            out = mha(x, x, x, need_weights=need_weights)
            out = out[0] if need_weights else out
            assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
