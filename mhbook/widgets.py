"""The attention explorer of chapter 1: move W_query and W_key, watch the weights change.

A handful of tokens have hand-made embeddings ``X`` of shape ``(num_tokens, d)`` whose
``d`` axes mean something (``axis_names``, e.g. ``["entertainment", "time", "other"]``).
The query and key projections are diagonal, ``W_q = diag(q)`` and ``W_k = diag(k)``, so
each slider scales one axis, and the explorer draws

.. math:: \\mathrm{softmax}\\big((X W_q)(X W_k)^\\top / \\sqrt{d}\\big).

A *focus axis* preset doubles that axis in ``W_q`` and halves the other axes in ``W_k``
(``W_v`` stays the identity). Two versions do the same computation:

* :func:`attention_explorer` is an ipywidgets widget; it needs a running kernel
  (Jupyter, Colab) and the optional ``ipywidgets`` package.
* :func:`attention_explorer_html` is self-contained HTML with inline JavaScript and
  no external files, so it keeps working in the static HTML book.
"""

from __future__ import annotations

import html
import itertools
import json
import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import to_hex

from .plot import _to_numpy, plot_heatmap

__all__ = [
    "explorer_weights",
    "focus_preset",
    "attention_explorer",
    "attention_explorer_html",
]

#: Range and step of the sliders for the diagonal entries of ``W_q`` and ``W_k``.
SLIDER_MIN, SLIDER_MAX, SLIDER_STEP = 0.0, 3.0, 0.1

_explorer_ids = itertools.count(1)  # deterministic ids: a fresh kernel prints the same HTML


def _check_inputs(tokens, X, axis_names) -> tuple[list[str], np.ndarray, list[str]]:
    """Return tokens, X as a float64 ``(num_tokens, d)`` array, and axis names."""
    if isinstance(tokens, str):
        raise TypeError("tokens must be a list of strings, got one string")
    tokens = [str(t) for t in tokens]
    X = _to_numpy(X, "X").astype(np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must have shape (num_tokens, d), got {X.shape}")
    if X.shape[0] != len(tokens):
        raise ValueError(f"X has shape {X.shape} but there are {len(tokens)} tokens")
    axis_names = [str(a) for a in axis_names]
    if len(axis_names) != X.shape[1]:
        raise ValueError(f"X has d = {X.shape[1]} axes but {len(axis_names)} axis_names")
    return tokens, X, axis_names


def explorer_weights(X, q_diag: Sequence[float], k_diag: Sequence[float]) -> np.ndarray:
    """The explorer's attention weights: ``softmax((X diag(q)) (X diag(k))^T / sqrt(d))``.

    Args:
        X: ``(num_tokens, d)`` embeddings.
        q_diag: ``d`` diagonal entries of ``W_q``.
        k_diag: ``d`` diagonal entries of ``W_k``.

    Returns:
        ``(num_tokens, num_tokens)`` float64 array whose rows sum to 1.
    """
    X = _to_numpy(X, "X").astype(np.float64)
    q, k = np.asarray(q_diag, dtype=np.float64), np.asarray(k_diag, dtype=np.float64)
    if X.ndim != 2 or q.shape != (X.shape[1],) or k.shape != (X.shape[1],):
        raise ValueError(
            f"expected X (num_tokens, d) with d entries in q_diag and k_diag; got X {X.shape}, "
            f"q_diag {q.shape}, k_diag {k.shape}"
        )
    scores = (X * q) @ (X * k).T / math.sqrt(X.shape[1])
    return torch.softmax(torch.from_numpy(scores), dim=-1).numpy()


def focus_preset(focus: int | None, d: int) -> tuple[list[float], list[float]]:
    """Diagonals of ``W_q`` and ``W_k`` that make attention focus on one axis.

    Args:
        focus: Index of the focus axis, or ``None`` for identity matrices.
        d: Number of axes.

    Returns:
        ``(q_diag, k_diag)``: ``W_q`` doubles the focus axis, ``W_k`` halves the others.
    """
    if focus is None:
        return [1.0] * d, [1.0] * d
    if not 0 <= focus < d:
        raise ValueError(f"focus must be an axis index in [0, {d}), got {focus}")
    q_diag = [2.0 if i == focus else 1.0 for i in range(d)]
    k_diag = [1.0 if i == focus else 0.5 for i in range(d)]
    return q_diag, k_diag


def _title(axis_names: list[str], focus: int | None) -> str:
    d = len(axis_names)
    where = f"focus on '{axis_names[focus]}'" if focus is not None else "no focus"
    return f"softmax((X W_q)(X W_k)ᵀ / √{d}), {where}"


def attention_explorer(tokens: Sequence[str], X, axis_names: Sequence[str]):
    """An ipywidgets explorer (needs a running kernel, e.g. Jupyter or Colab).

    Sliders set the diagonal entries of ``W_q`` and ``W_k`` (from 0 to 3); the
    "focus axis" menu sets them to :func:`focus_preset`. The heatmap of
    :func:`explorer_weights` is redrawn on every change.

    Args:
        tokens: The ``num_tokens`` tokens.
        X: ``(num_tokens, d)`` embeddings, tensor or array.
        axis_names: ``d`` names of the embedding axes.

    Returns:
        An ``ipywidgets.VBox``. Its ``weights`` attribute holds the weights drawn last,
        ``(num_tokens, num_tokens)``.

    Raises:
        ImportError: If ipywidgets is not installed (``pip install ipywidgets``).
    """
    try:
        import ipywidgets as widgets
        from IPython.display import display
    except ImportError as err:  # optional dependency
        raise ImportError(
            "attention_explorer needs ipywidgets: pip install ipywidgets "
            "(or use attention_explorer_html, which needs no kernel)"
        ) from err
    tokens, X, axis_names = _check_inputs(tokens, X, axis_names)
    d = len(axis_names)

    def slider(name: str):
        return widgets.FloatSlider(
            value=1.0,
            min=SLIDER_MIN,
            max=SLIDER_MAX,
            step=SLIDER_STEP,
            description=name,
            continuous_update=False,
            style={"description_width": "initial"},
        )

    q_sliders = [slider(name) for name in axis_names]
    k_sliders = [slider(name) for name in axis_names]
    focus = widgets.Dropdown(
        options=[("none (identity)", -1)] + [(name, i) for i, name in enumerate(axis_names)],
        value=-1,
        description="focus axis",
    )
    out = widgets.Output()
    box = widgets.VBox(
        [
            focus,
            widgets.HBox(
                [
                    widgets.VBox([widgets.HTML("<b>W_query diagonal</b>"), *q_sliders]),
                    widgets.VBox([widgets.HTML("<b>W_key diagonal</b>"), *k_sliders]),
                ]
            ),
            out,
        ]
    )
    state = {"busy": False}

    def redraw(*_):
        if state["busy"]:
            return
        weights = explorer_weights(X, [s.value for s in q_sliders], [s.value for s in k_sliders])
        box.weights = weights
        with out:
            out.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(5.5, 4.2), layout="constrained")
            chosen = focus.value if focus.value >= 0 else None
            title = _title(axis_names, chosen)
            plot_heatmap(weights, tokens, tokens, title, ax, annotate=True, vmin=0.0, vmax=1.0)
            display(fig)
            plt.close(fig)

    def apply_preset(change):
        q_diag, k_diag = focus_preset(change["new"] if change["new"] >= 0 else None, d)
        state["busy"] = True  # one redraw for the whole preset, not one per slider
        for s, v in zip(q_sliders + k_sliders, q_diag + k_diag):
            s.value = v
        state["busy"] = False
        redraw()

    for s in q_sliders + k_sliders:
        s.observe(redraw, names="value")
    focus.observe(apply_preset, names="value")
    redraw()
    return box


def _colour_table(cmap: str, n: int = 101) -> list[str]:
    colours = plt.get_cmap(cmap)
    return [to_hex(colours(i / (n - 1))) for i in range(n)]


def _svg_heatmap(uid: str, tokens: list[str], weights: np.ndarray, title: str, lut) -> str:
    """The heatmap as SVG, laid out here once; the JavaScript only recolours the cells."""
    n = len(tokens)
    cell = 52
    char = 7.5
    left = 42 + char * max(map(len, tokens))
    top = 58
    bottom = 30 + char * max(map(len, tokens)) * 0.75
    bar_w, bar_gap = 14, 22
    width = left + n * cell + bar_gap + bar_w + 48
    height = top + n * cell + bottom
    e = html.escape
    parts = [
        f'<svg id="{uid}-heatmap" class="mhbook-explorer-heatmap" '
        f'width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        f"data-weights='{json.dumps(np.round(weights, 4).tolist())}' "
        'font-family="DejaVu Sans, Arial, sans-serif" font-size="13">',
        f'<text class="mhbook-explorer-title" x="{left + n * cell / 2:.1f}" y="20" '
        f'text-anchor="middle" font-size="14">{e(title)}</text>',
        f'<text class="mhbook-explorer-subtitle" x="{left + n * cell / 2:.1f}" y="40" '
        'text-anchor="middle" font-size="12" fill="#444"></text>',
    ]
    for i, j in np.ndindex(n, n):
        w = weights[i, j]
        x, y = left + j * cell, top + i * cell
        parts.append(
            f'<rect class="mhbook-explorer-cell" data-i="{i}" data-j="{j}" x="{x}" y="{y}" '
            f'width="{cell}" height="{cell}" fill="{lut[round(w * (len(lut) - 1))]}" '
            'stroke="white" stroke-width="1"/>'
            f'<text class="mhbook-explorer-value" data-i="{i}" data-j="{j}" '
            f'x="{x + cell / 2}" y="{y + cell / 2 + 4}" text-anchor="middle" font-size="11" '
            f'fill="{"white" if w > 0.6 else "black"}">{w:.2f}</text>'
        )
    for i, token in enumerate(tokens):  # queries on the left, keys below (rotated)
        yc = top + i * cell + cell / 2 + 4
        parts.append(
            f'<text class="mhbook-explorer-query" x="{left - 6}" y="{yc}" '
            f'text-anchor="end">{e(token)}</text>'
        )
        xc, yb = left + i * cell + cell / 2, top + n * cell + 12
        parts.append(
            f'<text class="mhbook-explorer-key" x="{xc}" y="{yb}" text-anchor="end" '
            f'transform="rotate(-45 {xc} {yb})">{e(token)}</text>'
        )
    parts.append(
        f'<text x="{left + n * cell / 2}" y="{height - 6}" text-anchor="middle">keys</text>'
        f'<text x="14" y="{top + n * cell / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + n * cell / 2})">queries</text>'
    )
    # The colour bar: 0 at the bottom, 1 at the top.
    bx, h = left + n * cell + bar_gap, n * cell
    stops = "".join(
        f'<stop offset="{k / 10:.1f}" stop-color="{lut[round((1 - k / 10) * (len(lut) - 1))]}"/>'
        for k in range(11)
    )
    parts.append(
        f'<defs><linearGradient id="{uid}-bar" x1="0" y1="0" x2="0" y2="1">{stops}'
        "</linearGradient></defs>"
        f'<rect x="{bx}" y="{top}" width="{bar_w}" height="{h}" fill="url(#{uid}-bar)" '
        'stroke="#333" stroke-width="0.5"/>'
    )
    for v in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = top + (1 - v) * h
        parts.append(
            f'<line x1="{bx + bar_w}" y1="{y}" x2="{bx + bar_w + 4}" y2="{y}" stroke="#333"/>'
            f'<text x="{bx + bar_w + 7}" y="{y + 4}" font-size="11">{v:g}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


# Hand-written for the book (no library, so the page needs no kernel and no download).
# The placeholder __UID__ is replaced by the explorer's id.
_SCRIPT = """
(function () {
  const script = document.currentScript;
  const root = (script && script.closest(".mhbook-explorer")) ||
    document.getElementById("__UID__");
  if (!root) return;
  const X = JSON.parse(root.dataset.x);
  const names = JSON.parse(root.dataset.axisNames);
  const lut = JSON.parse(root.dataset.colours);
  const n = X.length, d = names.length;
  const svg = root.querySelector(".mhbook-explorer-heatmap");
  const focus = root.querySelector(".mhbook-explorer-focus");
  const sliders = (m) => Array.from(root.querySelectorAll(`input[data-matrix="${m}"]`));
  const qs = sliders("q"), ks = sliders("k");
  const values = (list) => list.map((s) => parseFloat(s.value));
  const focusAxis = () => (focus.value === "none" ? null : Number(focus.value));

  // softmax((X diag(q)) (X diag(k))^T / sqrt(d)), one query (row) at a time
  function weights(q, k) {
    return X.map((xi) => {
      const scores = X.map((xj) => {
        let s = 0;
        for (let a = 0; a < d; a++) s += xi[a] * q[a] * xj[a] * k[a];
        return s / Math.sqrt(d);
      });
      const m = Math.max(...scores);
      const e = scores.map((s) => Math.exp(s - m));
      const sum = e.reduce((x, y) => x + y, 0);
      return e.map((v) => v / sum);
    });
  }

  function redraw() {
    const q = values(qs), k = values(ks), w = weights(q, k);
    const texts = svg.querySelectorAll(".mhbook-explorer-value");
    svg.querySelectorAll(".mhbook-explorer-cell").forEach((cell, c) => {
      const v = w[cell.dataset.i][cell.dataset.j];
      cell.setAttribute("fill", lut[Math.round(v * (lut.length - 1))]);
      texts[c].textContent = v.toFixed(2);
      texts[c].setAttribute("fill", v > 0.6 ? "white" : "black");
    });
    for (const s of qs.concat(ks)) {
      const readout = root.querySelector(`output[data-for="${s.id}"]`);
      if (readout) readout.textContent = parseFloat(s.value).toFixed(1);
    }
    const f = focusAxis();
    svg.querySelector(".mhbook-explorer-title").textContent =
      `softmax((X W_q)(X W_k)\u1d40 / \u221a${d}), ` +
      (f === null ? "no focus" : `focus on '${names[f]}'`);
    const diag = (v) => v.map((x) => x.toFixed(1)).join(", ");
    svg.querySelector(".mhbook-explorer-subtitle").textContent =
      `W_q = diag(${diag(q)}),  W_k = diag(${diag(k)})`;
    const rounded = w.map((row) => row.map((v) => Math.round(v * 1e4) / 1e4));
    svg.setAttribute("data-weights", JSON.stringify(rounded));
  }

  focus.addEventListener("change", () => {
    const f = focusAxis();  // W_q doubles the focus axis, W_k halves the other axes
    for (let a = 0; a < d; a++) {
      qs[a].value = f === null || a !== f ? 1 : 2;
      ks[a].value = f === null || a === f ? 1 : 0.5;
    }
    redraw();
  });
  for (const s of qs.concat(ks)) s.addEventListener("input", redraw);
  redraw();
})();
"""


def attention_explorer_html(tokens: Sequence[str], X, axis_names: Sequence[str]):
    """The explorer as self-contained HTML and JavaScript: no kernel, no download.

    The same sliders, focus menu and heatmap as :func:`attention_explorer`, computed
    in the browser. Every call gets new element ids (``mhbook-explorer-1``,
    ``mhbook-explorer-2``, ... in a fresh kernel), so several explorers fit on one page.
    Elements a test can use: the root ``div.mhbook-explorer`` (``id`` = the explorer's
    id), the menu ``select.mhbook-explorer-focus`` (``id="{id}-focus"``), the sliders
    ``input.mhbook-explorer-slider`` (``id="{id}-q0"``, ``"{id}-k2"``, ...), and the
    heatmap ``svg.mhbook-explorer-heatmap`` (``id="{id}-heatmap"``), whose
    ``data-weights`` attribute holds the weights drawn, as JSON rounded to 4 decimals.

    Args:
        tokens: The ``num_tokens`` tokens.
        X: ``(num_tokens, d)`` embeddings, tensor or array.
        axis_names: ``d`` names of the embedding axes.

    Returns:
        An ``IPython.display.HTML`` object (its ``data`` attribute is the HTML string).
    """
    from IPython.display import HTML

    tokens, X, axis_names = _check_inputs(tokens, X, axis_names)
    d = len(axis_names)
    uid = f"mhbook-explorer-{next(_explorer_ids)}"
    lut = _colour_table("Reds")
    e = html.escape
    q_diag, k_diag = focus_preset(None, d)
    weights = explorer_weights(X, q_diag, k_diag)
    options = ['<option value="none" selected>none (identity)</option>'] + [
        f'<option value="{a}">{e(name)}</option>' for a, name in enumerate(axis_names)
    ]

    def slider_block(matrix: str, label: str, diag: list[float]) -> str:
        rows = []
        for a, name in enumerate(axis_names):
            sid = f"{uid}-{matrix}{a}"
            rows.append(
                f'<label for="{sid}" style="display:block;margin:2px 0">'
                f'<span style="display:inline-block;min-width:8.5em">{e(name)}</span>'
                f'<input type="range" class="mhbook-explorer-slider" id="{sid}" '
                f'data-matrix="{matrix}" data-axis="{a}" min="{SLIDER_MIN:g}" '
                f'max="{SLIDER_MAX:g}" step="{SLIDER_STEP:g}" value="{diag[a]:g}" '
                'style="vertical-align:middle;width:9em"> '
                f'<output class="mhbook-explorer-readout" data-for="{sid}">'
                f"{diag[a]:.1f}</output></label>"
            )
        return (
            '<fieldset style="border:1px solid #ccc;padding:4px 10px;margin:0">'
            '<legend style="float:none;width:auto;margin:0;padding:0 4px;font-size:14px;'
            f'font-weight:bold">{label}</legend>{"".join(rows)}</fieldset>'
        )

    x_json = json.dumps(X.tolist())
    body = (
        f'<div class="mhbook-explorer" id="{uid}" data-x="{e(x_json)}" '
        f'data-axis-names="{e(json.dumps(axis_names))}" '
        f'data-colours="{e(json.dumps(lut))}" '
        # Black on white, so that it stays readable when the book is in dark mode.
        'style="font-family:sans-serif;font-size:14px;line-height:1.4;color:#000;color-scheme:light;'
        'background:#fff;padding:10px;border-radius:6px;overflow-x:auto">'
        '<div style="display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start">'
        '<div style="display:flex;flex-direction:column;gap:8px">'
        f'<label for="{uid}-focus">focus axis '
        f'<select class="mhbook-explorer-focus" id="{uid}-focus">{"".join(options)}</select>'
        "</label>"
        f"{slider_block('q', 'W_query diagonal', q_diag)}"
        f"{slider_block('k', 'W_key diagonal', k_diag)}"
        "</div>"
        f"{_svg_heatmap(uid, tokens, weights, _title(axis_names, None), lut)}"
        "</div>"
        f"<script>{_SCRIPT.replace('__UID__', uid)}</script>"
        "</div>"
    )
    return HTML(body)
