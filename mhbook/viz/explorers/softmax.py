"""The softmax explorer of chapter 2: widen ``d_k`` or cool the temperature, and watch the
softmax saturate and its gradient vanish.

The chapter draws one query and ``n`` keys with standard normal entries for each ``d_k``
and keeps the raw dot products ``q . k_j`` (variance ``d_k``) and an upstream gradient
``g``; the explorer takes a few such queries. For the chosen query, ``d_k``, temperature
``T`` and scaling, it shows

.. math:: a = \\mathrm{softmax}(s), \\qquad s = \\frac{q \\cdot k}{c\\,T}, \\quad
   c = \\sqrt{d_k} \\text{ (scaled) or } 1 \\text{ (raw)},

as bars, the softmax's Jacobian ``J = diag(a) - a a^T`` (its Frobenius norm and largest
entry), and the gradient reaching the scores, ``dL/ds = J g`` for ``L = a . g``; a line
chart shows the median of ``||J||_F`` over the queries against ``d_k``, raw and scaled,
with a dot for the chosen query. :func:`softmax_stats` is the
reference: it lets autograd compute the Jacobian, which the JavaScript
(``static/softmax.js``) writes in closed form.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch

from ...core.utils import to_numpy
from .svg import bars_svg, colour_scale, embed, line_chart_svg
from .twin import redraw_on, widget_modules

__all__ = ["softmax_stats", "median_norms", "softmax_explorer", "softmax_explorer_html"]

#: Range and step of the temperature slider.
T_MIN, T_MAX, T_STEP = 0.1, 4.0, 0.1
#: The y range of the chart of ||J||_F (log scale).
NORM_RANGE = (1e-6, 1.0)

_ids = itertools.count(1)  # deterministic ids: a fresh kernel prints the same HTML


def softmax_stats(raw_scores, upstream, d_k: int, scaled: bool = True, temperature: float = 1.0):
    """What the explorer shows for one query: weights, Jacobian and gradient.

    Args:
        raw_scores: ``(n,)`` dot products ``q . k_j``.
        upstream: ``(n,)`` the gradient ``g = dL/da`` a loss sends back.
        d_k: the width of ``q`` and ``k``.
        scaled: divide the scores by ``sqrt(d_k)``.
        temperature: divide them by ``T`` too.

    Returns:
        A dict of floats and lists: ``weights`` ``(n,)``, ``max_weight``, ``entropy``
        (``-sum a log a``), ``jacobian_norm`` (Frobenius), ``jacobian_max`` (largest
        ``|J_jl|``), ``grad_norm`` (``||dL/ds||``), computed in float64 with autograd.
    """
    raw = torch.as_tensor(to_numpy(raw_scores, "raw_scores"), dtype=torch.float64)
    g = torch.as_tensor(to_numpy(upstream, "upstream"), dtype=torch.float64)
    if raw.ndim != 1 or g.shape != raw.shape:
        raise ValueError(f"raw_scores and upstream must be (n,), got {raw.shape} and {g.shape}")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    s = raw / (math.sqrt(d_k) if scaled else 1.0) / temperature
    a = torch.softmax(s, dim=-1)
    J = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, dim=-1), s)  # (n, n)
    return {
        "weights": a.tolist(),
        "max_weight": a.max().item(),
        "entropy": torch.special.entr(a).sum().item(),
        "jacobian_norm": J.norm().item(),
        "jacobian_max": J.abs().max().item(),
        "grad_norm": (J.T @ g).norm().item(),
    }


def _check(dims, raw_scores, upstream):
    dims = [int(d) for d in dims]
    raw = to_numpy(raw_scores, "raw_scores").astype(np.float64)
    g = to_numpy(upstream, "upstream").astype(np.float64)
    if raw.ndim != 3 or raw.shape[0] != len(dims):
        raise ValueError(
            f"raw_scores must be (len(dims), num_queries, n) = ({len(dims)}, ., .), got {raw.shape}"
        )
    if g.shape != raw.shape:
        raise ValueError(f"upstream must have the shape of raw_scores {raw.shape}, got {g.shape}")
    return dims, raw, g


def median_norms(dims, raw_scores, upstream, scaled: bool, temperature: float = 1.0) -> list:
    """For each ``d_k``, the median over the queries of ``||J||_F`` (:func:`softmax_stats`);
    ``raw_scores`` and ``upstream`` are ``(len(dims), num_queries, n)``. (An even number of
    queries takes the mean of the middle two.)"""
    dims, raw, g = _check(dims, raw_scores, upstream)
    return [
        float(np.median([softmax_stats(r, u, d, scaled, temperature)["jacobian_norm"]
                         for r, u in zip(raw[n], g[n])]))
        for n, d in enumerate(dims)
    ]  # fmt: skip


def _norm_series(dims, raw, g, temperature):
    x = [math.log2(d) for d in dims]
    return [median_norms(dims, raw, g, way, temperature) for way in (False, True)], x


def softmax_explorer(dims: Sequence[int], raw_scores, upstream, start: int | None = None):
    """An ipywidgets explorer (needs a running kernel, e.g. Jupyter or Colab): the same
    controls as :func:`softmax_explorer_html`, drawn with matplotlib.

    Returns:
        An ``ipywidgets.VBox`` with attributes ``d_k``, ``scaled``, ``temperature``,
        ``query`` (the controls) and ``stats`` (:func:`softmax_stats` of what was drawn last).
    """
    widgets = widget_modules("softmax_explorer")
    import matplotlib.pyplot as plt

    dims, raw, g = _check(dims, raw_scores, upstream)
    start = len(dims) // 2 if start is None else start
    d_k = widgets.SelectionSlider(options=dims, value=dims[start], description="d_k")
    scaled = widgets.Checkbox(value=True, description="divide the scores by √d_k")
    temperature = widgets.FloatSlider(
        value=1.0, min=T_MIN, max=T_MAX, step=T_STEP, description="temperature T"
    )
    query = widgets.IntSlider(value=0, min=0, max=raw.shape[1] - 1, description="query")
    out = widgets.Output()
    ui = widgets.VBox([widgets.HBox([d_k, temperature]), widgets.HBox([query, scaled]), out])
    ui.d_k, ui.scaled, ui.temperature, ui.query = d_k, scaled, temperature, query

    def draw():
        n, i = dims.index(d_k.value), query.value
        ui.stats = stats = softmax_stats(
            raw[n, i], g[n, i], d_k.value, scaled.value, temperature.value
        )
        series, x = _norm_series(dims, raw, g, temperature.value)
        fig, (ax_a, ax_j) = plt.subplots(1, 2, figsize=(11, 3.6), layout="constrained")
        ax_a.bar(range(len(stats["weights"])), stats["weights"], color="tab:red")
        ax_a.set_ylim(0, 1)
        ax_a.set_xlabel("key")
        ax_a.set_ylabel("weight")
        ax_a.set_title(f"softmax weights, d_k = {d_k.value}, T = {temperature.value:g}")
        ax_j.semilogy(x, series[0], "o-", color="tab:red", label="raw q·k")
        ax_j.semilogy(x, series[1], "s-", color="tab:blue", label="scaled q·k / √d_k")
        ax_j.plot([math.log2(d_k.value)], [stats["jacobian_norm"]], "ko")
        ax_j.set_ylim(*NORM_RANGE)
        ax_j.set_xlabel("log2 d_k")
        ax_j.set_ylabel("median ||J||_F over the queries")
        ax_j.set_title("Norm of the softmax Jacobian")
        ax_j.legend()
        return fig

    redraw_on((d_k, scaled, temperature, query), out, draw)
    return ui


def softmax_explorer_html(
    dims: Sequence[int],
    raw_scores,
    upstream,
    start: int | None = None,
    scaled: bool = True,
):
    """The explorer as self-contained HTML and JavaScript: no kernel, no download.

    Args:
        dims: the widths ``d_k`` the slider offers, e.g. ``[4, 8, ..., 1024]``.
        raw_scores: ``(len(dims), num_queries, n)``: for each ``d_k`` and query, the ``n``
            dot products of the query with its keys.
        upstream: the same shape: for each ``d_k`` and query, an upstream gradient ``g``.
        start: the index in ``dims`` shown first (default: the middle one).
        scaled: whether the scaling box starts ticked.

    Elements: the root ``div.mhbook-explorer`` (id ``mhbook-softmax-1``, ... in a fresh
    kernel), the slider ``input#{id}-dk`` (an index into ``dims``), the slider
    ``input#{id}-query``, the checkbox
    ``input#{id}-scaled``, the slider ``input#{id}-temperature``, the bars
    ``svg#{id}-weights`` (``data-values``: the weights drawn), the chart ``svg#{id}-norms``,
    and ``p#{id}-readouts`` whose ``data-stats`` holds :func:`softmax_stats`'s numbers
    (rounded to 6 significant digits) as the page computed them.

    Returns:
        An ``IPython.display.HTML`` object.
    """
    from IPython.display import HTML

    dims, raw, g = _check(dims, raw_scores, upstream)
    start = len(dims) // 2 if start is None else int(start)
    uid = f"mhbook-softmax-{next(_ids)}"
    n_keys = raw.shape[2]
    stats = softmax_stats(raw[start, 0], g[start, 0], dims[start], scaled, 1.0)
    series, x = _norm_series(dims, raw, g, 1.0)
    marker = [x[start], stats["jacobian_norm"]]
    lines = [
        {"x": x, "y": series[0], "label": "raw q·k (median)", "marker": None if scaled else marker},
        {
            "x": x,
            "y": series[1],
            "label": "q·k / √d_k (median)",
            "marker": marker if scaled else None,
        },
    ]
    checked = " checked" if scaled else ""
    controls = (
        '<div class="mhbook-explorer-controls">'
        f'<label class="mhbook-explorer-row" for="{uid}-dk">'
        '<span class="mhbook-explorer-axis">width d_k</span>'
        f'<input type="range" class="mhbook-explorer-slider" id="{uid}-dk" min="0" '
        f'max="{len(dims) - 1}" step="1" value="{start}" aria-valuetext="d_k = {dims[start]}"> '
        f'<output class="mhbook-explorer-readout" for="{uid}-dk">{dims[start]}</output></label>'
        f'<label class="mhbook-explorer-row" for="{uid}-temperature">'
        '<span class="mhbook-explorer-axis">temperature T</span>'
        f'<input type="range" class="mhbook-explorer-slider" id="{uid}-temperature" '
        f'min="{T_MIN:g}" max="{T_MAX:g}" step="{T_STEP:g}" value="1"> '
        f'<output class="mhbook-explorer-readout" for="{uid}-temperature">1.0</output></label>'
        f'<label class="mhbook-explorer-row" for="{uid}-query">'
        '<span class="mhbook-explorer-axis">query</span>'
        f'<input type="range" class="mhbook-explorer-slider" id="{uid}-query" min="0" '
        f'max="{raw.shape[1] - 1}" step="1" value="0"> '
        f'<output class="mhbook-explorer-readout" for="{uid}-query">0</output></label>'
        f'<label class="mhbook-explorer-row" for="{uid}-scaled">'
        f'<input type="checkbox" id="{uid}-scaled"{checked}> divide the scores by √d_k</label>'
        f'<p class="mhbook-explorer-readouts" id="{uid}-readouts" aria-live="polite"></p>'
        "</div>"
    )
    body = (
        '<div class="mhbook-explorer-layout">'
        + controls
        + '<div class="mhbook-explorer-charts">'
        + bars_svg(
            uid,
            "weights",
            stats["weights"],
            [f"k{j}" for j in range(n_keys)],
            "softmax weights of query 0",
            "key",
            "weight",
            bar_width=26,
            height=180,
        )
        + line_chart_svg(
            uid,
            "norms",
            lines,
            (x[0], x[-1]),
            NORM_RANGE,
            "Norm of the softmax Jacobian",
            "width d_k",
            "‖J‖_F (dot: this query)",
            ylog=True,
            xticks=[(v, f"{d}") for v, d in zip(x, dims)],
            yticks=[(10.0**p, f"1e{p}") for p in range(-6, 1, 2)],
            width=360,
            height=180,
        )
        + "</div></div>"
    )
    data = {
        "dims": dims,
        "raw": np.round(raw, 10).tolist(),
        "upstream": np.round(g, 10).tolist(),
        "scale": colour_scale(),
    }
    return HTML(embed(uid, body, ["charts.js", "softmax.js"], data))
