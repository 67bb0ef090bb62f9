"""EncoderBlock and DecoderBlock against nn.TransformerEncoderLayer and
nn.TransformerDecoderLayer (batch_first, ReLU, dropout 0, post- and pre-norm):
forward and gradients, with padding and causal masks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import randn as _randn
from helpers import upstream as _upstream
from torch import nn

import mhbook

D_MODEL, NUM_HEADS, D_FF = 16, 4, 32


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def norm_first(request) -> bool:
    return request.param


def _backward_both(ours_out, theirs_out, inputs):
    """Backpropagate the same random upstream gradient through both outputs; return
    the input gradients of each side (parameter gradients land in ``.grad``)."""
    g = _upstream(ours_out)
    ours = torch.autograd.grad((ours_out * g).sum(), inputs, retain_graph=True)
    (ours_out * g).sum().backward()
    theirs = torch.autograd.grad((theirs_out * g).sum(), inputs, retain_graph=True)
    (theirs_out * g).sum().backward()
    return ours, theirs


@pytest.mark.parametrize("masks", ["none", "padding", "causal", "causal+padding"])
def test_encoder_block_matches_torch(masks, norm_first, dtype, assert_close, assert_same_grads):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        D_MODEL, NUM_HEADS, D_FF, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=dtype
    )
    block = mhbook.encoder_block_from_torch(layer)
    x = _randn(3, 6, D_MODEL, dtype=dtype, seed=1)
    pad = mhbook.padding_mask(torch.tensor([6, 4, 1]), 6) if "padding" in masks else None
    causal = mhbook.causal_mask(6) if "causal" in masks else None
    mask = pad if causal is None else causal if pad is None else causal & pad

    out = block(x, mask)
    expected = layer(
        x,
        src_mask=None if causal is None else ~causal,  # PyTorch: True = not allowed
        src_key_padding_mask=None if pad is None else ~pad[:, 0, 0],
    )
    assert_close(out, expected, "output")
    (grad_ours,), (grad_theirs,) = _backward_both(out, expected, (x,))
    assert_close(grad_ours, grad_theirs, "gradient w.r.t. x")
    assert_same_grads(block, layer)


def test_encoder_block_matches_torch_eval(norm_first, dtype, assert_close):
    """Eval mode without grad, where PyTorch may take its native fast path."""
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(
        D_MODEL, NUM_HEADS, D_FF, dropout=0.1, batch_first=True, norm_first=norm_first, dtype=dtype
    ).eval()
    block = mhbook.encoder_block_from_torch(layer).eval()
    x = _randn(3, 6, D_MODEL, dtype=dtype, seed=2).detach()
    pad = mhbook.padding_mask(torch.tensor([6, 4, 2]), 6)
    with torch.no_grad():
        out = block(x, pad)
        expected = layer(x, src_key_padding_mask=~pad[:, 0, 0])
    valid = pad[:, 0, 0]  # a fast path may leave padded positions out: compare real ones
    assert_close(out[valid], expected[valid])


@pytest.mark.parametrize("tgt_padding", [False, True], ids=["tgt-full", "tgt-padded"])
def test_decoder_block_matches_torch(
    tgt_padding, norm_first, dtype, assert_close, assert_same_grads
):
    torch.manual_seed(2)
    layer = nn.TransformerDecoderLayer(
        D_MODEL, NUM_HEADS, D_FF, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=dtype
    )
    block = mhbook.decoder_block_from_torch(layer)
    tgt = _randn(3, 5, D_MODEL, dtype=dtype, seed=3)
    memory = _randn(3, 7, D_MODEL, dtype=dtype, seed=4)
    causal = mhbook.causal_mask(5)
    memory_mask = mhbook.padding_mask(torch.tensor([7, 3, 1]), 7)
    tgt_pad = mhbook.padding_mask(torch.tensor([5, 2, 4]), 5) if tgt_padding else None
    self_mask = causal if tgt_pad is None else causal & tgt_pad

    out = block(tgt, memory, self_mask, memory_mask)
    expected = layer(
        tgt,
        memory,
        tgt_mask=~causal,
        memory_key_padding_mask=~memory_mask[:, 0, 0],
        tgt_key_padding_mask=None if tgt_pad is None else ~tgt_pad[:, 0, 0],
    )
    assert_close(out, expected, "output")
    ours, theirs = _backward_both(out, expected, (tgt, memory))
    assert_close(ours[0], theirs[0], "gradient w.r.t. tgt")
    assert_close(ours[1], theirs[1], "gradient w.r.t. memory")
    assert_same_grads(block, layer)


def test_decoder_block_cache_step_by_step_equals_full(norm_first, dtype, assert_close):
    """Feeding one token at a time with a KV cache gives the rows of the full causal pass."""
    torch.manual_seed(3)
    config = mhbook.ModelConfig(D_MODEL, NUM_HEADS, 1, D_FF, norm_first=norm_first)
    block = mhbook.DecoderBlock(config).to(dtype).eval()
    tgt = _randn(2, 6, D_MODEL, dtype=dtype, seed=5).detach()
    memory = _randn(2, 4, D_MODEL, dtype=dtype, seed=6).detach()
    memory_mask = mhbook.padding_mask(torch.tensor([4, 2]), 4)
    with torch.no_grad():
        full = block(tgt, memory, mhbook.causal_mask(6), memory_mask)
        cache = mhbook.LayerCache()
        steps = []
        for t in range(6):
            steps.append(
                block(tgt[:, t : t + 1], memory, mhbook.causal_mask(1, t + 1), memory_mask, cache)
            )
    assert cache.length == 6
    assert cache.keys.shape == cache.values.shape == (2, NUM_HEADS, 6, D_MODEL // NUM_HEADS)
    assert cache.memory_keys.shape == (2, NUM_HEADS, 4, D_MODEL // NUM_HEADS)
    assert_close(torch.cat(steps, dim=1), full)


def test_from_torch_rejects_other_layers():
    silu = nn.TransformerEncoderLayer(D_MODEL, NUM_HEADS, D_FF, batch_first=True, activation=F.silu)
    with pytest.raises(ValueError, match="only ReLU and GELU are supported"):
        mhbook.encoder_block_from_torch(silu)
    seq_first = nn.TransformerDecoderLayer(D_MODEL, NUM_HEADS, D_FF)
    with pytest.raises(ValueError, match="batch_first=True"):
        mhbook.decoder_block_from_torch(seq_first)
    with pytest.raises(TypeError, match="expected TransformerDecoderLayer, got TransformerEncoder"):
        mhbook.decoder_block_from_torch(silu)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_from_torch_copies_a_gelu_layer(kind, norm_first, dtype, assert_close):
    """GELU (BERT, GPT-2): ModelConfig(ffn="gelu"), PyTorch's exact GELU."""
    torch.manual_seed(5)
    layer_class = nn.TransformerEncoderLayer if kind == "encoder" else nn.TransformerDecoderLayer
    layer = layer_class(
        D_MODEL, NUM_HEADS, D_FF, dropout=0.0, batch_first=True, norm_first=norm_first,
        activation="gelu", dtype=dtype,
    )  # fmt: skip
    from_torch = (
        mhbook.encoder_block_from_torch if kind == "encoder" else mhbook.decoder_block_from_torch
    )
    block = from_torch(layer)
    assert isinstance(block, mhbook.EncoderBlock if kind == "encoder" else mhbook.DecoderBlock)
    assert block.ffn.activation == "gelu"
    x = _randn(3, 5, D_MODEL, dtype=dtype, seed=9)
    if kind == "encoder":
        out, expected = block(x), layer(x)
    else:
        memory = _randn(3, 4, D_MODEL, dtype=dtype, seed=10)
        causal = mhbook.causal_mask(5)
        out, expected = block(x, memory, causal), layer(x, memory, tgt_mask=~causal)
    assert_close(out, expected, "output")


# -- is_causal, and dropout where the paper puts it ------------------------------------------
@pytest.mark.parametrize("tgt_padding", [False, True], ids=["tgt-full", "tgt-padded"])
def test_decoder_block_is_causal_equals_the_causal_mask(
    tgt_padding, norm_first, dtype, assert_close
):
    """``is_causal=True`` (what TransformerDecoder passes) is ``self_mask=causal_mask(T)``,
    forward and gradients, with or without a padding mask of its own."""
    torch.manual_seed(4)
    config = mhbook.ModelConfig(D_MODEL, NUM_HEADS, 1, D_FF, norm_first=norm_first)
    block = mhbook.DecoderBlock(config).to(dtype)
    tgt = _randn(3, 5, D_MODEL, dtype=dtype, seed=7)
    memory = _randn(3, 4, D_MODEL, dtype=dtype, seed=8)
    memory_mask = mhbook.padding_mask(torch.tensor([4, 2, 1]), 4)
    pad = mhbook.padding_mask(torch.tensor([5, 2, 4]), 5) if tgt_padding else None
    causal = mhbook.causal_mask(5) if pad is None else mhbook.causal_mask(5) & pad
    ours = block(tgt, memory, pad, memory_mask, is_causal=True)
    written = block(tgt, memory, causal, memory_mask)
    assert_close(ours, written, "output")
    g = _upstream(ours)
    a = torch.autograd.grad((ours * g).sum(), (tgt, memory))
    b = torch.autograd.grad((written * g).sum(), (tgt, memory))
    for name, x, y in zip(("tgt", "memory"), a, b):
        assert_close(x, y, f"gradient w.r.t. {name}")


def test_decoder_block_is_causal_with_a_cache_steps_like_the_full_pass(dtype, assert_close):
    torch.manual_seed(3)
    block = mhbook.DecoderBlock(mhbook.ModelConfig(D_MODEL, NUM_HEADS, 1, D_FF)).to(dtype).eval()
    tgt = _randn(2, 6, D_MODEL, dtype=dtype, seed=5).detach()
    memory = _randn(2, 4, D_MODEL, dtype=dtype, seed=6).detach()
    with torch.no_grad():
        full = block(tgt, memory, is_causal=True)
        cache = mhbook.LayerCache()
        steps = [block(tgt[:, :2], memory, cache=cache, is_causal=True)]  # a chunk of 2 first
        steps += [
            block(tgt[:, t : t + 1], memory, cache=cache, is_causal=True) for t in range(2, 6)
        ]
    assert_close(torch.cat(steps, dim=1), full)


def test_blocks_drop_out_only_the_sublayer_outputs():
    """The paper's residual dropout (Sec. 5.4): ModelConfig.dropout is one dropout per
    sublayer output (in AddNorm), none on the attention weights (that is
    ModelConfig.attention_dropout, 0 by default), none in the FFN."""
    config = mhbook.ModelConfig(D_MODEL, NUM_HEADS, 1, D_FF, dropout=0.1)
    for block in (mhbook.EncoderBlock(config), mhbook.DecoderBlock(config)):
        attentions = [m for m in block.modules() if isinstance(m, mhbook.MultiHeadAttention)]
        assert attentions and all(m.dropout == 0.0 for m in attentions)
        assert not any(isinstance(m, nn.Dropout) for m in block.ffn.modules())
        addnorms = [m for m in block.modules() if isinstance(m, mhbook.AddNorm)]
        assert len(addnorms) == len(attentions) + 1 and all(a.dropout.p == 0.1 for a in addnorms)
    attention_only = config.replace(dropout=0.0, attention_dropout=0.2)
    for block in (mhbook.EncoderBlock(attention_only), mhbook.DecoderBlock(attention_only)):
        attentions = [m for m in block.modules() if isinstance(m, mhbook.MultiHeadAttention)]
        assert attentions and all(m.dropout == 0.2 for m in attentions)
        addnorms = [m for m in block.modules() if isinstance(m, mhbook.AddNorm)]
        assert all(a.dropout.p == 0.0 for a in addnorms)
    # A copy of PyTorch's layer drops what it drops: its residual dropout in AddNorm, its
    # attention dropout (PyTorch's layer passes its dropout to the attention too).
    layer = nn.TransformerEncoderLayer(D_MODEL, NUM_HEADS, D_FF, dropout=0.1, batch_first=True)
    block = mhbook.encoder_block_from_torch(layer)
    assert block.self_attn.dropout == layer.self_attn.dropout == 0.1
    assert block.addnorm1.dropout.p == block.addnorm2.dropout.p == 0.1
