"""A head's circuits read from its weights (Elhage et al., 2021), for chapter 15.

In an attention-only model the residual stream is a sum of what the embedding and every head
wrote. A head reads it through two matrices of ``d_model x d_model``:

* its **QK circuit** ``W_Q^T W_K``: the score of a query position with residual ``x_q`` for
  a key position with ``x_k`` is ``x_q^T QK x_k`` (before RoPE rotates the two and before the
  division by ``sqrt(d_head)``);
* its **OV circuit** ``W_O W_V``: what it writes when it attends to a position with residual
  ``x`` is ``OV x`` (times the attention weight).

Pre-norm RMSNorm scales ``x`` by ``g / rms(x)`` before the head reads it: the gain ``g`` is
folded into the matrices, the positive scalar ``1 / rms(x)`` is left out (it changes no sign
and no ratio between two heads' scores). With the embedding ``E`` and the unembedding
``W_U`` (the final norm's gain folded in, centred across the vocabulary),
``W_U OV E^T`` is the head's **full OV circuit**:
entry ``(a, b)`` is how much attending to token ``b`` raises the logit of token ``a``. A head
that copies raises the logit of the token it attends to: its full OV circuit has mostly
positive eigenvalues, which :func:`copying_score` measures. :func:`composition_score` says
how much of what one head writes another one reads (K-composition: a later head's keys read
an earlier head's output).
"""

from __future__ import annotations

import torch

from .lm import DecoderOnlyLM

__all__ = ["head_qk", "head_ov", "full_ov_circuit", "copying_score", "composition_score"]

#: What the circuits need of a model: pre-norm RMSNorm (whose gains fold into the matrices)
#: and no biases (which would add terms the matrices do not hold).
_CIRCUIT_SHAPE = {
    "norm": ("rms", "RMSNorm, whose gain folds into the matrices"),
    "norm_first": (True, "pre-norm"),
    "bias": (False, "no biases"),
    "d_latent": (None, "query, key and value heads (no latent attention)"),
}


def _attention(model: DecoderOnlyLM, layer: int, head: int):
    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model must be a mhbook.DecoderOnlyLM, got {type(model).__name__}")
    model.config.require(_CIRCUIT_SHAPE, "the circuit matrices")
    if not 0 <= layer < len(model.blocks):
        raise ValueError(f"layer must be in [0, {len(model.blocks) - 1}], got {layer}")
    block = model.blocks[layer]
    attn = block.self_attn
    if not 0 <= head < attn.num_heads:
        raise ValueError(f"head must be in [0, {attn.num_heads - 1}], got {head}")
    return attn, block.addnorm1.norm.weight


def _rows(weight: torch.Tensor, head: int, d_head: int) -> torch.Tensor:
    return weight[head * d_head : (head + 1) * d_head]


def head_qk(model: DecoderOnlyLM, layer: int, head: int) -> torch.Tensor:
    """``(d_model, d_model)``: ``diag(g) W_Q,h^T W_K,h diag(g)`` of query head ``head`` of
    ``layer`` (0-based), ``W_K,h`` its key/value head's, ``g`` the layer's norm gain."""
    attn, g = _attention(model, layer, head)
    kv = head // (attn.num_heads // attn.num_kv_heads)
    W_Q = _rows(attn.W_q.weight, head, attn.d_head) * g  # (d_head, d_model)
    W_K = _rows(attn.W_k.weight, kv, attn.d_head) * g
    return W_Q.T @ W_K


def head_ov(model: DecoderOnlyLM, layer: int, head: int) -> torch.Tensor:
    """``(d_model, d_model)``: ``W_O[:, h] W_V,h diag(g)`` of head ``head`` of ``layer``."""
    attn, g = _attention(model, layer, head)
    kv = head // (attn.num_heads // attn.num_kv_heads)
    W_V = _rows(attn.W_v.weight, kv, attn.d_head) * g  # (d_head, d_model)
    W_O = attn.W_o.weight[:, head * attn.d_head : (head + 1) * attn.d_head]  # (d_model, d_head)
    return W_O @ W_V


def full_ov_circuit(model: DecoderOnlyLM, layer: int, head: int) -> torch.Tensor:
    """``(vocab, vocab)``: ``W_U diag(g_final) OV E^T``; entry ``(a, b)`` is how much attending
    to the embedding of token ``b`` raises the logit of token ``a`` (the direct path only),
    relative to the mean logit: ``W_U``'s rows are centred across the vocabulary, as
    TransformerLens centres its unembedding, since a constant added to every logit changes no
    probability."""
    ov = head_ov(model, layer, head)
    W_U = model.output.weight * model.norm.weight  # (vocab, d_model)
    W_U = W_U - W_U.mean(dim=0)  # a constant added to every logit changes nothing
    return W_U @ ov @ model.embedding.weight.T


def copying_score(matrix: torch.Tensor) -> float:
    """``sum(eigenvalues) / sum(|eigenvalues|)`` of a square matrix: 1 when every eigenvalue
    is positive (the head raises what it attends to), -1 when every one is negative, near 0
    for a random matrix (Elhage et al., 2021). Computed in float64."""
    if matrix.dim() != 2 or matrix.size(0) != matrix.size(1):
        raise ValueError(f"matrix must be square, got shape {tuple(matrix.shape)}")
    eigenvalues = torch.linalg.eigvals(matrix.detach().double())
    return (eigenvalues.sum().real / eigenvalues.abs().sum()).item()


def composition_score(first: torch.Tensor, second: torch.Tensor) -> float:
    """``||second @ first||_F / (||second||_F ||first||_F)``: how much of what ``first``
    writes (e.g. an earlier head's OV circuit) ``second`` reads (e.g. a later head's QK
    circuit, for K-composition). At most 1; small for matrices that share no directions."""
    if first.dim() != 2 or second.dim() != 2 or second.size(1) != first.size(0):
        raise ValueError(
            f"second @ first needs second (n, m) and first (m, k), got second "
            f"{tuple(second.shape)}, first {tuple(first.shape)}"
        )
    first, second = first.detach().double(), second.detach().double()
    return (
        torch.linalg.norm(second @ first) / (torch.linalg.norm(second) * torch.linalg.norm(first))
    ).item()
