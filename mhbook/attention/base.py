"""What every attention layer of mhbook shares around :func:`mhbook.attend`: the default
positions, the RoPE tables to rotate by, keeping the weights for plots, ``head_mask`` and
the merge of the heads; :func:`record_attention` reads the kept weights."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from ..core.validate import check_positions
from .cache import LayerCache

__all__ = ["AttentionLayer", "record_attention"]


class AttentionLayer(nn.Module):
    """The base of :class:`mhbook.MultiHeadAttention` and
    :class:`mhbook.MultiHeadLatentAttention`.

    Subclasses set ``num_heads``, ``W_o``, ``rope`` (their own
    :class:`mhbook.RotaryEmbedding`, or ``None``) and ``rotary`` (whether queries and keys
    are rotated), and call ``self._init_outputs()`` in ``__init__``.

    Attributes:
        keep_weights: when ``True``, every forward pass stores its per-head weights
            ``(batch, num_heads, Lq, Lk)`` in ``weights`` (:func:`record_attention`; the
            output is unchanged).
        head_mask: ``None`` or a tensor ``(num_heads,)`` that scales each head's output
            before the heads are merged: 0 switches a head off. Give it
            ``requires_grad=True`` to measure head importance (Michel et al., 2019). It is
            a buffer: ``.to()`` moves it, ``state_dict`` saves it when it is set, and
            ``load_state_dict`` restores it (or its absence).

    RoPE has one owner. A layer that stands alone owns its ``rope`` and makes its tables
    itself. Inside a model the layer holds none: the model owns one rotary embedding per
    kind of layer and hands each layer the tables of its kind, computed once per forward
    pass (``rope_tables``), as Hugging Face's models hand their layers
    ``position_embeddings``. A layer that is rotated by its model's tables refuses to run
    without them.
    """

    num_heads: int
    rope: nn.Module | None
    rotary: bool

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

    def _rope_tables(self, rope_tables, positions: torch.Tensor, dtype: torch.dtype):
        """``(cos, sin)`` to rotate by, ``(T, w)`` or ``(batch, 1, T, w)``: the model's
        ``rope_tables``, or the layer's own ``rope``'s tables of ``positions``; ``None``
        for a layer without RoPE."""
        if rope_tables is not None:
            if not self.rotary or self.rope is not None:
                owner = "owns its rope" if self.rotary else "has no RoPE"
                raise ValueError(f"rope_tables: this layer {owner}; pass none")
            return rope_tables
        if self.rope is not None:
            return self.rope.tables(positions, dtype)
        if self.rotary:
            raise ValueError(
                "rope_tables: this layer is rotated by the RoPE tables its model hands it "
                "(it has no rope of its own): call it through its model, pass rope_tables "
                "(model.rope.tables(positions, dtype)), or build it with rope= to use it alone"
            )
        return None

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


def check_rope(rope: nn.Module | None, size: int, size_name: str = "d_head") -> None:
    """A layer's own ``rope`` must rotate as many features as the layer's heads have
    (``size``, named ``size_name``)."""
    if rope is None:
        return
    if not isinstance(rope, nn.Module) or not hasattr(rope, "tables"):
        raise TypeError(f"rope must be None or a mhbook.RotaryEmbedding, got {type(rope).__name__}")
    if rope.d_head != size:
        layer = "heads have" if size_name == "d_head" else "RoPE part has"
        raise ValueError(
            f"rope rotates heads of d_head={rope.d_head}, but this layer's {layer} "
            f"{size_name}={size}: build RotaryEmbedding({size})"
        )


def check_cache(cache) -> None:
    """``cache`` must be ``None`` or a :class:`mhbook.LayerCache`."""
    if cache is not None and not isinstance(cache, LayerCache):
        raise TypeError(
            f"cache must be None or a mhbook.LayerCache (one layer of a KVCache), "
            f"got {type(cache).__name__}"
        )


@contextmanager
def record_attention(model: nn.Module):
    """Keep the per-head attention weights of every attention layer in ``model``.

    Inside the ``with`` block every attention layer (:class:`MultiHeadAttention`,
    :class:`mhbook.MultiHeadLatentAttention`) stores its weights
    ``(batch, h, Lq, Lk)`` of its latest call. The context value is a function that
    returns them as a dict of the layers that ran in this recording (weights kept from
    an earlier one are cleared when it starts), e.g. for a :class:`Transformer`::

        with record_attention(model) as weights:
            model(src, tgt_in, src_valid_lens)
        w = weights()   # {"encoder.blocks.0.self_attn": tensor, ...}

    The model's outputs are the same as without it (the explicit attention path is used).
    """
    layers = {name: m for name, m in model.named_modules() if isinstance(m, AttentionLayer)}
    previous = {name: m.keep_weights for name, m in layers.items()}
    for m in layers.values():
        m.keep_weights = True
        m.weights = None

    def weights() -> dict[str, torch.Tensor]:
        return {name: m.weights for name, m in layers.items() if m.weights is not None}

    try:
        yield weights
    finally:
        for name, m in layers.items():
            m.keep_weights = previous[name]
