"""A reference for the benchmark only: Dive into Deep Learning's Transformer, as in ``d2l.torch``.

NOT part of the book's model. :func:`benchmarks.bench.bench_training_vs_d2l` times the training
step of :class:`mhbook.Transformer` against this code, which is written here as D2L writes
it (Zhang et al., *Dive into Deep Learning*, chapter "Transformer", PyTorch edition:
``d2l.torch`` 0.17, ``train_seq2seq``), so that ``d2l`` need not be installed. It keeps D2L's
choices, including the ones that cost time: ``masked_softmax`` by ``valid_lens`` with an
in-place boolean-index fill, heads folded into the batch (``transpose_qkv``), a dropout
on the attention weights and on every residual branch and on the positional encoding,
the decoder's state list and ``dec_valid_lens`` rebuilt in every block, the masked
cross-entropy :class:`MaskedSoftmaxCELoss`, ``torch.optim.Adam`` and :func:`grad_clipping`.
The only changes: ``nn.LazyLinear`` is replaced by ``nn.Linear`` with the input size
given (the same layer once initialised), and the positional encoding's table is a
buffer so that ``.to(device)`` moves it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = [
    "sequence_mask",
    "masked_softmax",
    "DotProductAttention",
    "MultiHeadAttention",
    "PositionalEncoding",
    "PositionWiseFFN",
    "AddNorm",
    "EncoderBlock",
    "TransformerEncoder",
    "DecoderBlock",
    "TransformerDecoder",
    "EncoderDecoder",
    "MaskedSoftmaxCELoss",
    "grad_clipping",
    "d2l_transformer",
    "train_step",
]


def sequence_mask(X, valid_len, value=0):
    """Mask irrelevant entries in sequences (``d2l.sequence_mask``), in place."""
    maxlen = X.size(1)
    mask = torch.arange(maxlen, dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    X[~mask] = value
    return X


def masked_softmax(X, valid_lens):
    """Softmax over the last axis, keys beyond ``valid_lens`` masked (``d2l.masked_softmax``)."""
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    # Masked elements get a very large negative value, whose exponential is 0.
    X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


class DotProductAttention(nn.Module):
    """Scaled dot-product attention (``d2l.DotProductAttention``)."""

    def __init__(self, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (``d2l.MultiHeadAttention``): heads folded into the batch."""

    def __init__(
        self, key_size, query_size, value_size, num_hiddens, num_heads, dropout, bias=False
    ):
        super().__init__()
        self.num_heads = num_heads
        self.attention = DotProductAttention(dropout)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=bias)
        self.W_v = nn.Linear(value_size, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def forward(self, queries, keys, values, valid_lens):
        queries = transpose_qkv(self.W_q(queries), self.num_heads)
        keys = transpose_qkv(self.W_k(keys), self.num_heads)
        values = transpose_qkv(self.W_v(values), self.num_heads)
        if valid_lens is not None:
            valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
        output = self.attention(queries, keys, values, valid_lens)
        output_concat = transpose_output(output, self.num_heads)
        return self.W_o(output_concat)


def transpose_qkv(X, num_heads):
    """``(batch, L, num_hiddens)`` -> ``(batch * num_heads, L, num_hiddens / num_heads)``."""
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1)
    X = X.permute(0, 2, 1, 3)
    return X.reshape(-1, X.shape[2], X.shape[3])


def transpose_output(X, num_heads):
    """Reverse :func:`transpose_qkv`."""
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])
    X = X.permute(0, 2, 1, 3)
    return X.reshape(X.shape[0], X.shape[1], -1)


class PositionalEncoding(nn.Module):
    """Sinusoidal positional encoding plus dropout (``d2l.PositionalEncoding``)."""

    def __init__(self, num_hiddens, dropout, max_len=1000):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        P = torch.zeros((1, max_len, num_hiddens))
        X = torch.arange(max_len, dtype=torch.float32).reshape(-1, 1) / torch.pow(
            10000, torch.arange(0, num_hiddens, 2, dtype=torch.float32) / num_hiddens
        )
        P[:, :, 0::2] = torch.sin(X)
        P[:, :, 1::2] = torch.cos(X)
        self.register_buffer("P", P, persistent=False)

    def forward(self, X):
        X = X + self.P[:, : X.shape[1], :].to(X.device)
        return self.dropout(X)


class PositionWiseFFN(nn.Module):
    """``d2l.PositionWiseFFN``."""

    def __init__(self, ffn_num_input, ffn_num_hiddens, ffn_num_outputs):
        super().__init__()
        self.dense1 = nn.Linear(ffn_num_input, ffn_num_hiddens)
        self.relu = nn.ReLU()
        self.dense2 = nn.Linear(ffn_num_hiddens, ffn_num_outputs)

    def forward(self, X):
        return self.dense2(self.relu(self.dense1(X)))


class AddNorm(nn.Module):
    """``LayerNorm(dropout(Y) + X)`` (``d2l.AddNorm``)."""

    def __init__(self, normalized_shape, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, X, Y):
        return self.ln(self.dropout(Y) + X)


class EncoderBlock(nn.Module):
    """``d2l.EncoderBlock``."""

    def __init__(
        self,
        key_size,
        query_size,
        value_size,
        num_hiddens,
        norm_shape,
        ffn_num_input,
        ffn_num_hiddens,
        num_heads,
        dropout,
        use_bias=False,
    ):
        super().__init__()
        self.attention = MultiHeadAttention(
            key_size, query_size, value_size, num_hiddens, num_heads, dropout, use_bias
        )
        self.addnorm1 = AddNorm(norm_shape, dropout)
        self.ffn = PositionWiseFFN(ffn_num_input, ffn_num_hiddens, num_hiddens)
        self.addnorm2 = AddNorm(norm_shape, dropout)

    def forward(self, X, valid_lens):
        Y = self.addnorm1(X, self.attention(X, X, X, valid_lens))
        return self.addnorm2(Y, self.ffn(Y))


class TransformerEncoder(nn.Module):
    """``d2l.TransformerEncoder``."""

    def __init__(
        self,
        vocab_size,
        key_size,
        query_size,
        value_size,
        num_hiddens,
        norm_shape,
        ffn_num_input,
        ffn_num_hiddens,
        num_heads,
        num_layers,
        dropout,
        use_bias=False,
    ):
        super().__init__()
        self.num_hiddens = num_hiddens
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_encoding = PositionalEncoding(num_hiddens, dropout)
        self.blks = nn.Sequential()
        for i in range(num_layers):
            self.blks.add_module(
                "block" + str(i),
                EncoderBlock(
                    key_size,
                    query_size,
                    value_size,
                    num_hiddens,
                    norm_shape,
                    ffn_num_input,
                    ffn_num_hiddens,
                    num_heads,
                    dropout,
                    use_bias,
                ),
            )

    def forward(self, X, valid_lens, *args):
        X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens))
        self.attention_weights = [None] * len(self.blks)
        for i, blk in enumerate(self.blks):
            X = blk(X, valid_lens)
            self.attention_weights[i] = blk.attention.attention.attention_weights
        return X


class DecoderBlock(nn.Module):
    """The ``i``-th block of the decoder (``d2l.DecoderBlock``)."""

    def __init__(
        self,
        key_size,
        query_size,
        value_size,
        num_hiddens,
        norm_shape,
        ffn_num_input,
        ffn_num_hiddens,
        num_heads,
        dropout,
        i,
    ):
        super().__init__()
        self.i = i
        self.attention1 = MultiHeadAttention(
            key_size, query_size, value_size, num_hiddens, num_heads, dropout
        )
        self.addnorm1 = AddNorm(norm_shape, dropout)
        self.attention2 = MultiHeadAttention(
            key_size, query_size, value_size, num_hiddens, num_heads, dropout
        )
        self.addnorm2 = AddNorm(norm_shape, dropout)
        self.ffn = PositionWiseFFN(ffn_num_input, ffn_num_hiddens, num_hiddens)
        self.addnorm3 = AddNorm(norm_shape, dropout)

    def forward(self, X, state):
        enc_outputs, enc_valid_lens = state[0], state[1]
        # In training all the output tokens are processed at once, so state[2][self.i] is
        # None as initialised; in prediction it holds the earlier tokens' representations.
        if state[2][self.i] is None:
            key_values = X
        else:
            key_values = torch.cat((state[2][self.i], X), axis=1)
        state[2][self.i] = key_values
        if self.training:
            batch_size, num_steps, _ = X.shape
            # dec_valid_lens: (batch_size, num_steps), row i is [1, 2, ..., num_steps]
            dec_valid_lens = torch.arange(1, num_steps + 1, device=X.device).repeat(batch_size, 1)
        else:
            dec_valid_lens = None
        X2 = self.attention1(X, key_values, key_values, dec_valid_lens)
        Y = self.addnorm1(X, X2)
        Y2 = self.attention2(Y, enc_outputs, enc_outputs, enc_valid_lens)
        Z = self.addnorm2(Y, Y2)
        return self.addnorm3(Z, self.ffn(Z)), state


class TransformerDecoder(nn.Module):
    """``d2l.TransformerDecoder``."""

    def __init__(
        self,
        vocab_size,
        key_size,
        query_size,
        value_size,
        num_hiddens,
        norm_shape,
        ffn_num_input,
        ffn_num_hiddens,
        num_heads,
        num_layers,
        dropout,
    ):
        super().__init__()
        self.num_hiddens = num_hiddens
        self.num_layers = num_layers
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_encoding = PositionalEncoding(num_hiddens, dropout)
        self.blks = nn.Sequential()
        for i in range(num_layers):
            self.blks.add_module(
                "block" + str(i),
                DecoderBlock(
                    key_size,
                    query_size,
                    value_size,
                    num_hiddens,
                    norm_shape,
                    ffn_num_input,
                    ffn_num_hiddens,
                    num_heads,
                    dropout,
                    i,
                ),
            )
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def init_state(self, enc_outputs, enc_valid_lens, *args):
        return [enc_outputs, enc_valid_lens, [None] * self.num_layers]

    def forward(self, X, state):
        X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens))
        self._attention_weights = [[None] * len(self.blks) for _ in range(2)]
        for i, blk in enumerate(self.blks):
            X, state = blk(X, state)
            self._attention_weights[0][i] = blk.attention1.attention.attention_weights
            self._attention_weights[1][i] = blk.attention2.attention.attention_weights
        return self.dense(X), state


class EncoderDecoder(nn.Module):
    """``d2l.EncoderDecoder``."""

    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, enc_X, dec_X, *args):
        enc_outputs = self.encoder(enc_X, *args)
        dec_state = self.decoder.init_state(enc_outputs, *args)
        return self.decoder(dec_X, dec_state)


class MaskedSoftmaxCELoss(nn.CrossEntropyLoss):
    """The softmax cross-entropy loss with masks (``d2l.MaskedSoftmaxCELoss``).

    ``pred`` ``(batch, num_steps, vocab_size)``, ``label`` ``(batch, num_steps)``,
    ``valid_len`` ``(batch,)``; returns ``(batch,)``.
    """

    def forward(self, pred, label, valid_len):
        weights = torch.ones_like(label)
        weights = sequence_mask(weights, valid_len)
        self.reduction = "none"
        unweighted_loss = super().forward(pred.permute(0, 2, 1), label)
        weighted_loss = (unweighted_loss * weights).mean(dim=1)
        return weighted_loss


def grad_clipping(net, theta):
    """Clip the gradients' global norm to ``theta`` (``d2l.grad_clipping``)."""
    if isinstance(net, nn.Module):
        params = [p for p in net.parameters() if p.requires_grad]
    else:
        params = net.params
    norm = torch.sqrt(sum(torch.sum(p.grad**2) for p in params))
    if norm > theta:
        for param in params:
            param.grad[:] *= theta / norm


def d2l_transformer(
    src_vocab_size: int,
    tgt_vocab_size: int,
    num_hiddens: int = 32,
    num_layers: int = 2,
    dropout: float = 0.1,
    ffn_num_hiddens: int = 64,
    num_heads: int = 4,
) -> EncoderDecoder:
    """D2L's Transformer with the book's (D2L's) settings by default: ``num_hiddens=32``,
    2 + 2 layers, dropout 0.1, FFN hidden 64, 4 heads; weights initialised as in
    ``train_seq2seq`` (Xavier-uniform for every ``nn.Linear``)."""
    key_size = query_size = value_size = num_hiddens
    ffn_num_input, norm_shape = num_hiddens, [num_hiddens]
    encoder = TransformerEncoder(
        src_vocab_size,
        key_size,
        query_size,
        value_size,
        num_hiddens,
        norm_shape,
        ffn_num_input,
        ffn_num_hiddens,
        num_heads,
        num_layers,
        dropout,
    )
    decoder = TransformerDecoder(
        tgt_vocab_size,
        key_size,
        query_size,
        value_size,
        num_hiddens,
        norm_shape,
        ffn_num_input,
        ffn_num_hiddens,
        num_heads,
        num_layers,
        dropout,
    )
    net = EncoderDecoder(encoder, decoder)

    def xavier_init_weights(m):
        if type(m) is nn.Linear:
            nn.init.xavier_uniform_(m.weight)

    net.apply(xavier_init_weights)
    return net


def train_step(net, optimizer, loss, X, X_valid_len, Y, Y_valid_len, bos_id):
    """One step of D2L's ``train_seq2seq`` loop on one batch.

    Returns what the loop adds to its ``metric`` (a ``d2l.Accumulator``, which keeps
    floats): the summed loss and the number of target tokens."""
    optimizer.zero_grad()
    bos = torch.tensor([bos_id] * Y.shape[0], device=Y.device).reshape(-1, 1)
    dec_input = torch.cat([bos, Y[:, :-1]], 1)  # teacher forcing
    Y_hat, _ = net(X, dec_input, X_valid_len)
    l = loss(Y_hat, Y, Y_valid_len)  # noqa: E741 (D2L's name)
    l.sum().backward()  # the loss is a scalar for backward
    grad_clipping(net, 1)
    num_tokens = Y_valid_len.sum()
    optimizer.step()
    with torch.no_grad():
        return float(l.sum()), float(num_tokens)
