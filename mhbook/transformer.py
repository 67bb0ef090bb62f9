"""The encoder-decoder Transformer of Vaswani et al. (2017), with greedy decoding
that uses a real KV cache."""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import nn

from .blocks import DecoderBlock, EncoderBlock
from .cache import KVCache
from .config import ModelConfig
from .layers import PositionalEncoding
from .masks import padding_mask
from .multihead import MultiHeadAttention

__all__ = [
    "TransformerEncoder",
    "TransformerDecoder",
    "Transformer",
    "record_attention",
]


class _Stack(nn.Module):
    """What the encoder and the decoder share: token embedding scaled by ``sqrt(d_model)``,
    positional encoding, ``config.num_layers`` blocks, and (pre-norm only) a final layer norm."""

    def __init__(self, config: ModelConfig, vocab_size: int, block: type[nn.Module]):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a mhbook.ModelConfig, got {type(config).__name__}")
        self.config = config
        self.d_model = config.d_model
        self.embedding = nn.Embedding(vocab_size, config.d_model)
        self.pos_encoding = PositionalEncoding(config.d_model, config.dropout)
        self.blocks = nn.ModuleList(block(config) for _ in range(config.num_layers))
        self.norm = (
            nn.LayerNorm(config.d_model, config.norm_eps) if config.norm_first else nn.Identity()
        )

    def embed(self, tokens: torch.Tensor, name: str, offset: int = 0) -> torch.Tensor:
        """``(batch, L)`` token ids -> ``(batch, L, d_model)`` embeddings plus positions."""
        _check_tokens(name, tokens, self.embedding.num_embeddings)
        x = self.embedding(tokens) * math.sqrt(self.d_model)
        return self.pos_encoding(x, offset=offset)


class TransformerEncoder(_Stack):
    """Embedding, positional encoding and ``config.num_layers`` :class:`EncoderBlock`.

    Embeddings are scaled by ``sqrt(d_model)`` before the encoding is added. With
    ``norm_first=True`` a final layer norm follows the last block, as pre-norm needs.
    """

    def __init__(self, config: ModelConfig, vocab_size: int):
        super().__init__(config, vocab_size, EncoderBlock)

    def forward(self, src: torch.Tensor, valid_lens: torch.Tensor | None = None) -> torch.Tensor:
        """``src`` ``(batch, S)`` token ids, ``valid_lens`` ``(batch,)``.

        Returns ``(batch, S, d_model)``.
        """
        mask = None if valid_lens is None else padding_mask(valid_lens, src.size(1))
        x = self.embed(src, "src")
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x)


class TransformerDecoder(_Stack):
    """Embedding, positional encoding, ``config.num_layers`` :class:`DecoderBlock` and a
    linear layer to vocabulary logits."""

    def __init__(self, config: ModelConfig, vocab_size: int):
        super().__init__(config, vocab_size, DecoderBlock)
        self.output = nn.Linear(config.d_model, vocab_size)

    def new_cache(self) -> KVCache:
        """An empty :class:`mhbook.KVCache` for this decoder (one layer cache per block)."""
        return KVCache(len(self.blocks))

    def forward(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Logits for the next token at every position.

        Args:
            tgt: ``(batch, T)`` token ids: the whole prefix, or with ``cache`` only the
                new tokens.
            memory: ``(batch, S, d_model)`` from the encoder.
            memory_mask: bool, broadcastable to ``(batch, h, T, S)``.
            cache: ``None``, or a :class:`mhbook.KVCache` (:meth:`new_cache`) that holds
                the earlier tokens: ``cache.length`` of them come before ``tgt``. This
                call adds ``tgt``'s keys and values to it, and on the first call the
                projected ``memory`` (later calls reuse it: keep ``memory`` the same).

        Returns:
            ``(batch, T, vocab_size)``.
        """
        if memory.size(0) != tgt.size(0):
            raise ValueError(
                f"tgt and memory have different batch sizes: tgt {tuple(tgt.shape)}, "
                f"memory {tuple(memory.shape)}"
            )
        _check_cache(cache, len(self.blocks))
        num_cached = 0 if cache is None else cache.length
        x = self.embed(tgt, "tgt", offset=num_cached)
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache.layers[i]
            # The causal mask, aligned bottom-right: the new tokens see every cached one
            # and the earlier new ones. In training attend() need not even build it.
            x = block(x, memory, None, memory_mask, layer_cache, is_causal=True)
        return self.output(self.norm(x))


class Transformer(nn.Module):
    """The encoder-decoder Transformer.

    Args:
        config: the model's shape (:class:`mhbook.ModelConfig`): ``d_model``, ``num_heads``,
            ``num_layers`` (in the encoder and in the decoder), ``d_ff``, ``dropout``,
            ``norm_first``.
        src_vocab_size, tgt_vocab_size: vocabulary sizes.

    Example::

        model = Transformer(ModelConfig(d_model=32, num_heads=4), 40, 40)
    """

    def __init__(self, config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__()
        self.config = config
        self.encoder = TransformerEncoder(config, src_vocab_size)
        self.decoder = TransformerDecoder(config, tgt_vocab_size)

    def forward(
        self, src: torch.Tensor, tgt_in: torch.Tensor, src_valid_lens: torch.Tensor
    ) -> torch.Tensor:
        """Teacher-forced logits.

        Args:
            src: ``(batch, S)`` source token ids.
            tgt_in: ``(batch, T)`` target ids starting with ``<bos>``.
            src_valid_lens: ``(batch,)`` real source lengths.

        Returns:
            ``(batch, T, tgt_vocab_size)``; the causal mask is applied inside.
        """
        _check_batch(src, tgt_in, src_valid_lens)
        memory = self.encoder(src, src_valid_lens)
        memory_mask = padding_mask(src_valid_lens, src.size(1))
        return self.decoder(tgt_in, memory, memory_mask)

    @torch.no_grad()
    def greedy_decode(
        self,
        src: torch.Tensor,
        src_valid_lens: torch.Tensor,
        bos_id: int,
        eos_id: int,
        max_len: int,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Translate by picking the most likely token at every step.

        With ``use_cache=True`` each decoder layer keeps the projected keys and
        values of the tokens so far (a :class:`mhbook.KVCache`), so each step feeds in
        and projects only the newest token; the encoder memory's keys and values are
        projected once.
        With ``use_cache=False`` the whole prefix is run again at every step.
        Both give the same tokens. Runs in eval mode (restoring the mode after).

        Args:
            src: ``(batch, S)``. src_valid_lens: ``(batch,)``.
            bos_id, eos_id: ids of ``<bos>`` and ``<eos>``.
            max_len: at most this many new tokens.

        Returns:
            ``(batch, n)`` with ``n <= max_len`` generated ids, ``<bos>`` not
            included; after a sequence's ``<eos>`` it is filled with ``eos_id``.
            Stops early once every sequence has produced ``<eos>`` (except on the
            ``meta`` device, whose tensors hold no values to test).
        """
        _check_batch(src, None, src_valid_lens)
        was_training = self.training
        self.eval()
        try:
            memory = self.encoder(src, src_valid_lens)
            memory_mask = padding_mask(src_valid_lens, src.size(1))
            batch = src.size(0)
            # (A model without layers has nothing to cache.)
            cache = self.decoder.new_cache() if use_cache and len(self.decoder.blocks) else None
            tokens = torch.full((batch, 1), bos_id, dtype=torch.long, device=src.device)
            finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
            for _ in range(max_len):
                new = tokens if cache is None else tokens[:, -1:]
                logits = self.decoder(new, memory, memory_mask, cache)
                next_token = logits[:, -1].argmax(dim=-1)
                next_token = next_token.masked_fill(finished, eos_id)
                tokens = torch.cat([tokens, next_token[:, None]], dim=1)
                finished |= next_token == eos_id
                if finished.device.type != "meta" and bool(finished.all()):
                    break
            return tokens[:, 1:]
        finally:
            self.train(was_training)


@contextmanager
def record_attention(model: nn.Module):
    """Keep the per-head attention weights of every attention layer in ``model``.

    Inside the ``with`` block every :class:`MultiHeadAttention` (and every other
    attention layer with a ``keep_weights`` switch, e.g. :class:`mhbook.GroupedQueryAttention`)
    stores its weights
    ``(batch, h, Lq, Lk)`` of its latest call. The context value is a function that
    returns them as a dict of the layers that ran in this recording (weights kept from
    an earlier one are cleared when it starts), e.g. for a :class:`Transformer`::

        with record_attention(model) as weights:
            model(src, tgt_in, src_valid_lens)
        w = weights()   # {"encoder.blocks.0.self_attn": tensor, ...}

    The model's outputs are the same as without it (the explicit attention path is used).
    """
    layers = {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, MultiHeadAttention) or hasattr(m, "keep_weights")
    }
    previous = {name: m.keep_weights for name, m in layers.items()}
    for m in layers.values():
        m.keep_weights = True
        m.weights = None

    def weights() -> dict[str, torch.Tensor]:
        return {name: m.weights for name, m in layers.items() if m.weights is not None}

    try:
        yield weights
    finally:
        for name, m in layers.items():
            m.keep_weights = previous[name]


def _check_tokens(name: str, t: torch.Tensor, vocab_size: int | None = None) -> None:
    """Type, shape and dtype; with ``vocab_size`` also the ids, but only on the CPU:
    reading values from an accelerator would wait for it at every call."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, length), got {tuple(t.shape)}")
    if t.dtype not in (torch.long, torch.int, torch.int16, torch.uint8, torch.int8):
        raise TypeError(f"{name} must hold integer token ids, got dtype {t.dtype}")
    if vocab_size is not None and t.device.type == "cpu" and t.numel() > 0:
        low, high = (int(v) for v in torch.aminmax(t))
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{name} holds token ids from {low} to {high}, but the vocabulary has "
                f"{vocab_size} tokens: ids must be in [0, {vocab_size - 1}]"
            )


def _check_cache(cache: KVCache | None, num_layers: int) -> None:
    if cache is None:
        return
    if not isinstance(cache, KVCache):
        raise TypeError(
            f"cache must be None or a mhbook.KVCache (decoder.new_cache()), "
            f"got {type(cache).__name__}"
        )
    if len(cache.layers) != num_layers:
        raise ValueError(
            f"the decoder has {num_layers} layers but the cache has {len(cache.layers)}"
        )
    if cache.window is not None:
        raise ValueError(
            f"this decoder attends to every earlier token, but the cache keeps only the "
            f"last window={cache.window}: use a KVCache without a window"
        )


def _check_batch(src, tgt_in, src_valid_lens) -> None:
    _check_tokens("src", src)
    if tgt_in is not None:
        _check_tokens("tgt_in", tgt_in)
        if tgt_in.size(0) != src.size(0):
            raise ValueError(
                f"src and tgt_in have different batch sizes: src {tuple(src.shape)}, "
                f"tgt_in {tuple(tgt_in.shape)}"
            )
    if not isinstance(src_valid_lens, torch.Tensor) or src_valid_lens.shape != (src.size(0),):
        got = src_valid_lens
        got = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise ValueError(
            f"src_valid_lens must have shape ({src.size(0)},) for src {tuple(src.shape)}, got {got}"
        )
