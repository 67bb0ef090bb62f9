"""Tensor-parallel multi-head attention: heads split across processes (Megatron-LM).

Heads are independent of each other until ``W_o``. So ``p`` processes (ranks) can share one
attention layer by heads (Shoeybi et al., 2019): rank ``r`` holds ``num_heads / p`` whole
heads, that is the slices of ``W_q``, ``W_k`` and ``W_v`` that produce them and the matching
slice of ``W_o``. In the book's math (``X W`` with ``W`` of shape ``(in, out)``)::

    X W_q = [X W_q^(0) | ... | X W_q^(p-1)]       column-parallel: each rank its own heads
    H W_o = H^(0) W_o^(0) + ... + H^(p-1) W_o^(p-1)  row-parallel: partial sums, added up

``nn.Linear`` stores ``W^T`` (``(out, in)``), so a column of ``W_q`` is a *row* of
``W_q.weight``. Each rank computes its heads and its partial output ``H^(r) W_o^(r)`` without
talking to the others; one all-reduce adds the partial outputs (Megatron's ``g``) and every
rank holds the full output. In the backward pass each rank's input receives the gradient
through its own heads only; one all-reduce adds them (Megatron's ``f``, the identity in the
forward pass). Two all-reduces of ``(batch, L, d_model)`` per layer and step, whatever
``num_heads`` is.

:class:`TensorParallelMultiHeadAttention` writes this out with ``torch.distributed`` for
teaching; :func:`parallelize_heads` gets the same from PyTorch's own tensor-parallel API
(``ColwiseParallel``/``RowwiseParallel`` on a ``DeviceMesh``).
:func:`mhbook.distributed.verify.check_tensor_parallel`
runs in each rank (via :func:`mhbook.distributed.launch.run`) and compares either one with the
single-process :class:`mhbook.MultiHeadAttention`; :func:`layer_cost` counts the bytes
communicated against the FLOPs computed.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from ..attention.multihead import MultiHeadAttention, check_inputs
from ..attention.sdpa import attend
from ..core.validate import check_int

__all__ = [
    "SHARD_DIMS",
    "Collective",
    "record_collectives",
    "copy_to_parallel",
    "reduce_from_parallel",
    "head_slice",
    "TensorParallelMultiHeadAttention",
    "unshard",
    "gather_full",
    "parallelize_heads",
    "layer_cost",
    "cost_table",
]

#: How each parameter of ``MultiHeadAttention`` is split across the ranks: the dimension of
#: the tensor (``nn.Linear``'s ``(out, in)`` layout) cut into rank slices; ``None``: every
#: rank holds all of it.
SHARD_DIMS = {
    "W_q.weight": 0,
    "W_q.bias": 0,
    "W_k.weight": 0,
    "W_k.bias": 0,
    "W_v.weight": 0,
    "W_v.bias": 0,
    "W_o.weight": 1,
    "W_o.bias": None,
}


# -- the two collectives, recorded ------------------------------------------------------
class Collective(NamedTuple):
    """One collective call: ``op`` (``"all_reduce"``), ``phase`` (``"forward"`` or
    ``"backward"``), the tensor's ``shape`` and ``dtype`` (as a string) and ``nbytes``."""

    op: str
    phase: str
    shape: tuple
    dtype: str
    nbytes: int


_recording: list[list[Collective]] = []


@contextlib.contextmanager
def record_collectives():
    """Record the all-reduces of :func:`copy_to_parallel` and :func:`reduce_from_parallel`
    in this process. Yields a list that fills with :class:`Collective` entries."""
    log: list[Collective] = []
    _recording.append(log)
    try:
        yield log
    finally:
        _recording.remove(log)


def _all_reduce(x: torch.Tensor, group, phase: str) -> torch.Tensor:
    """The sum of ``x`` over the ranks of ``group``, in a new tensor (``x`` is untouched)."""
    out = x.contiguous().clone()  # dist.all_reduce works in place
    for log in _recording:
        shape, dtype = tuple(out.shape), str(out.dtype).removeprefix("torch.")
        log.append(Collective("all_reduce", phase, shape, dtype, out.numel() * out.element_size()))
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


# Written by hand for teaching (Megatron's mappings.py does the same). A ready-made
# torch.distributed.nn.functional.all_reduce would not do for g: its backward all-reduces
# the gradient too, which multiplies it by the world size here, because every rank computes
# the same loss from the same replicated output.
class _CopyToParallel(torch.autograd.Function):
    """Megatron's ``f``: the identity forward, an all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group, "backward"), None


class _ReduceFromParallel(torch.autograd.Function):
    """Megatron's ``g``: an all-reduce forward, the identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group, "forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_parallel(x: torch.Tensor, group=None) -> torch.Tensor:
    """``x`` unchanged; in the backward pass its gradient is summed over the ranks.

    Put it where a replicated tensor enters rank-local work (the input of the heads): each
    rank's gradient holds only its heads' part.
    """
    return _CopyToParallel.apply(x, group)


def reduce_from_parallel(x: torch.Tensor, group=None) -> torch.Tensor:
    """The sum of ``x`` over the ranks; in the backward pass the gradient passes unchanged.

    Put it where rank-local partial results become one replicated tensor (after ``W_o``).
    """
    return _ReduceFromParallel.apply(x, group)


# -- the layer, written out ----------------------------------------------------------------
def head_slice(num_heads: int, rank: int, world_size: int) -> slice:
    """The heads rank ``rank`` of ``world_size`` owns: ``num_heads / world_size`` of them in
    a row. Raises ``ValueError`` unless ``world_size`` divides ``num_heads``."""
    check_int("num_heads", num_heads)
    check_int("world_size", world_size)
    if num_heads % world_size != 0:
        raise ValueError(
            f"num_heads must be divisible by world_size to give every rank whole heads: got "
            f"num_heads={num_heads}, world_size={world_size} "
            f"(num_heads % world_size = {num_heads % world_size})"
        )
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    local = num_heads // world_size
    return slice(rank * local, (rank + 1) * local)


class TensorParallelMultiHeadAttention(nn.Module):
    """Rank ``rank``'s share of a :class:`mhbook.MultiHeadAttention`: its heads only.

    Build it with :meth:`from_module` from the single-process layer (the same on every
    rank). Its parameters have the names of ``MultiHeadAttention``'s and hold this rank's
    slices (see :data:`SHARD_DIMS`): ``W_q``, ``W_k``, ``W_v`` map to the ``local_heads *
    d_head`` features of its heads, ``W_o`` maps them to ``d_model``. ``W_o.bias`` is whole
    on every rank and added once, after the all-reduce.

    With ``world_size == 1`` there is nothing to communicate and no process group is needed.

    Attributes:
        num_heads: heads of the whole layer, ``h``.
        local_heads: heads on this rank, ``h / world_size``.
        heads: ``slice`` of the heads this rank owns.
        rank, world_size, group: where this share sits; ``group=None`` is the default group.
    """

    # The checks of MultiHeadAttention (check_inputs: shapes, device, dtype) read only the
    # projections, the widths and the kind of position, which this layer has not.
    rope = alibi = None
    rotary = streaming = False

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        rank: int,
        world_size: int,
        group=None,
        dropout: float = 0.0,
        bias: bool = True,
        *,
        d_head: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
    ):
        super().__init__()
        self.heads = head_slice(num_heads, rank, world_size)
        # The same checks and defaults as the single-process layer, on the meta device.
        with torch.device("meta"):
            whole = MultiHeadAttention(
                d_model, num_heads, dropout=dropout, bias=bias, d_head=d_head, kdim=kdim, vdim=vdim
            )
        self.d_model, self.num_heads, self.d_head = d_model, num_heads, whole.d_head
        self.kdim, self.vdim = whole.kdim, whole.vdim
        self.local_heads = num_heads // world_size
        self.rank, self.world_size, self.group = rank, world_size, group
        self.dropout = dropout
        inner = self.local_heads * self.d_head  # this rank's heads side by side
        self.W_q = nn.Linear(d_model, inner, bias=bias)
        self.W_k = nn.Linear(whole.kdim, inner, bias=bias)
        self.W_v = nn.Linear(whole.vdim, inner, bias=bias)
        self.W_o = nn.Linear(inner, d_model, bias=bias)  # bias: whole, added after the sum

    @classmethod
    def from_module(
        cls, mha: MultiHeadAttention, rank: int, world_size: int, group=None
    ) -> TensorParallelMultiHeadAttention:
        """Rank ``rank``'s slices of ``mha``'s weights (copies, on ``mha``'s device and dtype).

        Every rank calls it with the same ``mha``. ``mha.head_mask`` is sliced too.
        """
        _check_splittable(mha)
        w = mha.W_q.weight
        with torch.device("meta"):
            ours = cls(
                mha.d_model,
                mha.num_heads,
                rank,
                world_size,
                group,
                mha.dropout,
                mha.W_q.bias is not None,
                d_head=mha.d_head,
                kdim=mha.W_k.in_features,
                vdim=mha.W_v.in_features,
            )
        ours.to_empty(device=w.device).to(w.dtype)
        ours.load_state_dict(ours.shard_state(mha.state_dict()))
        if mha.head_mask is not None:
            ours.register_buffer("head_mask", mha.head_mask[ours.heads].detach().clone())
        ours.train(mha.training)
        return ours

    def shard_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's slices of a ``MultiHeadAttention`` state dict (``W_*`` entries only)."""
        features = slice(self.heads.start * self.d_head, self.heads.stop * self.d_head)
        out = {}
        for name, dim in SHARD_DIMS.items():
            if name not in state:
                continue
            tensor = state[name]
            out[name] = tensor if dim is None else tensor[(slice(None),) * dim + (features,)]
        return out

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, L, local_heads * d_head)`` -> ``(batch, local_heads, L, d_head)``."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.local_heads, self.d_head).transpose(1, 2)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, local_heads, L, d_head)`` -> ``(batch, L, local_heads * d_head)``."""
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.local_heads * self.d_head)

    def partial_forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """This rank's heads through its slice of ``W_o``, before the sum over the ranks.

        Args:
            query, key, value, mask: as for :class:`mhbook.MultiHeadAttention`; a mask with
                a head dimension of ``num_heads`` is cut to this rank's heads.

        Returns:
            ``H^(r) W_o^(r)``, ``(batch, Lq, d_model)``, without ``W_o``'s bias. The sum of
            every rank's is the single-process output minus the bias.
        """
        q = self.split_heads(self.W_q(query))  # (B, local_heads, Lq, d_head)
        k = self.split_heads(self.W_k(key))  # (B, local_heads, Lk, d_head)
        v = self.split_heads(self.W_v(value))
        if mask is not None and mask.dim() >= 3 and mask.size(-3) == self.num_heads > 1:
            mask = mask.narrow(-3, self.heads.start, self.local_heads)
        heads, _ = attend(q, k, v, mask, dropout_p=self.dropout if self.training else 0.0)
        head_mask = getattr(self, "head_mask", None)
        if head_mask is not None:
            heads = heads * head_mask.view(1, -1, 1, 1)
        return nn.functional.linear(self.merge_heads(heads), self.W_o.weight)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, None]:
        """Multi-head attention with this rank's heads; every rank returns the full output.

        Args:
            query: ``(batch, Lq, d_model)``, the same on every rank.
            key: ``(batch, Lk, kdim)``, the same on every rank.
            value: ``(batch, Lk, vdim)``, the same on every rank.
            mask: bool, broadcastable to ``(batch, num_heads, Lq, Lk)``; ``True`` = may attend.

        Returns:
            ``(output, None)``, as :class:`mhbook.MultiHeadAttention` returns without
            weights: output ``(batch, Lq, d_model)``, equal to the single-process layer's.
        """
        check_inputs(self, query, key, value)
        if self.world_size > 1:
            # f: the identity now, the sum of the ranks' input gradients in the backward
            # pass. Once per distinct tensor: in self-attention query, key and value are one
            # tensor, whose gradient then needs one all-reduce, not three.
            entered = {}
            for x in (query, key, value):
                if id(x) not in entered:
                    entered[id(x)] = copy_to_parallel(x, self.group)
            query, key, value = (entered[id(x)] for x in (query, key, value))
        partial = self.partial_forward(query, key, value, mask)
        # g: add up the ranks' partial outputs (the backward pass leaves the gradient as is).
        out = reduce_from_parallel(partial, self.group) if self.world_size > 1 else partial
        return (out if self.W_o.bias is None else out + self.W_o.bias), None

    def extra_repr(self) -> str:
        return (
            f"heads {self.heads.start}..{self.heads.stop - 1} of {self.num_heads}, "
            f"rank={self.rank}, world_size={self.world_size}"
        )


def unshard(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Put the ranks' slices back together: a ``MultiHeadAttention``-shaped dict.

    Args:
        shards: one dict per rank, in rank order, with names of :data:`SHARD_DIMS`
            (parameters or their gradients). Replicated entries are taken from rank 0.
    """
    if not shards:
        raise ValueError("unshard needs the slices of at least one rank, got none")
    out = {}
    for name in shards[0]:
        dim = SHARD_DIMS.get(name)
        out[name] = shards[0][name] if dim is None else torch.cat([s[name] for s in shards], dim)
    return out


def gather_full(
    module: TensorParallelMultiHeadAttention, grads: bool = False
) -> dict[str, torch.Tensor]:
    """Every rank's slices of ``module``'s parameters (or, with ``grads``, of their
    gradients), gathered: the whole layer's, on every rank. A collective: call it on all
    ranks of the module's group."""
    mine = {
        name: (p.grad if grads else p).detach().contiguous()
        for name, p in module.named_parameters()
    }
    if module.world_size == 1:
        return mine
    shards = [{} for _ in range(module.world_size)]
    for name, tensor in mine.items():
        pieces = [torch.empty_like(tensor) for _ in range(module.world_size)]
        dist.all_gather(pieces, tensor, group=module.group)
        for shard, piece in zip(shards, pieces):
            shard[name] = piece
    return unshard(shards)


# -- the same with PyTorch's tensor-parallel API ------------------------------------------
def parallelize_heads(mha: MultiHeadAttention, mesh) -> MultiHeadAttention:
    """Split ``mha`` by heads over a 1-D ``DeviceMesh`` with PyTorch's own tensor-parallel
    API, in place: ``ColwiseParallel`` on ``W_q``, ``W_k``, ``W_v`` and ``RowwiseParallel``
    on ``W_o``. Their weights become DTensors sharded like :data:`SHARD_DIMS`.

    ``mha.num_heads`` becomes the local head count: ``split_heads`` views the local
    projections as ``(batch, L, num_heads, d_head)``, and a rank now has ``num_heads /
    mesh.size()`` heads (PyTorch's tensor-parallel tutorial adjusts attention modules the
    same way). ``head_mask`` is cut to the rank's heads.
    """
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    _check_splittable(mha)
    if mesh.ndim != 1:
        raise ValueError(f"expected a 1-D DeviceMesh, got {mesh.ndim} dimensions")
    heads = head_slice(mha.num_heads, mesh.get_local_rank(), mesh.size())
    plan = {
        "W_q": ColwiseParallel(),  # Shard(0) of nn.Linear's (out, in) weight: our heads' rows
        "W_k": ColwiseParallel(),
        "W_v": ColwiseParallel(),
        "W_o": RowwiseParallel(),  # Shard(1): our heads' columns; one all-reduce after it
    }
    parallelize_module(mha, mesh, plan)
    if mha.head_mask is not None:
        mha.head_mask = mha.head_mask[heads].detach().clone()
    mha.num_heads = mha.num_kv_heads = heads.stop - heads.start
    return mha


def _check_splittable(mha) -> None:
    """Only plain multi-head attention is split here: as many key/value heads as query
    heads, no positions inside attention."""
    if not isinstance(mha, MultiHeadAttention):
        raise TypeError(f"expected mhbook.MultiHeadAttention, got {type(mha).__name__}")
    if mha.num_kv_heads != mha.num_heads or mha.rotary or mha.alibi is not None:
        raise ValueError(
            "tensor parallelism here splits multi-head attention with num_kv_heads == "
            f"num_heads and no rope or alibi; got num_heads={mha.num_heads}, num_kv_heads="
            f"{mha.num_kv_heads}, rope={mha.rotary}, alibi={mha.alibi is not None}"
        )


# -- what it costs: bytes communicated against FLOPs computed -----------------------------
def layer_cost(
    batch: int,
    length: int,
    d_model: int,
    num_heads: int,
    world_size: int,
    bytes_per_element: int = 4,
    d_head: int | None = None,
) -> dict[str, int]:
    """Exact costs of one tensor-parallel self-attention layer, from its shapes.

    FLOPs count the matrix products only (a multiply-add is 2 FLOPs; the softmax and the
    biases are left out): the four projections, ``2 B L d_model (h d_head)`` each, and
    ``Q K^T`` and ``P V``, ``2 B h L^2 d_head`` each. The backward pass does exactly twice
    the forward's (a gradient for each factor of every product). Each rank computes
    ``1 / world_size`` of it.

    Communication: one all-reduce of ``(batch, length, d_model)`` in each direction. A ring
    all-reduce of ``n`` bytes sends ``2 (p - 1) / p * n`` bytes from each rank.

    Returns:
        ``{name: int}``: ``flops_forward`` and ``flops_backward`` (whole layer),
        ``flops_forward_per_rank``, ``flops_backward_per_rank``, ``allreduce_bytes`` (the
        size of one all-reduced tensor), ``allreduces_forward``, ``allreduces_backward``,
        ``ring_bytes_sent_per_rank`` (per all-reduce).
    """
    for name, value in {
        "batch": batch,
        "length": length,
        "d_model": d_model,
        "num_heads": num_heads,
        "bytes_per_element": bytes_per_element,
    }.items():
        check_int(name, value)
    head_slice(num_heads, 0, world_size)  # world_size must divide num_heads
    d_head = d_model // num_heads if d_head is None else d_head
    inner = num_heads * d_head
    projections = 4 * 2 * batch * length * d_model * inner
    attention_products = 2 * 2 * batch * num_heads * length * length * d_head
    forward = projections + attention_products
    n = batch * length * d_model * bytes_per_element
    return {
        "flops_forward": forward,
        "flops_backward": 2 * forward,
        "flops_forward_per_rank": forward // world_size,
        "flops_backward_per_rank": 2 * forward // world_size,
        "allreduce_bytes": n,
        "allreduces_forward": 1 if world_size > 1 else 0,
        "allreduces_backward": 1 if world_size > 1 else 0,
        "ring_bytes_sent_per_rank": 2 * (world_size - 1) * n // world_size,
    }


def cost_table(shapes: dict[str, dict]) -> str:
    """A text table of :func:`layer_cost` for named shapes (``{name: layer_cost kwargs}``):
    per rank and layer, FLOPs and bytes sent in each direction, and FLOPs per byte."""
    width = max([len(name) for name in shapes] + [5]) + 2
    lines = [
        f"{'layer':<{width}}{'pass':<10}{'FLOPs per rank':>18}{'bytes sent per rank':>21}"
        f"{'FLOPs per byte':>16}"
    ]
    for name, shape in shapes.items():
        cost = layer_cost(**shape)
        for phase in ("forward", "backward"):
            flops = cost[f"flops_{phase}_per_rank"]
            sent = cost[f"allreduces_{phase}"] * cost["ring_bytes_sent_per_rank"]
            ratio = f"{flops / sent:>16,.0f}" if sent else f"{'-':>16}"
            label = name if phase == "forward" else ""
            lines.append(f"{label:<{width}}{phase:<10}{flops:>18,}{sent:>21,}{ratio}")
    return "\n".join(lines)
