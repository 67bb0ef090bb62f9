"""The mask builder of chapter 3: choose the shape, the keys' valid length (padding) and the
causal alignment, and see the bool mask and the attention weights it leaves.

For ``Lq`` queries and ``Lk`` keys the mask is ``padding & causal`` (True = may attend):

* padding: key ``j`` is real when ``j < valid_len`` (:func:`mhbook.padding_mask`);
* causal, *top-left* (PyTorch's ``is_causal=True``): query ``i`` sees keys ``j <= i``;
* causal, *bottom-right* (:func:`mhbook.causal_mask`): ``j <= i + (Lk - Lq)``. With
  ``Lq > Lk`` the first queries see no key at all (``mhbook.causal_mask`` refuses that
  shape; the explorer builds the same triangle, ``tril(diagonal=Lk - Lq)``, to show why).

The weights are those of :func:`mhbook.scaled_dot_product_attention` for a fixed matrix of
scores: a row with no key gets weights that are all zero, never NaN. :func:`explorer_mask`
and :func:`masked_weights` are the reference of the JavaScript (``static/masks.js``).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from ...core.utils import to_numpy
from ..colours import MASK_COLORS
from .svg import colour_scale, embed, heatmap_svg
from .twin import redraw_on, widget_modules

__all__ = ["ALIGNMENTS", "explorer_mask", "masked_weights", "mask_explorer", "mask_explorer_html"]

#: The choices of the causal menu.
ALIGNMENTS = ("none", "top-left", "bottom-right")

_ids = itertools.count(1)  # deterministic ids: a fresh kernel prints the same HTML


def explorer_mask(num_queries: int, num_keys: int, valid_len: int, causal: str) -> torch.Tensor:
    """The bool mask ``(Lq, Lk)``: padding (``j < valid_len``) and the causal triangle.

    Args:
        num_queries, num_keys: ``Lq`` and ``Lk``.
        valid_len: the number of real keys, from 0 to ``Lk``.
        causal: one of :data:`~mhbook.viz.explorers.masks.ALIGNMENTS`.
    """
    from ...core.masks import causal_mask, padding_mask

    if causal not in ALIGNMENTS:
        raise ValueError(f"causal must be one of {ALIGNMENTS}, got {causal!r}")
    mask = padding_mask(torch.tensor([valid_len]), num_keys)[0, 0].expand(num_queries, -1)
    ones = torch.ones(num_queries, num_keys, dtype=torch.bool)
    if causal == "top-left":
        mask = mask & ones.tril()
    elif causal == "bottom-right":
        if num_keys >= num_queries:
            mask = mask & causal_mask(num_queries, num_keys)
        else:  # the same triangle; causal_mask refuses it because rows end up empty
            mask = mask & ones.tril(diagonal=num_keys - num_queries)
    return mask


def masked_weights(scores, mask) -> np.ndarray:
    """The weights of :func:`mhbook.scaled_dot_product_attention` for these ``scores``
    ``(Lq, Lk)`` and bool ``mask``: masked keys get 0, a row with no key gets all zeros."""
    from ...attention.sdpa import scaled_dot_product_attention

    s = torch.as_tensor(to_numpy(scores, "scores"), dtype=torch.float64)
    num_keys = s.shape[-1]
    q = s * math.sqrt(num_keys)  # q @ k.T / sqrt(Lk) == scores, exactly up to rounding
    k = v = torch.eye(num_keys, dtype=torch.float64)
    _, weights = scaled_dot_product_attention(q, k, v, torch.as_tensor(mask))
    return weights.numpy()


def _labels(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def _check_scores(scores) -> np.ndarray:
    s = to_numpy(scores, "scores").astype(np.float64)
    if s.ndim != 2:
        raise ValueError(f"scores must be (max_queries, max_keys), got shape {s.shape}")
    return s


def mask_explorer(scores, num_queries: int = 4, num_keys: int = 6):
    """An ipywidgets explorer (needs a running kernel): the same controls as
    :func:`mask_explorer_html`, drawn with :func:`mhbook.plot_mask` and
    :func:`mhbook.plot_heatmap`.

    Returns:
        An ``ipywidgets.VBox`` with attributes ``lq``, ``lk``, ``valid``, ``causal`` (the
        controls), ``mask`` and ``weights`` (what was drawn last).
    """
    widgets = widget_modules("mask_explorer")
    import matplotlib.pyplot as plt

    from ..plot import plot_heatmap, plot_mask

    s = _check_scores(scores)
    lq = widgets.IntSlider(value=num_queries, min=1, max=s.shape[0], description="Lq")
    lk = widgets.IntSlider(value=num_keys, min=1, max=s.shape[1], description="Lk")
    valid = widgets.IntSlider(value=num_keys, min=0, max=num_keys, description="valid keys")
    causal = widgets.Dropdown(options=ALIGNMENTS, value="bottom-right", description="causal")
    out = widgets.Output()
    ui = widgets.VBox([widgets.HBox([lq, lk]), widgets.HBox([valid, causal]), out])
    ui.lq, ui.lk, ui.valid, ui.causal = lq, lk, valid, causal

    def draw():
        valid.max = lk.value
        ui.mask = explorer_mask(lq.value, lk.value, valid.value, causal.value)
        ui.weights = masked_weights(s[: lq.value, : lk.value], ui.mask)
        rows, cols = _labels("q", lq.value), _labels("k", lk.value)
        fig, (ax_m, ax_w) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
        plot_mask(ui.mask, rows, cols, title=f"mask ({causal.value})", ax=ax_m)
        plot_heatmap(ui.weights, rows, cols, "weights", ax_w, annotate=True, vmin=0, vmax=1)
        return fig

    redraw_on((lq, lk, valid, causal), out, draw)
    return ui


def mask_explorer_html(
    scores,
    num_queries: int = 4,
    num_keys: int = 6,
    valid_len: int | None = None,
    causal: str = "bottom-right",
):
    """The mask builder as self-contained HTML and JavaScript: no kernel, no download.

    Args:
        scores: ``(max_queries, max_keys)`` fixed attention scores; an explorer with
            ``Lq`` queries and ``Lk`` keys uses the top-left ``(Lq, Lk)`` block.
        num_queries, num_keys, valid_len, causal: the first settings (``valid_len``
            defaults to ``num_keys``: no padding).

    Elements: the root ``div.mhbook-explorer`` (id ``mhbook-masks-1``, ... in a fresh
    kernel), the sliders ``input#{id}-lq``, ``input#{id}-lk``, ``input#{id}-valid``, the
    menu ``select#{id}-causal``, the heatmaps ``svg#{id}-mask`` and ``svg#{id}-weights``
    (their ``data-weights``: the mask as 0/1 and the weights drawn).

    Returns:
        An ``IPython.display.HTML`` object.
    """
    from IPython.display import HTML

    s = _check_scores(scores)
    max_q, max_k = s.shape
    if not (1 <= num_queries <= max_q and 1 <= num_keys <= max_k):
        raise ValueError(f"need 1 <= num_queries <= {max_q} and 1 <= num_keys <= {max_k}")
    valid_len = num_keys if valid_len is None else valid_len
    uid = f"mhbook-masks-{next(_ids)}"
    mask = explorer_mask(num_queries, num_keys, valid_len, causal)
    weights = masked_weights(s[:num_queries, :num_keys], mask)
    full_mask = np.zeros((max_q, max_k))
    full_mask[:num_queries, :num_keys] = mask.numpy()
    full_weights = np.zeros((max_q, max_k))
    full_weights[:num_queries, :num_keys] = weights
    rows, cols = _labels("q", max_q), _labels("k", max_k)
    shown = (num_queries, num_keys)

    def slider(name: str, text: str, low: int, high: int, value: int) -> str:
        return (
            f'<label class="mhbook-explorer-row" for="{uid}-{name}">'
            f'<span class="mhbook-explorer-axis">{text}</span>'
            f'<input type="range" class="mhbook-explorer-slider" id="{uid}-{name}" '
            f'min="{low}" max="{high}" step="1" value="{value}"> '
            f'<output class="mhbook-explorer-readout" for="{uid}-{name}">{value}</output></label>'
        )

    options = "".join(
        f'<option value="{a}"{" selected" if a == causal else ""}>{a}</option>' for a in ALIGNMENTS
    )
    body = (
        '<div class="mhbook-explorer-layout"><div class="mhbook-explorer-controls">'
        + slider("lq", "queries Lq", 1, max_q, num_queries)
        + slider("lk", "keys Lk", 1, max_k, num_keys)
        + slider("valid", "valid keys", 0, num_keys, valid_len)
        + f'<label class="mhbook-explorer-row" for="{uid}-causal">'
        '<span class="mhbook-explorer-axis">causal mask</span>'
        f'<select class="mhbook-explorer-causal" id="{uid}-causal">{options}</select></label>'
        f'<p class="mhbook-explorer-hint" id="{uid}-note" aria-live="polite"></p>'
        "</div>"
        + heatmap_svg(
            uid,
            full_mask,
            rows,
            cols,
            "mask: True = may attend",
            cmap=tuple(MASK_COLORS),
            name="mask",
            fmt="bool",
            shown=shown,
        )
        + heatmap_svg(
            uid, full_weights, rows, cols, "attention weights", name="weights", shown=shown
        )
        + "</div>"
    )
    data = {
        "scores": np.round(s, 10).tolist(),
        "scale": colour_scale(),
        "maskScale": colour_scale(tuple(MASK_COLORS)),
    }
    return HTML(embed(uid, body, ["heatmap.js", "charts.js", "masks.js"], data))
