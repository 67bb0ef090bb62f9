"""The blocks every model of mhbook is a stack of, each built from a :class:`ModelConfig`.

* :func:`make_attention`: the attention layer the config describes (multi-head,
  grouped-query, multi-query or latent; RoPE, ALiBi or no position inside it). Every
  block gets its attention from it, so every model obeys the config alike.
* :class:`EncoderBlock`: self-attention, then a feed-forward network.
* :class:`DecoderBlock`: masked self-attention, cross-attention to the encoder's output,
  then a feed-forward network.
* :class:`DecoderOnlyBlock`: masked self-attention, then a feed-forward network.
* :class:`Stack`: token embedding, ``num_layers`` blocks, a final norm for pre-norm and
  optionally the output layer to vocabulary logits: what the encoder, the decoder and the
  decoder-only language model share.

Each sublayer sits in an :class:`~mhbook.models.layers.AddNorm`: the residual connection with
the config's norm (``"layer"`` or ``"rms"``), before (``norm_first``) or after the
sublayer, and the residual dropout.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.cache import KVCache, LayerCache
from ..attention.multihead import MultiHeadAttention
from ..core.config import ModelConfig
from ..core.validate import check_int, check_tokens
from .layers import AddNorm, PositionalEncoding, make_ffn, make_norm

__all__ = [
    "make_attention",
    "EncoderBlock",
    "DecoderBlock",
    "DecoderOnlyBlock",
    "Stack",
]


def make_attention(
    config: ModelConfig, *, cross: bool = False, decoder_only: bool = False
) -> nn.Module:
    """The attention layer ``config`` describes.

    * Self-attention with ``config.d_latent`` set: multi-head latent attention
      (:class:`mhbook.MultiHeadLatentAttention`), with a decoupled RoPE part of
      :attr:`ModelConfig.d_rope` features when ``config.position == "rope"``;
    * otherwise :class:`~mhbook.MultiHeadAttention` with ``config.kv_heads`` key/value
      heads (``num_heads`` of them: multi-head attention; 1: multi-query attention),
      with a :class:`mhbook.RotaryEmbedding` of base ``config.rope_theta`` (scaled by
      ``config.rope_scaling``) when ``config.position == "rope"`` and an
      :class:`mhbook.ALiBi` when it is ``"alibi"`` (in self-attention only:
      cross-attention has no shared positions, and never a latent).

    Args:
        config: the model's :class:`~mhbook.ModelConfig`.
        cross: cross-attention of a decoder to the encoder's output.
        decoder_only: for a decoder-only model: with ``config.bias=None`` no biases in
            the projections (as chapter 9's model has them), and the queries projected
            before the keys and values, as chapter 9's models were trained (the same
            output; the last bits of training follow that order).

    Every layer is called ``layer(x, key=None, value=None, mask=None, *, is_causal,
    positions, cache, need_weights)`` and returns ``(output, weights or None)``.
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a mhbook.ModelConfig, got {type(config).__name__}")
    bias = config.bias if config.bias is not None else not decoder_only
    if config.d_latent is not None and not cross:
        from ..attention.mla import MultiHeadLatentAttention

        if config.sinks and config.position == "rope":
            raise ValueError(
                f"ModelConfig.sinks={config.sinks} with d_latent={config.d_latent} and "
                "position='rope': latent attention caches its RoPE key rotated, at the text "
                "positions, so it cannot place keys within the cache as sinks need"
            )
        if config.position == "alibi":
            raise ValueError(
                "ModelConfig.position='alibi' with d_latent: latent attention with ALiBi "
                "is not built (its absorbed form attends over latents, not positions)"
            )
        return MultiHeadLatentAttention(
            config.d_model,
            config.num_heads,
            config.d_latent,
            config.attention_dropout,
            bias,
            d_head=config.head_dim,
            d_rope=config.d_rope,
            rope_base=config.rope_theta,
        )
    extra: dict[str, nn.Module] = {}
    if not cross and config.position == "rope":
        from ..attention.rope import RotaryEmbedding

        extra["rope"] = RotaryEmbedding(
            config.d_head, config.rope_theta, scaling=config.rope_scaling
        )
    elif not cross and config.position == "alibi":
        from ..attention.alibi import ALiBi

        extra["alibi"] = ALiBi(config.num_heads)
    layer = MultiHeadAttention(
        config.d_model,
        config.num_heads,
        num_kv_heads=config.num_kv_heads,
        dropout=config.attention_dropout,
        bias=bias,
        d_head=config.head_dim,
        **extra,
    )
    layer._queries_first = decoder_only  # chapters 9-12's training, bit for bit
    return layer


def _make_ffn(config: ModelConfig) -> nn.Module | None:
    """The block's feed-forward network, ``None`` for ``ffn="none"`` (attention only)."""
    return None if config.ffn == "none" else make_ffn(config)


def _add_norm(config: ModelConfig) -> AddNorm:
    """A residual connection with the config's norm, its placement and its dropout."""
    return AddNorm(config.d_model, config.dropout, config.norm_first, norm=make_norm(config))


class _Block(nn.Module):
    """What the encoder and decoder blocks share: a copy of PyTorch's layer (:meth:`from_torch`)."""

    #: the PyTorch layer this block mirrors, and its attentions: ours -> PyTorch's name
    torch_layer: type[nn.Module]
    attentions: dict[str, str]

    @classmethod
    def from_torch(cls, layer: nn.Module) -> _Block:
        """Copy a PyTorch layer (:attr:`torch_layer`, ``batch_first=True``, ReLU or GELU):
        same weights, same outputs.

        Same outputs in training too when the dropout is 0. PyTorch's layer also drops
        the feed-forward network's hidden units, which no block of mhbook does (see
        :attr:`ModelConfig.dropout`)."""
        _check_torch_layer(layer, cls.torch_layer)
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
        block = cls(config).to(layer.linear1.weight.device, layer.linear1.weight.dtype)
        for ours, theirs in cls.attentions.items():
            setattr(block, ours, MultiHeadAttention.from_torch(getattr(layer, theirs)))
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
        config: a :class:`mhbook.ModelConfig`. The block obeys every field but
            ``num_layers`` (a stack's) and ``window`` (which :class:`Stack` refuses for an
            encoder): the attention from :func:`make_attention`, the FFN
            (``ffn``, ``d_ff``), the norms (``norm``, ``norm_eps``, ``norm_first``),
            ``bias`` and the residual ``dropout`` (on each sublayer's output before it is
            added to the residual, the paper's "residual dropout").

    Example: ``EncoderBlock(ModelConfig(d_model=512, num_heads=8, d_ff=2048))``.

    ``from_torch(layer)`` copies an ``nn.TransformerEncoderLayer(..., batch_first=True)``.
    """

    torch_layer = nn.TransformerEncoderLayer
    attentions = {"self_attn": "self_attn"}

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = make_attention(config)
        self.ffn = _make_ffn(config)
        self.addnorm1 = _add_norm(config)
        self.addnorm2 = _add_norm(config) if self.ffn is not None else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` ``(batch, L, d_model)``; ``mask`` bool, broadcastable to ``(batch, h, L, L)``."""
        x = self.addnorm1(x, lambda x: self.self_attn(x, mask=mask)[0])
        return x if self.ffn is None else self.addnorm2(x, self.ffn)


class DecoderBlock(_Block):
    """Masked self-attention, cross-attention to the encoder's output, then a
    feed-forward network, each wrapped in :class:`AddNorm`.

    Arguments as for :class:`EncoderBlock`; the cross-attention comes from
    ``make_attention(config, cross=True)``. ``from_torch(layer)`` copies an
    ``nn.TransformerDecoderLayer(..., batch_first=True)``.
    """

    torch_layer = nn.TransformerDecoderLayer
    attentions = {"self_attn": "self_attn", "cross_attn": "multihead_attn"}

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = make_attention(config)
        self.cross_attn = make_attention(config, cross=True)
        self.ffn = _make_ffn(config)
        self.addnorm1 = _add_norm(config)
        self.addnorm2 = _add_norm(config)
        self.addnorm3 = _add_norm(config) if self.ffn is not None else None

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
                :class:`mhbook.LayerCache`, which both attentions update themselves:
                the self-attention adds the new tokens' keys and values, and the
                cross-attention projects ``memory`` into it on the first step only.
            is_causal: the self-attention also applies ``causal_mask(T, T_total)``,
                built only where needed (:func:`mhbook.attend`); what
                :class:`~mhbook.TransformerDecoder` passes.

        Returns:
            ``(batch, T, d_model)``.
        """
        x = self.addnorm1(
            x, lambda x: self.self_attn(x, mask=self_mask, is_causal=is_causal, cache=cache)[0]
        )
        x = self.addnorm2(x, lambda x: self.cross_attn(x, memory, mask=memory_mask, cache=cache)[0])
        return x if self.ffn is None else self.addnorm3(x, self.ffn)


class DecoderOnlyBlock(nn.Module):
    """Masked self-attention then a feed-forward network, each in an :class:`AddNorm`
    (pre-norm with ``config.norm_first``, the paper's post-norm otherwise).

    An encoder block with a causal mask, or a decoder block without cross-attention; with
    ``norm="rms"``, ``ffn="swiglu"``, ``bias=False``, ``position="rope"`` and
    ``norm_first=True``, Llama's decoder layer. With ``ffn="none"`` the self-attention
    alone (``ffn`` and ``addnorm2`` are ``None``): the attention-only blocks of Elhage et
    al. (2021).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = make_attention(config, decoder_only=True)
        self.ffn = _make_ffn(config)
        self.addnorm1 = _add_norm(config)
        self.addnorm2 = _add_norm(config) if self.ffn is not None else None

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        *,
        is_causal: bool = False,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` ``(batch, T, d_model)``; ``mask`` bool, broadcastable to
        ``(batch, h, T, S)``; ``cache`` this block's :class:`mhbook.LayerCache` or ``None``;
        ``positions`` ``(T,)`` or ``(batch, T)`` (see :class:`mhbook.MultiHeadAttention`)."""
        x = self.addnorm1(
            x,
            lambda x: self.self_attn(
                x, mask=mask, is_causal=is_causal, positions=positions, cache=cache
            )[0],
        )
        return x if self.ffn is None else self.addnorm2(x, self.ffn)


class Stack(nn.Module):
    """Token embedding, ``config.num_layers`` blocks, a final norm (pre-norm only) and,
    with ``output=True``, a linear layer to vocabulary logits: what the encoder, the
    decoder and the decoder-only language model share.

    The embedding obeys ``scale_embeddings`` (times ``sqrt(d_model)``), ``position``
    (``"sinusoidal"`` adds chapter 5's encoding; the others act inside attention) and
    ``dropout``; the output layer ``bias`` and ``tie_embeddings`` (it then shares the
    embedding's matrix).

    Args:
        config: a :class:`mhbook.ModelConfig`.
        vocab_size: the number of tokens.
        block: the block class, built as ``block(config)``.
        output: add the output layer.
    """

    def __init__(
        self, config: ModelConfig, vocab_size: int, block: type[nn.Module], output: bool = False
    ):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a mhbook.ModelConfig, got {type(config).__name__}")
        check_int("vocab_size", vocab_size)
        self.config = config
        self.d_model = config.d_model
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, config.d_model)
        if config.position == "sinusoidal":
            self.pos_encoding = PositionalEncoding(config.d_model, config.dropout)
        else:
            self.pos_encoding = None
            self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(block(config) for _ in range(config.num_layers))
        self.norm = make_norm(config) if config.norm_first else nn.Identity()
        if output:
            self.output = nn.Linear(config.d_model, vocab_size, bias=config.bias is not False)
            if config.tie_embeddings:
                self.output.weight = self.embedding.weight

    def embed(self, tokens: torch.Tensor, name: str, offset: int = 0) -> torch.Tensor:
        """``(batch, L)`` token ids -> ``(batch, L, d_model)`` embeddings (scaled by
        ``sqrt(d_model)`` if the config says so), plus the sinusoidal positions from
        ``offset`` (if the config's position is sinusoidal), then dropout."""
        check_tokens(name, tokens, self.vocab_size, self.embedding.weight.device)
        x = self.embedding(tokens)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.d_model)
        if self.pos_encoding is not None:
            return self.pos_encoding(x, offset=offset)
        return self.dropout(x)

    def new_cache(self) -> KVCache:
        """An empty :class:`mhbook.KVCache`, one layer cache per block; with
        ``config.window`` a rolling one that keeps the last ``window`` tokens (and the
        first ``config.sinks``) in the layers that have the window
        (:attr:`~mhbook.ModelConfig.layer_windows`). The one place where a model's cache
        is made."""
        windows = self._cache_windows()
        return KVCache(len(windows), window=windows, sinks=self.config.sinks)

    def _cache_windows(self) -> tuple[int | None, ...]:
        """The window of each layer cache (one layer cache for a model without blocks)."""
        return self.config.layer_windows or (self.config.window,)

    def _count_without_blocks(self, cache: KVCache | None, length: int) -> None:
        """A model without blocks caches nothing, but its cache still counts the tokens
        (the next token's position)."""
        if cache is not None and not self.blocks:
            cache.layers[0].length += length

    def _check_cache(self, cache: KVCache | None) -> None:
        if cache is None:
            return
        if not isinstance(cache, KVCache):
            raise TypeError(
                "cache must be None or a mhbook.KVCache (model.new_cache()), "
                f"got {type(cache).__name__}"
            )
        if len(cache.layers) != max(1, len(self.blocks)):
            raise ValueError(
                f"the model has {len(self.blocks)} layers but the cache has {len(cache.layers)}"
            )
        windows, sinks = self._cache_windows(), self.config.sinks
        if (cache.windows, cache.sinks) != (windows, sinks):
            raise ValueError(
                f"the cache keeps {_span(cache.windows, cache.sinks)} tokens but the model "
                f"attends to {_span(windows, sinks)}: use model.new_cache()"
            )


def _span(windows: tuple[int | None, ...], sinks: int) -> str:
    """``window=4`` (every layer's), or ``windows=(4, None)``, and ``sinks=`` if any."""
    span = f"window={windows[0]}" if len(set(windows)) == 1 else f"windows={windows}"
    return span + (f", sinks={sinks}" if sinks else "")


def _check_torch_layer(layer, kind) -> None:
    if not isinstance(layer, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(layer).__name__}")
    if not layer.self_attn.batch_first:
        raise ValueError(f"expected {kind.__name__}(..., batch_first=True), got batch_first=False")
    _activation(layer)


def _activation(layer) -> str:
    """``"relu"`` or ``"gelu"``: the activation of a PyTorch encoder or decoder layer."""
    act = layer.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return "gelu"
    raise ValueError(f"only ReLU and GELU are supported, got activation {act}")
