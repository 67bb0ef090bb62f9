"""The positional-encoding explorer of chapter 5: choose a position and a dimension, see the
sinusoidal code, and the dot product of two codes against their offset.

``P[t, 2i] = sin(omega_i t)`` and ``P[t, 2i+1] = cos(omega_i t)`` with
``omega_i = 10000^(-2i/d)`` (:func:`mhbook.sinusoidal_encoding`). The explorer shows the
code ``P_t`` as bars, dimension ``i`` of every position as a line (a sinusoid of period
``2 pi / omega``), and ``P_t . P_{t+k}`` against the offset ``k``, which is
``sum_i cos(omega_i k)`` whatever ``t``: the dot product of two codes depends only on how
far apart they are. The JavaScript (``static/positional.js``) computes the code from the
formula; :func:`mhbook.sinusoidal_encoding` is its reference.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .svg import bars_svg, embed, line_chart_svg
from .twin import redraw_on, widget_modules

__all__ = ["encoding", "offset_dots", "positional_explorer", "positional_explorer_html"]

_ids = itertools.count(1)  # deterministic ids: a fresh kernel prints the same HTML


def encoding(num_positions: int, d_model: int) -> np.ndarray:
    """``mhbook.sinusoidal_encoding(num_positions, d_model)`` in float64, as an array."""
    import torch

    from ...models.layers import sinusoidal_encoding

    return sinusoidal_encoding(num_positions, d_model, dtype=torch.float64).numpy()


def offset_dots(t: int, num_positions: int, d_model: int) -> tuple[list[int], list[float]]:
    """The offsets ``k`` with ``0 <= t + k < num_positions`` and the dot products
    ``P_t . P_{t+k}``."""
    P = encoding(num_positions, d_model)
    offsets = list(range(-t, num_positions - t))
    return offsets, [float(P[t] @ P[t + k]) for k in offsets]


def _round_ticks(lo: int, hi: int) -> list[int]:
    """About five ticks from ``lo`` to ``hi`` at multiples of a round step, ends included."""
    step = max(1, 10 ** int(math.log10(max(1, (hi - lo) / 4))))
    while (hi - lo) / step > 5:
        step *= 2
    inner = [x for x in range(math.ceil(lo / step) * step, hi + 1, step) if lo < x < hi]
    return [lo, *[x for x in inner if min(x - lo, hi - x) >= step / 2], hi]


def _frequency_text(i: int, d_model: int) -> str:
    omega = 10000.0 ** (-(i - i % 2) / d_model)
    kind = "sin" if i % 2 == 0 else "cos"
    return f"P[t, {i}] = {kind}(ω t), ω = {omega:.3g}, period {2 * math.pi / omega:.3g}"


def positional_explorer(num_positions: int = 64, d_model: int = 32):
    """An ipywidgets explorer (needs a running kernel): the same sliders as
    :func:`positional_explorer_html`, drawn with matplotlib.

    Returns:
        An ``ipywidgets.VBox`` with attributes ``t``, ``s``, ``i`` (the sliders) and ``dot``
        (``P_t . P_s`` drawn last).
    """
    widgets = widget_modules("positional_explorer")
    import matplotlib.pyplot as plt

    P = encoding(num_positions, d_model)
    t = widgets.IntSlider(value=10, min=0, max=num_positions - 1, description="position t")
    s = widgets.IntSlider(value=13, min=0, max=num_positions - 1, description="position s")
    i = widgets.IntSlider(value=4, min=0, max=d_model - 1, description="dimension i")
    out = widgets.Output()
    ui = widgets.VBox([widgets.HBox([t, s, i]), out])
    ui.t, ui.s, ui.i = t, s, i

    def draw():
        ui.dot = float(P[t.value] @ P[s.value])
        offsets, dots = offset_dots(t.value, num_positions, d_model)
        fig, axs = plt.subplots(1, 3, figsize=(14, 3.4), layout="constrained")
        axs[0].bar(range(d_model), P[t.value], color="tab:blue")
        axs[0].set_ylim(-1.1, 1.1)
        axs[0].set(title=f"code P_t, t = {t.value}", xlabel="dimension", ylabel="value")
        axs[1].plot(range(num_positions), P[:, i.value])
        axs[1].plot([t.value], [P[t.value, i.value]], "ko")
        axs[1].set(title=_frequency_text(i.value, d_model), xlabel="position", ylabel="value")
        axs[2].plot(offsets, dots)
        axs[2].plot([s.value - t.value], [ui.dot], "ko")
        axs[2].set(title="P_t · P_(t+k)", xlabel="offset k", ylabel="dot product")
        return fig

    redraw_on((t, s, i), out, draw)
    return ui


def positional_explorer_html(
    num_positions: int = 64, d_model: int = 32, t: int = 10, s: int = 13, i: int = 4
):
    """The explorer as self-contained HTML and JavaScript: no kernel, no download.

    Args:
        num_positions: ``L``, the positions ``0 .. L-1`` the sliders offer.
        d_model: the width of the code (even).
        t, s, i: the first position, second position and dimension shown.

    Elements: the root ``div.mhbook-explorer`` (id ``mhbook-positional-1``, ... in a fresh
    kernel), the sliders ``input#{id}-t``, ``input#{id}-s``, ``input#{id}-i``, the bars
    ``svg#{id}-code`` (``data-values``: ``P_t`` as drawn), the charts ``svg#{id}-column``
    and ``svg#{id}-dots``, and ``p#{id}-readouts`` whose ``data-stats`` holds ``dot``
    (``P_t . P_s``), ``value`` (``P[t, i]``) and ``dots`` (``P_t . P_{t+k}`` for every
    offset ``k`` in range) as the page computed them.

    Returns:
        An ``IPython.display.HTML`` object.
    """
    from IPython.display import HTML

    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    if not (0 <= t < num_positions and 0 <= s < num_positions and 0 <= i < d_model):
        raise ValueError(f"need 0 <= t, s < {num_positions} and 0 <= i < {d_model}")
    uid = f"mhbook-positional-{next(_ids)}"
    P = encoding(num_positions, d_model)
    L = num_positions
    offsets, dots = offset_dots(t, L, d_model)
    every_k = list(range(-(L - 1), L))
    omegas = 10000.0 ** (-np.arange(0, d_model, 2) / d_model)
    formula = [float(np.cos(omegas * k).sum()) for k in every_k]
    low = math.floor(min(formula) / 4) * 4
    dot_ts = float(P[t] @ P[s])

    def slider(name: str, text: str, high: int, value: int) -> str:
        return (
            f'<label class="mhbook-explorer-row" for="{uid}-{name}">'
            f'<span class="mhbook-explorer-axis">{text}</span>'
            f'<input type="range" class="mhbook-explorer-slider" id="{uid}-{name}" '
            f'min="0" max="{high}" step="1" value="{value}"> '
            f'<output class="mhbook-explorer-readout" for="{uid}-{name}">{value}</output></label>'
        )

    column = line_chart_svg(
        uid,
        "column",
        [{"x": list(range(L)), "y": P[:, i].tolist(), "label": "P[t, i]", "marker": [t, P[t, i]]}],
        (0, L - 1),
        (-1.1, 1.1),
        f"dimension i = {i} over the positions",
        "position t",
        "P[t, i]",
        xticks=[(x, f"{x}") for x in _round_ticks(0, L - 1)],
        yticks=[(-1.0, "-1"), (-0.5, "-0.5"), (0.0, "0"), (0.5, "0.5"), (1.0, "1")],
        width=330,
        height=170,
    )
    dot_chart = line_chart_svg(
        uid,
        "dots",
        [
            {
                "x": every_k,
                "y": formula,
                "label": "Σ cos(ω_i k), for every t",
                "dashed": True,
                "colour": "#999999",
            },
            {"x": offsets, "y": dots, "label": "P_t · P_(t+k), this t", "marker": [s - t, dot_ts]},
        ],  # fmt: skip
        (-(L - 1), L - 1),
        (low, d_model / 2),
        "dot product of two codes",
        "offset k = s − t",
        "P_t · P_(t+k)",
        xticks=[(x, f"{x}") for x in _round_ticks(-(L - 1), L - 1)],
        yticks=[(y, f"{y:g}") for y in np.linspace(low, d_model / 2, 5)],
        width=330,
        height=170,
    )
    body = (
        '<div class="mhbook-explorer-layout"><div class="mhbook-explorer-controls">'
        + slider("t", "position t", L - 1, t)
        + slider("s", "position s", L - 1, s)
        + slider("i", "dimension i", d_model - 1, i)
        + f'<p class="mhbook-explorer-readouts" id="{uid}-readouts" aria-live="polite"></p>'
        "</div>"
        + '<div class="mhbook-explorer-charts">'
        + bars_svg(
            uid,
            "code",
            P[t],
            [str(j) for j in range(d_model)],
            f"the code P_t of position t = {t}",
            "dimension",
            "value",
            ylim=(-1.0, 1.0),
            cmap=None,
            value_text=False,
            bar_width=min(14, 448 // d_model),
            height=150,
        )
        + column
        + dot_chart
        + "</div></div>"
    )
    data = {"L": L, "d": d_model}
    return HTML(embed(uid, body, ["charts.js", "positional.js"], data))
