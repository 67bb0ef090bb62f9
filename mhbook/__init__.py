"""mhbook: the reference code of the book *Multi-Head Attention, Run and Checked*.

Everything a chapter needs is re-exported here, e.g. ``mhbook.MultiHeadAttention``;
the modules are importable too (``mhbook.plot``, ``mhbook.data``, ...).
"""

from . import bleu, data, plot, train, widgets
from .attention import attend, scaled_dot_product_attention
from .bleu import corpus_bleu, sentence_bleu
from .blocks import DecoderBlock, EncoderBlock
from .cache import KVCache, LayerCache
from .config import BOOK_CONFIG, Config, DataConfig, ModelConfig, TrainConfig
from .data import Batch, NumberTranslation, Vocab, detokenize, english_words, french_words, tokenize
from .layers import AddNorm, PositionalEncoding, PositionWiseFFN, sinusoidal_encoding
from .masks import causal_mask, check_mask, padding_mask
from .multihead import MultiHeadAttention
from .plot import plot_attention_grid, plot_heatmap, plot_history, plot_lines, plot_mask
from .train import book_model, evaluate, fit, make_data, make_model
from .transformer import Transformer, TransformerDecoder, TransformerEncoder, record_attention
from .utils import get_device, load_checkpoint, save_checkpoint, set_seed
from .widgets import attention_explorer, attention_explorer_html

__version__ = "0.1.0"

__all__ = [
    # attention, masks, multi-head attention
    "scaled_dot_product_attention",
    "attend",
    "padding_mask",
    "causal_mask",
    "check_mask",
    "MultiHeadAttention",
    # the Transformer
    "sinusoidal_encoding",
    "PositionalEncoding",
    "PositionWiseFFN",
    "AddNorm",
    "EncoderBlock",
    "DecoderBlock",
    "TransformerEncoder",
    "TransformerDecoder",
    "Transformer",
    "record_attention",
    "KVCache",
    "LayerCache",
    # data, training, evaluation
    "english_words",
    "french_words",
    "tokenize",
    "detokenize",
    "Vocab",
    "Batch",
    "NumberTranslation",
    "corpus_bleu",
    "sentence_bleu",
    "BOOK_CONFIG",
    "Config",
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    "make_data",
    "make_model",
    "fit",
    "evaluate",
    "book_model",
    # utilities, plots, widgets
    "get_device",
    "set_seed",
    "save_checkpoint",
    "load_checkpoint",
    "plot_heatmap",
    "plot_attention_grid",
    "plot_mask",
    "plot_history",
    "plot_lines",
    "attention_explorer",
    "attention_explorer_html",
    # modules
    "bleu",
    "data",
    "plot",
    "train",
    "widgets",
]
