"""Self-contained HTML for the explorers: an SVG heatmap, its colour scale, and a helper
that inlines the explorer's JavaScript, CSS and data into one ``<div>``.

The page needs no kernel and no download: everything is in the returned string. The
JavaScript lives in ``static/*.js`` next to this file; the numbers it needs (the data, the
colour table, the text-colour threshold, titles) are computed here in Python, once, and
handed to it as JSON.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from functools import cache
from importlib import resources

import numpy as np

__all__ = [
    "COLOURMAP",
    "DARK_ABOVE",
    "text_colour",
    "colour_table",
    "colour_scale",
    "heatmap_svg",
    "embed",
]

#: The colour map of attention weights, in the explorers and in :func:`mhbook.plot_heatmap`.
COLOURMAP = "Reds"

#: A value written in a heatmap cell is white where the cell's colour is more than this
#: fraction of the way up the scale (a dark cell), black elsewhere.
DARK_ABOVE = 0.6

_CELL = 52  # pixels per heatmap cell
_CHAR = 7.5  # width of a label character, in pixels


def text_colour(fraction: float) -> str:
    """``"white"`` on a cell ``fraction`` (0 to 1) up the colour scale past
    :data:`DARK_ABOVE`, else ``"black"``."""
    return "white" if fraction > DARK_ABOVE else "black"


@cache
def colour_table(cmap: str = COLOURMAP, n: int = 101) -> tuple[str, ...]:
    """``n`` hex colours evenly spaced along matplotlib's ``cmap``, from 0 to 1."""
    import matplotlib  # here, not above: `import mhbook` stays free of matplotlib
    from matplotlib.colors import to_hex

    colours = matplotlib.colormaps[cmap]
    return tuple(to_hex(colours(i / (n - 1))) for i in range(n))


def colour_scale(cmap: str = COLOURMAP) -> dict:
    """What the JavaScript needs to colour a cell: ``{"colours": [...], "darkAbove": ...}``."""
    return {"colours": list(colour_table(cmap)), "darkAbove": DARK_ABOVE}


def _colour(lut: Sequence[str], fraction: float) -> str:
    return lut[round(fraction * (len(lut) - 1))]


def heatmap_svg(
    uid: str,
    values: np.ndarray,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str = "",
    xlabel: str = "keys",
    ylabel: str = "queries",
    cmap: str = COLOURMAP,
) -> str:
    """An SVG heatmap of ``values`` in ``[0, 1]``, laid out once; JavaScript may recolour it.

    Elements (classes): the ``svg.mhbook-explorer-heatmap`` (``id="{uid}-heatmap"``,
    ``data-weights`` = the values as JSON rounded to 4 decimals), one
    ``rect.mhbook-explorer-cell`` and one ``text.mhbook-explorer-value`` per cell (both
    with ``data-i``, ``data-j``), ``text.mhbook-explorer-title`` and an empty
    ``text.mhbook-explorer-subtitle``, row and column labels, and a colour bar from 0 to 1.

    Args:
        uid: the explorer's id, a prefix of the ids here.
        values: ``(num_rows, num_cols)``, e.g. attention weights (queries x keys).
        row_labels, col_labels: the tokens of the rows (left) and columns (below, rotated).
    """
    values = np.asarray(values, dtype=np.float64)
    rows, cols = values.shape
    if (len(row_labels), len(col_labels)) != (rows, cols):
        raise ValueError(
            f"values of shape {values.shape} need {rows} row and {cols} column labels, "
            f"got {len(row_labels)} and {len(col_labels)}"
        )
    lut = colour_table(cmap)
    e = html.escape
    cell = _CELL
    left = 42 + _CHAR * max(map(len, row_labels), default=1)
    top = 58
    bottom = 30 + _CHAR * max(map(len, col_labels), default=1) * 0.75
    bar_w, bar_gap = 14, 22
    width = left + cols * cell + bar_gap + bar_w + 48
    height = top + rows * cell + bottom
    mid_x, mid_y = left + cols * cell / 2, top + rows * cell / 2
    parts = [
        f'<svg id="{uid}-heatmap" class="mhbook-explorer-heatmap" '
        f'width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        f"data-weights='{json.dumps(np.round(values, 4).tolist())}' "
        'font-family="DejaVu Sans, Arial, sans-serif" font-size="13">',
        f'<text class="mhbook-explorer-title" x="{mid_x:.1f}" y="20" '
        f'text-anchor="middle" font-size="14">{e(title)}</text>',
        f'<text class="mhbook-explorer-subtitle" x="{mid_x:.1f}" y="40" '
        'text-anchor="middle" font-size="12" fill="#444"></text>',
    ]
    for i, j in np.ndindex(rows, cols):
        v = values[i, j]
        x, y = left + j * cell, top + i * cell
        parts.append(
            f'<rect class="mhbook-explorer-cell" data-i="{i}" data-j="{j}" x="{x}" y="{y}" '
            f'width="{cell}" height="{cell}" fill="{_colour(lut, v)}" '
            'stroke="white" stroke-width="1"/>'
            f'<text class="mhbook-explorer-value" data-i="{i}" data-j="{j}" '
            f'x="{x + cell / 2}" y="{y + cell / 2 + 4}" text-anchor="middle" font-size="11" '
            f'fill="{text_colour(v)}">{v:.2f}</text>'
        )
    for i, label in enumerate(row_labels):
        yc = top + i * cell + cell / 2 + 4
        parts.append(
            f'<text class="mhbook-explorer-query" x="{left - 6}" y="{yc}" '
            f'text-anchor="end">{e(label)}</text>'
        )
    for j, label in enumerate(col_labels):
        xc, yb = left + j * cell + cell / 2, top + rows * cell + 12
        parts.append(
            f'<text class="mhbook-explorer-key" x="{xc}" y="{yb}" text-anchor="end" '
            f'transform="rotate(-45 {xc} {yb})">{e(label)}</text>'
        )
    parts.append(
        f'<text x="{mid_x}" y="{height - 6}" text-anchor="middle">{e(xlabel)}</text>'
        f'<text x="14" y="{mid_y}" text-anchor="middle" '
        f'transform="rotate(-90 14 {mid_y})">{e(ylabel)}</text>'
    )
    parts.append(_colour_bar(uid, left + cols * cell + bar_gap, top, bar_w, rows * cell, lut))
    parts.append("</svg>")
    return "".join(parts)


def _colour_bar(uid: str, x: float, top: float, width: float, height: float, lut) -> str:
    """A vertical colour bar, 0 at the bottom and 1 at the top, with five ticks."""
    stops = "".join(
        f'<stop offset="{k / 10:.1f}" stop-color="{_colour(lut, 1 - k / 10)}"/>' for k in range(11)
    )
    parts = [
        f'<defs><linearGradient id="{uid}-bar" x1="0" y1="0" x2="0" y2="1">{stops}'
        "</linearGradient></defs>"
        f'<rect x="{x}" y="{top}" width="{width}" height="{height}" fill="url(#{uid}-bar)" '
        'stroke="#333" stroke-width="0.5"/>'
    ]
    for v in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = top + (1 - v) * height
        parts.append(
            f'<line x1="{x + width}" y1="{y}" x2="{x + width + 4}" y2="{y}" stroke="#333"/>'
            f'<text x="{x + width + 7}" y="{y + 4}" font-size="11">{v:g}</text>'
        )
    return "".join(parts)


@cache
def _static(name: str) -> str:
    """The text of ``static/name``, shipped with the package."""
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def _json_for_html(data) -> str:
    """JSON that is safe inside a ``<script>`` element (no ``</script>``, no ``<!--``)."""
    text = json.dumps(data, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def embed(uid: str, body: str, scripts: Sequence[str], data, css: str = "explorer.css") -> str:
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
        css: a file name in ``static/``.
    """
    code = "\n".join(_static(name) for name in scripts)
    script = _static("embed.js").replace("/* UID */", json.dumps(uid)).replace("/* CODE */", code)
    return (
        f'<div class="mhbook-explorer" id="{html.escape(uid)}">'
        f"<style>{_static(css)}</style>"
        f"{body}"
        f'<script type="application/json" class="mhbook-explorer-data">{_json_for_html(data)}'
        "</script>"
        f"<script>{script}</script>"
        "</div>"
    )
