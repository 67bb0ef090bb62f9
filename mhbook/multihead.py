"""Multi-head attention.

Each of the ``h`` heads attends in its own ``d_head``-dimensional subspace:

    head_i = Attention(X_q W_q^i, X_k W_k^i, X_v W_v^i)
    MultiHead(X_q, X_k, X_v) = concat(head_1, ..., head_h) W_o

All heads are computed at once: one ``d_model x (h * d_head)`` matrix ``W_q`` holds
every ``W_q^i`` side by side, and the result is split into heads with a reshape.
By default ``d_head = d_model / h``; a fixed ``d_head`` independent of ``h`` avoids the
low-rank bottleneck of small heads (Bhojanapalli et al., 2020). Keys and values may
come from inputs of other widths ``kdim`` and ``vdim`` (cross-attention to a memory
of another width), as in ``nn.MultiheadAttention(..., kdim=, vdim=)``.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from . import attention

__all__ = ["MultiHeadAttention"]

#: For each input: the name of its length and width in the error messages, its projection.
_INPUTS = {
    "query": ("length", "d_model", "W_q"),
    "key": ("Lk", "kdim", "W_k"),
    "value": ("Lk", "vdim", "W_v"),
}


class MultiHeadAttention(nn.Module):
    """Multi-head attention with ``num_heads`` heads of size ``d_head``.

    Args:
        d_model: feature size of the queries and of the output.
        num_heads: ``h``; must divide ``d_model`` unless ``d_head`` is given.
        dropout: dropout on the attention weights (training only).
        bias: whether the four projections have a bias.
        d_head: size of one head; ``None`` means ``d_model // num_heads``.
        kdim: feature size of the keys; ``None`` means ``d_model``.
        vdim: feature size of the values; ``None`` means ``d_model``.

    Attributes:
        W_q: ``nn.Linear(d_model, num_heads * d_head)``.
        W_k: ``nn.Linear(kdim, num_heads * d_head)``.
        W_v: ``nn.Linear(vdim, num_heads * d_head)``.
        W_o: ``nn.Linear(num_heads * d_head, d_model)``.
        keep_weights: when ``True``, every forward pass stores its per-head
            weights ``(batch, num_heads, Lq, Lk)`` in ``weights`` (for plots;
            the output is unchanged). See :func:`mhbook.record_attention`.
        head_mask: ``None`` or a tensor ``(num_heads,)`` that scales each head's
            output before the heads are merged: 0 switches a head off. Give it
            ``requires_grad=True`` to measure head importance (Michel et al., 2019).
            It is a buffer: ``.to()`` moves it with the module, ``state_dict`` saves
            it when it is set, and ``load_state_dict`` restores it (or its absence).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        *,
        d_head: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
    ):
        super().__init__()
        optional = {"d_head": d_head, "kdim": kdim, "vdim": vdim}  # None: the default
        for name, value in {"d_model": d_model, "num_heads": num_heads, **optional}.items():
            if value is None and name in optional:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                allowed = " or None" if name in optional else ""
                raise ValueError(
                    f"{name} must be a positive int{allowed}, got {value!r} "
                    f"({type(value).__name__})"
                )
        if d_head is None and d_model % num_heads != 0:
            raise ValueError(
                f"d_model must be divisible by num_heads: got d_model={d_model}, "
                f"num_heads={num_heads} (d_model % num_heads = {d_model % num_heads})"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_head = d_model // num_heads if d_head is None else d_head
        self.kdim = d_model if kdim is None else kdim
        self.vdim = d_model if vdim is None else vdim
        self.dropout = dropout
        inner = num_heads * self.d_head  # all heads side by side; d_model by default
        # Created in this order (q, k, v, o): seeded initialisation depends on it.
        self.W_q = nn.Linear(d_model, inner, bias=bias)
        self.W_k = nn.Linear(self.kdim, inner, bias=bias)
        self.W_v = nn.Linear(self.vdim, inner, bias=bias)
        self.W_o = nn.Linear(inner, d_model, bias=bias)
        self.keep_weights = False
        self.weights: torch.Tensor | None = None
        self.register_buffer("head_mask", None)

    # -- splitting and merging heads -------------------------------------------------
    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, L, num_heads * d_head)`` -> ``(batch, num_heads, L, d_head)``."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.d_head).transpose(1, 2)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, num_heads, L, d_head)`` -> ``(batch, L, num_heads * d_head)``."""
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.num_heads * self.d_head)

    # -- forward() and its two halves, used separately by the KV cache ----------------
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Multi-head attention of ``query`` over ``key``/``value``.

        Args:
            query: ``(batch, Lq, d_model)``.
            key: ``(batch, Lk, kdim)``.
            value: ``(batch, Lk, vdim)``.
            mask: bool, broadcastable to ``(batch, num_heads, Lq, Lk)``; ``True`` = may attend.
            need_weights: also return the per-head weights (explicit path).
            is_causal: also apply :func:`~mhbook.causal_mask` ``(Lq, Lk)``, without
                building it where the fused kernel can skip it (see :func:`mhbook.attend`).

        Returns:
            Output ``(batch, Lq, d_model)``, or ``(output, weights)`` with weights
            ``(batch, num_heads, Lq, Lk)`` when ``need_weights``.
        """
        self._check_inputs(query=query, key=key, value=value)
        k, v = self._project_kv(key, value)
        return self._attend(query, k, v, mask, need_weights, is_causal)

    def project_kv(
        self, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Project keys and values and split them into heads.

        Args:
            key: ``(batch, Lk, kdim)``.
            value: ``(batch, Lk, vdim)``.

        Returns:
            ``(k, v)``, each ``(batch, num_heads, Lk, d_head)``. A KV cache stores these.
        """
        self._check_inputs(key=key, value=value)
        return self._project_kv(key, value)

    def attend(
        self,
        query: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Project the queries and attend to already projected keys and values.

        Args:
            query: ``(batch, Lq, d_model)``.
            k, v: ``(batch, num_heads, Lk, d_head)`` from :meth:`project_kv`.
            mask: bool, broadcastable to ``(batch, num_heads, Lq, Lk)``; ``True`` = may attend.
            need_weights: also return the per-head weights.
            is_causal: also apply :func:`~mhbook.causal_mask` ``(Lq, Lk)`` (see :meth:`forward`).

        Returns:
            Output ``(batch, Lq, d_model)``, or ``(output, weights)`` with weights
            ``(batch, num_heads, Lq, Lk)`` when ``need_weights``.
        """
        self._check_inputs(query=query)
        return self._attend(query, k, v, mask, need_weights, is_causal)

    def _project_kv(self, key, value):
        return self.split_heads(self.W_k(key)), self.split_heads(self.W_v(value))

    def _attend(self, query, k, v, mask, need_weights, is_causal=False):
        q = self.split_heads(self.W_q(query))  # (B, h, Lq, d_head)
        heads, weights = attention.attend(
            q,
            k,
            v,
            mask,
            # The explicit path materialises the (B, h, Lq, Lk) weights; otherwise
            # PyTorch's fused kernel runs in O(L) memory.
            need_weights=need_weights or self.keep_weights,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal,
        )
        if self.keep_weights:
            self.weights = weights.detach()
        if self.head_mask is not None:
            heads = heads * self._checked_head_mask(heads).view(1, -1, 1, 1)
        output = self.W_o(self.merge_heads(heads))
        return (output, weights) if need_weights else output

    def _checked_head_mask(self, heads: torch.Tensor) -> torch.Tensor:
        mask = self.head_mask
        if not isinstance(mask, torch.Tensor) or mask.shape != (self.num_heads,):
            got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"head_mask must be None or of shape ({self.num_heads},), got {got}")
        if mask.device != heads.device:
            raise ValueError(
                f"head_mask is on {mask.device} but the heads are on {heads.device}; "
                "move it with the module (.to()) or create it on the module's device"
            )
        return mask

    def _check_inputs(self, **inputs: torch.Tensor) -> None:
        """Check query/key/value: tensors ``(batch, length, d_model)``, ``(batch, Lk, kdim)``
        and ``(batch, Lk, vdim)`` on the module's device and of its dtype, all with one
        batch size; key and value of one length."""
        weight = self.W_q.weight
        for name, x in inputs.items():
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
            length, size_name, projection = _INPUTS[name]
            # The width its projection takes (a subclass may build them without __init__).
            size = getattr(self, projection).in_features
            if x.dim() != 3 or x.size(-1) != size:
                raise ValueError(
                    f"{name} must have shape (batch, {length}, {size_name}={size}), "
                    f"got {tuple(x.shape)}"
                )
            if x.device != weight.device:
                raise ValueError(
                    f"{name} is on {x.device} but the module is on {weight.device}; "
                    f"move one of them (e.g. {name}.to({str(weight.device)!r}))"
                )
            if x.dtype != weight.dtype and not _autocasting(x.device):
                raise TypeError(
                    f"{name} has dtype {x.dtype} but the module's weights are {weight.dtype}; "
                    f"convert one of them (e.g. {name}.to({weight.dtype}))"
                )
        (first, x0), *rest = inputs.items()
        for name, x in rest:
            if x.size(0) != x0.size(0):
                raise ValueError(
                    f"{first} and {name} have different batch sizes: {first} "
                    f"{tuple(x0.shape)}, {name} {tuple(x.shape)}"
                )
        key, value = inputs.get("key"), inputs.get("value")
        if key is not None and value is not None and key.size(1) != value.size(1):
            raise ValueError(
                f"key and value need the same length Lk: key {tuple(key.shape)}, "
                f"value {tuple(value.shape)}"
            )

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A state_dict holds "head_mask" only when one was set. Loading restores that:
        # make room for a saved mask (the parent method copies it in), drop ours otherwise.
        saved = state_dict.get(prefix + "head_mask")
        weight = self.W_q.weight
        self.head_mask = (
            None
            if saved is None
            else torch.empty(saved.shape, dtype=weight.dtype, device=weight.device)
        )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # -- conversion to and from PyTorch ---------------------------------------------
    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy an ``nn.MultiheadAttention(..., batch_first=True)``: same weights, same outputs.

        ``kdim``/``vdim`` are copied too: PyTorch then keeps ``q_proj_weight``,
        ``k_proj_weight`` and ``v_proj_weight`` apart (and one packed ``in_proj_bias``).
        """
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"expected nn.MultiheadAttention, got {type(m).__name__}")
        if not m.batch_first:
            raise ValueError(
                "expected nn.MultiheadAttention(..., batch_first=True), got batch_first=False"
            )
        if m.bias_k is not None:
            raise ValueError("nn.MultiheadAttention with add_bias_kv=True is not supported")
        bias = m.in_proj_bias is not None
        e = m.embed_dim
        if m._qkv_same_embed_dim:
            w = m.in_proj_weight
            weights = (w[:e], w[e : 2 * e], w[2 * e :])
        else:
            weights = (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
        p = weights[0]
        ours = cls(e, m.num_heads, dropout=m.dropout, bias=bias, kdim=m.kdim, vdim=m.vdim)
        ours = ours.to(p.device, p.dtype)
        with torch.no_grad():
            for i, (lin, weight) in enumerate(zip((ours.W_q, ours.W_k, ours.W_v), weights)):
                lin.weight.copy_(weight)
                if bias:
                    lin.bias.copy_(m.in_proj_bias[i * e : (i + 1) * e])
            ours.W_o.weight.copy_(m.out_proj.weight)
            if bias:
                ours.W_o.bias.copy_(m.out_proj.bias)
        return ours

    def to_torch(self) -> nn.MultiheadAttention:
        """An ``nn.MultiheadAttention(..., batch_first=True, kdim=, vdim=)`` with the same
        weights. PyTorch's heads are ``embed_dim // num_heads`` wide, so ``num_heads *
        d_head`` must equal ``d_model``."""
        if self.num_heads * self.d_head != self.d_model:
            raise ValueError(
                "nn.MultiheadAttention needs num_heads * d_head == d_model (its heads are "
                f"embed_dim // num_heads wide): got num_heads={self.num_heads} * "
                f"d_head={self.d_head} = {self.num_heads * self.d_head}, d_model={self.d_model}"
            )
        bias = self.W_q.bias is not None
        w = self.W_q.weight
        m = nn.MultiheadAttention(
            self.d_model,
            self.num_heads,
            dropout=self.dropout,
            bias=bias,
            batch_first=True,
            kdim=self.W_k.in_features,
            vdim=self.W_v.in_features,
        ).to(w.device, w.dtype)
        with torch.no_grad():
            if m._qkv_same_embed_dim:
                m.in_proj_weight.copy_(
                    torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight])
                )
            else:
                m.q_proj_weight.copy_(self.W_q.weight)
                m.k_proj_weight.copy_(self.W_k.weight)
                m.v_proj_weight.copy_(self.W_v.weight)
            m.out_proj.weight.copy_(self.W_o.weight)
            if bias:
                m.in_proj_bias.copy_(torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias]))
                m.out_proj.bias.copy_(self.W_o.bias)
        return m


def _autocasting(device: torch.device) -> bool:
    """Whether autocast is on for ``device``: PyTorch then casts for the matrix products."""
    return torch.amp.is_autocast_available(device.type) and torch.is_autocast_enabled(device.type)
