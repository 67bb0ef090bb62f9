"""The attention explorer of chapter 1: set W_query, W_key and W_value, watch the weights
and the outputs change.

A handful of tokens have hand-made embeddings ``X`` of shape ``(num_tokens, d)`` whose
``d`` axes mean something (``axis_names``, e.g. ``["entertainment", "time", "food"]``).
Three ``d x d`` matrices map them to queries, keys and values, and the explorer draws

.. math:: A = \\mathrm{softmax}\\big((X W_q)(X W_k)^\\top / \\sqrt{d}\\big), \\qquad O = A\\,X W_v .

Every entry of the three matrices can be edited; *presets* set all three at once: the
identity, a *focus axis* (:func:`focus_preset`: ``W_q`` doubles that axis, ``W_k`` halves
the others, ``W_v`` is the identity), and any matrices the chapter passes (for instance its
asymmetric ``W_query`` that makes time words ask for entertainment). Two versions do the
same computation:

* :func:`attention_explorer` is an ipywidgets widget; it needs a running kernel
  (Jupyter, Colab) and the optional ``ipywidgets`` package.
* :func:`attention_explorer_html` is self-contained HTML with inline JavaScript
  (``static/attention.js``, drawn by :mod:`mhbook.viz.explorers.svg`) and no external
  files, so it keeps working in the static HTML book.

:func:`explorer_attention` is the reference (it calls
:func:`mhbook.scaled_dot_product_attention`); the browser test checks the JavaScript
against it. :func:`explorer_weights` is its special case with diagonal ``W_q`` and ``W_k``.
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ...core.utils import to_numpy
from .svg import colour_scale, embed, heatmap_svg
from .twin import redraw_on, widget_modules

__all__ = [
    "explorer_weights",
    "explorer_attention",
    "focus_preset",
    "explorer_title",
    "explorer_presets",
    "attention_explorer",
    "attention_explorer_html",
]

#: Range and step of the entries of W_query, W_key and W_value.
SLIDER_MIN, SLIDER_MAX, SLIDER_STEP = -3.0, 3.0, 0.1
#: The outputs' colour scale: a diverging map from -OUTPUT_RANGE to OUTPUT_RANGE.
OUTPUT_CMAP, OUTPUT_RANGE = "PuOr", 4.0
#: The three matrices, as (key in the data, name shown).
MATRICES = (("q", "W_query"), ("k", "W_key"), ("v", "W_value"))

_explorer_ids = itertools.count(1)  # deterministic ids: a fresh kernel prints the same HTML


def _check_inputs(tokens, X, axis_names) -> tuple[list[str], np.ndarray, list[str]]:
    """Return tokens, X as a float64 ``(num_tokens, d)`` array, and axis names."""
    if isinstance(tokens, str):
        raise TypeError("tokens must be a list of strings, got one string")
    tokens = [str(t) for t in tokens]
    X = to_numpy(X, "X").astype(np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must have shape (num_tokens, d), got {X.shape}")
    if X.shape[0] != len(tokens):
        raise ValueError(f"X has shape {X.shape} but there are {len(tokens)} tokens")
    axis_names = [str(a) for a in axis_names]
    if len(axis_names) != X.shape[1]:
        raise ValueError(f"X has d = {X.shape[1]} axes but {len(axis_names)} axis_names")
    return tokens, X, axis_names


def _square(W, d: int, name: str) -> np.ndarray:
    W = to_numpy(W, name).astype(np.float64)
    if W.shape != (d, d):
        raise ValueError(f"{name} must have shape ({d}, {d}), got {W.shape}")
    return W


def explorer_attention(X, W_query, W_key, W_value=None) -> tuple[np.ndarray, np.ndarray]:
    """The explorer's attention: ``mhbook.scaled_dot_product_attention(XW_q, XW_k, XW_v)``.

    Args:
        X: ``(num_tokens, d)`` embeddings.
        W_query, W_key, W_value: ``(d, d)`` matrices (rows: input axes); ``W_value=None``
            is the identity.

    Returns:
        ``(output, weights)`` as float64 arrays: ``(num_tokens, d)`` and
        ``(num_tokens, num_tokens)``, whose rows sum to 1.
    """
    from ...attention.sdpa import scaled_dot_product_attention

    X = to_numpy(X, "X").astype(np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must have shape (num_tokens, d), got {X.shape}")
    d = X.shape[1]
    Wq, Wk = _square(W_query, d, "W_query"), _square(W_key, d, "W_key")
    Wv = np.eye(d) if W_value is None else _square(W_value, d, "W_value")
    Xt = torch.from_numpy(X)
    out, weights = scaled_dot_product_attention(
        Xt @ torch.from_numpy(Wq), Xt @ torch.from_numpy(Wk), Xt @ torch.from_numpy(Wv)
    )
    return out.numpy(), weights.numpy()


def explorer_weights(X, q_diag: Sequence[float], k_diag: Sequence[float]) -> np.ndarray:
    """The weights ``softmax((X diag(q)) (X diag(k))^T / sqrt(d))``: :func:`explorer_attention`
    with diagonal ``W_q`` and ``W_k``.

    Args:
        X: ``(num_tokens, d)`` embeddings.
        q_diag: ``d`` diagonal entries of ``W_q``.
        k_diag: ``d`` diagonal entries of ``W_k``.

    Returns:
        ``(num_tokens, num_tokens)`` float64 array whose rows sum to 1.
    """
    X = to_numpy(X, "X").astype(np.float64)
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


def explorer_title(axis_names: Sequence[str], focus: int | None = None) -> str:
    """A heatmap's title: the formula, and the focus axis of :func:`focus_preset`."""
    d = len(axis_names)
    where = f"focus on '{axis_names[focus]}'" if focus is not None else "no focus"
    return f"softmax((X W_q)(X W_k)ᵀ / √{d}), {where}"


def explorer_presets(axis_names: Sequence[str], extra: Mapping | None = None) -> dict:
    """The presets of the explorer: ``{name: (W_query, W_key, W_value)}`` as nested lists.

    ``"identity"``, then ``"focus on {axis}"`` for each axis (:func:`focus_preset`, with
    the identity ``W_value``), then the ``extra`` presets in their order; an extra preset
    may give two matrices (``W_value`` is then the identity) or three.
    """
    d = len(axis_names)
    eye = np.eye(d)
    presets = {"identity": (eye, eye, eye)}
    for a, axis in enumerate(axis_names):
        q_diag, k_diag = focus_preset(a, d)
        presets[f"focus on {axis}"] = (np.diag(q_diag), np.diag(k_diag), eye)
    for name, matrices in (extra or {}).items():
        if len(matrices) not in (2, 3):
            raise ValueError(f"preset {name!r}: give (W_query, W_key) or (W_query, W_key, W_value)")
        Wv = matrices[2] if len(matrices) == 3 else eye
        presets[str(name)] = tuple(
            _square(W, d, f"{name}: {n}") for W, n in zip((*matrices[:2], Wv), ("Wq", "Wk", "Wv"))
        )
    return {name: [np.round(W, 6).tolist() for W in matrices] for name, matrices in presets.items()}


def attention_explorer(
    tokens: Sequence[str], X, axis_names: Sequence[str], presets: Mapping | None = None
):
    """An ipywidgets explorer (needs a running kernel, e.g. Jupyter or Colab).

    A menu of presets (:func:`explorer_presets`), a reset button (back to the identity),
    and one grid of number boxes per matrix; the heatmaps of the weights and the outputs
    (:func:`explorer_attention`) are redrawn on every change.

    Args:
        tokens: The ``num_tokens`` tokens.
        X: ``(num_tokens, d)`` embeddings, tensor or array.
        axis_names: ``d`` names of the embedding axes.
        presets: extra presets ``{name: (W_query, W_key[, W_value])}``.

    Returns:
        An ``ipywidgets.VBox``. Its ``weights`` and ``output`` attributes hold what was drawn
        last; ``boxes`` maps ``"q"``, ``"k"``, ``"v"`` to ``d x d`` lists of ``FloatText``;
        ``preset`` is the menu and ``reset`` the button.

    Raises:
        ImportError: If ipywidgets is not installed (``pip install ipywidgets``).
    """
    widgets = widget_modules("attention_explorer")
    import matplotlib.pyplot as plt

    from ..plot import plot_heatmap

    tokens, X, axis_names = _check_inputs(tokens, X, axis_names)
    d = len(axis_names)
    choices = explorer_presets(axis_names, presets)
    names = list(choices)

    def box(value: float):
        return widgets.BoundedFloatText(
            value=value, min=SLIDER_MIN, max=SLIDER_MAX, step=SLIDER_STEP,
            layout=widgets.Layout(width="4.5em"),
        )  # fmt: skip

    start = choices["identity"]
    boxes = {m: [[box(start[n][i][j]) for j in range(d)] for i in range(d)]
             for n, (m, _) in enumerate(MATRICES)}  # fmt: skip
    grids = []
    for m, title in MATRICES:
        cells = [widgets.HTML(f"<b>{title}</b>")] + [widgets.Label(a) for a in axis_names]
        for i, a in enumerate(axis_names):
            cells += [widgets.Label(a), *boxes[m][i]]
        grids.append(
            widgets.GridBox(
                cells,
                layout=widgets.Layout(grid_template_columns=f"7em repeat({d}, 5em)"),
            )
        )
    preset = widgets.Dropdown(options=names, value="identity", description="preset")
    reset = widgets.Button(description="reset", tooltip="back to the identity matrices")
    out = widgets.Output()
    ui = widgets.VBox([widgets.HBox([preset, reset]), widgets.HBox(grids), out])
    ui.boxes, ui.preset, ui.reset = boxes, preset, reset
    state = {"busy": False}

    def matrix(m: str) -> np.ndarray:
        return np.array([[b.value for b in row] for row in boxes[m]])

    def draw():
        if state["busy"]:
            return None
        ui.output, ui.weights = explorer_attention(X, matrix("q"), matrix("k"), matrix("v"))
        fig, (ax_w, ax_o) = plt.subplots(
            1, 2, figsize=(10, 4.2), layout="constrained", width_ratios=[5, 3.4]
        )
        title = f"softmax((X W_q)(X W_k)ᵀ / √{d})"
        plot_heatmap(ui.weights, tokens, tokens, title, ax_w, annotate=True, vmin=0, vmax=1)
        plot_heatmap(ui.output, tokens, axis_names, "outputs A X W_v", ax_o, annotate=True,
                     cmap=OUTPUT_CMAP, vmin=-OUTPUT_RANGE, vmax=OUTPUT_RANGE,
                     xlabel="output axis", ylabel="token")  # fmt: skip
        return fig

    def apply(name: str):
        state["busy"] = True  # one redraw for the whole preset, not one per box
        for n, (m, _) in enumerate(MATRICES):
            for i, j in np.ndindex(d, d):
                boxes[m][i][j].value = choices[name][n][i][j]
        state["busy"] = False
        redraw()

    redraw = redraw_on([b for m, _ in MATRICES for row in boxes[m] for b in row], out, draw)
    preset.observe(lambda change: apply(change["new"]), names="value")

    def on_reset(_):
        if preset.value == "identity":
            apply("identity")
        else:
            preset.value = "identity"  # applies it

    reset.on_click(on_reset)
    return ui


def attention_explorer_html(
    tokens: Sequence[str], X, axis_names: Sequence[str], presets: Mapping | None = None
):
    """The explorer as self-contained HTML and JavaScript: no kernel, no download.

    The same presets, reset button, matrices and heatmaps as :func:`attention_explorer`,
    computed in the browser (``static/attention.js``; :func:`explorer_attention` is its
    reference). Every call gets new element ids (``mhbook-explorer-1``,
    ``mhbook-explorer-2``, ... in a fresh kernel), so several explorers fit on one page
    and a fresh kernel prints the same HTML. Elements a test can use: the root
    ``div.mhbook-explorer`` (``id`` = the explorer's id), its data
    ``script.mhbook-explorer-data`` (JSON with ``X``, ``presets``, ``names``), the menu
    ``select.mhbook-explorer-preset`` (``id="{id}-preset"``), the button
    ``button.mhbook-explorer-reset``, the matrix entries
    ``input.mhbook-explorer-entry`` (``data-matrix`` ``q``, ``k`` or ``v``, ``data-i``,
    ``data-j``; ``id="{id}-q-0-1"``, ...), and two heatmaps, ``svg#{id}-heatmap`` (the
    weights) and ``svg#{id}-output`` (the outputs), whose ``data-weights`` attribute holds
    the values drawn, as JSON rounded to 4 decimals.

    Args:
        tokens: The ``num_tokens`` tokens.
        X: ``(num_tokens, d)`` embeddings, tensor or array.
        axis_names: ``d`` names of the embedding axes.
        presets: extra presets ``{name: (W_query, W_key[, W_value])}`` (see
            :func:`explorer_presets`).

    Returns:
        An ``IPython.display.HTML`` object (its ``data`` attribute is the HTML string).
    """
    from IPython.display import HTML

    tokens, X, axis_names = _check_inputs(tokens, X, axis_names)
    d = len(axis_names)
    uid = f"mhbook-explorer-{next(_explorer_ids)}"
    choices = explorer_presets(axis_names, presets)
    Wq, Wk, Wv = choices["identity"]
    output, weights = explorer_attention(X, Wq, Wk, Wv)
    e = html.escape
    options = "".join(
        f'<option value="{n}"{" selected" if n == 0 else ""}>{e(name)}</option>'
        for n, name in enumerate(choices)
    )

    def grid(n: int, m: str, title: str) -> str:
        head = "".join(f'<th scope="col">{e(a)}</th>' for a in axis_names)
        rows = []
        for i, a in enumerate(axis_names):
            cells = []
            for j, b in enumerate(axis_names):
                value = choices["identity"][n][i][j]
                cells.append(
                    f'<td><input type="number" class="mhbook-explorer-entry" '
                    f'id="{uid}-{m}-{i}-{j}" data-matrix="{m}" data-i="{i}" data-j="{j}" '
                    f'min="{SLIDER_MIN:g}" max="{SLIDER_MAX:g}" step="{SLIDER_STEP:g}" '
                    f'value="{value:g}" aria-label="{e(title)}, row {e(a)}, column {e(b)}">'
                    "</td>"
                )
            rows.append(f'<tr><th scope="row">{e(a)}</th>{"".join(cells)}</tr>')
        return (
            f'<fieldset><legend>{e(title)}</legend><table class="mhbook-explorer-matrix">'
            f'<tr><th scope="col"><span class="mhbook-explorer-hint">in \\ out</span></th>{head}'
            f"</tr>{''.join(rows)}</table></fieldset>"
        )

    formula = f"softmax((X W_q)(X W_k)ᵀ / √{d})"
    body = (
        '<div class="mhbook-explorer-layout"><div class="mhbook-explorer-controls">'
        '<div class="mhbook-explorer-buttons">'
        f'<label for="{uid}-preset">preset '
        f'<select class="mhbook-explorer-preset" id="{uid}-preset">{options}</select></label> '
        f'<button type="button" class="mhbook-explorer-reset" id="{uid}-reset">'
        "reset to identity</button></div>"
        + "".join(grid(n, m, title) for n, (m, title) in enumerate(MATRICES))
        + '<p class="mhbook-explorer-hint">Row i of a matrix says where input axis i goes; '
        "type a number or use the arrow keys.</p>"
        "</div>"
        + heatmap_svg(uid, weights, tokens, tokens, formula)
        + heatmap_svg(
            uid,
            output,
            tokens,
            axis_names,
            "outputs A X W_v",
            xlabel="output axis",
            ylabel="tokens",
            cmap=OUTPUT_CMAP,
            name="output",
            vmin=-OUTPUT_RANGE,
            vmax=OUTPUT_RANGE,
        )
        + "</div>"
    )
    data = {
        "X": X.tolist(),
        "names": list(choices),
        "presets": list(choices.values()),
        "scale": colour_scale(),
        "outputScale": colour_scale(OUTPUT_CMAP, -OUTPUT_RANGE, OUTPUT_RANGE),
    }
    return HTML(embed(uid, body, ["heatmap.js", "charts.js", "attention.js"], data))
