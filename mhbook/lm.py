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
:class:`~mhbook.ModelConfig`; see :func:`make_attention`. ``config.window`` makes every
layer attend to the last ``window`` tokens only, with a rolling KV cache.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .cache import KVCache
from .config import ModelConfig
from .gqa import GroupedQueryAttention
from .layers import AddNorm, PositionalEncoding, PositionWiseFFN
from .masks import causal_mask, padding_mask

__all__ = ["make_attention", "DecoderOnlyBlock", "DecoderOnlyLM"]


def make_attention(config: ModelConfig) -> nn.Module:
    """The self-attention layer ``config`` describes.

    * ``config.d_latent`` set: multi-head latent attention
      (:class:`mhbook.MultiHeadLatentAttention`);
    * otherwise :class:`~mhbook.GroupedQueryAttention` with ``config.kv_heads`` key/value
      heads (``num_heads`` of them: multi-head attention; 1: multi-query attention), with
      a :class:`mhbook.RotaryEmbedding` when ``config.position == "rope"`` and an
      :class:`mhbook.ALiBi` when it is ``"alibi"``.

    Every layer takes ``(x, mask, *, positions=None, cache=None, need_weights=False)``.
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a mhbook.ModelConfig, got {type(config).__name__}")
    rope = config.position == "rope"
    if config.d_latent is not None:
        from .mla import MultiHeadLatentAttention  # imported here: lm works without it

        if config.position == "alibi":
            raise ValueError("ModelConfig: latent attention (d_latent) with ALiBi is not built")
        # RoPE goes into a decoupled part of each query and key, half a head wide as in
        # DeepSeek-V2 (64 next to 128), rounded down to an even size.
        d_rope = 2 * max(1, config.d_head // 4) if rope else 0
        return MultiHeadLatentAttention(
            config.d_model,
            config.num_heads,
            config.d_latent,
            config.dropout,
            d_head=config.head_dim,
            d_rope=d_rope,
        )
    extra: dict[str, nn.Module] = {}
    if rope:
        from .rope import RotaryEmbedding

        extra["rope"] = RotaryEmbedding(config.d_head)
    elif config.position == "alibi":
        from .alibi import ALiBi

        extra["alibi"] = ALiBi(config.num_heads)
    return GroupedQueryAttention(
        config.d_model,
        config.num_heads,
        config.kv_heads,
        config.dropout,
        d_head=config.head_dim,
        **extra,
    )


class DecoderOnlyBlock(nn.Module):
    """Masked self-attention then a feed-forward network, each in an :class:`AddNorm`
    (pre-norm with ``config.norm_first``, the paper's post-norm otherwise).

    An encoder block with a causal mask, or a decoder block without cross-attention.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        d, p = config.d_model, config.dropout
        self.self_attn = make_attention(config)
        self.ffn = PositionWiseFFN(d, config.d_ff, p)
        self.addnorm1 = AddNorm(d, p, config.norm_first, config.norm_eps)
        self.addnorm2 = AddNorm(d, p, config.norm_first, config.norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, cache=None):
        """``x`` ``(batch, T, d_model)``; ``mask`` bool, broadcastable to
        ``(batch, h, T, S)``; ``cache`` this block's :class:`mhbook.LayerCache` or ``None``."""
        x = self.addnorm1(x, lambda x: self.self_attn(x, mask, cache=cache))
        return self.addnorm2(x, self.ffn)


class DecoderOnlyLM(nn.Module):
    """Token embedding, ``config.num_layers`` :class:`DecoderOnlyBlock`, a linear layer to
    next-token logits.

    Embeddings are scaled by ``sqrt(d_model)`` (as in :class:`mhbook.Transformer`);
    ``config.position == "sinusoidal"`` adds chapter 5's encoding to them, ``"rope"`` and
    ``"alibi"`` act inside attention, ``"none"`` gives no position at all (the causal
    mask alone). With ``config.norm_first`` a final layer norm precedes the output layer.

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
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a mhbook.ModelConfig, got {type(config).__name__}")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        self.config = config
        self.d_model = config.d_model
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, config.d_model)
        if config.position == "sinusoidal":
            self.pos_encoding = PositionalEncoding(config.d_model, config.dropout)
        else:
            self.pos_encoding = None
            self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(DecoderOnlyBlock(config) for _ in range(config.num_layers))
        self.norm = (
            nn.LayerNorm(config.d_model, config.norm_eps) if config.norm_first else nn.Identity()
        )
        self.output = nn.Linear(config.d_model, vocab_size)

    def new_cache(self) -> KVCache:
        """An empty :class:`mhbook.KVCache`, one layer cache per block; with
        ``config.window`` a rolling one that keeps the last ``window`` tokens."""
        return KVCache(max(1, len(self.blocks)), window=self.config.window)

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        cache: KVCache | None = None,
        valid_lens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Next-token logits at every position.

        Args:
            tokens: ``(batch, T)`` token ids: the whole sequence, or with ``cache`` the
                new tokens only (``cache.length`` tokens came before them).
            cache: ``None``, or a :class:`mhbook.KVCache` (:meth:`new_cache`): the new
                tokens attend to the ones it holds and are added to it.
            valid_lens: ``(batch,)`` real tokens at the start of each row (the rest is
                padding): keys past them are masked. Not needed for right-padded rows
                whose padded positions are ignored by the loss: the causal mask already
                keeps the padding out of every real token's view. Only without a cache.

        Returns:
            ``(batch, T, vocab_size)``.
        """
        _check_tokens(tokens, self.vocab_size)
        _check_cache(cache, self)
        if valid_lens is not None and cache is not None:
            raise ValueError("valid_lens is for a whole padded sequence: pass it without a cache")
        length = tokens.size(1)
        past = 0 if cache is None else cache.length
        kept = 0 if cache is None else cache.layers[0].num_kept
        # Bottom-right aligned: the new tokens see the kept ones and the earlier new ones.
        mask = causal_mask(length, kept + length, tokens.device, window=self.config.window)
        if valid_lens is not None:
            if not isinstance(valid_lens, torch.Tensor) or valid_lens.shape != (tokens.size(0),):
                got = valid_lens.shape if isinstance(valid_lens, torch.Tensor) else valid_lens
                raise ValueError(
                    f"valid_lens must have shape ({tokens.size(0)},) for tokens "
                    f"{tuple(tokens.shape)}, got {got}"
                )
            mask = mask & padding_mask(valid_lens, length)  # (batch, 1, T, T)
        x = self.embedding(tokens) * math.sqrt(self.d_model)
        x = self.pos_encoding(x, offset=past) if self.pos_encoding is not None else self.dropout(x)
        for i, block in enumerate(self.blocks):
            x = block(x, mask, None if cache is None else cache.layers[i])
        if cache is not None and not self.blocks:
            cache.layers[0].length += length  # nothing to cache, but count the tokens
        return self.output(self.norm(x))

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        eos_id: int | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Continue ``prompt`` one token at a time.

        At each step the next token is the most likely one (``temperature == 0``,
        greedy), or it is drawn from ``softmax(logits / temperature)`` restricted to the
        ``top_k`` most likely tokens (all of them when ``top_k`` is ``None``).

        With ``use_cache`` the prompt is run once and then each step feeds in only the
        newest token, attending to the keys and values kept in a :class:`mhbook.KVCache`;
        without it the whole sequence is run again at every step. Both give the same
        tokens. Runs in eval mode (restoring the mode after).

        Args:
            prompt: ``(batch, P)`` token ids, ``P >= 1``, no padding (prompts of one
                length; group prompts by length to generate for several lengths).
            max_new_tokens: at most this many new tokens.
            temperature: 0 for greedy decoding, else the softmax temperature (> 0).
            top_k: sample among the ``top_k`` most likely tokens only.
            generator: a ``torch.Generator`` on the model's device for the sampling
                (the same seed gives the same samples).
            eos_id: a sequence stops at this token; after it the row is filled with
                ``eos_id``, and generation stops once every row has one. ``None``: never.

        Returns:
            ``(batch, n)`` the new tokens, ``n <= max_new_tokens``.
        """
        _check_tokens(prompt, self.vocab_size, "prompt")
        if prompt.size(1) < 1:
            raise ValueError(
                f"prompt must hold at least one token, got shape {tuple(prompt.shape)}"
            )
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1
        ):
            raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
        was_training = self.training
        self.eval()
        try:
            cache = self.new_cache() if use_cache else None
            tokens, new = prompt, prompt
            finished = torch.zeros(prompt.size(0), dtype=torch.bool, device=prompt.device)
            for _ in range(max_new_tokens):
                logits = self(new, cache=cache)[:, -1]  # (batch, vocab_size)
                next_token = _pick(logits, temperature, top_k, generator)
                if eos_id is not None:
                    next_token = next_token.masked_fill(finished, eos_id)
                    finished |= next_token == eos_id
                tokens = torch.cat([tokens, next_token[:, None]], dim=1)
                new = tokens if cache is None else tokens[:, -1:]
                if eos_id is not None and finished.device.type != "meta" and finished.all():
                    break
            return tokens[:, prompt.size(1) :]
        finally:
            self.train(was_training)


def _pick(logits, temperature, top_k, generator) -> torch.Tensor:
    """The next token ``(batch,)`` from the last logits ``(batch, vocab_size)``."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _check_tokens(tokens, vocab_size: int, name: str = "tokens") -> None:
    """Type, shape and dtype; the ids too, but only on the CPU (reading values from an
    accelerator would wait for it at every call)."""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(tokens).__name__}")
    if tokens.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, length), got {tuple(tokens.shape)}")
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.device.type == "cpu" and tokens.numel() > 0:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{name} holds ids from {low} to {high}, but the vocabulary has {vocab_size} "
                f"tokens: ids must be in [0, {vocab_size - 1}]"
            )


def _check_cache(cache, model: DecoderOnlyLM) -> None:
    if cache is None:
        return
    if not isinstance(cache, KVCache):
        raise TypeError(
            "cache must be None or a mhbook.KVCache (model.new_cache()), "
            f"got {type(cache).__name__}"
        )
    if len(cache.layers) != max(1, len(model.blocks)):
        raise ValueError(
            f"the model has {len(model.blocks)} layers but the cache has {len(cache.layers)}"
        )
    if cache.window != model.config.window:
        raise ValueError(
            f"the cache keeps window={cache.window} tokens but the model attends to "
            f"window={model.config.window}: use model.new_cache()"
        )
