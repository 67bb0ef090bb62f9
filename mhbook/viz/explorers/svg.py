"""Self-contained HTML for the explorers: an SVG heatmap, its colour scale, and a helper
that inlines the explorer's JavaScript, CSS and data into one ``<div>``.

The page needs no kernel and no download: everything is in the returned string. The
JavaScript lives in ``static/*.js`` next to this file; the numbers it needs (the data, the
colour table, the text-colour threshold, titles) are computed here in Python, once, and
handed to it as JSON. The colour map and the text-colour threshold are those of
:mod:`mhbook.viz.colours`, shared with the plots (and re-exported here).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from functools import cache
from importlib import resources

import numpy as np

from ..colours import COLOURMAP, DARK_ABOVE, text_colour  # noqa: F401 (text_colour: for users)

__all__ = [
    "colour_table",
    "colour_scale",
    "heatmap_svg",
    "bars_svg",
    "line_chart_svg",
    "embed",
]

_CELL = 52  # pixels per heatmap cell
_CHAR = 7.5  # width of a label character, in pixels


@cache
def colour_table(cmap: str | tuple[str, ...] = COLOURMAP, n: int = 101) -> tuple[str, ...]:
    """``n`` hex colours evenly spaced along matplotlib's ``cmap``, from 0 to 1.

    ``cmap`` is a matplotlib colour map's name, or a tuple of colours (a listed colour map,
    e.g. the two colours of a bool mask, ``mhbook.viz.colours.MASK_COLORS``)."""
    import matplotlib  # here, not above: `import mhbook` stays free of matplotlib
    from matplotlib.colors import ListedColormap, to_hex

    colours = ListedColormap(list(cmap)) if isinstance(cmap, tuple) else matplotlib.colormaps[cmap]
    return tuple(to_hex(colours(i / (n - 1))) for i in range(n))


@cache
def _text_table(cmap: str | tuple[str, ...]) -> tuple[str, ...]:
    """Black or white, whichever reads better on each colour of ``colour_table(cmap)``:
    white where the colour's relative luminance (WCAG) is below 0.2."""
    from matplotlib.colors import to_rgb

    def luminance(hex_colour: str) -> float:
        linear = [
            c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(hex_colour)
        ]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    return tuple("white" if luminance(c) < 0.2 else "black" for c in colour_table(cmap))


def colour_scale(
    cmap: str | tuple[str, ...] = COLOURMAP, vmin: float = 0.0, vmax: float = 1.0
) -> dict:
    """What the JavaScript needs to colour a cell: ``{"colours": [...], "darkAbove": ...}``.

    The attention weights' scale (the default: :data:`mhbook.viz.colours.COLOURMAP` from 0 to 1)
    writes a cell's value in white past :data:`mhbook.viz.colours.DARK_ABOVE`. Another ``cmap``
    adds ``"text"``, the text colour of each colour; another range adds ``"vmin"`` and
    ``"vmax"``.
    """
    scale = {"colours": list(colour_table(cmap)), "darkAbove": DARK_ABOVE}
    if cmap != COLOURMAP:
        scale["text"] = list(_text_table(cmap))
    if (vmin, vmax) != (0.0, 1.0):
        scale["vmin"], scale["vmax"] = float(vmin), float(vmax)
    return scale


def _colour(lut: Sequence[str], fraction: float) -> str:
    return lut[round(fraction * (len(lut) - 1))]


def _fraction(value: float, vmin: float, vmax: float) -> float:
    """Where ``value`` sits on the scale from ``vmin`` to ``vmax``, clipped to [0, 1]."""
    return min(1.0, max(0.0, (value - vmin) / (vmax - vmin)))


def _cell_text(value: float, fmt: str) -> str:
    """A cell's text, as ``static/heatmap.js`` writes it: ``fmt`` is ``"bool"`` (True or
    False) or a number of decimals."""
    if fmt == "bool":
        return "True" if value > 0.5 else "False"
    return f"{value:.{int(fmt)}f}"


def _svg_open(
    uid: str, name: str, css_class: str, width: float, height: float, label: str, extra: str = ""
) -> str:
    """The opening ``<svg>`` tag: an image (``role="img"``) with an ``aria-label``."""
    return (
        f'<svg id="{uid}-{name}" class="{css_class}" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{html.escape(label)}" '
        f'{extra}font-family="DejaVu Sans, Arial, sans-serif" font-size="13">'
    )


def heatmap_svg(
    uid: str,
    values: np.ndarray,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str = "",
    xlabel: str = "keys",
    ylabel: str = "queries",
    cmap: str | tuple[str, ...] = COLOURMAP,
    *,
    name: str = "heatmap",
    vmin: float = 0.0,
    vmax: float = 1.0,
    fmt: str = "2",
    label: str | None = None,
    shown: tuple[int, int] | None = None,
) -> str:
    """An SVG heatmap of ``values`` (attention weights: from 0 to 1), laid out once;
    JavaScript (``static/heatmap.js``) may recolour it.

    Elements (classes): the ``svg.mhbook-explorer-heatmap`` (``id="{uid}-{name}"``,
    ``data-weights`` = the values as JSON rounded to 4 decimals, ``role="img"`` and an
    ``aria-label``), one ``rect.mhbook-explorer-cell`` and one ``text.mhbook-explorer-value``
    per cell (both with ``data-i``, ``data-j``), ``text.mhbook-explorer-title`` and an empty
    ``text.mhbook-explorer-subtitle``, row and column labels (``data-i``, ``data-j``), and a
    colour bar from ``vmin`` to ``vmax``.

    Args:
        uid: the explorer's id, a prefix of the ids here.
        values: ``(num_rows, num_cols)``, e.g. attention weights (queries x keys).
        row_labels, col_labels: the tokens of the rows (left) and columns (below, rotated).
        title, xlabel, ylabel: the texts around the map.
        cmap: a matplotlib colour map's name, or a tuple of colours.
        name: the svg's id is ``{uid}-{name}``: one name per heatmap of an explorer.
        vmin, vmax: the values at the two ends of the colour scale.
        fmt: how a cell writes its value: a number of decimals, or ``"bool"`` (True/False).
        label: the ``aria-label``; by default the title and the axes.
        shown: ``(rows, cols)``: only the top-left block of that size is visible (the
            JavaScript shows more when it draws a larger matrix); default: all.
    """
    values = np.asarray(values, dtype=np.float64)
    rows, cols = values.shape
    if (len(row_labels), len(col_labels)) != (rows, cols):
        raise ValueError(
            f"values of shape {values.shape} need {rows} row and {cols} column labels, "
            f"got {len(row_labels)} and {len(col_labels)}"
        )
    shown_rows, shown_cols = (rows, cols) if shown is None else shown
    scale = colour_scale(cmap, vmin, vmax)
    lut = scale["colours"]

    def text_fill(fraction: float) -> str:
        if "text" in scale:
            return scale["text"][round(fraction * (len(lut) - 1))]
        return text_colour(fraction)

    def hidden(visible: bool) -> str:
        return "" if visible else ' visibility="hidden"'

    e = html.escape
    cell = _CELL
    left = 42 + _CHAR * max(map(len, row_labels), default=1)
    top = 58
    bottom = 30 + _CHAR * max(map(len, col_labels), default=1) * 0.75
    bar_w, bar_gap = 14, 22
    width = left + cols * cell + bar_gap + bar_w + 48
    height = top + rows * cell + bottom
    mid_x, mid_y = left + cols * cell / 2, top + rows * cell / 2
    if label is None:
        label = f"Heatmap: {title}; rows are {ylabel}, columns are {xlabel}"
    parts = [
        _svg_open(
            uid,
            name,
            "mhbook-explorer-heatmap",
            width,
            height,
            label,
            f"data-weights='{json.dumps(np.round(values, 4).tolist())}' data-format=\"{fmt}\" ",
        ),
        f'<text class="mhbook-explorer-title" x="{mid_x:.1f}" y="20" '
        f'text-anchor="middle" font-size="14">{e(title)}</text>',
        f'<text class="mhbook-explorer-subtitle" x="{mid_x:.1f}" y="40" '
        'text-anchor="middle" font-size="12" fill="#444"></text>',
    ]
    for i, j in np.ndindex(rows, cols):
        v = values[i, j]
        f = _fraction(v, vmin, vmax)
        x, y = left + j * cell, top + i * cell
        show = hidden(i < shown_rows and j < shown_cols)
        parts.append(
            f'<rect class="mhbook-explorer-cell" data-i="{i}" data-j="{j}" x="{x}" y="{y}" '
            f'width="{cell}" height="{cell}" fill="{_colour(lut, f)}" '
            f'stroke="white" stroke-width="1"{show}/>'
            f'<text class="mhbook-explorer-value" data-i="{i}" data-j="{j}" '
            f'x="{x + cell / 2}" y="{y + cell / 2 + 4}" text-anchor="middle" font-size="11" '
            f'fill="{text_fill(f)}"{show}>{_cell_text(v, fmt)}</text>'
        )
    for i, row_label in enumerate(row_labels):
        yc = top + i * cell + cell / 2 + 4
        parts.append(
            f'<text class="mhbook-explorer-query" data-i="{i}" x="{left - 6}" y="{yc}" '
            f'text-anchor="end"{hidden(i < shown_rows)}>{e(row_label)}</text>'
        )
    for j, col_label in enumerate(col_labels):
        xc, yb = left + j * cell + cell / 2, top + rows * cell + 12
        parts.append(
            f'<text class="mhbook-explorer-key" data-j="{j}" x="{xc}" y="{yb}" '
            f'text-anchor="end" transform="rotate(-45 {xc} {yb})"'
            f"{hidden(j < shown_cols)}>{e(col_label)}</text>"
        )
    parts.append(
        f'<text x="{mid_x}" y="{height - 6}" text-anchor="middle">{e(xlabel)}</text>'
        f'<text x="14" y="{mid_y}" text-anchor="middle" '
        f'transform="rotate(-90 14 {mid_y})">{e(ylabel)}</text>'
    )
    gradient = f"{uid}-bar" if name == "heatmap" else f"{uid}-{name}-bar"
    x_bar = left + cols * cell + bar_gap
    parts.append(_colour_bar(gradient, x_bar, top, bar_w, rows * cell, lut, vmin, vmax, fmt))
    parts.append("</svg>")
    return "".join(parts)


def _colour_bar(
    gradient_id: str,
    x: float,
    top: float,
    width: float,
    height: float,
    lut,
    vmin=0.0,
    vmax=1.0,
    fmt="2",
) -> str:
    """A vertical colour bar, ``vmin`` at the bottom and ``vmax`` at the top, with five ticks
    (two, False and True, for a bool scale)."""
    stops = "".join(
        f'<stop offset="{k / 10:.1f}" stop-color="{_colour(lut, 1 - k / 10)}"/>' for k in range(11)
    )
    parts = [
        f'<defs><linearGradient id="{gradient_id}" x1="0" y1="0" x2="0" y2="1">{stops}'
        "</linearGradient></defs>"
        f'<rect x="{x}" y="{top}" width="{width}" height="{height}" '
        f'fill="url(#{gradient_id})" stroke="#333" stroke-width="0.5"/>'
    ]
    if fmt == "bool":
        ticks = [(0.25, "False"), (0.75, "True")]
    else:
        ticks = [(k / 4, f"{vmin + (vmax - vmin) * k / 4:g}") for k in range(5)]
    for fraction, text in ticks:
        y = top + (1 - fraction) * height
        parts.append(
            f'<line x1="{x + width}" y1="{y}" x2="{x + width + 4}" y2="{y}" stroke="#333"/>'
            f'<text x="{x + width + 7}" y="{y + 4}" font-size="11">{text}</text>'
        )
    return "".join(parts)


#: The colours of positive and negative bars, and of the lines of a line chart.
POSITIVE, NEGATIVE = "#2171b5", "#cb181d"
LINE_COLOURS = ("#cb181d", "#2171b5", "#238b45", "#6a51a3")


def _ticks(lo: float, hi: float, n: int = 5) -> list[tuple[float, str]]:
    return [(lo + (hi - lo) * k / (n - 1), f"{lo + (hi - lo) * k / (n - 1):g}") for k in range(n)]


def _axes(
    left: float,
    top: float,
    width: float,
    height: float,
    y_of,
    yticks,
    title: str,
    xlabel: str,
    ylabel: str,
    total_width: float,
    total_height: float,
) -> list[str]:
    """Title, frame, y ticks with grid lines, and axis labels of a chart."""
    e = html.escape
    mid_x, mid_y = left + width / 2, top + height / 2
    parts = [
        f'<text class="mhbook-explorer-title" x="{mid_x:.1f}" y="20" text-anchor="middle" '
        f'font-size="14">{e(title)}</text>',
        f'<text class="mhbook-explorer-subtitle" x="{mid_x:.1f}" y="38" text-anchor="middle" '
        'font-size="12" fill="#444"></text>',
        f'<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="none" '
        'stroke="#999" stroke-width="0.5"/>',
    ]
    for value, text in yticks:
        y = y_of(value)
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + width}" y2="{y:.1f}" stroke="#e5e5e5"/>'
            f'<line x1="{left - 4}" y1="{y:.1f}" x2="{left}" y2="{y:.1f}" stroke="#333"/>'
            f'<text x="{left - 7}" y="{y + 4:.1f}" text-anchor="end" font-size="11">'
            f"{e(text)}</text>"
        )
    parts.append(
        f'<text x="{mid_x:.1f}" y="{total_height - 6:.1f}" text-anchor="middle">{e(xlabel)}</text>'
        f'<text x="14" y="{mid_y:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {mid_y:.1f})">{e(ylabel)}</text>'
    )
    return parts


def bars_svg(
    uid: str,
    name: str,
    values,
    labels: Sequence[str],
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    *,
    ylim: tuple[float, float] = (0.0, 1.0),
    cmap: str | None = COLOURMAP,
    label: str | None = None,
    value_text: bool = True,
    bar_width: float = 30,
    height: float = 200,
) -> str:
    """An SVG bar chart of ``values``, laid out once; ``drawBars`` (``static/charts.js``)
    redraws it.

    Elements: the ``svg.mhbook-explorer-bars`` (``id="{uid}-{name}"``, ``role="img"``,
    ``aria-label``; ``data-values`` = the values as JSON rounded to 4 decimals,
    ``data-plot`` = the plot box ``left,top,width,height`` and ``data-ylim``), one
    ``rect.mhbook-explorer-bar`` per value (``data-j``) and, with ``value_text``, one
    ``text.mhbook-explorer-bar-value``.

    Args:
        values: ``n`` numbers.
        labels: ``n`` labels under the bars (at most every ``n // 16``-th is written).
        ylim: the range of the y axis; bars start at 0 (or at ``ylim[0]`` if 0 is outside).
        cmap: bars coloured by their value on this colour scale (from ``ylim[0]`` to
            ``ylim[1]``), or ``None``: blue when positive, red when negative.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or len(labels) != len(values):
        raise ValueError(f"need n values and n labels, got {values.shape} and {len(labels)}")
    n = len(values)
    lo, hi = ylim
    left, top = 58.0, 50.0
    width = n * bar_width
    bottom = 30 + _CHAR * max(map(len, labels), default=1) * 0.75
    total_w, total_h = left + width + 20, top + height + bottom + 4
    scale = colour_scale(cmap, lo, hi) if cmap is not None else None

    def y_of(v: float) -> float:
        return top + (1 - _fraction(v, lo, hi)) * height

    base = min(max(0.0, lo), hi)
    if label is None:
        label = f"Bar chart: {title}; {ylabel} for each {xlabel}"
    extra = (
        f"data-values='{json.dumps(np.round(values, 4).tolist())}' "
        f'data-plot="{left},{top},{width},{height}" data-ylim="{lo},{hi}" '
    )
    parts = [_svg_open(uid, name, "mhbook-explorer-bars", total_w, total_h, label, extra)]
    parts += _axes(
        left, top, width, height, y_of, _ticks(lo, hi), title, xlabel, ylabel, total_w, total_h
    )
    every = max(1, n // 16)
    for j, v in enumerate(values):
        x = left + j * bar_width + 0.15 * bar_width
        y0, y1 = sorted((y_of(base), y_of(v)))
        if scale is None:
            fill = POSITIVE if v >= 0 else NEGATIVE
        else:
            fill = _colour(scale["colours"], _fraction(v, lo, hi))
        parts.append(
            f'<rect class="mhbook-explorer-bar" data-j="{j}" x="{x:.1f}" y="{y0:.1f}" '
            f'width="{0.7 * bar_width:.1f}" height="{y1 - y0:.1f}" fill="{fill}" '
            'stroke="#333" stroke-width="0.5"/>'
        )
        if value_text:
            parts.append(
                f'<text class="mhbook-explorer-bar-value" data-j="{j}" '
                f'x="{x + 0.35 * bar_width:.1f}" y="{y0 - 3:.1f}" text-anchor="middle" '
                f'font-size="9">{v:.2f}</text>'
            )
        if j % every == 0:
            xc, yb = left + (j + 0.5) * bar_width, top + height + 12
            parts.append(
                f'<text class="mhbook-explorer-key" x="{xc:.1f}" y="{yb:.1f}" text-anchor="end" '
                f'font-size="11" transform="rotate(-45 {xc:.1f} {yb:.1f})">'
                f"{html.escape(labels[j])}</text>"
            )
    parts.append(
        f'<line x1="{left}" y1="{y_of(base):.1f}" x2="{left + width}" y2="{y_of(base):.1f}" '
        'stroke="#333"/>'
    )
    parts.append("</svg>")
    return "".join(parts)


def line_chart_svg(
    uid: str,
    name: str,
    series: Sequence[dict],
    xlim: tuple[float, float],
    ylim: tuple[float, float],
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    *,
    ylog: bool = False,
    xticks: Sequence[tuple[float, str]] | None = None,
    yticks: Sequence[tuple[float, str]] | None = None,
    label: str | None = None,
    width: float = 380,
    height: float = 220,
) -> str:
    """An SVG line chart, laid out once; ``drawLines`` (``static/charts.js``) redraws it.

    Each series is a dict with ``x`` and ``y`` (lists of numbers), ``label`` (for the
    legend), and optionally ``colour``, ``dashed`` (bool) and ``marker`` (an ``[x, y]``
    point drawn as a dot, or ``None``). Values outside ``ylim`` are drawn at its edge.

    Elements: the ``svg.mhbook-explorer-lines`` (``id="{uid}-{name}"``, ``role="img"``,
    ``aria-label``; ``data-plot`` = ``left,top,width,height``, ``data-xlim``, ``data-ylim``,
    ``data-ylog``), one ``polyline.mhbook-explorer-line`` and one
    ``circle.mhbook-explorer-marker`` per series (``data-k``).

    Args:
        xlim, ylim: the ranges of the axes (``ylim`` in data units also when ``ylog``).
        ylog: a logarithmic y axis (base 10).
        xticks, yticks: ``(value, text)`` pairs; default: five evenly spaced ticks.
    """
    left, top = 64.0, 48.0
    legend_h = 18 * len(series)
    total_w, total_h = left + width + 16, top + height + 44 + legend_h
    lo, hi = (math.log10(v) for v in ylim) if ylog else ylim

    def x_of(x: float) -> float:
        return left + _fraction(x, *xlim) * width

    def y_of(y: float) -> float:
        if ylog:
            y = math.log10(max(y, 1e-300))
        return top + (1 - _fraction(y, lo, hi)) * height

    if yticks is None:
        yticks = [(10**v, f"1e{v:g}") for v, _ in _ticks(lo, hi)] if ylog else _ticks(lo, hi)
    if xticks is None:
        xticks = _ticks(*xlim)
    if label is None:
        label = f"Line chart: {title}; {ylabel} against {xlabel}"
    extra = (
        f'data-plot="{left},{top},{width},{height}" data-xlim="{xlim[0]},{xlim[1]}" '
        f'data-ylim="{ylim[0]},{ylim[1]}" data-ylog="{int(ylog)}" '
    )
    parts = [_svg_open(uid, name, "mhbook-explorer-lines", total_w, total_h, label, extra)]
    parts += _axes(
        left, top, width, height, y_of, yticks, title, xlabel, ylabel, total_w, total_h - legend_h
    )
    for value, text in xticks:
        x = x_of(value)
        parts.append(
            f'<line x1="{x:.1f}" y1="{top + height}" x2="{x:.1f}" y2="{top + height + 4}" '
            'stroke="#333"/>'
            f'<text x="{x:.1f}" y="{top + height + 16}" text-anchor="middle" font-size="11">'
            f"{html.escape(text)}</text>"
        )
    for k, line in enumerate(series):
        colour = line.get("colour") or LINE_COLOURS[k % len(LINE_COLOURS)]
        points = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for x, y in zip(line["x"], line["y"]))
        dash = ' stroke-dasharray="6 4"' if line.get("dashed") else ""
        parts.append(
            f'<polyline class="mhbook-explorer-line" data-k="{k}" points="{points}" fill="none" '
            f'stroke="{colour}" stroke-width="2"{dash}/>'
        )
        marker = line.get("marker")
        cx, cy = (x_of(marker[0]), y_of(marker[1])) if marker else (0, 0)
        seen = "" if marker else ' visibility="hidden"'
        parts.append(
            f'<circle class="mhbook-explorer-marker" data-k="{k}" cx="{cx:.1f}" cy="{cy:.1f}" '
            f'r="5" fill="{colour}" stroke="white"{seen}/>'
        )
        ly = total_h - legend_h + 18 * k + 4
        parts.append(
            f'<line x1="{left}" y1="{ly}" x2="{left + 24}" y2="{ly}" stroke="{colour}" '
            f'stroke-width="2"{dash}/>'
            f'<text x="{left + 30}" y="{ly + 4}" font-size="12">'
            f"{html.escape(line.get('label', ''))}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


@cache
def static_text(name: str) -> str:
    """The text of ``static/name``, shipped with the package."""
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def _json_for_html(data) -> str:
    """JSON that is safe inside a ``<script>`` element (no ``</script>``, no ``<!--``)."""
    text = json.dumps(data, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def embed(
    uid: str, body: str, scripts: Sequence[str], data, css: str | Sequence[str] = "explorer.css"
) -> str:
    """One self-contained explorer: ``<div class="mhbook-explorer" id=uid>``, holding
    the CSS, ``body``, ``data`` as JSON, and the JavaScript that brings it to life.

    The scripts ``static/{name}`` are concatenated, in order, inside ``static/embed.js``,
    which finds the explorer's ``root`` element and parses its ``data`` for them. The
    data travels in ``<script type="application/json" class="mhbook-explorer-data">``.

    Args:
        uid: the id of the root ``<div>``; unique on the page.
        body: the explorer's HTML (controls, SVG).
        scripts: file names in ``static/``, e.g. ``["heatmap.js", "attention.js"]``.
        data: anything :func:`json.dumps` takes.
        css: a file name in ``static/``, or several, concatenated in order.
    """
    code = "\n".join(static_text(name) for name in scripts)
    style = "".join(static_text(name) for name in ([css] if isinstance(css, str) else css))
    script = static_text("embed.js").replace("/* UID */", json.dumps(uid))
    script = script.replace("/* CODE */", code)
    return (
        f'<div class="mhbook-explorer" id="{html.escape(uid)}">'
        f"<style>{style}</style>"
        f"{body}"
        f'<script type="application/json" class="mhbook-explorer-data">{_json_for_html(data)}'
        "</script>"
        f"<script>{script}</script>"
        "</div>"
    )
