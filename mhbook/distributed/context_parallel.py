"""Context (sequence) parallelism: attention with the *tokens* split across processes.

Tensor parallelism (:mod:`mhbook.distributed.tensor_parallel`) gives each of ``p`` ranks some heads
of every
token. Context parallelism gives each rank some *tokens*, ``L / p`` consecutive positions of
the sequence, with all the weights: the projections ``W_q``, ``W_k``, ``W_v`` and ``W_o``
work token by token and need no communication. Only attention mixes tokens, and two ways
of feeding it are in use:

* **Ulysses** (Jacobs et al., 2023): an all-to-all turns "my tokens, all heads" into "all
  tokens, my heads": each rank then runs ordinary attention over the whole sequence for
  ``num_heads / p`` heads, and a second all-to-all turns the heads' outputs back into "my
  tokens, all heads". Four all-to-alls (``q``, ``k``, ``v``, the output), each sending
  ``(p - 1) / p`` of a rank's ``(batch, L / p, d_model)`` tensor.
* **Ring attention** (Liu et al., 2024): each rank keeps its queries and passes its keys and
  values around a ring of the ranks, ``p - 1`` times. After each pass it attends to the
  block it holds and merges the result into a running output with the log-sum-exp of the
  scores (the online softmax of FlashAttention, chapter 8), so no rank ever holds more than
  two blocks of keys and values.

Both are written here for teaching, forward only, with ``torch.distributed`` on any
backend that has ``all_to_all_single``, ``send`` and ``recv`` (gloo on the CPU, NCCL on GPUs).
:func:`mhbook.distributed.verify.check_context_parallel` runs in each rank and compares
them with the single-process :class:`mhbook.MultiHeadAttention`, recording the bytes each
rank sends; :func:`context_parallel_bytes` gives those bytes from the shapes, beside
Megatron's all-reduce.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..core.masks import causal_mask
from ..core.validate import check_int

__all__ = [
    "ulysses_attention",
    "ring_attention",
    "context_parallel_bytes",
]


def _sent(log: list | None, what: str, nbytes: int) -> None:
    if log is not None:
        log.append((what, nbytes))


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group, log, what):
    """Split ``x`` into ``p`` parts along ``scatter_dim``, send part ``j`` to rank ``j``, and
    concatenate the parts received along ``gather_dim``. Each rank keeps its own part and
    sends the other ``p - 1``."""
    p = dist.get_world_size(group)
    parts = [t.contiguous() for t in x.chunk(p, dim=scatter_dim)]
    send = torch.stack(parts)  # (p, ...): part j goes to rank j
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    _sent(log, what, send.nbytes * (p - 1) // p)
    return torch.cat(list(received), dim=gather_dim)


def ulysses_attention(q, k, v, *, is_causal: bool = True, group=None, log=None):
    """Attention over a sequence split across the ranks, by heads in between (Ulysses).

    Args:
        q, k, v: this rank's tokens, ``(batch, num_heads, L / p, d_head)``; rank ``r`` holds
            positions ``r L / p`` to ``(r + 1) L / p - 1``. ``num_heads`` must be a multiple
            of ``p``.
        is_causal: a causal mask over the whole sequence.
        group: the process group (default: the world).
        log: a list to which ``(what, bytes sent)`` is appended for every collective.

    Returns:
        ``(batch, num_heads, L / p, d_head)``: the heads' outputs for this rank's tokens.
    """
    p = dist.get_world_size(group)
    if q.size(1) % p:
        raise ValueError(f"num_heads ({q.size(1)}) must be a multiple of the world size ({p})")
    # (B, h, L/p, d) -> (B, h/p, L, d): scatter the heads, gather the tokens
    q, k, v = (_all_to_all(t, 1, 2, group, log, name) for t, name in zip((q, k, v), "qkv"))
    mask = causal_mask(q.size(2), device=q.device) if is_causal else None
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    heads = torch.softmax(scores, dim=-1) @ v  # (B, h/p, L, d): ordinary attention
    # (B, h/p, L, d) -> (B, h, L/p, d): scatter the tokens, gather the heads
    return _all_to_all(heads, 2, 1, group, log, "output")


def ring_attention(q, k, v, *, is_causal: bool = True, group=None, log=None):
    """Attention over a sequence split across the ranks, keys and values passed in a ring.

    Rank ``r`` keeps its queries. At step ``s`` it holds the keys and values of rank
    ``(r - s) mod p``, attends to them, merges the result into its running output with the
    log-sum-exp of the scores, and passes the block on to rank ``r + 1`` (``p - 1`` passes).

    Args and returns: as :func:`ulysses_attention` (any ``num_heads``).
    """
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    k, v = k.contiguous(), v.contiguous()  # sent as they are
    n = q.size(2)  # tokens per rank
    positions = torch.arange(rank * n, (rank + 1) * n, device=q.device)  # of the queries
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    for step in range(p):
        source = (rank - step) % p  # whose keys and values this rank holds now
        if step > 0:  # receive the block from rank - 1 while sending ours to rank + 1
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            ops = [dist.P2POp(dist.isend, t, (rank + 1) % p, group) for t in (k, v)] + [
                dist.P2POp(dist.irecv, t, (rank - 1) % p, group) for t in (k_next, v_next)
            ]
            for request in dist.batch_isend_irecv(ops):
                request.wait()
            _sent(log, "k, v", k.nbytes + v.nbytes)
            k, v = k_next, v_next
        key_positions = torch.arange(source * n, (source + 1) * n, device=q.device)
        visible = positions[:, None] >= key_positions[None, :] if is_causal else None
        if visible is not None and not visible.any():
            continue  # a block entirely in the future of every query of this rank
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, n, n)
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        block_lse = torch.logsumexp(scores, dim=-1)  # (B, h, n); -inf where nothing visible
        block_out = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v
        new_lse = torch.logaddexp(lse, block_lse)
        # the online softmax: rescale both parts to the new normaliser
        old_weight = torch.exp(lse - new_lse).nan_to_num(0.0)[..., None]
        new_weight = torch.exp(block_lse - new_lse).nan_to_num(0.0)[..., None]
        out, lse = out * old_weight + block_out * new_weight, new_lse
    return out


def context_parallel_bytes(
    batch: int, length: int, d_model: int, world_size: int, bytes_per_element: int = 4
) -> dict[str, int]:
    """Bytes each rank sends in the forward pass of one self-attention layer (multi-head,
    ``num_kv_heads == num_heads``), from its shapes: ``n = batch * length * d_model`` numbers.

    * ``megatron``: tensor parallelism's one ring all-reduce of ``n``: ``2 (p - 1) / p * n``;
    * ``ulysses``: four all-to-alls of a rank's ``n / p``, each sending ``(p - 1) / p`` of it;
    * ``ring``: ``p - 1`` passes of a rank's keys and values, ``2 n / p`` each.
    """
    for name, value in {
        "batch": batch,
        "length": length,
        "d_model": d_model,
        "world_size": world_size,
        "bytes_per_element": bytes_per_element,
    }.items():
        check_int(name, value)
    p, n = world_size, batch * length * d_model * bytes_per_element
    if length % p:
        raise ValueError(f"length ({length}) must be a multiple of world_size ({p})")
    return {
        "megatron": 2 * (p - 1) * n // p,
        "ulysses": 4 * (p - 1) * n // (p * p),
        "ring": (p - 1) * 2 * n // p,
    }
