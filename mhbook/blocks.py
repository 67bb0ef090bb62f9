"""Encoder and decoder blocks: attention, feed-forward, and add & norm around each."""

from __future__ import annotations

import torch
from torch import nn

from .layers import AddNorm, PositionWiseFFN
from .multihead import MultiHeadAttention

__all__ = ["EncoderBlock", "DecoderBlock"]


class EncoderBlock(nn.Module):
    """Self-attention then a feed-forward network, each wrapped in :class:`AddNorm`.

    Args:
        d_model, num_heads: as in :class:`MultiHeadAttention`.
        d_ff: hidden size of the feed-forward network.
        dropout: dropout on attention weights, inside the FFN and on each residual branch.
        norm_first: ``False`` for post-norm (the paper), ``True`` for pre-norm.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        eps: float = 1e-5,
    ):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ffn = PositionWiseFFN(d_model, d_ff, dropout)
        self.addnorm1 = AddNorm(d_model, dropout, norm_first, eps)
        self.addnorm2 = AddNorm(d_model, dropout, norm_first, eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` ``(batch, L, d_model)``; ``mask`` bool, broadcastable to ``(batch, h, L, L)``."""
        x = self.addnorm1(x, lambda x: self.self_attn(x, x, x, mask))
        return self.addnorm2(x, self.ffn)

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> EncoderBlock:
        """Copy an ``nn.TransformerEncoderLayer(..., batch_first=True)`` with ReLU."""
        _check_torch_layer(layer, nn.TransformerEncoderLayer)
        block = cls(
            layer.self_attn.embed_dim,
            layer.self_attn.num_heads,
            layer.linear1.out_features,
            dropout=layer.dropout.p,
            norm_first=layer.norm_first,
            eps=layer.norm1.eps,
        ).to(layer.linear1.weight.device, layer.linear1.weight.dtype)
        block.self_attn = MultiHeadAttention.from_torch(layer.self_attn)
        _copy_ffn_and_norms(layer, block.ffn, [block.addnorm1, block.addnorm2])
        return block


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention to the encoder's output, then a
    feed-forward network, each wrapped in :class:`AddNorm`.

    Arguments as for :class:`EncoderBlock`.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        eps: float = 1e-5,
    ):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ffn = PositionWiseFFN(d_model, d_ff, dropout)
        self.addnorm1 = AddNorm(d_model, dropout, norm_first, eps)
        self.addnorm2 = AddNorm(d_model, dropout, norm_first, eps)
        self.addnorm3 = AddNorm(d_model, dropout, norm_first, eps)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        self_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        cache: dict | None = None,
    ) -> torch.Tensor:
        """Run the block.

        Args:
            x: ``(batch, T, d_model)``, the target tokens so far (or only the new
                ones when ``cache`` holds the earlier ones).
            memory: ``(batch, S, d_model)``, the encoder's output.
            self_mask: bool, broadcastable to ``(batch, h, T, T_total)``; usually
                :func:`mhbook.causal_mask`.
            memory_mask: bool, broadcastable to ``(batch, h, T, S)``; usually
                :func:`mhbook.padding_mask` of the source.
            cache: ``None`` in training. When decoding, a dict this block fills:
                ``cache["self"]`` holds the projected keys and values of every
                earlier target token, ``cache["memory"]`` those of ``memory``
                (projected once, on the first step).

        Returns:
            ``(batch, T, d_model)``.
        """
        x = self.addnorm1(x, lambda x: self._self_attention(x, self_mask, cache))
        x = self.addnorm2(x, lambda x: self._cross_attention(x, memory, memory_mask, cache))
        return self.addnorm3(x, self.ffn)

    def _self_attention(self, x, mask, cache):
        k, v = self.self_attn.project_kv(x, x)  # only the new tokens are projected
        if cache is not None:
            if "self" in cache:
                k_old, v_old = cache["self"]
                k, v = torch.cat([k_old, k], dim=2), torch.cat([v_old, v], dim=2)
            cache["self"] = (k, v)
        return self.self_attn.attend(x, k, v, mask)

    def _cross_attention(self, x, memory, mask, cache):
        if cache is not None and "memory" in cache:
            k, v = cache["memory"]
        else:
            k, v = self.cross_attn.project_kv(memory, memory)
            if cache is not None:
                cache["memory"] = (k, v)
        return self.cross_attn.attend(x, k, v, mask)

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> DecoderBlock:
        """Copy an ``nn.TransformerDecoderLayer(..., batch_first=True)`` with ReLU."""
        _check_torch_layer(layer, nn.TransformerDecoderLayer)
        block = cls(
            layer.self_attn.embed_dim,
            layer.self_attn.num_heads,
            layer.linear1.out_features,
            dropout=layer.dropout.p,
            norm_first=layer.norm_first,
            eps=layer.norm1.eps,
        ).to(layer.linear1.weight.device, layer.linear1.weight.dtype)
        block.self_attn = MultiHeadAttention.from_torch(layer.self_attn)
        block.cross_attn = MultiHeadAttention.from_torch(layer.multihead_attn)
        _copy_ffn_and_norms(layer, block.ffn, [block.addnorm1, block.addnorm2, block.addnorm3])
        return block


def _check_torch_layer(layer, kind) -> None:
    if not isinstance(layer, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(layer).__name__}")
    if not layer.self_attn.batch_first:
        raise ValueError(f"expected {kind.__name__}(..., batch_first=True), got batch_first=False")
    if getattr(layer, "activation_relu_or_gelu", 1) != 1:
        raise ValueError(f"only ReLU is supported, got activation {layer.activation}")


def _copy_ffn_and_norms(layer, ffn: PositionWiseFFN, addnorms: list[AddNorm]) -> None:
    norms = [layer.norm1, layer.norm2, getattr(layer, "norm3", None)]
    with torch.no_grad():
        ffn.linear1.load_state_dict(layer.linear1.state_dict())
        ffn.linear2.load_state_dict(layer.linear2.state_dict())
        for addnorm, norm in zip(addnorms, norms):
            addnorm.norm.load_state_dict(norm.state_dict())
