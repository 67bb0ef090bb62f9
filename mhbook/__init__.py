"""mhbook: the reference code of the book *Multi-Head Attention, Run and Checked*.

Everything a chapter needs is re-exported here, e.g. ``mhbook.MultiHeadAttention``;
the modules are importable too (``mhbook.plot``, ``mhbook.data``, ...).

``import mhbook`` is cheap: the plots and diagrams (matplotlib) and the explorers
(ipywidgets) are imported the first time one of their names is used, e.g.
``mhbook.plot_heatmap`` (PEP 562, the module's ``__getattr__`` below).
"""

import importlib

from . import (
    alibi,
    bleu,
    config,
    context_parallel,
    data,
    hf,
    launch,
    lm,
    lm_data,
    mla,
    parallel,
    rope,
    shakespeare,
    text,
    train,
)
from .alibi import ALiBi, alibi_slopes
from .attention import attend, scaled_dot_product_attention
from .bleu import corpus_bleu, sentence_bleu
from .blocks import DecoderBlock, DecoderOnlyBlock, EncoderBlock, Stack, make_attention
from .cache import KVCache, LayerCache
from .config import BOOK_CONFIG, FAST_CONFIG, Config, DataConfig, ModelConfig, TrainConfig
from .data import Batch, NumberTranslation, Vocab, detokenize, english_words, french_words, tokenize
from .generate import generate, next_token_probs
from .layers import (
    AddNorm,
    PositionalEncoding,
    PositionWiseFFN,
    RMSNorm,
    SwiGLU,
    make_ffn,
    make_norm,
    sinusoidal_encoding,
)
from .lm import DecoderOnlyLM
from .lm_data import LMBatch, PromptCompletion, completion_loss, evaluate_lm
from .masks import causal_mask, check_mask, padding_mask, window_slots
from .measure import peak_memory_bytes
from .mla import MultiHeadLatentAttention
from .multihead import MultiHeadAttention
from .parallel import TensorParallelMultiHeadAttention
from .rope import RopeScaling, RotaryEmbedding
from .shakespeare import (
    SHAKESPEARE_CONTEXT,
    SHAKESPEARE_MODEL,
    SHAKESPEARE_TRAIN,
    shakespeare_data,
    shakespeare_model,
)
from .text import (
    CharTokenizer,
    TextData,
    lm_loss,
    load_shakespeare,
    ngram_losses,
    split_text,
    train_bpe,
)
from .train import (
    TrainingLog,
    book_model,
    cpu_threads,
    evaluate,
    fit,
    load_model,
    lr_lambda,
    make_data,
    make_model,
    make_optimizer,
    make_scheduler,
    sequence_loss,
    translation_loss,
    valid_loss,
)
from .transformer import Transformer, TransformerDecoder, TransformerEncoder, record_attention
from .utils import (
    cpu_or_gpu,
    describe_machine,
    get_device,
    glue,
    load_checkpoint,
    save_checkpoint,
    set_seed,
    to_numpy,
    use_sharp_figures,
)

__version__ = "0.3.0"

# In Jupyter, figures are retina PNGs (sharp on HiDPI screens); nothing happens elsewhere.
use_sharp_figures()

# Imported on first use: name -> the module (of this package) that defines it.
_LAZY = {
    "plot": "plot",
    "plot_heatmap": "plot",
    "plot_attention_grid": "plot",
    "plot_mask": "plot",
    "plot_history": "plot",
    "plot_lines": "plot",
    "diagrams": "diagrams",
    "draw_transformer": "diagrams",
    "draw_multihead": "diagrams",
    "draw_kv_cache": "diagrams",
    "explorers": "explorers",
    "attention_explorer": "explorers",
    "attention_explorer_html": "explorers",
    "explorer_weights": "explorers",
    "focus_preset": "explorers",
    "explorer_title": "explorers",
    "explorer_attention": "explorers",
    "explorer_presets": "explorers",
    "softmax_explorer": "explorers",
    "softmax_explorer_html": "explorers",
    "mask_explorer": "explorers",
    "mask_explorer_html": "explorers",
    "positional_explorer": "explorers",
    "positional_explorer_html": "explorers",
}


def __getattr__(name: str):
    """Import a plot, an explorer or their module the first time it is used."""
    if name not in _LAZY:
        raise AttributeError(f"module 'mhbook' has no attribute {name!r}")
    module = importlib.import_module(f".{_LAZY[name]}", __name__)
    value = module if name == _LAZY[name] else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    # attention, masks, multi-head attention
    "scaled_dot_product_attention",
    "attend",
    "padding_mask",
    "causal_mask",
    "window_slots",
    "check_mask",
    "MultiHeadAttention",
    "TensorParallelMultiHeadAttention",
    "MultiHeadLatentAttention",
    # position inside attention
    "RotaryEmbedding",
    "RopeScaling",
    "ALiBi",
    "alibi_slopes",
    # the Transformer
    "sinusoidal_encoding",
    "PositionalEncoding",
    "PositionWiseFFN",
    "SwiGLU",
    "RMSNorm",
    "AddNorm",
    "make_norm",
    "make_ffn",
    "EncoderBlock",
    "DecoderBlock",
    "TransformerEncoder",
    "TransformerDecoder",
    "Transformer",
    "record_attention",
    # the decoder-only language model
    "make_attention",
    "Stack",
    "DecoderOnlyBlock",
    "DecoderOnlyLM",
    "generate",
    "next_token_probs",
    "PromptCompletion",
    "LMBatch",
    "completion_loss",
    "evaluate_lm",
    "KVCache",
    "LayerCache",
    # configurations
    "BOOK_CONFIG",
    "FAST_CONFIG",
    "Config",
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    # data
    "english_words",
    "french_words",
    "tokenize",
    "detokenize",
    "Vocab",
    "Batch",
    "NumberTranslation",
    "corpus_bleu",
    "sentence_bleu",
    # training, evaluation, the book's model
    "make_data",
    "make_model",
    "load_model",
    "sequence_loss",
    "translation_loss",
    "lr_lambda",
    "make_optimizer",
    "make_scheduler",
    "TrainingLog",
    "fit",
    "cpu_threads",
    "valid_loss",
    "evaluate",
    "book_model",
    # Part V: real text, its tokenizers, and the shared Shakespeare model
    "load_shakespeare",
    "split_text",
    "CharTokenizer",
    "train_bpe",
    "TextData",
    "lm_loss",
    "ngram_losses",
    "SHAKESPEARE_MODEL",
    "SHAKESPEARE_TRAIN",
    "SHAKESPEARE_CONTEXT",
    "shakespeare_data",
    "shakespeare_model",
    # utilities
    "get_device",
    "cpu_or_gpu",
    "describe_machine",
    "glue",
    "set_seed",
    "save_checkpoint",
    "load_checkpoint",
    "to_numpy",
    "use_sharp_figures",
    "peak_memory_bytes",
    # plots and explorers (imported on first use)
    "plot_heatmap",
    "plot_attention_grid",
    "plot_mask",
    "plot_history",
    "plot_lines",
    "draw_transformer",
    "draw_multihead",
    "draw_kv_cache",
    "attention_explorer",
    "attention_explorer_html",
    "explorer_weights",
    "focus_preset",
    "explorer_title",
    "explorer_attention",
    "explorer_presets",
    "softmax_explorer",
    "softmax_explorer_html",
    "mask_explorer",
    "mask_explorer_html",
    "positional_explorer",
    "positional_explorer_html",
    # modules
    "alibi",
    "bleu",
    "config",
    "context_parallel",
    "data",
    "hf",
    "lm",
    "lm_data",
    "mla",
    "diagrams",
    "explorers",
    "launch",
    "parallel",
    "plot",
    "rope",
    "shakespeare",
    "text",
    "train",
]
