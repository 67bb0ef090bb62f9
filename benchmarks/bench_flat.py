"""References for the benchmark only: the book's Transformer written flat, and PyTorch's own.

NOT part of the book's model. Table (e) of ``python -m benchmarks.bench`` times the training
step of :class:`mhbook.Transformer` against D2L's code (:mod:`benchmarks.bench_d2l`) and,
to show where the time goes, against two more models trained by the same step:

- :class:`FlatTransformer`, the book's model with nothing around it: the same parameters
  under the same names (``load_state_dict`` takes a :class:`mhbook.Transformer`'s) and
  the same operations in the same order, so that it trains to the same bits
  (``tests/benchmarks/test_bench_flat.py``), written as a few functions with no input checks, no
  KV cache, no explicit path, no hooks and no options. Its speed is what the book's
  readable modules and clear errors could at most gain; the rest of the time is PyTorch's.
- :class:`TorchTransformer`, :class:`torch.nn.Transformer` with the same sizes, between
  the same embeddings, positional encoding and output layer: PyTorch's own code. Its
  ``dropout`` also falls on the attention weights and inside the feed-forward network,
  and it adds a final layer norm to the encoder and to the decoder.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mhbook import ModelConfig, sinusoidal_encoding
from mhbook.models.layers import Dropout  # the book's own dropout

__all__ = ["FlatTransformer", "TorchTransformer"]

#: Positions in the positional-encoding tables of both models (the benchmark uses 10).
MAX_LENGTH = 512


def _attention_weights(d_model: int) -> nn.ModuleDict:
    return nn.ModuleDict(
        {name: nn.Linear(d_model, d_model) for name in ("W_q", "W_k", "W_v", "W_o")}
    )


def _block(config: ModelConfig, attentions: list[str]) -> nn.ModuleDict:
    """One block's weights, named as in :class:`mhbook.EncoderBlock` / ``DecoderBlock``."""
    d = config.d_model
    block = nn.ModuleDict({name: _attention_weights(d) for name in attentions})
    block["ffn"] = nn.ModuleDict(
        {"linear1": nn.Linear(d, config.d_ff), "linear2": nn.Linear(config.d_ff, d)}
    )
    for i in range(len(attentions) + 1):  # one add & norm per sublayer
        block[f"addnorm{i + 1}"] = nn.ModuleDict({"norm": nn.LayerNorm(d, eps=config.norm_eps)})
    return block


class FlatTransformer(nn.Module):
    """:class:`mhbook.Transformer` (post-norm, heads of ``d_model / num_heads``) written
    flat. ``forward(src, tgt_in, src_valid_lens)`` -> logits ``(batch, T, tgt_vocab_size)``."""

    def __init__(self, config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__()
        if config.norm_first or config.head_dim not in (None, config.d_model // config.num_heads):
            raise NotImplementedError("only the post-norm model with the default head size")
        self.config = config
        L = config.num_layers
        self.encoder = nn.Module()
        self.encoder.embedding = nn.Embedding(src_vocab_size, config.d_model)
        self.encoder.blocks = nn.ModuleList(_block(config, ["self_attn"]) for _ in range(L))
        self.decoder = nn.Module()
        self.decoder.embedding = nn.Embedding(tgt_vocab_size, config.d_model)
        self.decoder.blocks = nn.ModuleList(
            _block(config, ["self_attn", "cross_attn"]) for _ in range(L)
        )
        self.decoder.output = nn.Linear(config.d_model, tgt_vocab_size)
        P = sinusoidal_encoding(MAX_LENGTH, config.d_model)
        self.register_buffer("P", P, persistent=False)
        self.dropout = Dropout(config.dropout)  # every dropout site's: the same p and mode

    def forward(self, src, tgt_in, src_valid_lens):
        positions = torch.arange(src.size(1), device=src.device)
        mask = (positions < src_valid_lens[:, None])[:, None, None, :]  # True = may attend
        x = self._embed(self.encoder.embedding, src)
        for block in self.encoder.blocks:
            x = self._add_norm(block.addnorm1, x, self._attend(block.self_attn, x, x, mask))
            x = self._add_norm(block.addnorm2, x, self._ffn(block.ffn, x))
        memory = x
        y = self._embed(self.decoder.embedding, tgt_in)
        for block in self.decoder.blocks:
            y = self._add_norm(block.addnorm1, y, self._attend(block.self_attn, y, y, None, True))
            y = self._add_norm(block.addnorm2, y, self._attend(block.cross_attn, y, memory, mask))
            y = self._add_norm(block.addnorm3, y, self._ffn(block.ffn, y))
        return self.decoder.output(y)

    def _embed(self, embedding, tokens):
        x = embedding(tokens) * math.sqrt(self.config.d_model)
        return self.dropout(x + self.P[: tokens.size(1)])

    def _attend(self, w, x, memory, mask, is_causal=False):
        (B, L, d), S, h = x.shape, memory.size(1), self.config.num_heads
        # Keys and values first, as mhbook does: the order decides in which order backward
        # adds up the gradients of x, and so their last bits.
        k = w.W_k(memory).view(B, S, h, d // h).transpose(1, 2)
        v = w.W_v(memory).view(B, S, h, d // h).transpose(1, 2)
        q = w.W_q(x).view(B, L, h, d // h).transpose(1, 2)
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
        return w.W_o(heads.transpose(1, 2).reshape(B, L, d))

    def _ffn(self, w, x):
        return w.linear2(torch.relu(w.linear1(x)))

    def _add_norm(self, w, x, sublayer_output):
        return w.norm(x + self.dropout(sublayer_output))


class TorchTransformer(nn.Module):
    """:class:`torch.nn.Transformer` (``batch_first=True``, post-norm) of ``config``'s sizes
    between embeddings scaled by ``sqrt(d_model)`` plus the sinusoidal encoding (with
    dropout) and a linear layer to the target vocabulary.
    ``forward(src, tgt_in, src_valid_lens)`` -> logits ``(batch, T, tgt_vocab_size)``."""

    def __init__(self, config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__()
        c = config
        self.config = config
        self.src_embedding = nn.Embedding(src_vocab_size, c.d_model)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, c.d_model)
        self.transformer = nn.Transformer(
            c.d_model, c.num_heads, c.num_layers, c.num_layers, c.d_ff, c.dropout,
            batch_first=True, norm_first=c.norm_first, layer_norm_eps=c.norm_eps,
        )  # fmt: skip
        self.output = nn.Linear(c.d_model, tgt_vocab_size)
        self.register_buffer("P", sinusoidal_encoding(MAX_LENGTH, c.d_model), persistent=False)

    def forward(self, src, tgt_in, src_valid_lens):
        # nn.Transformer's key_padding_mask is True where a key is padding (the opposite
        # of the book's masks), and its causal mask is a float one (-inf above the diagonal).
        padding = torch.arange(src.size(1), device=src.device) >= src_valid_lens[:, None]
        T = tgt_in.size(1)
        causal = nn.Transformer.generate_square_subsequent_mask(T, device=tgt_in.device)
        y = self.transformer(
            self._embed(self.src_embedding, src), self._embed(self.tgt_embedding, tgt_in),
            tgt_mask=causal, tgt_is_causal=True,
            src_key_padding_mask=padding, memory_key_padding_mask=padding,
        )  # fmt: skip
        return self.output(y)

    def _embed(self, embedding, tokens):
        x = embedding(tokens) * math.sqrt(self.config.d_model)
        return F.dropout(x + self.P[: tokens.size(1)], self.config.dropout, self.training)
