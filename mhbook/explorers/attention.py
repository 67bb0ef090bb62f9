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
* :func:`attention_explorer_html` is self-contained HTML with inline JavaScript
  (``static/attention.js``, laid out by :mod:`mhbook.explorers.svg`) and no external
  files, so it keeps working in the static HTML book.

:func:`explorer_weights`, :func:`focus_preset` and :func:`explorer_title` are the
reference; the JavaScript gets the presets and titles from them and recomputes only
the softmax, which a browser test checks against :func:`explorer_weights`.
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch

from ..utils import to_numpy
from .svg import colour_scale, embed, heatmap_svg

__all__ = [
    "explorer_weights",
    "focus_preset",
    "explorer_title",
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
    X = to_numpy(X, "X").astype(np.float64)
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


def explorer_title(axis_names: Sequence[str], focus: int | None) -> str:
    """The heatmap's title: the formula, and the focus axis of :func:`focus_preset`."""
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
    import matplotlib.pyplot as plt

    from ..plot import plot_heatmap

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
            title = explorer_title(axis_names, chosen)
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


def attention_explorer_html(tokens: Sequence[str], X, axis_names: Sequence[str]):
    """The explorer as self-contained HTML and JavaScript: no kernel, no download.

    The same sliders, focus menu and heatmap as :func:`attention_explorer`, computed
    in the browser (``static/attention.js``; :func:`explorer_weights` is its reference).
    Every call gets new element ids (``mhbook-explorer-1``, ``mhbook-explorer-2``, ...
    in a fresh kernel), so several explorers fit on one page and a fresh kernel prints
    the same HTML. Elements a test can use: the root ``div.mhbook-explorer`` (``id`` =
    the explorer's id), its data ``script.mhbook-explorer-data`` (JSON with ``X``,
    ``titles``, ``presets``), the menu ``select.mhbook-explorer-focus``
    (``id="{id}-focus"``), the sliders ``input.mhbook-explorer-slider`` (``id="{id}-q0"``,
    ``"{id}-k2"``, ...), and the heatmap ``svg.mhbook-explorer-heatmap``
    (``id="{id}-heatmap"``), whose ``data-weights`` attribute holds the weights drawn,
    as JSON rounded to 4 decimals.

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
    choices = [None, *range(d)]  # what the focus menu offers, in its order
    q_diag, k_diag = focus_preset(None, d)
    weights = explorer_weights(X, q_diag, k_diag)
    e = html.escape
    options = ['<option value="none" selected>none (identity)</option>'] + [
        f'<option value="{a}">{e(name)}</option>' for a, name in enumerate(axis_names)
    ]

    def sliders(matrix: str, label: str, diag: list[float]) -> str:
        rows = []
        for a, name in enumerate(axis_names):
            sid = f"{uid}-{matrix}{a}"
            rows.append(
                f'<label class="mhbook-explorer-row" for="{sid}">'
                f'<span class="mhbook-explorer-axis">{e(name)}</span>'
                f'<input type="range" class="mhbook-explorer-slider" id="{sid}" '
                f'data-matrix="{matrix}" data-axis="{a}" min="{SLIDER_MIN:g}" '
                f'max="{SLIDER_MAX:g}" step="{SLIDER_STEP:g}" value="{diag[a]:g}"> '
                f'<output class="mhbook-explorer-readout" data-for="{sid}">'
                f"{diag[a]:.1f}</output></label>"
            )
        return f"<fieldset><legend>{label}</legend>{''.join(rows)}</fieldset>"

    body = (
        '<div class="mhbook-explorer-layout"><div class="mhbook-explorer-controls">'
        f'<label for="{uid}-focus">focus axis '
        f'<select class="mhbook-explorer-focus" id="{uid}-focus">{"".join(options)}</select>'
        "</label>"
        f"{sliders('q', 'W_query diagonal', q_diag)}"
        f"{sliders('k', 'W_key diagonal', k_diag)}"
        "</div>"
        f"{heatmap_svg(uid, weights, tokens, tokens, explorer_title(axis_names, None))}"
        "</div>"
    )
    data = {
        "X": X.tolist(),
        "scale": colour_scale(),
        "titles": [explorer_title(axis_names, f) for f in choices],
        "presets": [focus_preset(f, d) for f in choices],
    }
    return HTML(embed(uid, body, ["heatmap.js", "attention.js"], data))
