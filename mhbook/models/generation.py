"""Generation, one token at a time, for every model of mhbook: the one ``generate``.

At each step the model gives the next token's logits, the next token is chosen, and it is
fed back in. With a KV cache (the default) the prompt is run once and each later step
feeds in only the newest token, which attends to the keys and values kept in the cache
(:class:`mhbook.KVCache`); without it the whole sequence is run again at every step. Both
give the same tokens.

The next token is the most likely one (``temperature=0``, greedy), or it is drawn from
``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens and to
the smallest set of tokens whose probabilities add up to ``top_p`` (nucleus sampling,
Holtzman et al., 2020): :func:`next_token_probs`.

:meth:`mhbook.DecoderOnlyLM.generate` and :meth:`mhbook.Transformer.generate` both call
:func:`generate`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch import nn

from ..core.validate import check_int, check_number, check_tokens

__all__ = ["generate", "next_token_probs", "eval_mode"]


@contextmanager
def eval_mode(model: nn.Module):
    """Run ``model`` in eval mode inside the ``with`` block, then restore its mode."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def next_token_probs(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """The distribution the next token is drawn from.

    Args:
        logits: ``(batch, vocab_size)``, the last position's logits.
        temperature: ``> 0``; the logits are divided by it (below 1 sharper, above 1
            flatter).
        top_k: keep only the ``top_k`` most likely tokens (``None``: all).
        top_p: keep only the most likely tokens whose probabilities, largest first, add
            up to ``top_p`` (the token that crosses it included; ``None``: all).

    Returns:
        float32 probabilities ``(batch, vocab_size)``, each row summing to one.

    The largest logit is subtracted before dividing by the temperature, so a tiny
    temperature gives the argmax's distribution (shared among ties), never ``inf / inf``.
    """
    scaled = logits.float()
    scaled = (scaled - scaled.max(dim=-1, keepdim=True).values) / temperature
    if top_k is not None and top_k < scaled.size(-1):
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]  # the k-th largest
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the likelier tokens
        drop_sorted = before >= top_p  # the smallest set reaching top_p is kept
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    step: Callable[[torch.Tensor, object], torch.Tensor] | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    use_cache: bool = True,
    max_length: int | None = None,
) -> torch.Tensor:
    """Continue ``prompt`` one token at a time.

    Args:
        model: a model with ``new_cache()``, ``vocab_size`` and an ``embedding`` (a
            :class:`mhbook.DecoderOnlyLM`, or the decoder of a :class:`mhbook.Transformer`).
            It runs in eval mode (its mode is restored after).
        prompt: ``(batch, P)`` token ids, ``P >= 1``, no padding (prompts of one length;
            group prompts by length to generate for several lengths).
        max_new_tokens: at most this many new tokens.
        step: ``step(tokens, cache)`` gives the logits ``(batch, T, vocab_size)`` of
            ``tokens`` (the whole sequence, or with a cache only the new tokens);
            default ``model(tokens, cache=cache)``.
        temperature: 0 for greedy decoding, else the softmax temperature (> 0, finite).
        top_k, top_p: sample among the ``top_k`` most likely tokens only, and among those
            whose probabilities add up to ``top_p`` (see :func:`next_token_probs`).
        generator: a ``torch.Generator`` on the model's device for the sampling (the
            same seed gives the same samples).
        eos_id: a sequence stops at this token; after it the row is filled with
            ``eos_id``, and generation stops once every row has one (except on the
            ``meta`` device, whose tensors hold no values to test). ``None``: never.
        use_cache: keep the keys and values in ``model.new_cache()``.
        max_length: ``None``, or the most tokens, prompt and new ones together, that the
            sequence (and so a full-attention KV cache) may reach, as Hugging Face's
            ``max_length``: generation stops there, and a prompt that already fills it is
            refused with a ``ValueError`` naming both lengths (nothing could be generated,
            and its cache alone would exceed the bound).

    Returns:
        ``(batch, n)`` the new tokens, ``n <= max_new_tokens``.
    """
    vocab_size = model.vocab_size
    check_tokens("prompt", prompt, vocab_size, model.embedding.weight.device)
    if prompt.size(1) < 1:
        raise ValueError(f"prompt must hold at least one token, got shape {tuple(prompt.shape)}")
    check_int("max_new_tokens", max_new_tokens, 0)
    check_int("max_length", max_length, 1, optional=True)
    if max_length is not None:
        if prompt.size(1) >= max_length:
            raise ValueError(
                f"the prompt has {prompt.size(1)} tokens, but max_length={max_length} bounds "
                "the prompt and the new tokens together: shorten the prompt (e.g. keep its "
                "last tokens) or raise max_length"
            )
        max_new_tokens = min(max_new_tokens, max_length - prompt.size(1))
    check_number("temperature", temperature, 0.0, math.inf)
    check_int("top_k", top_k, 1, optional=True)
    if top_p is not None:
        check_number("top_p", top_p, 0.0, 1.0, low_inclusive=False, high_inclusive=True)
    if eos_id is not None:
        check_int("eos_id", eos_id, 0)
        if eos_id >= vocab_size:
            raise ValueError(
                f"eos_id must be a token id in [0, {vocab_size - 1}] (the vocabulary has "
                f"{vocab_size} tokens), got {eos_id}: generation could never stop on it"
            )
    if step is None:

        def step(tokens, cache):
            return model(tokens, cache=cache)

    with eval_mode(model):
        cache = model.new_cache() if use_cache else None
        tokens, new = prompt, prompt
        finished = torch.zeros(prompt.size(0), dtype=torch.bool, device=prompt.device)
        for _ in range(max_new_tokens):
            logits = step(new, cache)[:, -1]  # (batch, vocab_size)
            if temperature == 0:
                next_token = logits.argmax(dim=-1)
            else:
                probs = next_token_probs(logits, temperature, top_k, top_p)
                next_token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            if eos_id is not None:
                next_token = next_token.masked_fill(finished, eos_id)
                finished |= next_token == eos_id
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            new = tokens if cache is None else tokens[:, -1:]
            if eos_id is not None and finished.device.type != "meta" and bool(finished.all()):
                break
        return tokens[:, prompt.size(1) :]
