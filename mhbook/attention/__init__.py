"""Attention itself: the one core (:func:`~mhbook.attention.sdpa.attend`), positions inside
attention (RoPE, ALiBi), the one cache protocol, and the attention layers: multi-head
attention (MHA, GQA, MQA, windows, sinks) and DeepSeek's multi-head latent attention.

Imports only :mod:`mhbook.core`."""

from ..core.public import gather

#: The modules whose public names this folder offers (and ``mhbook`` with it).
__all__ = gather(
    globals(), ("sdpa", "rope", "alibi", "cache", "base", "streaming", "multihead", "mla")
)
