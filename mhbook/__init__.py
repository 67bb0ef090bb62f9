"""mhbook: the reference code of the book *Multi-Head Attention, Run and Checked*.

Everything a chapter imports is re-exported here, e.g. ``mhbook.MultiHeadAttention``.
"""

from .attention import scaled_dot_product_attention
from .blocks import DecoderBlock, EncoderBlock
from .layers import AddNorm, PositionalEncoding, PositionWiseFFN, sinusoidal_encoding
from .masks import causal_mask, check_mask, padding_mask
from .multihead import MultiHeadAttention
from .transformer import Transformer, TransformerDecoder, TransformerEncoder, record_attention
from .utils import get_device, load_checkpoint, save_checkpoint, set_seed

__version__ = "0.1.0"
