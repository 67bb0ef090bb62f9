"""mhbook.MultiHeadAttention, the one attention layer.

Against nn.MultiheadAttention(batch_first=True): weights copied both ways, forward,
per-head weights and gradients; the fused and the explicit paths; head_mask; d_head, kdim
and vdim. With fewer key/value heads (grouped-query and multi-query attention, and
attend(..., bias=)): against PyTorch's SDPA with enable_gqa, Hugging Face's LlamaAttention
(attention_from_hf), explicit formulas, and itself with a KV cache."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import CLOSE, EXACT, additive_mask, head_zeroed, seeded
from helpers import randn as _randn
from helpers import upstream as _upstream
from torch import nn

import mhbook
from mhbook import MultiHeadAttention

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
    ours = mhbook.attention_from_torch(theirs)
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
    ours = mhbook.attention_from_torch(theirs)
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
    if kind == "self":  # key=None, the self-attention call, is the same
        self_out, self_weights = ours(query, mask=mask, need_weights=True)
        assert_close(self_out, expected, "output of the self-attention call")
        assert_close(self_weights, expected_weights, "weights of the self-attention call")

    inputs = tuple({id(t): t for t in (query, key, value)}.values())
    _compare_gradients(ours, theirs, out, expected, inputs, assert_close, assert_same_grads)


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_matches_torch_fused_path(kind, dtype, assert_close):
    """``need_weights=False`` on both sides (PyTorch runs SDPA then, and so do we)."""
    theirs = _torch_mha(dtype)
    ours = mhbook.attention_from_torch(theirs)
    query, key, value = _inputs(kind, dtype)
    mask = mhbook.padding_mask(torch.tensor([key.size(1), 3, 2]), key.size(1))
    out, weights = ours(query, key, value, mask)
    expected, none = theirs(query, key, value, key_padding_mask=~mask[:, 0, 0], need_weights=False)
    assert none is None and weights is None
    assert_close(out, expected)


def test_matches_torch_eval_fast_path(dtype, assert_close):
    """In eval mode without grad PyTorch takes its native fast path."""
    theirs = _torch_mha(dtype).eval()
    ours = mhbook.attention_from_torch(theirs).eval()
    x = _randn(3, 5, D_MODEL, dtype=dtype, seed=4).detach()
    mask = mhbook.padding_mask(torch.tensor([5, 3, 1]), 5)
    with torch.no_grad():
        expected = theirs(x, x, x, key_padding_mask=~mask[:, 0, 0])[0]
        assert_close(ours(x, x, x, mask)[0], expected)
        assert_close(ours(x, mask=mask)[0], expected)  # key=None: self-attention


def test_causal_self_attention_matches_torch_attn_mask(dtype, assert_close):
    theirs = _torch_mha(dtype)
    ours = mhbook.attention_from_torch(theirs)
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
    ours = mhbook.attention_from_torch(theirs)
    x, _, _ = _inputs("self", dtype)
    out = ours(x, x, x, is_causal=True)[0]
    causal = mhbook.causal_mask(5)
    expected = theirs(x, x, x, attn_mask=~causal, is_causal=True, need_weights=False)[0]
    assert_close(out, expected)
    grad_ours = torch.autograd.grad(out.square().sum(), x)[0]
    grad_theirs = torch.autograd.grad(expected.square().sum(), x)[0]
    assert_close(grad_ours, grad_theirs)
    assert_close(ours(x, x, x, is_causal=True, need_weights=True)[0], out)  # explicit path
    assert_close(ours(x, is_causal=True)[0], out)  # key=None: self-attention


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_to_torch_round_trip(bias, dtype, assert_close):
    torch.manual_seed(5)
    ours = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, bias=bias).to(dtype)
    theirs = mhbook.attention_to_torch(ours)
    assert isinstance(theirs, nn.MultiheadAttention) and theirs.batch_first
    assert theirs.in_proj_weight.dtype == dtype
    assert (theirs.in_proj_bias is not None) == bias
    query, key, value = _inputs("cross", dtype)
    mask = mhbook.padding_mask(torch.tensor([7, 4, 2]), 7)
    expected, _ = theirs(query, key, value, key_padding_mask=~mask[:, 0, 0])
    assert_close(ours(query, key, value, mask)[0], expected)
    again = mhbook.attention_from_torch(theirs)
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

    fused, _ = mha(query, key, value, mask)
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

    with head_zeroed(mha, head, d_head):
        expected = mha(x, key, value)[0]
    mha.head_mask = torch.ones(NUM_HEADS, dtype=dtype)
    mha.head_mask[head] = 0
    for need_weights in (False, True):
        out, _ = mha(x, key, value, need_weights=need_weights)
        assert_close(out, expected)
    mha.head_mask = None
    assert not torch.allclose(mha(x, key, value)[0], expected)


def test_head_mask_gradient(dtype, assert_close):
    """The output is affine in the head mask, so d loss / d m_i = loss(1) - loss(1 - e_i)."""
    torch.manual_seed(8)
    mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS).to(dtype)
    x, key, value = _inputs("cross", dtype)
    g = _upstream(mha(x, key, value)[0])

    def loss(head_mask):
        mha.head_mask = head_mask
        return (mha(x, key, value)[0] * g).sum()

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
    assert mha(x, x, x)[0].dtype == torch.float64
    on_meta = mha.to("meta")
    assert on_meta.head_mask.device.type == "meta"
    out, _ = on_meta(*[x.detach().to("meta")] * 3)
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
    assert torch.equal(fresh(x, x, x)[0], mha(x, x, x)[0])
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
    mha(x, x, x)[0].sum().backward()
    assert head_mask.grad is not None and torch.isfinite(head_mask.grad).all()


def test_subclass_built_on_the_meta_device_then_copied():
    """Chapter 7's PrunedMultiHeadAttention: ``super().__init__`` on the meta device (shapes,
    no memory, no random numbers used up), ``to_empty``, then the kept heads' weights copied
    in. It runs as the full layer with the other heads masked off, self-attention too."""

    class Pruned(mhbook.MultiHeadAttention):
        def __init__(self, layer, keep):
            with torch.device("meta"):
                super().__init__(
                    layer.d_model, len(keep), d_head=layer.d_head, dropout=layer.dropout
                )
            self.to_empty(device=layer.W_o.weight.device)
            rows = torch.cat([torch.arange(i * layer.d_head, (i + 1) * layer.d_head) for i in keep])
            with torch.no_grad():
                for name in ("W_q", "W_k", "W_v"):
                    getattr(self, name).weight.copy_(getattr(layer, name).weight[rows])
                    getattr(self, name).bias.copy_(getattr(layer, name).bias[rows])
                self.W_o.weight.copy_(layer.W_o.weight[:, rows])
                self.W_o.bias.copy_(layer.W_o.bias)
            self.train(layer.training)

    torch.manual_seed(14)
    full = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS)
    x = _randn(2, 3, D_MODEL, dtype=torch.float32, seed=15).detach()
    state = torch.get_rng_state()
    pruned = Pruned(full, keep=[0, 2])
    assert torch.equal(torch.get_rng_state(), state)  # no random initial weights drawn
    assert all(p.device.type == "cpu" for p in pruned.parameters())
    full.head_mask = torch.tensor([1.0, 0.0, 1.0, 0.0])
    torch.testing.assert_close(pruned(x, x, x)[0], full(x, x, x)[0])
    torch.testing.assert_close(pruned(x)[0], full(x)[0])
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
            out, _ = mha(x, x, x, need_weights=need_weights)
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
    cache = mhbook.LayerCache()  # cross-attention projects the memory into it
    mha(query, key, value, cache=cache)
    k, v = cache.memory_keys, cache.memory_values
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
    assert torch.equal(default(x, x, x)[0], explicit(x, x, x)[0])


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
    assert mha(query, key, value)[0].shape == query.shape


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_kdim_vdim_match_torch_forward_weights_and_grads(
    bias, dtype, assert_close, assert_same_grads
):
    theirs = _torch_kv(dtype, bias)
    assert not theirs._qkv_same_embed_dim  # separate q/k/v_proj_weight
    ours = mhbook.attention_from_torch(theirs)
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
    fused, _ = ours(query, key, value, mask)
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
    theirs = mhbook.attention_to_torch(ours)
    assert (theirs.kdim, theirs.vdim, theirs.batch_first) == (KDIM, VDIM, True)
    assert theirs.in_proj_weight is None and theirs.k_proj_weight.shape == (D_MODEL, KDIM)
    assert theirs.q_proj_weight.dtype == dtype
    query, key, value = _kv_inputs(dtype)
    mask = mhbook.padding_mask(torch.tensor([7, 4, 2]), 7)
    expected, _ = theirs(query, key, value, key_padding_mask=~mask[:, 0, 0])
    assert_close(ours(query, key, value, mask)[0], expected)
    again = mhbook.attention_from_torch(theirs)
    assert list(again.state_dict()) == list(ours.state_dict())
    for a, b in zip(ours.parameters(), again.parameters()):
        assert torch.equal(a, b)


def test_kdim_vdim_equal_to_d_model_is_the_packed_layout():
    """``kdim=vdim=d_model`` is PyTorch's packed ``in_proj_weight`` both ways."""
    torch.manual_seed(25)
    ours = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, kdim=D_MODEL, vdim=D_MODEL)
    theirs = mhbook.attention_to_torch(ours)
    assert theirs._qkv_same_embed_dim and theirs.in_proj_weight is not None
    again = mhbook.attention_from_torch(theirs)
    for a, b in zip(ours.parameters(), again.parameters()):
        assert torch.equal(a, b)


def test_custom_d_head_to_torch_when_heads_fill_d_model():
    """A d_head with num_heads * d_head == d_model is PyTorch's layout too."""
    torch.manual_seed(26)
    ours = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, d_head=D_MODEL // NUM_HEADS)
    x = _randn(2, 3, D_MODEL, dtype=torch.float32, seed=27)
    expected, _ = mhbook.attention_to_torch(ours)(x, x, x)
    torch.testing.assert_close(ours(x, x, x)[0], expected)


def test_d_head_and_kdim_vdim_on_meta():
    mha = mhbook.MultiHeadAttention(D_MODEL, 3, d_head=5, kdim=KDIM, vdim=VDIM).to("meta")
    query = torch.empty(2, 4, D_MODEL, device="meta")
    key = torch.empty(2, 7, KDIM, device="meta")
    value = torch.empty(2, 7, VDIM, device="meta")
    for need_weights in (False, True):
        out, _ = mha(query, key, value, need_weights=need_weights)
        assert out.device.type == "meta" and out.shape == (2, 4, D_MODEL)
    cache = mhbook.LayerCache()
    mha(query, key, value, cache=cache)
    k, v = cache.memory_keys, cache.memory_values
    assert k.device.type == "meta" and k.shape == v.shape == (2, 3, 7, 5)
    with torch.device("meta"):
        built = mhbook.MultiHeadAttention(D_MODEL, 3, d_head=5, kdim=KDIM, vdim=VDIM)
    assert all(p.device.type == "meta" for p in built.parameters())


# == grouped-query and multi-query attention: num_kv_heads < num_heads ======================
def _gqa(num_kv_heads, dtype=torch.float64, seed=0, **kwargs):
    """Grouped-query attention as chapter 10 builds it: no biases (Llama's), unless told."""
    torch.manual_seed(seed)
    kwargs = {"bias": False, **kwargs}
    layer = MultiHeadAttention(D_MODEL, NUM_HEADS, num_kv_heads=num_kv_heads, **kwargs)
    return layer.to(dtype).eval()


# -- stand-ins for mhbook.RotaryEmbedding and mhbook.ALiBi (same call signatures) --------
class _Rotate(nn.Module):
    """Rotate-half rotary embedding, written out here: the tables ``cos`` and ``sin`` of
    each angle twice (the layer rotates by them: ``x cos + rotate_half(x) sin``)."""

    d_head = D_MODEL // NUM_HEADS  # the heads' size

    def forward(self, x, positions):
        cos, sin = self.tables(positions, x.dtype)
        x1, x2 = x[..., : self.d_head // 2], x[..., self.d_head // 2 :]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def tables(self, positions, dtype):  # what a model computes once per forward pass
        d = self.d_head
        inv_freq = 10000.0 ** (-torch.arange(0, d, 2, device=positions.device) / d)
        angles = positions.double()[:, None] * inv_freq  # (T, d/2)
        angles = torch.cat([angles, angles], -1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


class _Distance(nn.Module):
    """An ALiBi-like bias: ``-slope_h * |i - j|``, ``(num_heads, T, S)``."""

    def __init__(self, num_heads):
        super().__init__()
        self.num_heads = num_heads

    def forward(self, q_positions, k_positions):
        slopes = 2.0 ** -torch.arange(1, self.num_heads + 1, device=q_positions.device)
        distance = (q_positions[:, None] - k_positions[None, :]).abs()
        return -slopes[:, None, None] * distance


POSITIONS = {"none": {}, "rope": {"rope": _Rotate()}, "alibi": {"alibi": _Distance(NUM_HEADS)}}


# -- attend(..., bias=) -----------------------------------------------------------------------
def _explicit(q, k, v, mask=None, bias=None):
    """softmax(q k^T / sqrt(d) + bias) v, keys repeated for the groups, written out."""
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("use_mask", [False, True], ids=["no-mask", "causal"])
def test_attend_bias_equals_explicit_formula(need_weights, use_mask):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 7, 8, generator=g, dtype=torch.float64) for _ in range(2))
    bias = torch.randn(4, 5, 7, generator=g, dtype=torch.float64)
    mask = mhbook.causal_mask(5, 7) if use_mask else None
    out, weights = mhbook.attend(q, k, v, mask, need_weights=need_weights, bias=bias)
    torch.testing.assert_close(out, _explicit(q, k, v, mask, bias), rtol=1e-12, atol=1e-12)
    assert (weights is not None) == need_weights


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
def test_attend_bias_fully_masked_row_is_zero(need_weights):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=g, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 2, 3, 3, generator=g)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    out, _ = mhbook.attend(q, k, v, mask, need_weights=need_weights, bias=bias)
    assert torch.isfinite(out).all() and (out[:, :, 1] == 0).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_attend_bias_errors():
    q = k = v = torch.zeros(1, 2, 3, 4)
    with pytest.raises(TypeError, match="floating-point"):
        mhbook.attend(q, k, v, bias=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"bias of shape \(5, 3\) does not broadcast"):
        mhbook.attend(q, k, v, bias=torch.zeros(5, 3))


# -- the layer with num_kv_heads -----------------------------------------------------------------
def test_num_kv_heads_equal_to_num_heads_is_multi_head_attention():
    """``num_kv_heads=num_heads`` is the default layer; its self-attention call (key=None)
    is the call with the input as query, key and value."""
    gqa = _gqa(NUM_HEADS, bias=True)
    assert gqa.num_kv_heads == NUM_HEADS and gqa.group_size == 1
    mha = MultiHeadAttention(D_MODEL, NUM_HEADS, bias=True).double().eval()
    assert mha.num_kv_heads == NUM_HEADS
    for name in ("W_q", "W_k", "W_v", "W_o"):
        getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
    x, mask = seeded(2, 6, D_MODEL), mhbook.causal_mask(6)
    out, weights = gqa(x, mask=mask, need_weights=True)
    out_mha, weights_mha = mha(x, x, x, mask, need_weights=True)
    torch.testing.assert_close(out, out_mha, **EXACT)
    torch.testing.assert_close(weights, weights_mha, **EXACT)


@pytest.mark.parametrize("num_kv_heads", [2, 1], ids=["GQA", "MQA"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_equals_torch_sdpa_with_enable_gqa(num_kv_heads, causal):
    gqa = _gqa(num_kv_heads)
    x = seeded(2, 6, D_MODEL)
    B, T, _ = x.shape
    d = gqa.d_head
    q = gqa.W_q(x).view(B, T, NUM_HEADS, d).transpose(1, 2)
    k = gqa.W_k(x).view(B, T, num_kv_heads, d).transpose(1, 2)
    v = gqa.W_v(x).view(B, T, num_kv_heads, d).transpose(1, 2)
    assert k.shape == (B, num_kv_heads, T, d)
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    expected = gqa.W_o(heads.transpose(1, 2).reshape(B, T, NUM_HEADS * d))
    mask = mhbook.causal_mask(T) if causal else None
    for need_weights in (False, True):
        out, _ = gqa(x, mask=mask, need_weights=need_weights)
        torch.testing.assert_close(out, expected, **EXACT)
        out, _ = gqa(x, is_causal=causal, need_weights=need_weights)
        torch.testing.assert_close(out, expected, **EXACT)


def test_parameter_counts():
    """W_k and W_v shrink with the key/value heads; W_q and W_o do not."""
    d_head = D_MODEL // NUM_HEADS
    for h_kv in (4, 2, 1):
        gqa = MultiHeadAttention(D_MODEL, NUM_HEADS, num_kv_heads=h_kv, bias=False)
        expected = 2 * D_MODEL * D_MODEL + 2 * D_MODEL * h_kv * d_head
        assert sum(p.numel() for p in gqa.parameters()) == expected


def test_fixed_head_size():
    gqa = MultiHeadAttention(D_MODEL, 8, num_kv_heads=2, bias=False, d_head=6)
    assert gqa.W_q.weight.shape == (48, D_MODEL) and gqa.W_k.weight.shape == (12, D_MODEL)
    assert gqa.W_o.weight.shape == (D_MODEL, 48)
    assert gqa(torch.zeros(1, 3, D_MODEL))[0].shape == (1, 3, D_MODEL)


def _decode_step_by_step(gqa, x, chunks=(1,)):
    """Feed ``x`` in pieces of the sizes in ``chunks`` (cycled) through a LayerCache; the
    causal mask over the kept and new keys (a layer with a window adds its own)."""
    cache = mhbook.LayerCache()
    outputs, start, i = [], 0, 0
    while start < x.size(1):
        size = min(chunks[i % len(chunks)], x.size(1) - start)
        new = x[:, start : start + size]
        mask = mhbook.causal_mask(size, cache.num_kept + size)
        outputs.append(gqa(new, mask=mask, cache=cache)[0])
        start, i = start + size, i + 1
    assert cache.length == x.size(1)
    return torch.cat(outputs, dim=1), cache


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("position", list(POSITIONS))
@pytest.mark.parametrize("chunks", [(1,), (3, 1, 2)], ids=["one-by-one", "chunks"])
def test_cache_equals_full_causal_forward(num_kv_heads, position, chunks):
    gqa = _gqa(num_kv_heads, **POSITIONS[position])
    x = seeded(2, 7, D_MODEL)
    full, _ = gqa(x, mask=mhbook.causal_mask(7))
    stepped, cache = _decode_step_by_step(gqa, x, chunks=chunks)
    torch.testing.assert_close(stepped, full, **EXACT)
    # The cache holds num_kv_heads heads only: num_heads / num_kv_heads times fewer bytes.
    assert cache.keys.shape == (2, num_kv_heads, 7, D_MODEL // NUM_HEADS)


@pytest.mark.parametrize("position", list(POSITIONS))
def test_rolling_cache_equals_window_mask(position):
    """A layer told its window at construction masks by it and keeps only it in its
    cache: the same as a global layer given the window's mask."""
    x, window = seeded(2, 9, D_MODEL), 3
    full, _ = _gqa(2, **POSITIONS[position])(x, mask=mhbook.causal_mask(9, window=window))
    local = _gqa(2, **POSITIONS[position], window=window)
    assert local.window == window and "window=3" in repr(local)
    torch.testing.assert_close(local(x)[0], full, **EXACT)  # its own mask, no other
    for chunks in ((1,), (2, 4, 1)):
        stepped, cache = _decode_step_by_step(local, x, chunks=chunks)
        torch.testing.assert_close(stepped, full, **EXACT)
        assert cache.num_kept == window and cache.length == 9


def test_rope_and_alibi_are_applied():
    """The stand-ins change the output, and each equals the formula written out."""
    x, mask = seeded(2, 5, D_MODEL), mhbook.causal_mask(5)
    plain = _gqa(2)
    B, T, _ = x.shape
    q = plain.W_q(x).view(B, T, NUM_HEADS, 4).transpose(1, 2)
    k = plain.W_k(x).view(B, T, 2, 4).transpose(1, 2)
    v = plain.W_v(x).view(B, T, 2, 4).transpose(1, 2)
    positions = torch.arange(T)

    def merge(heads):
        return plain.W_o(heads.transpose(1, 2).reshape(B, T, -1))

    rope = _Rotate()
    expected = merge(_explicit(rope(q, positions), rope(k, positions), v, mask))
    torch.testing.assert_close(_gqa(2, rope=rope)(x, mask=mask)[0], expected, **EXACT)
    alibi = _Distance(NUM_HEADS)
    expected = merge(_explicit(q, k, v, mask, alibi(positions, positions)))
    torch.testing.assert_close(_gqa(2, alibi=alibi)(x, mask=mask)[0], expected, **EXACT)
    assert not torch.allclose(plain(x, mask=mask)[0], expected)


def test_explicit_positions():
    """Given positions equal the default ones. Shifting every position leaves the scores
    as they are (rotary embedding is relative); spreading them out does not."""
    gqa = _gqa(2, rope=_Rotate())
    x, mask = seeded(2, 4, D_MODEL), mhbook.causal_mask(4)
    default, _ = gqa(x, mask=mask)
    torch.testing.assert_close(gqa(x, mask=mask, positions=torch.arange(4))[0], default)
    shifted, _ = gqa(x, mask=mask, positions=torch.arange(4) + 3)
    torch.testing.assert_close(shifted, default, **EXACT)
    spread, _ = gqa(x, mask=mask, positions=torch.tensor([0, 2, 5, 9]))
    assert not torch.allclose(spread, default)


def test_record_attention_sees_grouped_query_attention():
    gqa = _gqa(2)
    model = nn.ModuleDict({"attn": gqa})
    x, mask = seeded(2, 5, D_MODEL), mhbook.causal_mask(5)
    with mhbook.record_attention(model) as weights:
        out, _ = gqa(x, mask=mask)
    w = weights()["attn"]
    assert w.shape == (2, NUM_HEADS, 5, 5)
    torch.testing.assert_close(gqa(x, mask=mask)[0], out)
    assert (w.masked_select(~mask) == 0).all()


def test_gradients_flow_to_every_parameter():
    gqa = _gqa(2, bias=True).train()
    gqa(seeded(2, 6, D_MODEL), mask=mhbook.causal_mask(6))[0].sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in gqa.parameters())


# -- against Hugging Face's LlamaAttention and MistralAttention (random weights) ---------------
def _by_hand(theirs, config):
    """The weight mapping written out: q_proj, k_proj, v_proj, o_proj are W_q, W_k, W_v,
    W_o, and RoPE of the config's base rotates Llama's halves."""
    rope = mhbook.RotaryEmbedding(theirs.head_dim, rope_theta=config.rope_parameters["rope_theta"])
    bias = theirs.q_proj.bias is not None
    ours = MultiHeadAttention(
        config.hidden_size,
        config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        bias=bias,
        d_head=theirs.head_dim,
        rope=rope,
    ).double()
    with torch.no_grad():
        for mine, hf_name in zip(
            ("W_q", "W_k", "W_v", "W_o"), ("q_proj", "k_proj", "v_proj", "o_proj")
        ):
            getattr(ours, mine).weight.copy_(getattr(theirs, hf_name).weight)
            if bias:
                getattr(ours, mine).bias.copy_(getattr(theirs, hf_name).bias)
    return ours.eval()


@pytest.mark.parametrize("kind", ["llama", "llama-bias", "mistral"])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_from_hf_is_the_weight_mapping_by_hand(
    kind, num_kv_heads, hf_llama_attention, hf_mistral_attention
):
    """mhbook.attention_from_hf, which the other tests against transformers use, copies
    the weights as the mapping written out does (Mistral: heads of 8 != d_model / h)."""
    if kind == "mistral":
        config, theirs, rotary = hf_mistral_attention(
            3, d_model=D_MODEL, num_heads=NUM_HEADS, num_kv_heads=num_kv_heads, head_dim=8
        )
    else:
        config, theirs, rotary = hf_llama_attention(
            num_kv_heads,
            d_model=D_MODEL,
            num_heads=NUM_HEADS,
            rope_theta=500.0,
            bias=kind == "llama-bias",
        )
    ours = mhbook.attention_from_hf(theirs)
    by_hand = _by_hand(theirs, config)
    assert (ours.num_kv_heads, ours.d_head, ours.training) == (num_kv_heads, theirs.head_dim, False)
    assert (ours.rope.rope_theta, ours.rope.interleaved) == (by_hand.rope.rope_theta, False)
    assert ours.state_dict().keys() == by_hand.state_dict().keys()
    for name, tensor in by_hand.state_dict().items():
        assert torch.equal(ours.state_dict()[name], tensor), name
    x, mask = seeded(2, 7, D_MODEL, seed=1), mhbook.causal_mask(7)
    positions = torch.arange(20, 27)
    mine, _ = ours(x, mask=mask, positions=positions)
    torch.testing.assert_close(mine, by_hand(x, mask=mask, positions=positions)[0], rtol=0, atol=0)
    # ... and both give transformers' output.
    cos_sin = rotary(x, positions[None])
    theirs_out, _ = theirs(x, position_embeddings=cos_sin, attention_mask=additive_mask(mask))
    torch.testing.assert_close(mine, theirs_out, **CLOSE)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_equals_llama_attention_without_rotation(num_kv_heads, hf_llama_attention):
    """LlamaAttention takes the rotation as (cos, sin): cos = 1, sin = 0 is no rotation,
    so this checks the grouped heads alone (RoPE is checked in test_rope.py)."""
    _, llama, _ = hf_llama_attention(num_kv_heads, d_model=D_MODEL, num_heads=NUM_HEADS)
    gqa = mhbook.attention_from_hf(llama)
    gqa.rope, gqa.rotary = None, False  # the grouped heads alone
    x = seeded(2, 5, D_MODEL)
    d_head = D_MODEL // NUM_HEADS
    cos = torch.ones(1, 5, d_head, dtype=torch.float64)
    sin = torch.zeros(1, 5, d_head, dtype=torch.float64)
    mask = mhbook.causal_mask(5)
    theirs, _ = llama(x, position_embeddings=(cos, sin), attention_mask=additive_mask(mask))
    torch.testing.assert_close(gqa(x, mask=mask)[0], theirs, **CLOSE)


# -- errors and the meta device ----------------------------------------------------------------
def test_num_heads_not_divisible_by_num_kv_heads():
    with pytest.raises(
        ValueError, match=r"divisible by num_kv_heads .*got num_heads=4, num_kv_heads=3$"
    ):
        MultiHeadAttention(D_MODEL, 4, num_kv_heads=3)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"d_model": 10, "num_heads": 4}, "d_model must be divisible by num_heads"),
        ({"num_kv_heads": 0}, r"num_kv_heads must be an int >= 1 or None, got 0"),
        ({"dropout": 1.0}, r"dropout must be a number in \[0.0, 1.0\), got 1.0"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"d_model": D_MODEL, "num_heads": NUM_HEADS, "num_kv_heads": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**args)


def test_bad_inputs():
    gqa = _gqa(2, dtype=torch.float32)
    with pytest.raises(
        ValueError, match=r"query must have shape \(batch, length, d_model=16\), got \(2, 5, 8\)"
    ):
        gqa(torch.zeros(2, 5, 8))
    with pytest.raises(TypeError, match="query has dtype torch.float64"):
        gqa(torch.zeros(2, 5, D_MODEL, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"positions must have shape \(T,\) = \(5,\) .*got \(4,\)"):
        gqa(torch.zeros(2, 5, D_MODEL), positions=torch.arange(4))
    with pytest.raises(TypeError, match="positions must hold integers"):
        gqa(torch.zeros(2, 5, D_MODEL), positions=torch.zeros(5))
    with pytest.raises(TypeError, match="cache must be None or a mhbook.LayerCache"):
        gqa(torch.zeros(2, 5, D_MODEL), cache=mhbook.KVCache(1))
    with pytest.raises(ValueError, match="does not broadcast"):
        gqa(torch.zeros(2, 5, D_MODEL), mask=mhbook.causal_mask(5, 6))
    # The mask is the fourth argument: in second place it would be taken for the key.
    with pytest.raises(TypeError, match="key is a bool tensor: pass a mask as mask="):
        gqa(torch.zeros(2, 5, D_MODEL), mhbook.causal_mask(5))


@pytest.mark.parametrize("position", list(POSITIONS))
def test_meta_device(position):
    meta = torch.device("meta")
    with meta:
        gqa = MultiHeadAttention(
            D_MODEL, NUM_HEADS, num_kv_heads=2, dropout=0.1, bias=False, **POSITIONS[position]
        )
    x = torch.randn(2, 5, D_MODEL, device=meta)
    out, weights = gqa(x, mask=mhbook.causal_mask(5, device=meta), need_weights=True)
    assert out.device.type == "meta" and out.shape == (2, 5, D_MODEL)
    assert weights.shape == (2, NUM_HEADS, 5, 5)
    out.sum().backward()
    cache = mhbook.LayerCache()
    gqa.eval()
    gqa.window = 3  # a local layer: its own mask, a rolling cache
    for step in range(4):
        y, _ = gqa(x[:, :1], cache=cache)
        assert y.device.type == "meta" and cache.num_kept == min(step + 1, 3)


@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
def test_no_dropout_in_eval_mode(num_kv_heads):
    """Attention-weight dropout is for training only: in eval mode a layer with dropout
    gives the output of the same layer without it, call after call."""
    torch.manual_seed(0)
    layer = mhbook.MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads, dropout=0.5).eval()
    plain = copy.deepcopy(layer)
    plain.dropout = 0.0
    x = torch.randn(2, 5, 16)
    expected, _ = plain(x, is_causal=True)
    for need_weights in (False, True, False):
        out, _ = layer(x, is_causal=True, need_weights=need_weights)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    layer.train()
    assert not torch.allclose(layer(x, is_causal=True)[0], expected)  # it does drop in training
