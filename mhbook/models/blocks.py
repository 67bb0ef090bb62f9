"""The blocks every model of mhbook is a stack of, each built from a :class:`ModelConfig`.

* :func:`make_attention`: the attention layer the config describes (multi-head,
  grouped-query, multi-query or latent; RoPE, ALiBi or no position inside it; local
  with its window and sinks, or global), for layer ``i`` of a stack. Every block gets its
  attention from it, so every model obeys the config alike.
* :class:`EncoderBlock`: self-attention, then a feed-forward network.
* :class:`DecoderBlock`: masked self-attention, cross-attention to the encoder's output,
  then a feed-forward network.
* :class:`DecoderOnlyBlock`: masked self-attention, then a feed-forward network.
* :class:`Stack`: token embedding, ``num_layers`` blocks, a final norm for pre-norm and
  optionally the output layer to vocabulary logits: what the encoder, the decoder and the
  decoder-only language model share.

Each block writes its residual connections out, as nanoGPT and Hugging Face do: pre-norm
(``norm_first``, GPT-2 and Llama) ``x = x + Dropout(sublayer(Norm(x)))``, post-norm (the
paper) ``x = Norm(x + Dropout(sublayer(x)))``. Each sublayer's norm and dropout are kept
in an :class:`~mhbook.models.layers.AddNorm` (``addnorm1.norm``, ``addnorm1.dropout``, ...).

RoPE has one owner, the :class:`Stack`: :func:`make_rope` builds its rotary embeddings (one
per kind of layer), and the stack hands every layer its tables, computed once per forward
pass (:meth:`Stack.rope_tables`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..attention.cache import KVCache, LayerCache
from ..attention.multihead import MultiHeadAttention
from ..attention.rope import RotaryEmbedding
from ..core.config import ModelConfig
from ..core.validate import check_int, check_tokens
from .layers import AddNorm, PositionalEncoding, make_ffn, make_norm

__all__ = [
    "make_attention",
    "make_rope",
    "EncoderBlock",
    "DecoderBlock",
    "DecoderOnlyBlock",
    "Stack",
]


def make_attention(
    config: ModelConfig, *, cross: bool = False, layer: int | None = None
) -> nn.Module:
    """The attention layer ``config`` describes.

    * Self-attention with ``config.d_latent`` set: multi-head latent attention
      (:class:`mhbook.MultiHeadLatentAttention`), with a decoupled RoPE part of
      :attr:`ModelConfig.d_rope` features when ``config.position == "rope"``;
    * otherwise :class:`~mhbook.MultiHeadAttention` with ``config.kv_heads`` key/value
      heads (``num_heads`` of them: multi-head attention; 1: multi-query attention),
      ``rotary`` when ``config.position == "rope"`` and with an :class:`mhbook.ALiBi` when it
      is ``"alibi"`` (in self-attention only: cross-attention has no shared positions, and
      never a latent).

    A layer with RoPE holds no rotary embedding: its model owns them (:func:`make_rope`)
    and hands it ``rope_tables`` at every call.

    The self-attention is told its kind, as TransformerLens's ``Attention(cfg, attn_type,
    layer)`` is: a local layer gets ``window`` and ``sinks``
    (:attr:`~mhbook.ModelConfig.layer_windows`), builds its own causal mask and tells its
    cache what to keep; a global layer gets no window.

    Args:
        config: the model's :class:`~mhbook.ModelConfig`.
        cross: cross-attention of a decoder to the encoder's output (never a window).
        layer: the layer's index in its stack, for its window
            (``config.layer_windows[layer]``); ``None``: ``config.window``.

    Every layer is called ``layer(x, key=None, value=None, mask=None, *, is_causal,
    positions, cache, need_weights, rope_tables)`` and returns ``(output, weights or None)``.
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a mhbook.ModelConfig, got {type(config).__name__}")
    bias = config.bias
    if cross:
        window = None
    elif layer is None:
        window = config.window
    else:
        check_int("layer", layer, 0)
        if layer >= config.num_layers:
            raise ValueError(
                f"layer must be below ModelConfig.num_layers={config.num_layers}, got {layer}"
            )
        window = config.layer_windows[layer]
    local = {"window": window, "sinks": config.sinks if window is not None else 0}
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
            **local,
        )
    alibi = None
    if not cross and config.position == "alibi":
        from ..attention.alibi import ALiBi

        alibi = ALiBi(config.num_heads)
    return MultiHeadAttention(
        config.d_model,
        config.num_heads,
        num_kv_heads=config.num_kv_heads,
        dropout=config.attention_dropout,
        bias=bias,
        d_head=config.head_dim,
        rotary=not cross and config.position == "rope",
        alibi=alibi,
        **local,
    )


def make_rope(config: ModelConfig, layer: int | None = None) -> RotaryEmbedding | None:
    """The rotary embedding of layer ``layer`` of a model of ``config`` (``None`` unless
    ``config.position == "rope"``): the one place that decides RoPE's size, base, scaling
    and layout.

    * Multi-head attention: heads of ``config.d_head``, base
      ``config.layer_rope_theta(layer)`` (``config.rope_theta`` for ``layer=None``), scaled
      by ``config.rope_scaling``, in Llama's rotate-half layout;
    * latent attention (``config.d_latent``): its decoupled part of ``config.d_rope``
      features, base ``config.rope_theta``, in the paper's interleaved pairs, as DeepSeek.
    """
    if config.position != "rope":
        return None
    if config.d_latent is not None:
        return RotaryEmbedding(config.d_rope, config.rope_theta, interleaved=True)
    theta = config.rope_theta if layer is None else config.layer_rope_theta(layer)
    return RotaryEmbedding(config.d_head, theta, scaling=config.rope_scaling)


def _make_ffn(config: ModelConfig) -> nn.Module | None:
    """The block's feed-forward network, ``None`` for ``ffn="none"`` (attention only)."""
    return None if config.ffn == "none" else make_ffn(config)


def _add_norm(config: ModelConfig) -> AddNorm:
    """A residual connection with the config's norm, its placement and its dropout."""
    return AddNorm(config.d_model, config.dropout, config.norm_first, norm=make_norm(config))


class EncoderBlock(nn.Module):
    """Self-attention then a feed-forward network, each wrapped in :class:`AddNorm`.

    Args:
        config: a :class:`mhbook.ModelConfig`. The block obeys every field but
            ``num_layers`` (a stack's) and ``window`` (which :class:`Stack` refuses for an
            encoder): the attention from :func:`make_attention`, the FFN
            (``ffn``, ``d_ff``), the norms (``norm``, ``norm_eps``, ``norm_first``),
            ``bias`` and the residual ``dropout`` (on each sublayer's output before it is
            added to the residual, the paper's "residual dropout").

    Example: ``EncoderBlock(ModelConfig(d_model=512, num_heads=8, d_ff=2048))``.

    :func:`~mhbook.models.torch_interop.encoder_block_from_torch` copies an
    ``nn.TransformerEncoderLayer(..., batch_first=True)``.
    """

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__()
        self.norm_first = config.norm_first
        self.self_attn = make_attention(config, layer=layer)
        self.ffn = _make_ffn(config)
        self.addnorm1 = _add_norm(config)
        self.addnorm2 = _add_norm(config) if self.ffn is not None else None

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        rope_tables: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``x`` ``(batch, L, d_model)``; ``mask`` bool, broadcastable to ``(batch, h, L, L)``;
        ``rope_tables`` the self-attention's RoPE tables (:meth:`Stack.rope_tables`)."""
        if self.norm_first:  # pre-norm: x + Dropout(sublayer(Norm(x)))
            h, _ = self.self_attn(self.addnorm1.norm(x), mask=mask, rope_tables=rope_tables)
            x = x + self.addnorm1.dropout(h)
            if self.ffn is not None:
                x = x + self.addnorm2.dropout(self.ffn(self.addnorm2.norm(x)))
        else:  # post-norm (the paper): Norm(x + Dropout(sublayer(x)))
            h, _ = self.self_attn(x, mask=mask, rope_tables=rope_tables)
            x = self.addnorm1.norm(x + self.addnorm1.dropout(h))
            if self.ffn is not None:
                x = self.addnorm2.norm(x + self.addnorm2.dropout(self.ffn(x)))
        return x


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention to the encoder's output, then a
    feed-forward network, each wrapped in :class:`AddNorm`.

    Arguments as for :class:`EncoderBlock`; the cross-attention comes from
    ``make_attention(config, cross=True)``.
    :func:`~mhbook.models.torch_interop.decoder_block_from_torch` copies an
    ``nn.TransformerDecoderLayer(..., batch_first=True)``.
    """

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__()
        self.norm_first = config.norm_first
        self.self_attn = make_attention(config, layer=layer)
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
        rope_tables: tuple[torch.Tensor, torch.Tensor] | None = None,
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
            rope_tables: the self-attention's RoPE tables (:meth:`Stack.rope_tables`).

        Returns:
            ``(batch, T, d_model)``.
        """
        attention = {"mask": self_mask, "is_causal": is_causal, "cache": cache}
        attention["rope_tables"] = rope_tables  # the self-attention's arguments
        if self.norm_first:  # pre-norm: x + Dropout(sublayer(Norm(x)))
            h, _ = self.self_attn(self.addnorm1.norm(x), **attention)
            x = x + self.addnorm1.dropout(h)
            h, _ = self.cross_attn(self.addnorm2.norm(x), memory, mask=memory_mask, cache=cache)
            x = x + self.addnorm2.dropout(h)
            if self.ffn is not None:
                x = x + self.addnorm3.dropout(self.ffn(self.addnorm3.norm(x)))
        else:  # post-norm (the paper): Norm(x + Dropout(sublayer(x)))
            h, _ = self.self_attn(x, **attention)
            x = self.addnorm1.norm(x + self.addnorm1.dropout(h))
            h, _ = self.cross_attn(x, memory, mask=memory_mask, cache=cache)
            x = self.addnorm2.norm(x + self.addnorm2.dropout(h))
            if self.ffn is not None:
                x = self.addnorm3.norm(x + self.addnorm3.dropout(self.ffn(x)))
        return x


class DecoderOnlyBlock(nn.Module):
    """Masked self-attention then a feed-forward network, each in an :class:`AddNorm`
    (pre-norm with ``config.norm_first``, the paper's post-norm otherwise).

    An encoder block with a causal mask, or a decoder block without cross-attention; with
    ``norm="rms"``, ``ffn="swiglu"``, ``bias=False``, ``position="rope"`` and
    ``norm_first=True``, Llama's decoder layer. With ``ffn="none"`` the self-attention
    alone (``ffn`` and ``addnorm2`` are ``None``): the attention-only blocks of Elhage et
    al. (2021).
    """

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__()
        self.norm_first = config.norm_first
        self.self_attn = make_attention(config, layer=layer)
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
        rope_tables: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``x`` ``(batch, T, d_model)``; ``mask`` bool, broadcastable to
        ``(batch, h, T, S)``; ``cache`` this block's :class:`mhbook.LayerCache` or ``None``;
        ``positions`` ``(T,)`` or ``(batch, T)`` and ``rope_tables`` the self-attention's
        RoPE tables (:meth:`Stack.rope_tables`)."""
        attention = {"mask": mask, "is_causal": is_causal, "positions": positions, "cache": cache}
        attention["rope_tables"] = rope_tables  # the self-attention's arguments
        if self.norm_first:  # pre-norm: x + Dropout(sublayer(Norm(x)))
            h, _ = self.self_attn(self.addnorm1.norm(x), **attention)
            x = x + self.addnorm1.dropout(h)
            if self.ffn is not None:
                x = x + self.addnorm2.dropout(self.ffn(self.addnorm2.norm(x)))
        else:  # post-norm (the paper): Norm(x + Dropout(sublayer(x)))
            h, _ = self.self_attn(x, **attention)
            x = self.addnorm1.norm(x + self.addnorm1.dropout(h))
            if self.ffn is not None:
                x = self.addnorm2.norm(x + self.addnorm2.dropout(self.ffn(x)))
        return x


class Stack(nn.Module):
    """Token embedding, ``config.num_layers`` blocks, a final norm (pre-norm only) and,
    with ``output=True``, a linear layer to vocabulary logits: what the encoder, the
    decoder and the decoder-only language model share.

    The embedding obeys ``scale_embeddings`` (times ``sqrt(d_model)``), ``position``
    (``"sinusoidal"`` adds chapter 5's encoding, ``"learned"`` a trained table of
    ``max_position_embeddings`` rows, as GPT-2's ``wpe``; the others act inside attention)
    and ``dropout``; the output layer ``bias`` and ``tie_embeddings`` (it then shares the
    embedding's matrix).

    Args:
        config: a :class:`mhbook.ModelConfig`.
        vocab_size: the number of tokens.
        block: the block class, built as ``block(config, layer=i)`` for layer ``i``.
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
        self.pos_table = None  # position="learned": one trained row per position
        if config.position == "sinusoidal":
            self.pos_encoding = PositionalEncoding(config.d_model, config.dropout)
        else:
            self.pos_encoding = None
            self.dropout = nn.Dropout(config.dropout)
            if config.position == "learned":
                self.pos_table = nn.Embedding(config.max_position_embeddings, config.d_model)
        self.blocks = nn.ModuleList(block(config, layer=i) for i in range(config.num_layers))
        self.norm = make_norm(config) if config.norm_first else nn.Identity()
        if output:
            self.output = nn.Linear(config.d_model, vocab_size, bias=config.bias)
            if config.tie_embeddings:
                self.output.weight = self.embedding.weight
        # RoPE's one owner: a rotary embedding per kind of layer (Gemma 3's global layers
        # have their own base), whose tables rope_tables computes once per forward pass.
        self.rope = make_rope(config)
        self.global_rope = None
        if config.global_rope_theta is not None:
            self.global_rope = make_rope(config, config.layer_windows.index(None))

    def embed(self, tokens: torch.Tensor, name: str, offset: int = 0) -> torch.Tensor:
        """``(batch, L)`` token ids -> ``(batch, L, d_model)`` embeddings (scaled by
        ``sqrt(d_model)`` if the config says so), plus the sinusoidal or learned positions
        ``offset .. offset + L - 1`` (if the config's position is one of those), then
        dropout."""
        check_tokens(name, tokens, self.vocab_size, self.embedding.weight.device)
        x = self.embedding(tokens)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.d_model)
        if self.pos_encoding is not None:
            return self.pos_encoding(x, offset=offset)
        if self.pos_table is not None:
            end = offset + tokens.size(1)
            if end > self.pos_table.num_embeddings:
                raise ValueError(
                    f"{name} reach position {end - 1} (from {offset}), past the learned position "
                    "table of ModelConfig.max_position_embeddings="
                    f"{self.pos_table.num_embeddings} rows"
                )
            x = x + self.pos_table(torch.arange(offset, end, device=x.device))
        return self.dropout(x)

    def rope_tables(
        self, positions: torch.Tensor | None, start: int, x: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """RoPE's ``(cos, sin)`` for every block, computed once per kind of layer, as Hugging
        Face's models compute ``position_embeddings`` once for all their layers.

        Layer ``i``'s kind comes from the config: its base ``config.layer_rope_theta(i)``,
        and whether it positions its keys within the cache (a local layer with
        ``config.sinks``, StreamingLLM: the tables of the positions ``0 .. sinks + window +
        T - 1``, every column of its keys, the kept ones and the ``T`` new ones) or at the
        tokens' ``positions``.

        Args:
            positions: ``(T,)`` or ``(batch, T)`` positions of the ``T`` new tokens, or
                ``None`` for ``start + arange(T)``.
            start: the first new token's position (the cache's length).
            x: the new tokens' embeddings ``(batch, T, d_model)``: the tables' dtype.

        Returns:
            One ``(cos, sin)`` per block (:meth:`mhbook.RotaryEmbedding.tables`), the same
            tensors for blocks of one kind; ``None`` per block without RoPE.
        """
        config = self.config
        if self.rope is None:
            return [None] * len(self.blocks)
        if positions is None:
            positions = torch.arange(start, start + x.size(1), device=x.device)
        ropes = {
            rope.rope_theta: rope for rope in (self.rope, self.global_rope) if rope is not None
        }
        made, tables = {}, []
        for i, window in enumerate(config.layer_windows):
            kind = (float(config.layer_rope_theta(i)), window is not None and config.sinks > 0)
            if kind not in made:
                theta, slots = kind
                if slots:  # every column of the layer's keys: the kept ones, the new ones
                    at = torch.arange(config.sinks + window + x.size(1), device=x.device)
                else:
                    at = positions
                made[kind] = ropes[theta].tables(at, x.dtype)
            tables.append(made[kind])
        return tables

    def new_cache(self) -> KVCache:
        """An empty :class:`mhbook.KVCache`, one layer cache per block (one for a model
        without blocks, which still counts the tokens). The one place where a model's
        cache is made; each layer tells its cache what to keep (its window and sinks)."""
        return KVCache(max(1, len(self.blocks)))

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
