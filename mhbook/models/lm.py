"""A decoder-only language model: one causal stack of self-attention blocks.

The models most readers use (GPT, Llama, Mistral, DeepSeek) have no encoder: one stack of
blocks, each masked self-attention then a feed-forward network, reads a sequence and
predicts every next token. A task with an input and an output becomes one sequence, a
*prompt* followed by its *completion*::

    seventy - one = soixante et onze <eos>

and the model generates the completion one token at a time after the prompt, keeping
the keys and values of the tokens so far in a KV cache.

What the attention is (multi-head, grouped-query, latent) and how it knows positions
(sinusoidal or a learned table at the embedding, RoPE or ALiBi inside attention, none) come
from the :class:`~mhbook.ModelConfig`; see :func:`mhbook.make_attention`. ``config.window``
makes every layer attend to the last ``window`` tokens only, with a rolling KV cache;
``config.sinks`` adds the first tokens to every window (StreamingLLM), and
``config.global_every`` keeps every ``global_every``-th layer global (Gemma 2 and 3).
"""

from __future__ import annotations

import torch

from ..attention.cache import KVCache
from ..core.config import ModelConfig
from ..core.masks import padding_mask
from .blocks import DecoderOnlyBlock, Stack
from .generation import generate

__all__ = ["DecoderOnlyLM"]


class DecoderOnlyLM(Stack):
    """Token embedding, ``config.num_layers`` :class:`DecoderOnlyBlock`, a linear layer to
    next-token logits (a :class:`~mhbook.models.blocks.Stack`).

    Every field of the config is obeyed. With the defaults this is chapter 9's model:
    embeddings scaled by ``sqrt(d_model)``, chapter 5's sinusoidal encoding added to them,
    post-norm LayerNorm, ReLU, biases. ``"learned"`` adds a trained table of positions
    instead (GPT-2's); ``"rope"`` and ``"alibi"`` act inside attention, ``"none"`` gives no
    position at all (the causal mask alone). With ``config.norm_first`` a final norm precedes
    the output layer. A Llama-shaped config (see :class:`~mhbook.ModelConfig`) gives a model that
    :func:`~mhbook.models.hf.lm_to_hf` turns into a ``transformers.LlamaForCausalLM``.

    Args:
        config: a :class:`mhbook.ModelConfig`.
        vocab_size: the number of tokens.

    Example::

        lm = DecoderOnlyLM(ModelConfig(d_model=64, num_heads=4, num_layers=4,
                                       norm_first=True), vocab_size=60)
        logits = lm(tokens)                            # (batch, T, 60)
        new = lm.generate(prompt, 20, eos_id=2)        # greedy, with the KV cache
    """

    def __init__(self, config: ModelConfig, vocab_size: int):
        super().__init__(config, vocab_size, DecoderOnlyBlock, output=True)

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        cache: KVCache | None = None,
        valid_lens: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Next-token logits at every position.

        Args:
            tokens: ``(batch, T)`` token ids: the whole sequence, or with ``cache`` the
                new tokens only (``cache.length`` tokens came before them).
            cache: ``None``, or a :class:`mhbook.KVCache`
                (:meth:`~mhbook.models.blocks.Stack.new_cache`): the new tokens attend to the
                ones it holds and are added to it.
            valid_lens: ``(batch,)`` real tokens at the start of each row (the rest is
                padding): keys past them are masked. Not needed for right-padded rows
                whose padded positions are ignored by the loss: the causal mask already
                keeps the padding out of every real token's view. Only without a cache.
            positions: ``(T,)`` or ``(batch, T)`` positions of the new tokens for RoPE
                and ALiBi (Hugging Face's ``position_ids``); default ``cache.length +
                arange(T)``. Not with sinusoidal positions, which are added to the
                embeddings from ``cache.length`` on, nor with ``config.sinks``, which
                places the keys within the cache
                (:attr:`mhbook.MultiHeadAttention.streaming`).

        Each layer masks causally itself (within its window, if it has one) and tells its
        cache what to keep; RoPE's tables are computed here once per kind of layer
        (:meth:`~mhbook.models.blocks.Stack.rope_tables`).

        Returns:
            ``(batch, T, vocab_size)``; for ``T = 0``, an empty ``(batch, 0, vocab_size)``.
        """
        self._check_cache(cache)
        if valid_lens is not None and cache is not None:
            raise ValueError("valid_lens is for a whole padded sequence: pass it without a cache")
        if positions is not None and self.config.position in ("sinusoidal", "learned"):
            raise ValueError(
                "positions are for position='rope' or 'alibi' (inside attention); this model's "
                f"{self.config.position} positions are added to the embeddings from "
                "cache.length on"
            )
        past = 0 if cache is None else cache.length
        x = self.embed(tokens, "tokens", offset=past)
        length = tokens.size(1)
        padding = None
        if valid_lens is not None:
            if not isinstance(valid_lens, torch.Tensor) or valid_lens.shape != (tokens.size(0),):
                got = valid_lens.shape if isinstance(valid_lens, torch.Tensor) else valid_lens
                raise ValueError(
                    f"valid_lens must have shape ({tokens.size(0)},) for tokens "
                    f"{tuple(tokens.shape)}, got {got}"
                )
            padding = padding_mask(valid_lens, length)  # (batch, 1, 1, T)
        rope_tables = self.rope_tables(positions, past, x)  # once per kind of layer
        layer_caches = [None] * len(self.blocks) if cache is None else cache.layers
        for block, layer_cache, tables in zip(self.blocks, layer_caches, rope_tables):
            x = block(
                x,
                padding,
                layer_cache,
                is_causal=True,
                positions=positions,
                rope_tables=tables,
            )
        self._count_without_blocks(cache, length)
        return self.output(self.norm(x))

    def generate(self, prompt: torch.Tensor, max_new_tokens: int, **options) -> torch.Tensor:
        """Continue ``prompt`` (``(batch, P)``) by up to ``max_new_tokens`` tokens:
        :func:`mhbook.generate` with this model; ``options`` are its ``temperature``,
        ``top_k``, ``top_p``, ``generator``, ``eos_id``, ``use_cache`` and ``max_length``.

        Returns ``(batch, n)``, the new tokens."""
        return generate(self, prompt, max_new_tokens, **options)
