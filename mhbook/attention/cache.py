"""The KV cache: what a decoder keeps between decoding steps.

When a decoder generates one token at a time, the keys and values of the earlier
tokens do not change, so each layer keeps them instead of projecting the whole prefix
again at every step::

    cache = model.decoder.new_cache()            # or mhbook.KVCache(num_layers)
    for step in range(n):
        logits = model.decoder(new_tokens, memory, memory_mask, cache)
        ...
    cache.length                  # tokens seen so far: the position of the next one
    cache.layers[0].keys.shape    # (batch, num_heads, length, d_head)
    cache.nbytes                  # bytes held by all the cached tensors

A :class:`KVCache` is a list of :class:`LayerCache`, one per decoder layer. It holds
tensors, lengths and positions, and no attention configuration: each attention layer
knows its own window and tells its cache what to keep when it updates it, so local
layers roll and global ones keep everything (Gemma 2's and 3's interleaved layers).
A layer cache holds

* ``keys`` and ``values`` ``(batch, h_kv, S, d_head)`` of self-attention, which grow by
  the new tokens at every step (:meth:`LayerCache.update`). ``h_kv`` may be smaller than
  the number of query heads (grouped-query attention);
* or, for multi-head latent attention, one ``latent`` ``(batch, S, d_latent)`` per
  token instead of keys and values (:meth:`LayerCache.update_latent`);
* ``length``: how many tokens it has seen. An update with a ``window`` keeps only the
  keys and values of the last ``window`` tokens (a rolling cache for sliding-window
  attention), but ``length`` still counts every token, so that it stays the next token's
  position. With ``sinks`` as well it also keeps the first ``sinks`` tokens for good
  (attention sinks, Xiao et al., 2023). A cache that dropped tokens refuses an update by a
  layer that would need them (a wider window, more sinks, or full attention);
* ``memory_keys`` and ``memory_values`` ``(batch, h, S_src, d_head)``: in an
  encoder-decoder, the encoder output projected once by the cross-attention's ``W_k``
  and ``W_v``, on the first step (``None`` in a decoder-only model).

Cached tensors are never modified in place: an update concatenates and stores new
tensors. So :meth:`KVCache.copy` only copies the lists, and a step on the copy leaves
the original as it was.
"""

from __future__ import annotations

import copy

import torch

from ..core.validate import check_int, check_window

__all__ = ["LayerCache", "KVCache"]


class LayerCache:
    """The cache of one decoder layer: tensors, the length and positions. What it keeps
    of them is what its layer says at each :meth:`update` (its ``window`` and ``sinks``).

    Attributes:
        keys, values: ``(batch, h_kv, S, d_head)`` self-attention keys and values of
            the tokens kept (``S <= sinks + window``), or ``None`` before the first step.
            Keys before RoPE for a layer with sinks (it positions them within the cache).
        within_cache: ``True`` when the keys are positioned within the cache by the layer
            that reads them (cached before RoPE: StreamingLLM's sinks), ``False`` when they
            are cached at their text positions; ``None`` before the first update. A layer of
            the other kind refuses the cache: the keys would be read at the wrong positions.
        latent: ``(batch, S, d_latent)`` instead of keys and values (latent attention).
        length: tokens seen so far, kept or not.
        kept_sinks: once tokens were dropped (``num_kept < length``), how many of the first
            tokens are kept for good; the other ``num_kept - kept_sinks`` kept ones are the
            most recent.
        memory_keys, memory_values: ``(batch, h_kv, S_src, d_head)``, the projected encoder
            output for cross-attention, or ``None`` (:meth:`memory`).
        positions: ``(S,)`` or ``(batch, S)`` integer positions of the kept keys, kept only for
            attention that needs them after the keys are cached (ALiBi's distances), or
            ``None``. Not counted in :attr:`nbytes`, which counts keys and values.

    One layer cache holds keys and values, or a latent, never both: the two kinds of
    attention cannot share the tokens' history, and each refuses a cache the other filled.
    """

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.latent: torch.Tensor | None = None
        self.length = 0
        self.kept_sinks = 0
        self.memory_keys: torch.Tensor | None = None
        self.memory_values: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.within_cache: bool | None = None

    def update(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        window: int | None = None,
        sinks: int = 0,
        within_cache: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Add the keys and values of new tokens.

        Args:
            k: ``(batch, h_kv, T, d_head)``, the ``T`` new tokens' keys.
            v: ``(batch, h_kv, T, d_v)``, their values.
            positions: ``None``, or the new tokens' integer positions ``(T,)`` or
                ``(batch, T)``, kept beside the keys in ``positions`` (pass them at
                every call or at none).
            window: the updating layer's sliding window: keep only the last ``window``
                tokens for the next call; ``None``: keep every token.
            sinks: with a ``window``, also keep the first ``sinks`` tokens for good
                (StreamingLLM's attention sinks): ``S <= sinks + window``, the sinks first.
            within_cache: whether the updating layer positions the keys within the cache
                (they come before RoPE); every update of a cache must say the same.

        Returns:
            ``(keys, values, positions)``: keys and values ``(batch, h_kv, S + T, ...)``,
            the kept ones followed by the new ones, in time order: what the new queries
            attend to; and their positions ``(S + T,)`` or ``(batch, S + T)`` when
            ``positions`` are given, else ``None``. (With a ``window`` the cache then
            keeps only the first ``sinks`` and the last ``window`` of them; the new queries
            still get all, since the first of ``T`` new tokens needs older keys than the
            last one. Mask them with ``causal_mask(T, S + T, window=window, sinks=sinks)``.)

        Raises:
            ValueError: if the cache dropped tokens that a layer of this ``window`` and
                ``sinks`` needs (e.g. it rolled with a window of 4 and the update is full
                attention's), or if its keys are positioned otherwise (``within_cache``).
        """
        check_window(window, sinks)
        self._refuse_mixing("keys and values", self.latent, "a latent")
        _check_new("k", k, 4, self.keys)
        _check_new("v", v, 4, self.values)
        if k.shape[:3] != v.shape[:3]:
            raise ValueError(
                f"k and v need the same (batch, h_kv, T), got k {tuple(k.shape)}, "
                f"v {tuple(v.shape)}"
            )
        if (positions is None) != (self.positions is None) and self.keys is not None:
            raise ValueError(
                "positions must be passed at every update of a cache or at none: this cache "
                f"holds {'no ' if self.positions is None else ''}positions of its keys"
            )
        self._check_holds(window, sinks)
        self._check_positioned(bool(within_cache))
        if positions is not None:
            positions = _append_positions(self.positions, positions)
            self.positions = _trim(positions, -1, window, sinks)
        keys, values = _append(self.keys, k, dim=2), _append(self.values, v, dim=2)
        self.keys, self.values = _trim(keys, 2, window, sinks), _trim(values, 2, window, sinks)
        self._count(k.size(2), sinks)
        return keys, values, positions

    def memory(self, project) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention's keys and values of the encoder output: ``project()`` gives
        them ``(batch, h_kv, S_src, d_head)`` on the first call and they are kept in
        ``memory_keys``/``memory_values``; later calls return the kept ones."""
        if self.memory_keys is None:
            self.memory_keys, self.memory_values = project()
        return self.memory_keys, self.memory_values

    def update_latent(
        self, c: torch.Tensor, *, window: int | None = None, sinks: int = 0
    ) -> torch.Tensor:
        """Add the latents ``(batch, T, d_latent)`` of new tokens (latent attention);
        return all kept ones followed by the new ones, and keep what ``window`` and
        ``sinks`` say, as :meth:`update` does."""
        check_window(window, sinks)
        self._refuse_mixing("a latent", self.keys, "keys and values")
        _check_new("c", c, 3, self.latent)
        self._check_holds(window, sinks)
        latent = _append(self.latent, c, dim=1)
        self.latent = _trim(latent, 1, window, sinks)
        self._count(c.size(1), sinks)
        return latent

    def _count(self, new: int, sinks: int) -> None:
        """Count ``new`` tokens; once some are dropped, the first ``sinks`` stay for good."""
        self.length += new
        if self.num_kept < self.length:
            self.kept_sinks = sinks

    def _check_holds(self, window: int | None, sinks: int) -> None:
        """Refuse an update by a layer of ``window`` and ``sinks`` that needs tokens this
        cache dropped: the first ``sinks`` and the last ``window - 1`` tokens seen (all of
        them for ``window=None``), since a query sees itself and ``window - 1`` before."""
        if self.num_kept == self.length:  # nothing dropped
            return
        recent = self.num_kept - self.kept_sinks
        needs_recent = self.length if window is None else min(window - 1, self.length)
        if needs_recent <= recent and min(sinks, self.length) <= self.kept_sinks:
            return
        held = f"the last {recent}" + (
            f" and the first {self.kept_sinks}" if self.kept_sinks else ""
        )
        kept = f"window={recent}" + (f", sinks={self.kept_sinks}" if self.kept_sinks else "")
        layer = "full attention (window=None)" if window is None else f"window={window}"
        raise ValueError(
            f"this cache holds {held} of the {self.length} tokens it has seen (filled by a "
            f"layer with {kept}); a layer with {layer}{f', sinks={sinks}' if sinks else ''} "
            "needs tokens it dropped: fill a cache with the model that reads it"
        )

    def _check_positioned(self, within_cache: bool) -> None:
        """Refuse keys positioned otherwise than the ones held; remember how they are."""
        where = {True: "within the cache (before RoPE)", False: "at their text positions"}
        if self.keys is not None and self.within_cache != within_cache:
            raise ValueError(
                f"within_cache: this LayerCache holds the keys of {self.length} tokens "
                f"positioned {where[self.within_cache]}, and the update's layer positions "
                f"them {where[within_cache]}: a layer with sinks and RoPE or ALiBi "
                "(StreamingLLM) and one without cannot share a cache; fill a cache with the "
                "model that reads it"
            )
        self.within_cache = within_cache

    def _refuse_mixing(self, new: str, held: torch.Tensor | None, kind: str) -> None:
        if held is not None:
            raise ValueError(
                f"this LayerCache holds {kind} of {self.length} tokens; it cannot take {new} "
                "as well: one cache per kind of attention (keys and values for multi-head "
                "attention, a latent for latent attention)"
            )

    @property
    def num_kept(self) -> int:
        """How many tokens' keys and values (or latents) the cache holds."""
        if self.keys is not None:
            return self.keys.size(2)
        return 0 if self.latent is None else self.latent.size(1)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the cache holds."""
        held = (self.keys, self.values, self.latent, self.memory_keys, self.memory_values)
        return [t for t in held if t is not None]

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached tensors."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def copy(self) -> LayerCache:
        """A copy that shares the tensors (they are never changed in place): cheap."""
        return copy.copy(self)

    def __repr__(self) -> str:
        shapes = ", ".join(
            f"{name}={tuple(getattr(self, name).shape)}"
            for name in ("keys", "values", "latent", "memory_keys", "memory_values")
            if getattr(self, name) is not None
        )
        return f"LayerCache(length={self.length}{', ' if shapes else ''}{shapes})"


class KVCache:
    """The cache of a whole decoder: one :class:`LayerCache` per layer.

    Args:
        num_layers: the decoder's number of layers (blocks), at least 1.

    Attributes:
        layers: the list of :class:`LayerCache`, ``layers[i]`` for block ``i``.
    """

    def __init__(self, num_layers: int):
        check_int("num_layers", num_layers, 1)
        self.layers = [LayerCache() for _ in range(num_layers)]

    @property
    def length(self) -> int:
        """Tokens seen so far: the position of the next token, and the causal mask's offset."""
        return self.layers[0].length

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached tensors of every layer (memory keys and values included)."""
        return sum(layer.nbytes for layer in self.layers)

    def copy(self) -> KVCache:
        """A copy to step on while this one stays as it is; the tensors are shared, not copied."""
        new = copy.copy(self)
        new.layers = [layer.copy() for layer in self.layers]
        return new

    def __repr__(self) -> str:
        return f"KVCache(num_layers={len(self.layers)}, length={self.length}, nbytes={self.nbytes})"


def _trim(x: torch.Tensor, dim: int, window: int | None, sinks: int) -> torch.Tensor:
    """The first ``sinks`` and the last ``window`` along ``dim``. The first ``sinks`` of
    ``x`` are the sequence's first tokens: earlier trims kept them in front."""
    if window is None or x.size(dim) <= sinks + window:
        return x
    recent = x.narrow(dim, x.size(dim) - window, window)
    if not sinks:
        # clone(): a slice would keep the whole concatenated tensor alive.
        return recent.clone()
    return torch.cat([x.narrow(dim, 0, sinks), recent], dim=dim)


def _append(old: torch.Tensor | None, new: torch.Tensor, dim: int) -> torch.Tensor:
    return new if old is None else torch.cat([old, new], dim=dim)


def _append_positions(old: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """Positions ``(S,)`` while every update gave one row for the whole batch, else
    ``(batch, S)``."""
    if old is not None and old.dim() != new.dim():
        batch = old.size(0) if old.dim() == 2 else new.size(0)
        old, new = old.expand(batch, -1), new.expand(batch, -1)
    return _append(old, new, dim=-1)


def _check_new(name: str, new: torch.Tensor, dims: int, old: torch.Tensor | None) -> None:
    """``new`` must have ``dims`` dimensions and, if the cache holds ``old``, fit it:
    same sizes but along the time dimension, same dtype and device."""
    if not isinstance(new, torch.Tensor) or new.dim() != dims:
        got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
        raise ValueError(f"{name} must be a tensor with {dims} dimensions, got {got}")
    if old is None:
        return
    time = 2 if dims == 4 else 1
    same_shape = (
        new.shape[:time] + new.shape[time + 1 :] == old.shape[:time] + old.shape[time + 1 :]
    )
    if not same_shape or new.dtype != old.dtype or new.device != old.device:
        raise ValueError(
            f"new {name} {tuple(new.shape)} ({new.dtype}, {new.device}) does not fit the cached "
            f"{tuple(old.shape)} ({old.dtype}, {old.device}): only the length (dim {time}) "
            "may differ"
        )
