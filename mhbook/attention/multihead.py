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
  (``rope``) or a distance bias on the scores (``alibi``);
* a sliding ``window`` (and attention ``sinks``), told at construction: the layer builds
  its own causal, windowed mask and tells its cache what to keep;
* a KV cache (:class:`mhbook.LayerCache`) that the layer updates itself: with the new
  tokens' keys and values in self-attention, with the projected memory once in
  cross-attention.

It always returns ``(output, weights)``, with ``weights`` ``None`` unless asked for, as
``nn.MultiheadAttention`` and Hugging Face's attention layers do.
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.masks import causal_mask, check_mask, window_slots
from ..core.validate import (
    check_features,
    check_heads,
    check_int,
    check_module,
    check_number,
    check_positions,
    check_window,
)
from .cache import LayerCache, _append_positions
from .sdpa import attend

__all__ = ["AttentionLayer", "MultiHeadAttention"]


class AttentionLayer(nn.Module):
    """What every attention layer of mhbook does around :func:`mhbook.attend`: the call
    signature, the default positions, keeping the weights for plots, and ``head_mask``.

    Subclasses set ``num_heads`` and call ``self._init_outputs()`` in ``__init__``.
    """

    num_heads: int

    def _init_outputs(self) -> None:
        self.keep_weights = False
        self.weights: torch.Tensor | None = None
        self.register_buffer("head_mask", None)

    def _positions(self, x: torch.Tensor, positions, cache: LayerCache | None) -> torch.Tensor:
        """The new tokens' positions: ``positions`` checked, or ``cache.length + arange(T)``
        (``arange(T)`` without a cache)."""
        batch, length = x.shape[:2]
        if positions is None:
            start = 0 if cache is None else cache.length
            return torch.arange(start, start + length, device=x.device)
        check_positions(positions, batch, length, x.device)
        return positions

    def _heads_out(
        self, heads: torch.Tensor, weights: torch.Tensor | None, need_weights: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Keep the weights if asked, scale heads by ``head_mask``, merge, ``W_o``."""
        if self.keep_weights:
            self.weights = weights.detach()
        if self.head_mask is not None:
            heads = heads * self._checked_head_mask(heads).view(1, -1, 1, 1)
        return self.W_o(self.merge_heads(heads)), (weights if need_weights else None)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, heads, L, d)`` -> ``(batch, L, heads * d)``: the heads side by side."""
        batch, heads, length, d = x.shape
        return x.transpose(1, 2).reshape(batch, length, heads * d)

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

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A state_dict holds "head_mask" only when one was set. Loading restores that:
        # make room for a saved mask (the parent method copies it in), drop ours otherwise.
        saved = state_dict.get(prefix + "head_mask")
        weight = self.W_o.weight
        self.head_mask = (
            None
            if saved is None
            else torch.empty(saved.shape, dtype=weight.dtype, device=weight.device)
        )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


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
        rope: ``None`` or a module ``rope(x, positions)`` (a :class:`mhbook.RotaryEmbedding`)
            applied to the queries and keys ``(batch, heads, T, d_head)`` of
            self-attention after the head split and before the cache: the cache stores
            rotated keys, as Llama does.
        alibi: ``None`` or a module ``alibi(q_positions, k_positions)`` (a
            :class:`mhbook.ALiBi` built for ``num_heads`` heads) that gives a float bias
            ``(num_heads, T, S)`` added to the scores of self-attention.
        window: ``None`` (a global layer), or a local layer's sliding window: each query
            of self-attention sees its last ``window`` keys, itself included, and no
            later one (the layer builds ``causal_mask(T, S, window=, sinks=)`` itself),
            and the layer's cache keeps only those.
        sinks: with a ``window``, every query also sees the first ``sinks`` tokens
            (attention sinks, Xiao et al., 2023); with ``rope`` or ``alibi`` the keys are
            then positioned within the cache (:attr:`streaming`).

    Attributes:
        W_q: ``nn.Linear(d_model, num_heads * d_head)``.
        W_k: ``nn.Linear(kdim, num_kv_heads * d_head)``.
        W_v: ``nn.Linear(vdim, num_kv_heads * d_head)``.
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
        *,
        num_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        d_head: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        rope: nn.Module | None = None,
        alibi: nn.Module | None = None,
        window: int | None = None,
        sinks: int = 0,
    ):
        super().__init__()
        check_int("d_model", d_model)
        check_int("num_heads", num_heads)
        for name, value in (("num_kv_heads", num_kv_heads), ("d_head", d_head)):
            check_int(name, value, optional=True)
        for name, value in (("kdim", kdim), ("vdim", vdim)):
            check_int(name, value, optional=True)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_heads(num_heads, num_kv_heads, d_model, d_head)
        check_window(window, sinks)
        check_number("dropout", dropout, 0.0, 1.0)
        check_module("rope", rope)
        check_module("alibi", alibi)
        if alibi is not None and getattr(alibi, "num_heads", num_heads) != num_heads:
            raise ValueError(
                f"alibi must give one slope per query head: got an ALiBi of "
                f"num_heads={alibi.num_heads} for a layer of num_heads={num_heads}"
            )
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.d_head = d_model // num_heads if d_head is None else d_head
        self.kdim = d_model if kdim is None else kdim
        self.vdim = d_model if vdim is None else vdim
        self.dropout = dropout
        # Created in this order (q, k, v, o): seeded initialisation depends on it.
        self.W_q = nn.Linear(d_model, num_heads * self.d_head, bias=bias)
        self.W_k = nn.Linear(self.kdim, num_kv_heads * self.d_head, bias=bias)
        self.W_v = nn.Linear(self.vdim, num_kv_heads * self.d_head, bias=bias)
        self.W_o = nn.Linear(num_heads * self.d_head, d_model, bias=bias)
        self.rope = rope
        self.alibi = alibi
        self.window = window
        self.sinks = sinks
        self._init_outputs()

    @property
    def streaming(self) -> bool:
        """Whether the layer places the keys *within the cache* (StreamingLLM, with
        ``sinks`` and ``rope`` or ``alibi``): each query's keys, the sinks then its window,
        sit at positions ``0, 1, ..., m - 1``, the query itself at ``m - 1``, whatever their
        text positions, so that no distance exceeds ``sinks + window - 1``. The keys are
        then cached before RoPE (they are rotated anew at every step) and ALiBi measures
        distances in the cache. See :func:`mhbook.window_slots`."""
        return self.sinks > 0 and (self.rope is not None or self.alibi is not None)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head: ``num_heads // num_kv_heads``."""
        return self.num_heads // self.num_kv_heads

    def extra_repr(self) -> str:
        kv = "" if self.num_kv_heads == self.num_heads else f", num_kv_heads={self.num_kv_heads}"
        widths = "".join(
            f", {name}={getattr(self, name)}"
            for name in ("kdim", "vdim")
            if getattr(self, name) != self.d_model
        )
        heads = f"num_heads={self.num_heads}{kv}, d_head={self.d_head}"
        local = "" if self.window is None else f", window={self.window}"
        local += f", sinks={self.sinks}" if self.sinks else ""
        return f"d_model={self.d_model}, {heads}{widths}{local}"

    # -- splitting heads (merge_heads: AttentionLayer's) -------------------------------
    def split_heads(self, x: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """``(batch, L, heads * d_head)`` -> ``(batch, heads, L, d_head)``; ``heads``
        defaults to ``num_heads`` (pass ``num_kv_heads`` for keys and values)."""
        batch, length, _ = x.shape
        heads = self.num_heads if heads is None else heads
        return x.view(batch, length, heads, self.d_head).transpose(1, 2)

    # -- forward ---------------------------------------------------------------------
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
        """Attention of ``query`` over ``key``/``value``, or over itself.

        Args:
            query: ``(batch, T, d_model)``.
            key: ``(batch, S, kdim)``: cross-attention to this memory. ``None``:
                self-attention, keys and values come from ``query``.
            value: ``(batch, S, vdim)``; ``None``: ``key``.
            mask: bool, broadcastable to ``(batch, num_heads, T, S)``; ``True`` = may
                attend. With a cache in self-attention ``S`` counts the kept tokens too.
                A layer with a ``window`` adds its own causal, windowed mask to it.
            is_causal: also apply :func:`~mhbook.causal_mask` ``(T, S)``, aligned
                bottom-right, without building it where the fused kernel can skip it
                (see :func:`mhbook.attend`).
            positions: integer positions of the ``T`` new tokens for ``rope`` and
                ``alibi``, ``(T,)`` or ``(batch, T)`` (one row per sequence, e.g. a
                left-padded batch, Hugging Face's ``position_ids``); default
                ``cache.length + arange(T)``, or ``arange(T)`` without a cache.
            cache: ``None``, or this layer's :class:`mhbook.LayerCache`. In
                self-attention the new tokens' keys and values are added to it and the
                queries attend to all it holds. In cross-attention the memory is
                projected into it on the first call; later calls reuse those keys and
                values (keep ``key`` the same).
            need_weights: also return the per-head weights (explicit path).
            rope_tables: ``(cos, sin)`` of ``positions``, from ``rope.tables``: what a
                model computes once per forward pass for all its layers. ``None``:
                the layer computes them.

        Returns:
            ``(output, weights)``: output ``(batch, T, d_model)``; weights
            ``(batch, num_heads, T, S)`` when ``need_weights``, else ``None``.
        """
        self_attention = key is None
        if self_attention and value is not None:
            raise ValueError("value was given without key: pass both (cross-attention) or neither")
        self._check_inputs(query, key, value, cache)
        keep = need_weights or self.keep_weights  # the explicit path stores the weights
        if not self_attention:
            return self._cross_attention(query, key, value, mask, cache, need_weights, is_causal)
        # 1. project: the new tokens' keys, values and queries, split into heads
        k, v = self._project_kv(query, query)  # (B, h_kv, T, d_head)
        q = self.split_heads(self.W_q(query))  # (B, h, T, d_head)
        if self.streaming:  # 2. to 4. at positions within the cache
            if positions is not None:
                raise ValueError(
                    f"positions: with sinks={self.sinks} (StreamingLLM) the keys are "
                    "positioned within the cache, not at text positions; pass none"
                )
            if cache is not None:  # before RoPE: (B, h_kv, kept + T, d_head)
                k, v = cache.update(k, v, window=self.window, sinks=self.sinks)
            heads, weights = self._attend_within_cache(q, k, v, mask, keep)
            return self._heads_out(heads, weights, need_weights)
        # 2. position: RoPE rotates q and k at the new tokens' positions
        positions = self._positions(query, positions, cache)  # (T,) or (B, T)
        if self.rope is not None:
            cos, sin = self.rope.tables(positions, q.dtype) if rope_tables is None else rope_tables
            q, k = self.rope.rotate(q, cos, sin), self.rope.rotate(k, cos, sin)
        # 3. cache: the kept keys and values, then the new ones (k_positions: ALiBi's)
        k_positions = positions
        if cache is not None:
            kept_positions = positions if self.alibi is not None else None
            if kept_positions is not None and cache.positions is not None:
                k_positions = _append_positions(cache.positions, positions)
            k, v = cache.update(k, v, kept_positions, window=self.window, sinks=self.sinks)
        # 4. attend: with a window, the layer's own causal mask (bottom-right), ALiBi's bias
        if self.window is not None:
            local = causal_mask(
                q.size(2), k.size(2), q.device, window=self.window, sinks=self.sinks
            )
            mask, is_causal = (local if mask is None else mask & local), False
        bias = None
        if self.alibi is not None:
            bias = self._alibi_bias(positions, k_positions, query.dtype)
        # The explicit path materialises the (B, h, T, S) weights; otherwise PyTorch's
        # fused kernel runs in O(T) memory.
        heads, weights = self.attend_heads(
            q, k, v, mask, need_weights=keep, bias=bias, is_causal=is_causal
        )
        # 5. merge: the heads side by side, W_o
        return self._heads_out(heads, weights, need_weights)

    def _cross_attention(self, query, key, value, mask, cache, need_weights, is_causal):
        """Attention of ``query`` over a memory: its keys and values projected, or those
        of the cache (projected once, on the first call)."""
        value = key if value is None else value
        if cache is None:
            k, v = self._project_kv(key, value)  # (B, h_kv, S, d_head)
        else:
            k, v = cache.memory(lambda: self._project_kv(key, value))
        q = self.split_heads(self.W_q(query))  # (B, h, T, d_head)
        heads, weights = self.attend_heads(
            q, k, v, mask, need_weights=need_weights or self.keep_weights, is_causal=is_causal
        )
        return self._heads_out(heads, weights, need_weights)

    def _attend_within_cache(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        need_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention with sinks, positioned within the cache (StreamingLLM, Xiao et al.,
        2023): each query sees the first ``sinks`` keys and its last ``window`` keys
        (:func:`mhbook.window_slots`), placed at positions ``0, 1, ..., m - 1`` in that
        order, the query itself at ``m - 1``. RoPE rotates them there (and ALiBi measures
        those distances), so no distance exceeds ``sinks + window - 1``, however long the
        text: the first tokens' keys are used at other positions than they were made at.

        Args:
            q: ``(B, h, T, d_head)`` the new queries, not rotated.
            k, v: ``(B, h_kv, N, d_head)`` what ``cache.update`` returned: the kept keys
                (not rotated) and values, then the ``T`` new ones (without a cache: the
                ``T`` new ones).
            mask: bool, broadcastable to ``(B, h, T, N)``, or ``None``; the layer's
                window and sinks apply whatever it says.
            need_weights: also return the weights ``(B, h, T, N)``.

        Returns:
            ``(heads, weights or None)``: heads ``(B, h, T, d_v)``.

        Each query has its own ``K = sinks + window`` keys at its own positions, so each
        is a batch row of its own: ``(B * T, h, 1, d_head)`` over ``(B * T, h_kv, K,
        d_head)``, through :meth:`attend_heads`.
        """
        B, h, T, N = *q.shape[:3], k.size(2)
        index, valid = window_slots(T, N, self.window, self.sinks, q.device)  # (T, K)
        K = index.size(1)
        k, v = k[:, :, index], v[:, :, index]  # (B, h_kv, T, K, d): each query's keys
        key_positions = torch.arange(K, device=q.device)
        q_positions = valid.sum(-1) - 1  # (T,): the query's own key is its last slot
        bias = None
        if self.rope is not None:
            q, k = self.rope(q, q_positions), self.rope(k, key_positions)
        if self.alibi is not None:
            bias = self.alibi(q_positions, key_positions, q.dtype)  # (h, T, K)
            bias = _rows(bias.unsqueeze(0).expand(B, -1, -1, -1))
        allowed = valid.expand(B, 1, T, K)
        if mask is not None:  # the mask's columns, slot by slot
            check_mask(mask, (B, h, T, N), q.device)
            mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
            mask = mask.expand(B, mask.size(1), T, N)
            allowed = allowed & mask.gather(-1, index.expand(B, mask.size(1), T, K))
        heads, weights = self.attend_heads(
            _rows(q), _rows(k), _rows(v), _rows(allowed), need_weights=need_weights, bias=bias
        )
        heads = heads.reshape(B, T, h, -1).transpose(1, 2)  # (B, h, T, d_v)
        if weights is not None:  # back to the columns of the N keys
            weights = weights.reshape(B, T, h, K).transpose(1, 2)
            full = weights.new_zeros(B, h, T, N)
            weights = full.scatter_add(-1, index.expand(B, h, T, K), weights)
        return heads, weights

    def attend_heads(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        need_weights: bool = False,
        bias: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The heads' attention: :func:`mhbook.attend` of the projected, split ``q``
        ``(batch, h, T, d_head)`` over ``k``, ``v`` ``(batch, h_kv, S, d_head)``, with
        this layer's dropout in training. Returns ``(heads, weights or None)``, heads
        ``(batch, h, T, d_head)``. A subclass overrides it to score differently (chapter
        6's additive attention)."""
        dropout_p = self.dropout if self.training else 0.0
        return attend(
            q,
            k,
            v,
            mask,
            need_weights=need_weights,
            dropout_p=dropout_p,
            bias=bias,
            is_causal=is_causal,
        )

    def project_kv(
        self, key: torch.Tensor, value: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention's keys and values of a memory: ``key`` ``(batch, S, kdim)`` and
        ``value`` ``(batch, S, vdim)`` (default ``key``) projected by ``W_k`` and ``W_v``
        and split into ``(batch, num_kv_heads, S, d_head)`` each: what a cache keeps as
        ``memory_keys`` and ``memory_values``."""
        weight = self.W_k.weight
        layout = "(batch, S, {size_name}={size})"
        check_features("key", key, self.kdim, weight, layout=layout, size_name="kdim")
        value = key if value is None else value
        check_features("value", value, self.vdim, weight, layout=layout, size_name="vdim")
        return self._project_kv(key, value)

    def _project_kv(self, key, value) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            self.split_heads(self.W_k(key), self.num_kv_heads),
            self.split_heads(self.W_v(value), self.num_kv_heads),
        )

    def _alibi_bias(self, q_positions, k_positions, dtype) -> torch.Tensor:
        """ALiBi's bias ``(num_heads, T, S)``, or ``(batch, num_heads, T, S)`` for
        positions of one row per sequence."""
        if q_positions.dim() == 1 and k_positions.dim() == 2:
            q_positions = q_positions.expand(k_positions.size(0), -1)
        if q_positions.dim() == 2 and k_positions.dim() == 1:
            k_positions = k_positions.expand(q_positions.size(0), -1)
        return self.alibi(q_positions, k_positions).to(dtype)

    def _check_inputs(self, query, key, value, cache) -> None:
        """Query, key and value: ``(batch, length, width)`` tensors on the module's device
        and of its dtype, with one batch size; key and value of one length."""
        weight = self.W_q.weight
        check_features("query", query, self.W_q.in_features, weight)
        if key is None:
            if (self.kdim, self.vdim) != (self.d_model, self.d_model):
                raise ValueError(
                    f"self-attention (key=None) needs kdim == vdim == d_model={self.d_model}, "
                    f"got kdim={self.kdim}, vdim={self.vdim}: pass the memory as key"
                )
        else:
            if isinstance(key, torch.Tensor) and key.dtype == torch.bool:
                raise TypeError("key is a bool tensor: pass a mask as mask=, after key and value")
            if self.rope is not None or self.alibi is not None:
                raise ValueError(
                    "rope and alibi position the queries and keys of self-attention: "
                    "call with key=None (cross-attention has no shared positions)"
                )
            layout = "(batch, S, {size_name}={size})"
            check_features("key", key, self.kdim, weight, layout=layout, size_name="kdim")
            if value is not None:
                check_features("value", value, self.vdim, weight, layout=layout, size_name="vdim")
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
        if cache is not None and not isinstance(cache, LayerCache):
            raise TypeError(
                f"cache must be None or a mhbook.LayerCache (one layer of a KVCache), "
                f"got {type(cache).__name__}"
            )


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``(B, heads, T, ...)`` -> ``(B * T, heads, 1, ...)``: each query a batch row of its
    own, with its own keys (``(B, heads, T, K, d)`` -> ``(B * T, heads, K, d)``)."""
    x = x.transpose(1, 2)
    if x.dim() == 4:  # (B, T, heads, d): one query
        x = x.unsqueeze(3)
    return x.reshape(x.size(0) * x.size(1), *x.shape[2:])
