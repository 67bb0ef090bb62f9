"""Encoder and decoder blocks: attention, feed-forward, and add & norm around each."""

from __future__ import annotations

import torch
from torch import nn

from .cache import LayerCache
from .config import ModelConfig
from .layers import AddNorm, PositionWiseFFN
from .multihead import MultiHeadAttention

__all__ = ["EncoderBlock", "DecoderBlock"]


class _Block(nn.Module):
    """What both blocks share: a copy of PyTorch's layer (:meth:`from_torch`)."""

    #: the PyTorch layer this block mirrors, and its attentions: ours -> PyTorch's name
    torch_layer: type[nn.Module]
    attentions: dict[str, str]

    @classmethod
    def from_torch(cls, layer: nn.Module) -> _Block:
        """Copy a PyTorch layer (:attr:`torch_layer`, ``batch_first=True``, ReLU):
        same weights, same outputs.

        Same outputs in training too when the dropout is 0. PyTorch's layer also drops
        attention weights and the feed-forward network's hidden units; ours drops only
        what the paper drops (see :class:`EncoderBlock`)."""
        _check_torch_layer(layer, cls.torch_layer)
        config = ModelConfig(
            d_model=layer.self_attn.embed_dim,
            num_heads=layer.self_attn.num_heads,
            num_layers=1,
            d_ff=layer.linear1.out_features,
            dropout=layer.dropout.p,
            norm_first=layer.norm_first,
            norm_eps=layer.norm1.eps,
        )
        block = cls(config).to(layer.linear1.weight.device, layer.linear1.weight.dtype)
        for ours, theirs in cls.attentions.items():
            attention = MultiHeadAttention.from_torch(getattr(layer, theirs))
            attention.dropout = 0.0  # the block drops out where the paper does (see below)
            setattr(block, ours, attention)
        with torch.no_grad():
            block.ffn.linear1.load_state_dict(layer.linear1.state_dict())
            block.ffn.linear2.load_state_dict(layer.linear2.state_dict())
            for i in range(1, len(cls.attentions) + 2):  # one norm per sublayer
                norm = getattr(layer, f"norm{i}")
                getattr(block, f"addnorm{i}").norm.load_state_dict(norm.state_dict())
        return block


class EncoderBlock(_Block):
    """Self-attention then a feed-forward network, each wrapped in :class:`AddNorm`.

    Args:
        config: a :class:`mhbook.ModelConfig`; the block uses its ``d_model``,
            ``num_heads``, ``head_dim`` (the size of one head; ``None``: ``d_model //
            num_heads``), ``d_ff`` (the feed-forward network's hidden size), ``dropout``
            (on each sublayer's output before it is added to the residual, the paper's
            "residual dropout"; not on the attention weights or inside the FFN, which
            the paper does not drop),
            ``norm_first`` (``False`` for post-norm, the paper; ``True`` for pre-norm)
            and ``norm_eps``. ``num_layers`` does not concern a block.

    Example: ``EncoderBlock(ModelConfig(d_model=512, num_heads=8, d_ff=2048))``.

    ``from_torch(layer)`` copies an ``nn.TransformerEncoderLayer(..., batch_first=True)``.
    """

    torch_layer = nn.TransformerEncoderLayer
    attentions = {"self_attn": "self_attn"}

    def __init__(self, config: ModelConfig):
        super().__init__()
        d, p = config.d_model, config.dropout
        # Dropout only on the sublayers' outputs (in AddNorm), as in the paper (Sec. 5.4).
        self.self_attn = MultiHeadAttention(d, config.num_heads, d_head=config.head_dim)
        self.ffn = PositionWiseFFN(d, config.d_ff)
        self.addnorm1 = AddNorm(d, p, config.norm_first, config.norm_eps)
        self.addnorm2 = AddNorm(d, p, config.norm_first, config.norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` ``(batch, L, d_model)``; ``mask`` bool, broadcastable to ``(batch, h, L, L)``."""
        x = self.addnorm1(x, lambda x: self.self_attn(x, x, x, mask))
        return self.addnorm2(x, self.ffn)


class DecoderBlock(_Block):
    """Masked self-attention, cross-attention to the encoder's output, then a
    feed-forward network, each wrapped in :class:`AddNorm`.

    Arguments as for :class:`EncoderBlock`. ``from_torch(layer)`` copies an
    ``nn.TransformerDecoderLayer(..., batch_first=True)``.
    """

    torch_layer = nn.TransformerDecoderLayer
    attentions = {"self_attn": "self_attn", "cross_attn": "multihead_attn"}

    def __init__(self, config: ModelConfig):
        super().__init__()
        d, p = config.d_model, config.dropout
        # Dropout only on the sublayers' outputs (in AddNorm), as in the paper (Sec. 5.4).
        self.self_attn = MultiHeadAttention(d, config.num_heads, d_head=config.head_dim)
        self.cross_attn = MultiHeadAttention(d, config.num_heads, d_head=config.head_dim)
        self.ffn = PositionWiseFFN(d, config.d_ff)
        self.addnorm1 = AddNorm(d, p, config.norm_first, config.norm_eps)
        self.addnorm2 = AddNorm(d, p, config.norm_first, config.norm_eps)
        self.addnorm3 = AddNorm(d, p, config.norm_first, config.norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        self_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        *,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """Run the block.

        Args:
            x: ``(batch, T, d_model)``, the target tokens so far (or only the new
                ones when ``cache`` holds the earlier ones).
            memory: ``(batch, S, d_model)``, the encoder's output.
            self_mask: bool, broadcastable to ``(batch, h, T, T_total)``, e.g.
                :func:`mhbook.causal_mask` (or pass ``is_causal=True``).
            memory_mask: bool, broadcastable to ``(batch, h, T, S)``; usually
                :func:`mhbook.padding_mask` of the source.
            cache: ``None`` in training. When decoding, this block's
                :class:`mhbook.LayerCache`: the new tokens' keys and values are added
                to it (:meth:`~mhbook.LayerCache.update`), and ``memory`` is projected
                into its ``memory_keys``/``memory_values`` on the first step only.
            is_causal: the self-attention also applies ``causal_mask(T, T_total)``,
                built only where needed (:func:`mhbook.attend`); what
                :class:`~mhbook.TransformerDecoder` passes.

        Returns:
            ``(batch, T, d_model)``.
        """
        x = self.addnorm1(x, lambda x: self._self_attention(x, self_mask, cache, is_causal))
        x = self.addnorm2(x, lambda x: self._cross_attention(x, memory, memory_mask, cache))
        return self.addnorm3(x, self.ffn)

    def _self_attention(self, x, mask, cache, is_causal):
        k, v = self.self_attn.project_kv(x, x)  # only the new tokens are projected
        if cache is not None:
            k, v = cache.update(k, v)  # the earlier tokens' keys and values, then these
        return self.self_attn.attend(x, k, v, mask, is_causal=is_causal)

    def _cross_attention(self, x, memory, mask, cache):
        if cache is None:
            k, v = self.cross_attn.project_kv(memory, memory)
        else:
            if cache.memory_keys is None:  # the first step: project the memory once
                cache.memory_keys, cache.memory_values = self.cross_attn.project_kv(memory, memory)
            k, v = cache.memory_keys, cache.memory_values
        return self.cross_attn.attend(x, k, v, mask)


def _check_torch_layer(layer, kind) -> None:
    if not isinstance(layer, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(layer).__name__}")
    if not layer.self_attn.batch_first:
        raise ValueError(f"expected {kind.__name__}(..., batch_first=True), got batch_first=False")
    if getattr(layer, "activation_relu_or_gelu", 1) != 1:
        raise ValueError(f"only ReLU is supported, got activation {layer.activation}")
