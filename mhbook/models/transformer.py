"""The encoder-decoder Transformer of Vaswani et al. (2017), built from a
:class:`~mhbook.ModelConfig` it obeys field by field, with generation that uses a real KV
cache (:func:`mhbook.generate`)."""

from __future__ import annotations

import torch
from torch import nn

from ..attention.cache import KVCache
from ..core.config import ModelConfig
from ..core.masks import padding_mask
from ..core.validate import check_int, check_tokens
from .blocks import DecoderBlock, EncoderBlock, Stack
from .generation import eval_mode, generate

__all__ = ["TransformerEncoder", "TransformerDecoder", "Transformer"]


class TransformerEncoder(Stack):
    """Embedding, positions and ``config.num_layers`` :class:`EncoderBlock` (a
    :class:`~mhbook.models.blocks.Stack`).

    By default embeddings are scaled by ``sqrt(d_model)`` before the sinusoidal encoding
    is added. With ``norm_first=True`` a final norm follows the last block, as pre-norm
    needs.
    """

    def __init__(self, config: ModelConfig, vocab_size: int):
        _refuse_window(config)
        super().__init__(config, vocab_size, EncoderBlock)

    def forward(self, src: torch.Tensor, valid_lens: torch.Tensor | None = None) -> torch.Tensor:
        """``src`` ``(batch, S)`` token ids, ``valid_lens`` ``(batch,)``.

        Returns ``(batch, S, d_model)``.
        """
        mask = None if valid_lens is None else padding_mask(valid_lens, src.size(1))
        x = self.embed(src, "src")
        for block, tables in zip(self.blocks, self.rope_tables(None, 0, x)):
            x = block(x, mask, rope_tables=tables)
        return self.norm(x)


class TransformerDecoder(Stack):
    """Embedding, positions, ``config.num_layers`` :class:`DecoderBlock` and a linear
    layer to vocabulary logits (a :class:`~mhbook.models.blocks.Stack`)."""

    def __init__(self, config: ModelConfig, vocab_size: int):
        _refuse_window(config)
        super().__init__(config, vocab_size, DecoderBlock, output=True)

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
            cache: ``None``, or a :class:`mhbook.KVCache`
                (:meth:`~mhbook.models.blocks.Stack.new_cache`) that holds the earlier tokens:
                ``cache.length`` of them come before ``tgt``. This call adds ``tgt``'s
                keys and values to it, and on the first call the projected ``memory``
                (later calls reuse it: keep ``memory`` the same).

        Returns:
            ``(batch, T, vocab_size)``.
        """
        if memory.size(0) != tgt.size(0):
            raise ValueError(
                f"tgt and memory have different batch sizes: tgt {tuple(tgt.shape)}, "
                f"memory {tuple(memory.shape)}"
            )
        self._check_cache(cache)
        num_cached = 0 if cache is None else cache.length
        x = self.embed(tgt, "tgt", offset=num_cached)
        rope_tables = self.rope_tables(None, num_cached, x)  # once per forward pass
        for i, (block, tables) in enumerate(zip(self.blocks, rope_tables)):
            layer_cache = None if cache is None else cache.layers[i]
            # The causal mask, aligned bottom-right: the new tokens see every cached one
            # and the earlier new ones. In training attend() need not even build it.
            x = block(x, memory, None, memory_mask, layer_cache, is_causal=True, rope_tables=tables)
        self._count_without_blocks(cache, tgt.size(1))
        return self.output(self.norm(x))


class Transformer(nn.Module):
    """The encoder-decoder Transformer.

    Args:
        config: the model's shape (:class:`mhbook.ModelConfig`), obeyed field by field:
            ``num_layers`` blocks in the encoder and in the decoder, each with its
            attention from :func:`mhbook.make_attention` (so ``num_kv_heads``,
            ``position``, ``d_latent``, ``rope_theta`` and ``attention_dropout`` shape the
            self-attention; the cross-attention takes ``num_kv_heads``), and the norm,
            FFN, bias, dropout and embedding fields as every model does. ``window`` is
            refused with a ``ValueError`` (the encoder attends both ways);
            ``tie_embeddings`` ties the decoder's output layer to its own embedding.
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

    def generate(
        self,
        src: torch.Tensor,
        src_valid_lens: torch.Tensor,
        max_new_tokens: int,
        *,
        bos_id: int,
        eos_id: int | None = None,
        use_cache: bool = True,
        **sampling,
    ) -> torch.Tensor:
        """Translate: encode ``src`` once, then generate the target after ``<bos>`` with
        :func:`mhbook.generate` (greedy by default; ``sampling`` takes its
        ``temperature``, ``top_k``, ``top_p`` and ``generator``).

        With ``use_cache=True`` each decoder layer keeps the projected keys and values of
        the tokens so far (a :class:`mhbook.KVCache`), so each step feeds in and projects
        only the newest token; the encoder memory's keys and values are projected once.
        Runs in eval mode (restoring the mode after).

        Args:
            src: ``(batch, S)``. src_valid_lens: ``(batch,)``.
            max_new_tokens: at most this many new tokens.
            bos_id, eos_id: ids of ``<bos>`` and ``<eos>`` in the target vocabulary.

        Returns:
            ``(batch, n)`` with ``n <= max_new_tokens`` generated ids, ``<bos>`` not
            included; after a sequence's ``<eos>`` it is filled with ``eos_id``.
        """
        _check_batch(src, None, src_valid_lens)
        with eval_mode(self), torch.no_grad():
            memory = self.encoder(src, src_valid_lens)
            memory_mask = padding_mask(src_valid_lens, src.size(1))
            check_int("bos_id", bos_id, 0)
            start = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
            return generate(
                self.decoder,
                start,
                max_new_tokens,
                step=lambda tokens, cache: self.decoder(tokens, memory, memory_mask, cache),
                eos_id=eos_id,
                use_cache=use_cache,
                **sampling,
            )


def _refuse_window(config: ModelConfig) -> None:
    if config.window is not None:
        raise ValueError(
            f"ModelConfig.window={config.window}: the encoder-decoder Transformer does not "
            "build sliding-window attention (its encoder attends both ways); "
            "mhbook.DecoderOnlyLM does"
        )


def _check_batch(src, tgt_in, src_valid_lens) -> None:
    check_tokens("src", src)
    if tgt_in is not None:
        check_tokens("tgt_in", tgt_in)
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
