"""The models built from attention: the other layers (positional encoding, FFNs, norms, add
& norm), the blocks and ``make_attention``, the encoder-decoder Transformer, the decoder-only
language model, the one generation loop, and the conversions: to and from Hugging Face
``transformers`` (:mod:`~mhbook.models.hf`) and PyTorch's ``torch.nn`` layers
(:mod:`~mhbook.models.torch_interop`); and a head's circuits read from its weights
(:mod:`~mhbook.models.circuits`)."""

from ..core.public import gather

#: The modules whose public names this folder offers (and ``mhbook`` with it).
__all__ = gather(
    globals(),
    ("layers", "blocks", "transformer", "lm", "generation", "hf", "torch_interop", "circuits"),
)
