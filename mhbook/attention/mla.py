"""Multi-head latent attention (DeepSeek-V2, 2024): keys and values from one small latent.

Multi-head attention caches ``2 * num_heads * d_head`` numbers per token and layer.
Latent attention caches one vector ``c = W_dkv x`` of ``d_latent`` numbers per token
(plus a small shared key part ``k_rope`` of ``d_rope`` numbers, see below) and rebuilds
every head's key and value from it with the up-projections ``W_uk`` and ``W_uv``::

    c_j      = RMSNorm(W_dkv x_j)                 (batch, S, d_latent), cached
    k_rope_j = RoPE(W_kr x_j, j)                  (batch, S, d_rope), cached, one for all heads
    k_ij     = [W_uk_i c_j ; k_rope_j]            head i's key, d_head + d_rope
    v_ij     = W_uv_i c_j                         head i's value, d_v
    q_it     = [W_q_i x_t ; RoPE(W_qr_i x_t, t)]  head i's query, d_head + d_rope
    out_t    = W_o [softmax_j(q_it . k_ij / sqrt(d_head + d_rope)) v_ij]_i

With ``d_q_latent`` the queries also go through a low-rank latent:
``c_q = RMSNorm(W_dq x)``, and ``W_q``, ``W_qr`` act on ``c_q`` instead of ``x``.

Two forms compute the same thing (``absorb=False`` / ``True``):

* the naive form expands every cached latent into ``num_heads`` keys and values, then
  runs ordinary multi-head attention;
* the absorbed form never builds keys or values: since ``q_i . W_uk_i c = (W_uk_i^T q_i) .
  c``, ``W_uk`` moves to the query side, and since ``sum_j a_j W_uv_i c_j = W_uv_i sum_j
  a_j c_j``, ``W_uv`` moves to the output side (next to ``W_o``). Every head then attends
  directly over the cached ``[c ; k_rope]``, like multi-query attention with one key/value
  head of size ``d_latent + d_rope``. This is how DeepSeek decodes.

RoPE cannot be absorbed (the rotation depends on the key's position, so it would sit
between ``W_uk`` and ``c``); that is why its part is decoupled: a few extra dimensions
``d_rope`` per head whose key is computed from ``x`` directly and cached as it is.
``d_rope=0`` leaves it out (positions then have to come from elsewhere, e.g. added
sinusoids).

The layout follows Hugging Face's ``DeepseekV3Attention`` (``transformers`` 5.23) so that
its weights copy over (:func:`mhbook.models.hf.mla_from_hf`): its ``q_proj`` /
``q_b_proj`` are our ``W_q`` and ``W_qr`` side by side per head, ``kv_a_proj_with_mqa`` is
``W_dkv`` and ``W_kr`` stacked, ``kv_b_proj`` is ``W_uk`` and ``W_uv`` side by side per
head. As there, the up-projections have no bias (a bias would not absorb).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..core.masks import causal_mask, check_mask
from ..core.validate import check_features, check_heads, check_int, check_number, check_window
from .base import AttentionLayer, check_cache, check_rope
from .cache import LayerCache
from .rope import apply_rope
from .sdpa import attend

__all__ = ["MultiHeadLatentAttention"]


class MultiHeadLatentAttention(AttentionLayer):
    """Multi-head latent attention with ``num_heads`` heads over a cached latent.

    Args:
        d_model: feature size of the input and of the output.
        num_heads: ``h``.
        d_latent: size of the key/value latent ``c`` (DeepSeek's ``kv_lora_rank``),
            at most ``d_model``.
        dropout: dropout on the attention weights (training only).
        bias: whether the down-projections (``W_dq``, ``W_dkv``, ``W_kr``) and ``W_o``
            have a bias (Hugging Face's ``attention_bias``); the up-projections never do.
        d_head: size of a head's content query/key part (``qk_nope_head_dim``);
            ``None`` means ``d_model // num_heads``.
        d_rope: size of the decoupled RoPE query/key part (``qk_rope_head_dim``), even;
            0 (the default) leaves it out.
        d_v: size of a head's value (``v_head_dim``); ``None`` means ``d_head``.
        d_q_latent: size of the query latent (``q_lora_rank``); ``None``: the queries
            are projected from ``x`` directly.
        rope: with ``d_rope``, ``None`` (inside a model, which hands :meth:`forward` its
            tables) or the layer's own :class:`mhbook.RotaryEmbedding` of ``d_rope``
            features (a layer that stands alone), e.g. ``RotaryEmbedding(d_rope,
            interleaved=True)``: adjacent pairs ``(x0, x1), (x2, x3), ...`` as the RoFormer
            paper and DeepSeek rotate them.
        window, sinks: a local layer's sliding window and attention sinks, as in
            :class:`mhbook.MultiHeadAttention` (the layer masks and keeps its latents so).
        absorb: compute attention in the absorbed form (see the module's docstring).
        norm_eps: epsilon of the latents' RMS norms.

    Attributes:
        W_dq: ``nn.Linear(d_model, d_q_latent)`` and ``q_norm`` (only with ``d_q_latent``).
        W_q: ``nn.Linear(d_q, num_heads * d_head)`` (``d_q`` = ``d_q_latent`` or ``d_model``).
        W_qr: ``nn.Linear(d_q, num_heads * d_rope)`` (only with ``d_rope > 0``).
        W_dkv: ``nn.Linear(d_model, d_latent)`` and ``kv_norm`` ``nn.RMSNorm(d_latent)``.
        W_kr: ``nn.Linear(d_model, d_rope)`` (only with ``d_rope > 0``).
        rotary: ``d_rope > 0``: the decoupled part is rotated, by ``rope``'s tables or by
            those the model hands to :meth:`forward`.
        W_uk: ``nn.Linear(d_latent, num_heads * d_head)``.
        W_uv: ``nn.Linear(d_latent, num_heads * d_v)``.
        W_o: ``nn.Linear(num_heads * d_v, d_model)``.
        keep_weights: when ``True``, every forward pass stores its weights
            ``(batch, num_heads, T, S)`` in ``weights`` (see :func:`mhbook.record_attention`).
        head_mask: ``None`` or ``(num_heads,)``, as in :class:`mhbook.MultiHeadAttention`.

    It is called as :class:`mhbook.MultiHeadAttention` is for self-attention, and returns
    ``(output, weights or None)``; it has no cross-attention (``key`` must be ``None``).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_latent: int,
        dropout: float = 0.0,
        bias: bool = False,
        *,
        d_head: int | None = None,
        d_rope: int = 0,
        d_v: int | None = None,
        d_q_latent: int | None = None,
        rope: nn.Module | None = None,
        absorb: bool = False,
        norm_eps: float = 1e-6,
        window: int | None = None,
        sinks: int = 0,
    ):
        super().__init__()
        for name, value in (("d_model", d_model), ("num_heads", num_heads), ("d_latent", d_latent)):
            check_int(name, value)
        for name, value in (("d_head", d_head), ("d_v", d_v), ("d_q_latent", d_q_latent)):
            check_int(name, value, optional=True)
        check_int("d_rope", d_rope, 0)
        if d_latent > d_model:
            raise ValueError(
                f"d_latent must be at most d_model={d_model} (a latent larger than the "
                f"input compresses nothing), got d_latent={d_latent}"
            )
        if d_q_latent is not None and d_q_latent > d_model:
            raise ValueError(f"d_q_latent must be at most d_model={d_model}, got {d_q_latent}")
        check_heads(num_heads, d_model=d_model, d_head=d_head)
        check_window(window, sinks)
        if d_rope % 2 != 0:
            raise ValueError(f"d_rope must be even (RoPE rotates pairs), got {d_rope}")
        check_rope(rope, d_rope, size_name="d_rope")
        check_number("dropout", dropout, 0.0, 1.0)
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_latent = d_latent
        self.d_head = d_model // num_heads if d_head is None else d_head
        self.d_rope = d_rope
        self.d_v = self.d_head if d_v is None else d_v
        self.d_q_latent = d_q_latent
        self.dropout = dropout
        self.absorb = bool(absorb)
        self.window = window
        self.sinks = sinks
        h = num_heads
        d_q = d_model
        if d_q_latent is not None:
            self.W_dq = nn.Linear(d_model, d_q_latent, bias=bias)
            self.q_norm = nn.RMSNorm(d_q_latent, eps=norm_eps)
            d_q = d_q_latent
        self.W_q = nn.Linear(d_q, h * self.d_head, bias=False)
        if d_rope:
            self.W_qr = nn.Linear(d_q, h * d_rope, bias=False)
        self.rope, self.rotary = rope, d_rope > 0
        self.W_dkv = nn.Linear(d_model, d_latent, bias=bias)
        self.kv_norm = nn.RMSNorm(d_latent, eps=norm_eps)
        if d_rope:
            self.W_kr = nn.Linear(d_model, d_rope, bias=bias)
        self.W_uk = nn.Linear(d_latent, h * self.d_head, bias=False)
        self.W_uv = nn.Linear(d_latent, h * self.d_v, bias=False)
        self.W_o = nn.Linear(h * self.d_v, d_model, bias=bias)
        self._init_outputs()

    @property
    def d_cache(self) -> int:
        """Numbers cached per token: ``d_latent + d_rope``."""
        return self.d_latent + self.d_rope

    def extra_repr(self) -> str:
        q = "" if self.d_q_latent is None else f", d_q_latent={self.d_q_latent}"
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, d_latent={self.d_latent}, "
            f"d_head={self.d_head}, d_rope={self.d_rope}, d_v={self.d_v}{q}, "
            f"absorb={self.absorb}"
        )

    # -- the pieces ------------------------------------------------------------------
    def latent(self, x: torch.Tensor, rope_tables=None) -> torch.Tensor:
        """What the cache stores: ``[c ; k_rope]`` ``(batch, T, d_latent + d_rope)``.

        Args:
            x: ``(batch, T, d_model)``.
            rope_tables: with ``d_rope``, RoPE's ``(cos, sin)`` of the tokens' positions
                (``(T, d_rope / 2)`` interleaved), for ``k_rope``.
        """
        c = self.kv_norm(self.W_dkv(x))
        if not self.d_rope:
            return c
        k_rope = apply_rope(self.W_kr(x).unsqueeze(1), *rope_tables).squeeze(1)
        return torch.cat([c, k_rope], dim=-1)

    def queries(self, x: torch.Tensor, rope_tables=None):
        """``(q, q_rope)``: ``(batch, h, T, d_head)`` and ``(batch, h, T, d_rope)``
        (``None`` when ``d_rope == 0``), rotated by ``rope_tables`` as in :meth:`latent`."""
        c_q = self.q_norm(self.W_dq(x)) if self.d_q_latent is not None else x
        q = self._split(self.W_q(c_q), self.d_head)
        if not self.d_rope:
            return q, None
        return q, apply_rope(self._split(self.W_qr(c_q), self.d_rope), *rope_tables)

    def expand(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The naive form's keys and values from cached latents.

        Args:
            latent: ``(batch, S, d_latent + d_rope)`` from :meth:`latent`.

        Returns:
            ``(k, v)``: ``(batch, h, S, d_head + d_rope)`` and ``(batch, h, S, d_v)``.
        """
        c, k_rope = latent.split([self.d_latent, self.d_rope], dim=-1)
        k = self._split(self.W_uk(c), self.d_head)
        v = self._split(self.W_uv(c), self.d_v)
        if self.d_rope:
            k_rope = k_rope.unsqueeze(1).expand(-1, self.num_heads, -1, -1)
            k = torch.cat([k, k_rope], dim=-1)
        return k, v

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
        """Self-attention of ``query`` over itself and, with a cache, the cached tokens.

        Args:
            query: ``(batch, T, d_model)``, the ``T`` new tokens.
            key, value: must be ``None``: latent attention is self-attention.
            mask: bool, broadcastable to ``(batch, num_heads, T, S)``; ``True`` = may
                attend. ``S`` = cached tokens + ``T``. ``None``: attend to all.
            is_causal: also apply :func:`~mhbook.causal_mask` ``(T, S)`` (bottom-right).
            positions: integer positions of the new tokens (used by RoPE), ``(T,)`` or
                ``(batch, T)``; default ``cache.length + arange(T)`` (``arange(T)``
                without a cache).
            cache: a :class:`mhbook.LayerCache`; the new latents are added to it
                (``cache.update_latent``), and the queries attend to all it holds.
            need_weights: also return the weights ``(batch, num_heads, T, S)``.
            rope_tables: RoPE's ``(cos, sin)`` of ``positions`` for the decoupled part,
                from the model's rotary embedding of ``d_rope`` (a layer without its own
                ``rope``).

        Returns:
            ``(output, weights)``: ``(batch, T, d_model)`` and the weights when
            ``need_weights``, else ``None``.
        """
        if key is not None or value is not None:
            raise ValueError(
                "MultiHeadLatentAttention is self-attention: call it with key=None and "
                "value=None (keys and values come from the cached latent of query)"
            )
        check_cache(cache)
        check_features("query", query, self.d_model, self.W_dkv.weight)
        x = query
        positions = self._positions(x, positions, cache)
        rope = self._rope_tables(rope_tables, positions, x.dtype)  # None without d_rope
        latent = self.latent(x, rope)  # (B, T, d_latent + d_rope)
        if cache is not None:  # (B, S, d_latent + d_rope)
            latent = cache.update_latent(latent, window=self.window, sinks=self.sinks)
        if self.window is not None:  # a local layer: its own causal mask, bottom-right
            local = causal_mask(
                x.size(1), latent.size(1), x.device, window=self.window, sinks=self.sinks
            )
            mask, is_causal = (local if mask is None else mask & local), False
        q, q_rope = self.queries(x, rope)
        dropout_p = self.dropout if self.training else 0.0
        keep = need_weights or self.keep_weights
        if self.absorb:
            if is_causal:  # the absorbed rows (h * T queries) need the mask written out
                causal = causal_mask(x.size(1), latent.size(1), device=x.device)
                mask = causal if mask is None else mask & causal
            heads, weights = self._absorbed(q, q_rope, latent, mask, keep, dropout_p)
        else:
            heads, weights = self._naive(q, q_rope, latent, mask, keep, dropout_p, is_causal)
        return self._heads_out(heads, weights, need_weights)

    def _naive(self, q, q_rope, latent, mask, need_weights, dropout_p, is_causal=False):
        """Expand keys and values for every head, then multi-head attention."""
        k, v = self.expand(latent)
        if q_rope is not None:
            q = torch.cat([q, q_rope], dim=-1)
        return attend(
            q, k, v, mask, need_weights=need_weights, dropout_p=dropout_p, is_causal=is_causal
        )

    def _absorbed(self, q, q_rope, latent, mask, need_weights, dropout_p):
        """Attend over the latents themselves: ``W_uk`` on the query side, ``W_uv`` after.

        Written with einsums over the factors, as DeepSeek-V3's inference code does
        (``attn_impl="absorb"``); multiplying ``W_uk_i^T W_q_i`` out first gives the same.
        """
        h = self.num_heads
        batch, _, length, _ = q.shape
        num_keys = latent.size(1)
        W_uk = self.W_uk.weight.view(h, self.d_head, self.d_latent)
        W_uv = self.W_uv.weight.view(h, self.d_v, self.d_latent)
        q_latent = torch.einsum("bhtd,hdc->bhtc", q, W_uk)  # (B, h, T, d_latent)
        if q_rope is not None:
            q_latent = torch.cat([q_latent, q_rope], dim=-1)  # (B, h, T, d_latent + d_rope)
        # `attend` scales by 1/sqrt(its query size, d_latent + d_rope); the scores must be
        # scaled by 1/sqrt(d_head + d_rope) as in the naive form: rescale the queries.
        q_latent = q_latent * math.sqrt(self.d_cache / (self.d_head + self.d_rope))
        # Every head attends to the same keys [c ; k_rope] and values c: one key/value
        # head. So the h heads are just h * T query rows over it (as FlashMLA does): no
        # copy of the keys per head. The values are the keys too, whose first d_latent
        # features are c: equal sizes let PyTorch use its fused kernel.
        check_mask(mask, (batch, h, length, num_keys), q.device)
        rows_mask = None
        if mask is not None:
            rows_mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
            rows_mask = rows_mask.expand(rows_mask.size(0), h, length, num_keys)
            rows_mask = rows_mask.reshape(-1, 1, h * length, num_keys)
        keys = latent.unsqueeze(1)  # (B, 1, S, d_latent + d_rope)
        rows = q_latent.reshape(batch, 1, h * length, self.d_cache)
        out, weights = attend(
            rows, keys, keys, rows_mask, need_weights=need_weights, dropout_p=dropout_p
        )
        out = out[..., : self.d_latent].reshape(batch, h, length, self.d_latent)
        if weights is not None:
            weights = weights.reshape(batch, h, length, num_keys)
        return torch.einsum("bhtc,hvc->bhtv", out, W_uv), weights

    # -- helpers ---------------------------------------------------------------------
    def _split(self, x: torch.Tensor, size: int) -> torch.Tensor:
        """``(batch, T, h * size)`` -> ``(batch, h, T, size)``."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, size).transpose(1, 2)
