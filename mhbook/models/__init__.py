"""The models built from attention: the other layers (positional encoding, FFNs, norms, add
& norm), the blocks and ``make_attention``, the encoder-decoder Transformer, the decoder-only
language model, the one generation loop, and the conversions: to and from Hugging Face
``transformers`` (:mod:`~mhbook.models.hf`) and PyTorch's ``torch.nn`` layers
(:mod:`~mhbook.models.torch_interop`); and a head's circuits read from its weights
(:mod:`~mhbook.models.circuits`)."""

from . import blocks, circuits, generation, hf, layers, lm, torch_interop, transformer
from .blocks import *  # noqa: F403
from .circuits import *  # noqa: F403
from .generation import *  # noqa: F403
from .hf import *  # noqa: F403
from .layers import *  # noqa: F403
from .lm import *  # noqa: F403
from .torch_interop import *  # noqa: F403
from .transformer import *  # noqa: F403

__all__ = [
    *layers.__all__,
    *blocks.__all__,
    *transformer.__all__,
    *lm.__all__,
    *generation.__all__,
    *hf.__all__,
    *torch_interop.__all__,
    *circuits.__all__,
]
