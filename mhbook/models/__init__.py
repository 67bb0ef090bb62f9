"""The models built from attention: the other layers (positional encoding, FFNs, norms, add
& norm), the blocks and ``make_attention``, the encoder-decoder Transformer, the decoder-only
language model, the one generation loop, and the Hugging Face mapping."""

from . import blocks, generation, hf, layers, lm, transformer
from .blocks import *  # noqa: F403
from .generation import *  # noqa: F403
from .hf import *  # noqa: F403
from .layers import *  # noqa: F403
from .lm import *  # noqa: F403
from .transformer import *  # noqa: F403

__all__ = [
    *layers.__all__,
    *blocks.__all__,
    *transformer.__all__,
    *lm.__all__,
    *generation.__all__,
    *hf.__all__,
]
