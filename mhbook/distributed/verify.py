"""The harnesses that check the distributed layers against one process, run in every rank.

Each is a function of ``(rank, world_size, device, ...)`` for
:func:`mhbook.distributed.launch.run`: every rank builds the same
:class:`~mhbook.MultiHeadAttention` and inputs from one seed, runs the single-process layer,
then its own share of the parallel one, and returns how far apart they are and what it sent.
They live in the package, not in ``tests/``, because spawned ranks import them by name.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..attention.multihead import MultiHeadAttention
from ..core.masks import causal_mask, padding_mask
from ..core.validate import check_choice, check_int
from .context_parallel import ring_attention, ulysses_attention
from .tensor_parallel import (
    TensorParallelMultiHeadAttention,
    gather_full,
    parallelize_heads,
    record_collectives,
)

__all__ = ["check_tensor_parallel", "check_context_parallel"]


def _same_layer_and_input(
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
    batch: int,
    length: int,
    d_model: int,
    num_heads: int,
    memory_dim: int | None = None,
) -> tuple[MultiHeadAttention, torch.Tensor]:
    """The layer and the input ``x`` (batch, length, d_model) that every rank draws alike
    from ``seed``; the layer attends to a memory of width ``memory_dim`` if one is given."""
    torch.manual_seed(seed)
    mha = MultiHeadAttention(d_model, num_heads, kdim=memory_dim, vdim=memory_dim)
    return mha.to(device, dtype), torch.randn(batch, length, d_model, device=device, dtype=dtype)


def check_tensor_parallel(
    rank: int,
    world_size: int,
    device: torch.device,
    api: str = "by hand",
    *,
    cross: bool = False,
    dtype: torch.dtype = torch.float64,
    batch: int = 2,
    length: int = 6,
    d_model: int = 16,
    num_heads: int = 4,
    seed: int = 0,
) -> dict:
    """Compare tensor-parallel attention with the single-process layer, in one rank.

    Run it in every rank with ``mhbook.distributed.launch.run(check_tensor_parallel, ...)``.
    Each rank builds the same ``MultiHeadAttention``, inputs and output gradient from ``seed``, runs
    the single-process layer, then its share of the tensor-parallel one (``api="by hand"``:
    :class:`TensorParallelMultiHeadAttention`; ``api="dtensor"``: :func:`parallelize_heads`),
    and compares the outputs, the gradients of the inputs and the gathered gradients of every
    parameter.

    Args:
        cross: cross-attention to a memory of another width and length with a padding mask,
            instead of causal self-attention.

    Returns:
        ``{"rank", "world_size", "backend", "api", "heads", "max_diff", "collectives"}``:
        ``heads`` the rank's ``(first, last)`` head; ``max_diff`` ``{what: max |tp - single|}``
        for the output, each input's gradient and each parameter's gradient; ``collectives``
        ``{"forward": [...], "backward": [...]}``, the :class:`Collective` calls (``"by
        hand"``) or the numbers of all-reduces PyTorch issued (``"dtensor"``).
    """
    if api not in ("by hand", "dtensor"):
        raise ValueError(f"api must be 'by hand' or 'dtensor', got {api!r}")
    memory_dim = d_model - 4 if cross else None
    shape = (batch, length, d_model, num_heads)
    mha, x = _same_layer_and_input(seed, device, dtype, *shape, memory_dim)
    if cross:
        memory = torch.randn(batch, length + 2, memory_dim, device=device, dtype=dtype)
        valid_lens = torch.full((batch,), length + 2, device=device)
        valid_lens[1::2] = 3  # every other memory is padded after 3 positions
        mask = padding_mask(valid_lens, length + 2)
        inputs = {"query": x, "memory": memory}
    else:
        mask = causal_mask(length, device=device)
        inputs = {"x": x}
    grad_output = torch.randn(batch, length, d_model, device=device, dtype=dtype)

    def call(layer, leaves):
        if cross:
            return layer(leaves["query"], leaves["memory"], leaves["memory"], mask)[0]
        return layer(leaves["x"], leaves["x"], leaves["x"], mask)[0]

    def leaves():
        return {name: t.detach().clone().requires_grad_() for name, t in inputs.items()}

    single_inputs = leaves()
    single_out = call(mha, single_inputs)
    single_out.backward(grad_output)
    single_grads = {name: p.grad for name, p in mha.named_parameters()}

    tp_inputs = leaves()
    if api == "by hand":
        tp = TensorParallelMultiHeadAttention.from_module(mha, rank, world_size)
        with record_collectives() as forward_log:
            tp_out = call(tp, tp_inputs)
        with record_collectives() as backward_log:
            tp_out.backward(grad_output)
        collectives = {"forward": list(forward_log), "backward": list(backward_log)}
        tp_grads = gather_full(tp, grads=True)
        heads = (tp.heads.start, tp.heads.stop - 1)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.debug import CommDebugMode

        mesh = init_device_mesh(device.type, (world_size,))
        tp = MultiHeadAttention(d_model, num_heads, kdim=memory_dim, vdim=memory_dim)
        tp = tp.to(device, dtype)
        tp.load_state_dict(mha.state_dict())
        parallelize_heads(tp, mesh)
        counts = {}
        with CommDebugMode() as comm:
            tp_out = call(tp, tp_inputs)
        counts["forward"] = comm.get_total_counts()
        with CommDebugMode() as comm:
            tp_out.backward(grad_output)
        counts["backward"] = comm.get_total_counts()
        collectives = counts
        tp_grads = {name: p.grad.full_tensor() for name, p in tp.named_parameters()}
        heads = (rank * tp.num_heads, (rank + 1) * tp.num_heads - 1)

    def max_diff(a, b):
        return (a.detach() - b.detach()).abs().max().item()

    diffs = {"output": max_diff(tp_out, single_out)}
    for name in inputs:
        diffs[f"grad {name}"] = max_diff(tp_inputs[name].grad, single_inputs[name].grad)
    for name, grad in single_grads.items():
        diffs[f"grad {name}"] = max_diff(tp_grads[name], grad)
    return {
        "rank": rank,
        "world_size": world_size,
        "backend": dist.get_backend(),
        "api": api,
        "heads": heads,
        "max_diff": diffs,
        "collectives": collectives,
    }


def check_context_parallel(
    rank: int,
    world_size: int,
    device: torch.device,
    method: str = "ulysses",
    *,
    dtype: torch.dtype = torch.float64,
    batch: int = 2,
    length: int = 8,
    d_model: int = 16,
    num_heads: int = 4,
    seed: int = 0,
) -> dict:
    """Compare context-parallel causal self-attention with the single-process layer.

    Run it in every rank with
    ``mhbook.distributed.launch.run(check_context_parallel, method, ...)``. Every rank builds
    the same ``MultiHeadAttention`` and input from ``seed``, runs the single-process layer on
    the whole sequence, then the layer on its own ``length / p`` tokens with ``method``
    (``"ulysses"`` or ``"ring"``) in place of attention.

    Returns:
        ``{"rank", "backend", "method", "tokens", "max_diff", "sent"}``: ``tokens`` the
        rank's ``(first, last)`` position, ``max_diff`` ``max |parallel - single|`` of the
        rank's output rows, ``sent`` the ``(what, bytes)`` of every collective it issued.
    """
    check_choice("method", method, ("ulysses", "ring"))
    attend = {"ulysses": ulysses_attention, "ring": ring_attention}[method]
    check_int("length", length)
    if length % world_size:
        raise ValueError(f"length ({length}) must be a multiple of world_size ({world_size})")
    mha, x = _same_layer_and_input(seed, device, dtype, batch, length, d_model, num_heads)
    with torch.no_grad():
        single, _ = mha(x, is_causal=True)
        n = length // world_size
        mine = x[:, rank * n : (rank + 1) * n]  # this rank's tokens
        # the projections work token by token: no communication
        q, k, v = (mha.split_heads(W(mine)) for W in (mha.W_q, mha.W_k, mha.W_v))
        log: list = []
        heads = attend(q, k, v, is_causal=True, log=log)
        out = mha.W_o(mha.merge_heads(heads))
    return {
        "rank": rank,
        "backend": dist.get_backend(),
        "method": method,
        "tokens": (rank * n, (rank + 1) * n - 1),
        "max_diff": (out - single[:, rank * n : (rank + 1) * n]).abs().max().item(),
        "sent": log,
    }
