"""Multi-head attention: the one attention layer of mhbook.

Each of the ``h`` heads attends in its own ``d_head``-dimensional subspace:

    head_i = Attention(X_q W_q^i, X_k W_k^g(i), X_v W_v^g(i))
    MultiHead(X_q, X_k, X_v) = concat(head_1, ..., head_h) W_o

All heads are computed at once: one ``d_model x (h * d_head)`` matrix ``W_q`` holds
every ``W_q^i`` side by side, and the result is split into heads with a reshape.
By default ``d_head = d_model / h``; a fixed ``d_head`` independent of ``h`` avoids the
low-rank bottleneck of small heads (Bhojanapalli et al., 2020).

The same layer covers what today's models add:

* fewer key/value heads than query heads, ``num_kv_heads = h_kv``: query head ``i`` uses
  key/value head ``g(i) = i // (h / h_kv)`` (grouped-query attention, Ainslie et al.,
  2023; ``h_kv = 1`` is multi-query attention, Shazeer, 2019; ``h_kv = h``, the default,
  is multi-head attention). The KV cache then holds ``h / h_kv`` times fewer numbers;
* cross-attention to a memory of other widths ``kdim`` and ``vdim``, as
  ``nn.MultiheadAttention(..., kdim=, vdim=)``;
* position inside attention, for self-attention: a rotary embedding of queries and keys
  (RoPE: the layer's own ``rope``, or the tables its model hands it) or a distance bias on
  the scores (``alibi``);
* a sliding ``window`` (and attention ``sinks``, :mod:`mhbook.attention.streaming`), told at
  construction: the layer builds its own causal, windowed mask and tells its cache what
  to keep;
* a KV cache (:class:`mhbook.LayerCache`) that the layer updates itself: with the new
  tokens' keys and values in self-attention, with the projected memory once in
  cross-attention.

It always returns ``(output, weights)``, with ``weights`` ``None`` unless asked for, as
``nn.MultiheadAttention`` and Hugging Face's attention layers do.
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.masks import causal_mask
from ..core.validate import (
    check_features,
    check_heads,
    check_int,
    check_number,
    check_window,
)
from .alibi import check_alibi
from .base import AttentionLayer, check_cache, check_rope
from .cache import LayerCache
from .rope import apply_rope
from .sdpa import attend
from .streaming import attend_within_cache

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(AttentionLayer):
    """Multi-head attention with ``num_heads`` query heads and ``num_kv_heads`` key/value
    heads of size ``d_head``.

    Args:
        d_model: feature size of the queries and of the output.
        num_heads: ``h``, query heads; must divide ``d_model`` unless ``d_head`` is given.
        num_kv_heads: ``h_kv``, key/value heads; must divide ``num_heads``. ``None``:
            ``num_heads`` (multi-head attention); 1: multi-query attention.
        dropout: dropout on the attention weights (training only).
        bias: whether the four projections have a bias (``nn.MultiheadAttention``'s
            have one, Llama's none).
        d_head: size of one head; ``None`` means ``d_model // num_heads``.
        kdim, vdim: feature sizes of the keys' and the values' inputs (cross-attention
            to a memory of another width); ``None`` means ``d_model``.
        rope: ``None`` or the layer's own :class:`mhbook.RotaryEmbedding` of ``d_head``
            (a layer that stands alone): self-attention's queries and keys are rotated
            after the head split and before the cache, which stores rotated keys (Llama's).
        rotary: rotate them by the tables its model hands to :meth:`forward`
            (``rope_tables``), as :func:`mhbook.make_attention` builds it; implied by ``rope``.
        alibi: ``None`` or a :class:`mhbook.ALiBi` of ``num_heads``: a distance bias
            ``(num_heads, T, S)`` added to self-attention's scores.
        window: ``None`` (a global layer), or a local layer's sliding window: each query
            of self-attention sees its last ``window`` keys, itself included (the layer
            builds ``causal_mask(T, S, window=, sinks=)`` itself), and its cache keeps those.
        sinks: with a ``window``, every query also sees the first ``sinks`` tokens
            (attention sinks, Xiao et al., 2023); with RoPE or ALiBi the keys are then
            positioned within the cache (:attr:`streaming`).

    Attributes:
        W_q, W_k, W_v, W_o: the projections, ``d_model -> h * d_head``, ``kdim -> h_kv *
            d_head``, ``vdim -> h_kv * d_head`` and ``h * d_head -> d_model``; and
            ``keep_weights``, ``weights`` and ``head_mask``, :class:`AttentionLayer`'s.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        d_head: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        rope: nn.Module | None = None,
        rotary: bool = False,
        alibi: nn.Module | None = None,
        window: int | None = None,
        sinks: int = 0,
    ):
        super().__init__()
        _check_arguments(d_model, num_heads, num_kv_heads, d_head, kdim, vdim, dropout, rope)
        check_window(window, sinks)
        check_alibi(alibi, num_heads)
        self.d_model, self.num_heads = d_model, num_heads
        self.num_kv_heads = num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.d_head = d_head = d_model // num_heads if d_head is None else d_head
        self.kdim, self.vdim = kdim or d_model, vdim or d_model
        self.dropout = dropout
        # Created in this order (q, k, v, o): seeded initialisation depends on it.
        self.W_q = nn.Linear(d_model, num_heads * d_head, bias=bias)
        self.W_k = nn.Linear(self.kdim, num_kv_heads * d_head, bias=bias)
        self.W_v = nn.Linear(self.vdim, num_kv_heads * d_head, bias=bias)
        self.W_o = nn.Linear(num_heads * d_head, d_model, bias=bias)
        self.rope, self.rotary, self.alibi = rope, bool(rotary) or rope is not None, alibi
        self.window, self.sinks = window, sinks
        self._init_outputs()

    @property
    def streaming(self) -> bool:
        """Whether the keys are positioned *within the cache* (StreamingLLM: ``sinks`` with
        RoPE or ALiBi, :mod:`mhbook.attention.streaming`); they are cached before RoPE."""
        return self.sinks > 0 and (self.rotary or self.alibi is not None)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head: ``num_heads // num_kv_heads``."""
        return self.num_heads // self.num_kv_heads

    def extra_repr(self) -> str:
        kv = "" if self.num_kv_heads == self.num_heads else f", num_kv_heads={self.num_kv_heads}"
        out = f"d_model={self.d_model}, num_heads={self.num_heads}{kv}, d_head={self.d_head}"
        defaults = {"kdim": self.d_model, "vdim": self.d_model, "window": None, "sinks": 0}
        for name, default in defaults.items():
            if getattr(self, name) != default:
                out += f", {name}={getattr(self, name)}"
        return out

    def split_heads(self, x: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """``(batch, L, heads * d_head)`` -> ``(batch, heads, L, d_head)``; ``heads``
        defaults to ``num_heads`` (pass ``num_kv_heads`` for keys and values)."""
        batch, length, _ = x.shape
        heads = self.num_heads if heads is None else heads
        return x.view(batch, length, heads, self.d_head).transpose(1, 2)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        *,
        is_causal: bool = False,
        positions: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
        rope_tables: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of ``query`` ``(batch, T, d_model)`` over ``key`` ``(batch, S, kdim)``
        and ``value`` ``(batch, S, vdim)`` (default ``key``), or over itself (``key=None``).

        Args:
            mask: bool, broadcastable to ``(batch, num_heads, T, S)``, ``True`` = may
                attend; ``S`` counts the cached tokens too. A ``window`` adds its own.
            is_causal: also apply :func:`~mhbook.causal_mask` ``(T, S)`` (bottom-right),
                without building it where the fused kernel can skip it.
            positions: integer ``(T,)`` or ``(batch, T)`` positions of the new tokens
                (Hugging Face's ``position_ids``); default ``cache.length + arange(T)``.
            cache: this layer's :class:`mhbook.LayerCache`: self-attention adds the new
                keys and values and attends to all it holds; cross-attention projects the
                memory into it on the first call.
            need_weights: also return the weights ``(batch, num_heads, T, S)``.
            rope_tables: RoPE's ``(cos, sin)`` of ``positions`` (when :attr:`streaming`,
                of the positions ``0 .. N - 1`` or more, ``N`` the kept keys and the new
                ones: the cache's columns), from the model, for ``rotary``.

        Returns:
            ``(output (batch, T, d_model), weights or None)``.
        """
        check_inputs(self, query, key, value, positions=positions, cache=cache)
        keep = need_weights or self.keep_weights  # the explicit path stores the weights
        if key is not None:  # cross-attention: the memory's keys and values, once per cache
            value = key if value is None else value
            if cache is None:
                k, v = self._project_kv(key, value)  # (B, h_kv, S, d_head)
            else:
                k, v = cache.memory(lambda: self._project_kv(key, value))
            q = self.split_heads(self.W_q(query))  # (B, h, T, d_head)
            heads, weights = self.attend_heads(
                q, k, v, mask, need_weights=keep, is_causal=is_causal
            )
            return self._heads_out(heads, weights, need_weights)
        # 1. project: the new tokens' keys, values and queries, split into heads
        k, v = self._project_kv(query, query)  # (B, h_kv, T, d_head)
        q = self.split_heads(self.W_q(query))  # (B, h, T, d_head)
        if self.streaming:  # 2. to 4. at positions within the cache (keys cached unrotated)
            if cache is not None:  # (B, h_kv, kept + T, d_head)
                k, v, _ = cache.update(
                    k, v, window=self.window, sinks=self.sinks, within_cache=True
                )
            columns = torch.arange(k.size(2), device=q.device)  # the kept keys, the new ones
            heads, weights = attend_within_cache(
                q, k, v, mask, window=self.window, sinks=self.sinks, attend=self.attend_heads,
                tables=self._rope_tables(rope_tables, columns, q.dtype), alibi=self.alibi,
                need_weights=keep,
            )  # fmt: skip
            return self._heads_out(heads, weights, need_weights)
        # 2. position: RoPE rotates q and k at the new tokens' positions
        if positions is not None or self.rope is not None or self.alibi is not None:
            positions = self._positions(query, positions, cache)  # (T,) or (B, T)
        rope = self._rope_tables(rope_tables, positions, q.dtype)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        # 3. cache: the kept keys and values, then the new ones (and, for ALiBi, positions)
        k_positions = positions
        if cache is not None:
            kept = positions if self.alibi is not None else None
            k, v, k_positions = cache.update(k, v, kept, window=self.window, sinks=self.sinks)
        # 4. attend: with a window, the layer's own causal mask (bottom-right); ALiBi's bias
        if self.window is not None:
            local = causal_mask(
                q.size(2), k.size(2), q.device, window=self.window, sinks=self.sinks
            )
            mask, is_causal = (local if mask is None else mask & local), False
        bias = None if self.alibi is None else self.alibi(positions, k_positions).to(q.dtype)
        heads, weights = self.attend_heads(
            q, k, v, mask, need_weights=keep, bias=bias, is_causal=is_causal
        )
        return self._heads_out(heads, weights, need_weights)  # 5. merge the heads, W_o

    def attend_heads(self, q, k, v, mask=None, *, need_weights=False, bias=None, is_causal=False):
        """:func:`mhbook.attend` of the split heads ``q`` ``(batch, h, T, d_head)``, ``k``,
        ``v`` ``(batch, h_kv, S, d_head)`` with the layer's dropout in training: ``(heads
        (batch, h, T, d_head), weights or None)``. Chapter 6's additive attention overrides it."""
        p = self.dropout if self.training else 0.0
        return attend(
            q, k, v, mask, need_weights=need_weights, dropout_p=p, bias=bias, is_causal=is_causal
        )

    def project_kv(self, key: torch.Tensor, value: torch.Tensor | None = None):
        """Cross-attention's keys and values of a memory ``key`` ``(batch, S, kdim)`` and
        ``value`` ``(batch, S, vdim)`` (default ``key``): each ``(batch, num_kv_heads, S,
        d_head)``: what a cache keeps as ``memory_keys`` and ``memory_values``."""
        value = key if value is None else value
        _check_memory(self, key, value)
        return self._project_kv(key, value)

    def _project_kv(self, key, value) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.W_k(key), self.W_v(value)  # (B, S, h_kv * d_head)
        return self.split_heads(k, self.num_kv_heads), self.split_heads(v, self.num_kv_heads)


def check_inputs(layer, query, key=None, value=None, *, positions=None, cache=None) -> None:
    """The inputs of a :class:`MultiHeadAttention` ``layer`` (or of a layer with its
    ``W_q``, ``W_k``, widths and kind): query, key and value ``(batch, length, width)``
    tensors on the module's device and of its dtype, with one batch size, key and value of
    one length; no positions for a layer that positions its keys within the cache."""
    check_features("query", query, layer.W_q.in_features, layer.W_q.weight)
    if positions is not None and layer.streaming:
        raise ValueError(
            f"positions: with sinks={layer.sinks} (StreamingLLM) the keys are "
            "positioned within the cache, not at text positions; pass none"
        )
    if key is None:
        if value is not None:
            raise ValueError("value was given without key: pass both (cross-attention) or neither")
        if (layer.kdim, layer.vdim) != (layer.d_model, layer.d_model):
            raise ValueError(
                f"self-attention (key=None) needs kdim == vdim == d_model={layer.d_model}, "
                f"got kdim={layer.kdim}, vdim={layer.vdim}: pass the memory as key"
            )
    else:
        if isinstance(key, torch.Tensor) and key.dtype == torch.bool:
            raise TypeError("key is a bool tensor: pass a mask as mask=, after key and value")
        if layer.rotary or layer.alibi is not None:
            raise ValueError(
                "rope and alibi position the queries and keys of self-attention: "
                "call with key=None (cross-attention has no shared positions)"
            )
        _check_memory(layer, key, value)
        for name, x in (("key", key), ("value", value)):
            if x is not None and x.size(0) != query.size(0):
                raise ValueError(
                    f"query and {name} have different batch sizes: query "
                    f"{tuple(query.shape)}, {name} {tuple(x.shape)}"
                )
        if value is not None and key.size(1) != value.size(1):
            raise ValueError(
                f"key and value need the same length S: key {tuple(key.shape)}, "
                f"value {tuple(value.shape)}"
            )
    check_cache(cache)


def _check_memory(layer: MultiHeadAttention, key, value) -> None:
    """``key`` ``(batch, S, kdim)`` and ``value`` (``None``, or ``(batch, S, vdim)``)."""
    layout, weight = "(batch, S, {size_name}={size})", layer.W_k.weight
    check_features("key", key, layer.kdim, weight, layout=layout, size_name="kdim")
    if value is not None:
        check_features("value", value, layer.vdim, weight, layout=layout, size_name="vdim")


def _check_arguments(d_model, num_heads, num_kv_heads, d_head, kdim, vdim, dropout, rope):
    """The sizes, the dropout and the rope of :class:`MultiHeadAttention`, by name."""
    check_int("d_model", d_model)
    check_int("num_heads", num_heads)
    for name, value in (("num_kv_heads", num_kv_heads), ("d_head", d_head)):
        check_int(name, value, optional=True)
    for name, value in (("kdim", kdim), ("vdim", vdim)):
        check_int(name, value, optional=True)
    check_heads(num_heads, num_heads if num_kv_heads is None else num_kv_heads, d_model, d_head)
    check_number("dropout", dropout, 0.0, 1.0)
    check_rope(rope, d_model // num_heads if d_head is None else d_head)
