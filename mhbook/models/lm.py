"""A decoder-only language model: one causal stack of self-attention blocks.

The models most readers use (GPT, Llama, Mistral, DeepSeek) have no encoder: one stack of
blocks, each masked self-attention then a feed-forward network, reads a sequence and
predicts every next token. A task with an input and an output becomes one sequence, a
*prompt* followed by its *completion*::

    seventy - one = soixante et onze <eos>

and the model generates the completion one token at a time after the prompt, keeping
the keys and values of the tokens so far in a KV cache.

What the attention is (multi-head, grouped-query, latent) and how it knows positions
(sinusoidal at the embedding, RoPE or ALiBi inside attention, none) come from the
:class:`~mhbook.ModelConfig`; see :func:`mhbook.make_attention`. ``config.window`` makes every
layer attend to the last ``window`` tokens only, with a rolling KV cache; ``config.sinks``
adds the first tokens to every window (StreamingLLM), and ``config.global_every`` keeps
every ``global_every``-th layer global (Gemma 2 and 3).
"""

from __future__ import annotations

import torch

from ..attention.cache import KVCache
from ..core.config import ModelConfig
from ..core.masks import causal_mask, padding_mask
from .blocks import DecoderOnlyBlock, Stack
from .generation import generate

__all__ = ["DecoderOnlyLM"]


class DecoderOnlyLM(Stack):
    """Token embedding, ``config.num_layers`` :class:`DecoderOnlyBlock`, a linear layer to
    next-token logits (a :class:`~mhbook.models.blocks.Stack`).

    Every field of the config is obeyed. With the defaults this is chapter 9's model:
    embeddings scaled by ``sqrt(d_model)``, chapter 5's sinusoidal encoding added to them,
    post-norm LayerNorm, ReLU, biases but in the attention projections. ``"rope"`` and
    ``"alibi"`` act inside attention, ``"none"`` gives no position at all (the causal mask
    alone). With ``config.norm_first`` a final norm precedes the output layer. A
    Llama-shaped config (see :class:`~mhbook.ModelConfig`) gives a model that
    :meth:`to_hf` turns into a ``transformers.LlamaForCausalLM``.

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
                places the keys within the cache (:attr:`mhbook.LayerCache.streaming`).

        Returns:
            ``(batch, T, vocab_size)``; for ``T = 0``, an empty ``(batch, 0, vocab_size)``.
        """
        self._check_cache(cache)
        if valid_lens is not None and cache is not None:
            raise ValueError("valid_lens is for a whole padded sequence: pass it without a cache")
        if positions is not None and self.config.position == "sinusoidal":
            raise ValueError(
                "positions are for position='rope' or 'alibi' (inside attention); this model's "
                "sinusoidal positions are added to the embeddings from cache.length on"
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
        if cache is None and self.config.sinks and self.config.position in ("rope", "alibi"):
            # With sinks, keys are positioned within the cache (LayerCache.streaming): the
            # whole sequence is what decoding it into a fresh cache gives.
            cache = self.new_cache()
        masks = {}  # one mask per (window, kept tokens): local and global layers differ
        for i, (block, window) in enumerate(zip(self.blocks, self.config.layer_windows)):
            layer_cache = None if cache is None else cache.layers[i]
            kept = 0 if layer_cache is None else layer_cache.num_kept
            if (window, kept) not in masks:
                # Bottom-right aligned: the new tokens see the kept ones and the earlier new ones.
                sinks = self.config.sinks if window is not None else 0
                mask = causal_mask(length, kept + length, tokens.device, window=window, sinks=sinks)
                masks[window, kept] = mask if padding is None else mask & padding
            x = block(x, masks[window, kept], layer_cache, positions=positions)
        self._count_without_blocks(cache, length)
        return self.output(self.norm(x))

    def generate(self, prompt: torch.Tensor, max_new_tokens: int, **options) -> torch.Tensor:
        """Continue ``prompt`` (``(batch, P)``) by up to ``max_new_tokens`` tokens:
        :func:`mhbook.generate` with this model; ``options`` are its ``temperature``,
        ``top_k``, ``top_p``, ``generator``, ``eos_id``, ``use_cache`` and ``max_length``.

        Returns ``(batch, n)``, the new tokens."""
        return generate(self, prompt, max_new_tokens, **options)

    # -- Hugging Face ----------------------------------------------------------------
    def to_hf(self, **special_tokens):
        """This model as a ``transformers.LlamaForCausalLM`` (a ``MistralForCausalLM``
        when ``config.window`` is set): the same weights, on the same device and dtype,
        in the same mode, giving the same logits.

        The config must be Llama-shaped (see :func:`mhbook.models.hf.hf_config`); a field the
        Hugging Face class cannot express (LayerNorm, ReLU, biases, sinusoidal positions,
        scaled embeddings, ...) raises a ``ValueError`` naming it, and so does a set
        ``head_mask``. ``special_tokens`` (``bos_token_id``, ``eos_token_id``,
        ``pad_token_id``) go into its config. ``save_pretrained(folder)`` then writes a
        checkpoint that ``transformers.AutoModelForCausalLM.from_pretrained(folder)``
        loads.
        """
        from transformers import AutoModelForCausalLM

        from .hf import hf_config, to_hf_names

        config = hf_config(self.config, self.vocab_size, **special_tokens)
        weight = self.embedding.weight
        with torch.random.fork_rng(devices=[]):  # its random initialisation, overwritten below
            model = AutoModelForCausalLM.from_config(config, dtype=weight.dtype)
        model.to(weight.device)
        model.load_state_dict(to_hf_names(self.state_dict(), len(self.blocks)))
        model.train(self.training)
        return model

    @classmethod
    def from_hf(cls, model) -> DecoderOnlyLM:
        """The book's model of a Hugging Face ``LlamaForCausalLM`` or
        ``MistralForCausalLM``: same weights, device, dtype and mode, same logits. A
        setting the book's model cannot express (a scaled RoPE, biases, another
        activation) raises a ``ValueError`` naming it."""
        from .hf import from_hf_names, model_config

        config, vocab_size = model_config(model)
        weight = model.get_input_embeddings().weight
        with torch.device("meta"):
            ours = cls(config, vocab_size)
        ours.to_empty(device=weight.device).to(weight.dtype)
        ours.load_state_dict(from_hf_names(model.state_dict(), config.num_layers))
        if config.tie_embeddings:
            ours.output.weight = ours.embedding.weight
        ours.train(model.training)
        return ours
