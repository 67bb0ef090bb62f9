"""Attention itself: the one core (:func:`~mhbook.attention.sdpa.attend`), positions inside
attention (RoPE, ALiBi), the one cache protocol, and the attention layers: multi-head
attention (MHA, GQA, MQA, windows, sinks) and DeepSeek's multi-head latent attention.

Imports only :mod:`mhbook.core`."""

from . import alibi, base, cache, mla, multihead, rope, sdpa, streaming
from .alibi import *  # noqa: F403
from .base import *  # noqa: F403
from .cache import *  # noqa: F403
from .mla import *  # noqa: F403
from .multihead import *  # noqa: F403
from .rope import *  # noqa: F403
from .sdpa import *  # noqa: F403
from .streaming import *  # noqa: F403

__all__ = [
    *sdpa.__all__,
    *rope.__all__,
    *alibi.__all__,
    *cache.__all__,
    *base.__all__,
    *streaming.__all__,
    *multihead.__all__,
    *mla.__all__,
]
