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


def _compare_gradients(ours, theirs, out, expected, inputs, assert_close, assert_same_grads):
    """Backpropagate one seeded upstream gradient through both modules' outputs and compare
    the input and parameter gradients; return PyTorch's input gradients."""
    g = _upstream(out)
    ours_grads = torch.autograd.grad((out * g).sum(), inputs + tuple(ours.parameters()))
    for p, grad in zip(ours.parameters(), ours_grads[len(inputs) :]):
        p.grad = grad
    theirs_grads = torch.autograd.grad((expected * g).sum(), inputs, retain_graph=True)
    (expected * g).sum().backward()
    for a, b in zip(ours_grads[: len(inputs)], theirs_grads):
        assert_close(a, b, "input gradient")
    assert_same_grads(ours, theirs)
    return theirs_grads


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

    inputs = tuple({id(t): t for t in (query, key, value)}.values())
    _compare_gradients(ours, theirs, out, expected, inputs, assert_close, assert_same_grads)


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


def test_is_causal_self_attention_matches_torch(dtype, assert_close):
    """``is_causal=True`` builds no mask on the fused path; same result as PyTorch's layer
    given the causal mask (and the ``is_causal`` hint), forward and gradients."""
    theirs = _torch_mha(dtype)
    ours = mhbook.MultiHeadAttention.from_torch(theirs)
    x, _, _ = _inputs("self", dtype)
    out = ours(x, x, x, is_causal=True)
    causal = mhbook.causal_mask(5)
    expected = theirs(x, x, x, attn_mask=~causal, is_causal=True, need_weights=False)[0]
    assert_close(out, expected)
    grad_ours = torch.autograd.grad(out.square().sum(), x)[0]
    grad_theirs = torch.autograd.grad(expected.square().sum(), x)[0]
    assert_close(grad_ours, grad_theirs)
    assert_close(ours(x, x, x, is_causal=True, need_weights=True)[0], out)  # explicit path


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


# -- a head size of its own (d_head) and keys/values of other widths (kdim, vdim) -------
KDIM, VDIM = 6, 10


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("num_heads,d_head", [(4, 8), (3, 5), (8, 16)])
def test_custom_d_head_shapes_and_parameter_count(num_heads, d_head, bias):
    """Heads of a fixed size, independent of h (Bhojanapalli et al., 2020)."""
    mha = mhbook.MultiHeadAttention(D_MODEL, num_heads, bias=bias, d_head=d_head)
    inner = num_heads * d_head
    assert mha.d_head == d_head and (mha.kdim, mha.vdim) == (D_MODEL, D_MODEL)
    assert mha.W_q.weight.shape == mha.W_k.weight.shape == mha.W_v.weight.shape
    assert mha.W_q.weight.shape == (inner, D_MODEL)
    assert mha.W_o.weight.shape == (D_MODEL, inner)
    biases = 3 * inner + D_MODEL if bias else 0
    assert sum(p.numel() for p in mha.parameters()) == 4 * D_MODEL * inner + biases
    query, key, value = _inputs("cross", torch.float32)
    out, weights = mha(query, key, value, need_weights=True)
    assert out.shape == query.shape and weights.shape == (3, num_heads, 4, 7)
    k, v = mha.project_kv(key, value)
    assert k.shape == v.shape == (3, num_heads, 7, d_head)
    assert mha.split_heads(mha.W_q(query)).shape == (3, num_heads, 4, d_head)
    assert mha.merge_heads(k).shape == (3, 7, inner)


def test_d_head_of_d_model_over_h_is_todays_module():
    """The default path creates the same parameters, in the same order, with the same
    seeded values: the book's trained models depend on it."""
    torch.manual_seed(17)
    default = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS)
    torch.manual_seed(17)
    explicit = mhbook.MultiHeadAttention(
        D_MODEL, NUM_HEADS, d_head=D_MODEL // NUM_HEADS, kdim=D_MODEL, vdim=D_MODEL
    )
    torch.manual_seed(17)
    expected = [nn.Linear(D_MODEL, D_MODEL) for _ in range(4)]  # today's W_q, W_k, W_v, W_o
    names = [f"W_{c}.{kind}" for c in "qkvo" for kind in ("weight", "bias")]
    for mha in (default, explicit):
        state = mha.state_dict()
        assert list(state) == names
        for i, lin in enumerate(expected):
            assert torch.equal(state[names[2 * i]], lin.weight)
            assert torch.equal(state[names[2 * i + 1]], lin.bias)
    x = _randn(2, 3, D_MODEL, dtype=torch.float32, seed=18)
    assert torch.equal(default(x, x, x), explicit(x, x, x))


def test_model_config_head_dim():
    config = mhbook.ModelConfig(d_model=30, num_heads=4, head_dim=16)  # 4 does not divide 30
    assert config.d_head == 16
    assert mhbook.ModelConfig(d_model=32, num_heads=4).d_head == 8
    whole = mhbook.Config(model=config)
    assert whole.to_dict()["model"]["head_dim"] == 16
    assert mhbook.Config.from_dict(whole.to_dict()) == whole
    assert mhbook.Config.from_dict(mhbook.BOOK_CONFIG.to_dict()) == mhbook.BOOK_CONFIG
    assert mhbook.BOOK_CONFIG.model.head_dim is None


def test_blocks_use_the_configs_head_dim():
    torch.manual_seed(19)
    config = mhbook.ModelConfig(d_model=30, num_heads=4, num_layers=1, d_ff=12, head_dim=16)
    model = mhbook.Transformer(config, 11, 13)
    attentions = [m for m in model.modules() if isinstance(m, mhbook.MultiHeadAttention)]
    assert len(attentions) == 3
    for mha in attentions:
        assert mha.d_head == 16 and mha.W_q.weight.shape == (64, 30)
    src = torch.randint(0, 11, (2, 5))
    tgt = torch.randint(0, 13, (2, 4))
    out = model(src, tgt, torch.tensor([5, 3]))
    assert torch.isfinite(out).all() and out.shape[:2] == (2, 4)


def _torch_kv(dtype, bias=True, seed=20):
    torch.manual_seed(seed)
    return nn.MultiheadAttention(
        D_MODEL, NUM_HEADS, bias=bias, batch_first=True, kdim=KDIM, vdim=VDIM, dtype=dtype
    )


def _kv_inputs(dtype):
    return (
        _randn(3, 4, D_MODEL, dtype=dtype, seed=21),
        _randn(3, 7, KDIM, dtype=dtype, seed=22),
        _randn(3, 7, VDIM, dtype=dtype, seed=23),
    )


def test_kdim_vdim_shapes():
    mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, kdim=KDIM, vdim=VDIM)
    assert mha.W_q.weight.shape == (D_MODEL, D_MODEL)
    assert mha.W_k.weight.shape == (D_MODEL, KDIM)
    assert mha.W_v.weight.shape == (D_MODEL, VDIM)
    assert mha.W_o.weight.shape == (D_MODEL, D_MODEL)
    query, key, value = _kv_inputs(torch.float32)
    assert mha(query, key, value).shape == query.shape


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_kdim_vdim_match_torch_forward_weights_and_grads(
    bias, dtype, assert_close, assert_same_grads
):
    theirs = _torch_kv(dtype, bias)
    assert not theirs._qkv_same_embed_dim  # separate q/k/v_proj_weight
    ours = mhbook.MultiHeadAttention.from_torch(theirs)
    assert (ours.kdim, ours.vdim) == (KDIM, VDIM)
    query, key, value = _kv_inputs(dtype)
    mask = mhbook.padding_mask(torch.tensor([7, 3, 1]), 7)
    key_padding_mask = ~mask[:, 0, 0]

    out, weights = ours(query, key, value, mask, need_weights=True)
    expected, expected_weights = theirs(
        query, key, value, key_padding_mask=key_padding_mask, average_attn_weights=False
    )
    assert_close(out, expected, "output")
    assert_close(weights, expected_weights, "per-head weights")
    fused = ours(query, key, value, mask)
    expected_fused, _ = theirs(
        query, key, value, key_padding_mask=key_padding_mask, need_weights=False
    )
    assert_close(fused, expected_fused, "fused output")

    g = _upstream(out)
    inputs = (query, key, value)
    theirs_grads = _compare_gradients(
        ours, theirs, out, expected, inputs, assert_close, assert_same_grads
    )
    fused_grads = torch.autograd.grad((fused * g).sum(), inputs)
    for a, b in zip(fused_grads, theirs_grads):
        assert_close(a, b, "input gradient, fused path")


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_kdim_vdim_to_torch_and_back(bias, dtype, assert_close):
    torch.manual_seed(24)
    ours = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, bias=bias, kdim=KDIM, vdim=VDIM)
    ours = ours.to(dtype)
    theirs = ours.to_torch()
    assert (theirs.kdim, theirs.vdim, theirs.batch_first) == (KDIM, VDIM, True)
    assert theirs.in_proj_weight is None and theirs.k_proj_weight.shape == (D_MODEL, KDIM)
    assert theirs.q_proj_weight.dtype == dtype
    query, key, value = _kv_inputs(dtype)
    mask = mhbook.padding_mask(torch.tensor([7, 4, 2]), 7)
    expected, _ = theirs(query, key, value, key_padding_mask=~mask[:, 0, 0])
    assert_close(ours(query, key, value, mask), expected)
    again = mhbook.MultiHeadAttention.from_torch(theirs)
    assert list(again.state_dict()) == list(ours.state_dict())
    for a, b in zip(ours.parameters(), again.parameters()):
        assert torch.equal(a, b)


def test_kdim_vdim_equal_to_d_model_is_the_packed_layout():
    """``kdim=vdim=d_model`` is PyTorch's packed ``in_proj_weight`` both ways."""
    torch.manual_seed(25)
    ours = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, kdim=D_MODEL, vdim=D_MODEL)
    theirs = ours.to_torch()
    assert theirs._qkv_same_embed_dim and theirs.in_proj_weight is not None
    again = mhbook.MultiHeadAttention.from_torch(theirs)
    for a, b in zip(ours.parameters(), again.parameters()):
        assert torch.equal(a, b)


def test_custom_d_head_to_torch_when_heads_fill_d_model():
    """A d_head with num_heads * d_head == d_model is PyTorch's layout too."""
    torch.manual_seed(26)
    ours = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, d_head=D_MODEL // NUM_HEADS)
    x = _randn(2, 3, D_MODEL, dtype=torch.float32, seed=27)
    expected, _ = ours.to_torch()(x, x, x)
    torch.testing.assert_close(ours(x, x, x), expected)


def test_d_head_and_kdim_vdim_on_meta():
    mha = mhbook.MultiHeadAttention(D_MODEL, 3, d_head=5, kdim=KDIM, vdim=VDIM).to("meta")
    query = torch.empty(2, 4, D_MODEL, device="meta")
    key = torch.empty(2, 7, KDIM, device="meta")
    value = torch.empty(2, 7, VDIM, device="meta")
    for need_weights in (False, True):
        out = mha(query, key, value, need_weights=need_weights)
        out = out[0] if need_weights else out
        assert out.device.type == "meta" and out.shape == (2, 4, D_MODEL)
    k, v = mha.project_kv(key, value)
    assert k.device.type == "meta" and k.shape == v.shape == (2, 3, 7, 5)
    with torch.device("meta"):
        built = mhbook.MultiHeadAttention(D_MODEL, 3, d_head=5, kdim=KDIM, vdim=VDIM)
    assert all(p.device.type == "meta" for p in built.parameters())
