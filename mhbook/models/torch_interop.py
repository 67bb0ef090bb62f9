"""mhbook's layers as PyTorch's and back: every conversion to and from ``torch.nn`` in one place.

* :func:`attention_from_torch` / :func:`attention_to_torch`: a
  :class:`~mhbook.MultiHeadAttention` and an ``nn.MultiheadAttention(..., batch_first=True)``;
* :func:`encoder_block_from_torch` / :func:`decoder_block_from_torch`: an
  :class:`~mhbook.EncoderBlock` from an ``nn.TransformerEncoderLayer``, a
  :class:`~mhbook.DecoderBlock` from an ``nn.TransformerDecoderLayer``.

The weights only change names (and PyTorch packs ``W_q``, ``W_k``, ``W_v`` into one
``in_proj_weight`` when ``kdim`` and ``vdim`` are ``embed_dim``)::

    mhbook                              torch.nn
    W_q / W_k / W_v                     in_proj_weight rows [0:e] / [e:2e] / [2e:3e]
                                        (q_proj_weight / k_proj_weight / v_proj_weight
                                        when kdim or vdim differ), in_proj_bias likewise
    W_o                                 out_proj
    self_attn / cross_attn              self_attn / multihead_attn
    ffn.linear1 / ffn.linear2           linear1 / linear2
    addnorm1.norm / addnorm2 / addnorm3 norm1 / norm2 / norm3

Each conversion gives the same outputs and copies the device, the dtype and the weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.multihead import MultiHeadAttention
from ..core.config import ModelConfig
from .blocks import DecoderBlock, EncoderBlock

__all__ = [
    "attention_from_torch",
    "attention_to_torch",
    "encoder_block_from_torch",
    "decoder_block_from_torch",
]


# -- attention ---------------------------------------------------------------------------------
def attention_from_torch(m: nn.MultiheadAttention) -> MultiHeadAttention:
    """Copy an ``nn.MultiheadAttention(..., batch_first=True)``: same weights, same outputs.

    ``kdim``/``vdim`` are copied too: PyTorch then keeps ``q_proj_weight``,
    ``k_proj_weight`` and ``v_proj_weight`` apart (and one packed ``in_proj_bias``).
    ``batch_first=False`` and ``add_bias_kv=True`` raise a ``ValueError``.
    """
    if not isinstance(m, nn.MultiheadAttention):
        raise TypeError(f"expected nn.MultiheadAttention, got {type(m).__name__}")
    if not m.batch_first:
        raise ValueError(
            "expected nn.MultiheadAttention(..., batch_first=True), got batch_first=False"
        )
    if m.bias_k is not None:
        raise ValueError("nn.MultiheadAttention with add_bias_kv=True is not supported")
    bias = m.in_proj_bias is not None
    e = m.embed_dim
    if m._qkv_same_embed_dim:
        w = m.in_proj_weight
        weights = (w[:e], w[e : 2 * e], w[2 * e :])
    else:
        weights = (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
    p = weights[0]
    ours = MultiHeadAttention(
        e, m.num_heads, dropout=m.dropout, bias=bias, kdim=m.kdim, vdim=m.vdim
    ).to(p.device, p.dtype)
    with torch.no_grad():
        for i, (lin, weight) in enumerate(zip((ours.W_q, ours.W_k, ours.W_v), weights)):
            lin.weight.copy_(weight)
            if bias:
                lin.bias.copy_(m.in_proj_bias[i * e : (i + 1) * e])
        ours.W_o.weight.copy_(m.out_proj.weight)
        if bias:
            ours.W_o.bias.copy_(m.out_proj.bias)
    return ours


def attention_to_torch(attention: MultiHeadAttention) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention(..., batch_first=True, kdim=, vdim=)`` with the same
    weights as ``attention``, on its device and dtype. PyTorch's layer has as many key/value
    heads as query heads, heads of ``embed_dim // num_heads``, no positions inside attention
    and no head mask: a layer with any of these raises a ``ValueError`` naming it."""
    if not isinstance(attention, MultiHeadAttention):
        raise TypeError(f"expected a mhbook.MultiHeadAttention, got {type(attention).__name__}")
    a = attention
    problems = {
        "num_kv_heads": a.num_kv_heads != a.num_heads,
        "d_head": a.num_heads * a.d_head != a.d_model,
        "rope": a.rope is not None,
        "alibi": a.alibi is not None,
        "head_mask": a.head_mask is not None,
    }
    wrong = [name for name, bad in problems.items() if bad]
    if wrong:
        raise ValueError(
            f"nn.MultiheadAttention cannot express this layer's {', '.join(wrong)} "
            f"(num_heads={a.num_heads}, num_kv_heads={a.num_kv_heads}, "
            f"d_head={a.d_head}, d_model={a.d_model}; it needs num_kv_heads == "
            "num_heads, num_heads * d_head == d_model, no rope, alibi or head_mask)"
        )
    bias = a.W_q.bias is not None
    w = a.W_q.weight
    m = nn.MultiheadAttention(
        a.d_model,
        a.num_heads,
        dropout=a.dropout,
        bias=bias,
        batch_first=True,
        kdim=a.kdim,
        vdim=a.vdim,
    ).to(w.device, w.dtype)
    with torch.no_grad():
        if m._qkv_same_embed_dim:
            m.in_proj_weight.copy_(torch.cat([a.W_q.weight, a.W_k.weight, a.W_v.weight]))
        else:
            m.q_proj_weight.copy_(a.W_q.weight)
            m.k_proj_weight.copy_(a.W_k.weight)
            m.v_proj_weight.copy_(a.W_v.weight)
        m.out_proj.weight.copy_(a.W_o.weight)
        if bias:
            m.in_proj_bias.copy_(torch.cat([a.W_q.bias, a.W_k.bias, a.W_v.bias]))
            m.out_proj.bias.copy_(a.W_o.bias)
    return m


# -- blocks ------------------------------------------------------------------------------------
def encoder_block_from_torch(layer: nn.TransformerEncoderLayer) -> EncoderBlock:
    """Copy an ``nn.TransformerEncoderLayer(..., batch_first=True)`` with ReLU or GELU:
    an :class:`~mhbook.EncoderBlock` with the same weights and outputs.

    Same outputs in training too when the dropout is 0. PyTorch's layer also drops the
    feed-forward network's hidden units, which no block of mhbook does (see
    :attr:`ModelConfig.dropout`). Another layer, ``batch_first=False`` or another
    activation raises a ``TypeError`` or ``ValueError`` naming it."""
    return _block_from_torch(
        layer, EncoderBlock, nn.TransformerEncoderLayer, {"self_attn": "self_attn"}
    )


def decoder_block_from_torch(layer: nn.TransformerDecoderLayer) -> DecoderBlock:
    """Copy an ``nn.TransformerDecoderLayer(..., batch_first=True)`` with ReLU or GELU:
    a :class:`~mhbook.DecoderBlock` with the same weights and outputs (its
    ``multihead_attn`` is our ``cross_attn``).

    As :func:`encoder_block_from_torch`: same outputs in training when the dropout is 0;
    another layer, ``batch_first=False`` or another activation raises an error naming it."""
    attentions = {"self_attn": "self_attn", "cross_attn": "multihead_attn"}
    return _block_from_torch(layer, DecoderBlock, nn.TransformerDecoderLayer, attentions)


def _block_from_torch(layer, block_class, torch_class, attentions: dict[str, str]):
    """``block_class`` copying ``layer`` (a ``torch_class``); ``attentions`` maps our
    attention sublayers to PyTorch's names."""
    if not isinstance(layer, torch_class):
        raise TypeError(f"expected {torch_class.__name__}, got {type(layer).__name__}")
    if not layer.self_attn.batch_first:
        raise ValueError(
            f"expected {torch_class.__name__}(..., batch_first=True), got batch_first=False"
        )
    config = ModelConfig(
        d_model=layer.self_attn.embed_dim,
        num_heads=layer.self_attn.num_heads,
        num_layers=1,
        d_ff=layer.linear1.out_features,
        dropout=layer.dropout.p,
        attention_dropout=layer.self_attn.dropout,
        norm_first=layer.norm_first,
        norm_eps=layer.norm1.eps,
        ffn=_activation(layer),
        bias=layer.linear1.bias is not None,
    )
    weight = layer.linear1.weight
    block = block_class(config).to(weight.device, weight.dtype)
    for ours, theirs in attentions.items():
        setattr(block, ours, attention_from_torch(getattr(layer, theirs)))
    with torch.no_grad():
        block.ffn.linear1.load_state_dict(layer.linear1.state_dict())
        block.ffn.linear2.load_state_dict(layer.linear2.state_dict())
        for i in range(1, len(attentions) + 2):  # one norm per sublayer
            norm = getattr(layer, f"norm{i}")
            getattr(block, f"addnorm{i}").norm.load_state_dict(norm.state_dict())
    return block


def _activation(layer) -> str:
    """``"relu"`` or ``"gelu"``: the activation of a PyTorch encoder or decoder layer."""
    act = layer.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return "gelu"
    raise ValueError(f"only ReLU and GELU are supported, got activation {act}")
