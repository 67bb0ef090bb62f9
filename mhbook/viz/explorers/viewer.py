"""The attention viewer of chapters 6 and 7: the trained model's attention on every test number.

:func:`mhbook.viz.attention_records.viewer_data` records what a trained model does on
every number of a split: its greedy translations, the attention weights of every layer, head
and kind it used to write them, and the effect of removing each head; the result is a
:class:`~mhbook.viz.attention_records.ViewerData`. This module only shows one. Two views:

* ``attention_viewer_html``: self-contained HTML and JavaScript (``static/viewer.js``),
  no kernel and no download, for the static book. The weights travel quantised to ``uint8``
  (``round(255 w)``, so a weight is shown within ``1/510`` of its value), deflated with
  ``zlib`` and base64-encoded; the browser inflates them with ``DecompressionStream``.
  ``viewer_payload`` builds that data and ``payload_weights`` decodes it again, the
  way the JavaScript does, for the tests.
* ``attention_viewer``: an ipywidgets twin for Jupyter and Colab (needs a kernel).
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import zlib

import numpy as np

from ..attention_records import KINDS, ViewerData, layer_name
from .svg import colour_scale, colour_table, embed, static_text
from .twin import redraw_on, widget_modules

__all__ = [
    "viewer_payload",
    "payload_weights",
    "payload_text",
    "attention_viewer_html",
    "attention_viewer",
]

_viewer_ids = itertools.count(1)  # deterministic ids: a fresh kernel prints the same HTML


def quantise(weights) -> np.ndarray:
    """Attention weights in ``[0, 1]`` -> ``uint8`` ``round(255 w)``; ``q / 255`` is within
    ``1/510`` of ``w``."""
    w = np.asarray(weights, dtype=np.float64)
    return np.rint(np.clip(w, 0.0, 1.0) * 255).astype(np.uint8)


# ------------------------------------------------------------------------------ the payload


def pack(raw: bytes, level: int = 9) -> str:
    """zlib (what ``DecompressionStream("deflate")`` reads), then base64. ``level`` 6 is
    zlib's default: megabytes of weights deflate ten times faster than at 9, 8% larger."""
    return base64.b64encode(zlib.compress(raw, level)).decode("ascii")


def unpack(text: str) -> bytes:
    return zlib.decompress(base64.b64decode(text))


def _head_label(kind: int, layer: int, i: int) -> str:
    return f"{KINDS[kind].name}, layer {layer + 1}, head {i + 1}"


def viewer_payload(view: ViewerData) -> dict:
    """The JSON the JavaScript gets: plain metadata and two packed blobs.

    * ``weights``: the ``uint8`` weights (``quantise``) of every number, in the split's
      order; per number, kind by kind (``KINDS``), layer by layer, head by head, each
      ``(Lq, Lk)`` map row by row, with ``(Lq, Lk)`` = ``(S, S)``, ``(T, T)``, ``(T, S)``.
      Decode with ``payload_weights``.
    * ``text``: JSON with ``src`` and ``out`` (the tokens that give ``S`` and ``T``),
      ``english``, ``reference``, ``translation`` and ``ablated``: per head, the
      ``[index, translation]`` pairs of the numbers whose translation changes without that
      head. Decode with ``payload_text``.

    ``heads`` lists every head in the viewer's order with its ``loss`` and ``exact`` (the
    fraction translated exactly right) when it is removed; ``loss`` and ``exact`` at the top
    are those of the whole model.
    """
    blobs = []
    for n in range(len(view)):
        for k in range(len(KINDS)):
            for layer in range(view.num_layers):
                blobs.append(quantise(view.weights[n][layer_name(k, layer)]).tobytes())
    heads = view.heads
    text = {
        "src": view.src_tokens,
        "out": view.out_tokens,
        "english": view.english,
        "reference": view.reference,
        "translation": view.translation,
        "ablated": [
            [
                [n, fr]
                for n, fr in enumerate(view.head_translation[head])
                if fr != view.translation[n]
            ]
            for head in heads
        ],
    }
    head_info = []
    for j, head in enumerate(heads):
        k, rest = divmod(j, view.num_layers * view.num_heads)
        layer, i = divmod(rest, view.num_heads)
        head_info.append(
            {
                "name": head[0],
                "kind": k,
                "layer": layer,
                "head": i,
                "label": _head_label(k, layer, i),
                "loss": view.head_loss[head],
                "exact": view.head_exact(head),
            }
        )
    return {
        "split": view.split,
        "numbers": view.numbers,
        "numLayers": view.num_layers,
        "numHeads": view.num_heads,
        "kinds": [k._asdict() for k in KINDS],
        "scale": colour_scale(),
        "loss": view.loss,
        "exact": view.exact,
        "heads": head_info,
        "text": pack(json.dumps(text, ensure_ascii=False, separators=(",", ":")).encode()),
        "weights": pack(b"".join(blobs)),
    }


def payload_text(payload: dict) -> dict:
    """The ``text`` blob of ``viewer_payload``, unpacked."""
    return json.loads(unpack(payload["text"]).decode("utf-8"))


def payload_weights(payload: dict) -> list[dict[str, np.ndarray]]:
    """The weights of ``viewer_payload``, unpacked as the JavaScript reads them:
    ``[{layer name: (num_heads, Lq, Lk) uint8}]``, one dict per number."""
    raw = np.frombuffer(unpack(payload["weights"]), dtype=np.uint8)
    text = payload_text(payload)
    L, H = payload["numLayers"], payload["numHeads"]
    result, offset = [], 0
    for src, out in zip(text["src"], text["out"]):
        S, T = len(src), len(out)
        one = {}
        for k, shape in enumerate([(S, S), (T, T), (T, S)]):
            for layer in range(L):
                size = H * shape[0] * shape[1]
                one[layer_name(k, layer)] = raw[offset : offset + size].reshape(H, *shape)
                offset += size
        result.append(one)
    if offset != raw.size:
        raise ValueError(f"the weights hold {raw.size} bytes, the tokens account for {offset}")
    return result


# ------------------------------------------------------------------------------ the HTML


def _points(change: float) -> str:
    """A change of exact match in points, signed: ``"−5.2"``, ``"+0.1"``, ``"0.0"``."""
    text = f"{change:+.1f}"
    return "0.0" if text in ("+0.0", "-0.0") else text.replace("-", "\u2212")


def _format_number(n: int) -> str:
    """``71080`` -> ``"71 080"`` (a thin space per thousand, as the book writes numbers)."""
    return f"{n:,}".replace(",", "\u2009")


def select(uid: str, name: str, label: str, options: list[tuple[str, str]], value: str) -> str:
    opts = "".join(
        f'<option value="{v}"{" selected" if v == value else ""}>{html.escape(t)}</option>'
        for v, t in options
    )
    return (
        f'<label class="mhbook-viewer-field" for="{uid}-{name}">{label} '
        f'<select id="{uid}-{name}" class="mhbook-viewer-{name}">{opts}</select></label>'
    )


def _ablation_table(uid: str, payload: dict, remove: int) -> str:
    """A table of radio buttons, one per head, each labelled with its removal's effect."""
    L, H = payload["numLayers"], payload["numHeads"]
    base_exact = payload["exact"]
    lut = colour_table()
    drops = [base_exact - h["exact"] for h in payload["heads"]]
    largest = max(max(drops), 1e-9)
    head_cols = "".join(f'<th scope="col">head {i + 1}</th>' for i in range(H))
    rows = []
    for k, kind in enumerate(KINDS):
        for layer in range(L):
            cells = []
            for i in range(H):
                j = (k * L + layer) * H + i
                info = payload["heads"][j]
                drop = 100 * drops[j]
                shade = lut[round(min(drops[j] / largest, 1.0) * 45)]  # light: black text
                rid = f"{uid}-remove-{j}"
                cells.append(
                    f'<td style="background:{shade}">'
                    f'<input type="radio" name="{uid}-remove" id="{rid}" value="{j}"'
                    f'{" checked" if j == remove else ""} aria-label="remove '
                    f"{html.escape(info['label'])}: exact match {_points(-drop)} points, loss "
                    f'{info["loss"] - payload["loss"]:+.3f}">'
                    f'<label for="{rid}">'
                    f"{_points(-drop)}<span class='mhbook-viewer-unit'> pts</span><br>"
                    f'<span class="mhbook-viewer-loss">+{info["loss"] - payload["loss"]:.3f}'
                    "</span></label></td>"
                )
            rows.append(
                f'<tr><th scope="row">{html.escape(kind.name)}, layer {layer + 1}</th>'
                f"{''.join(cells)}</tr>"
            )
    none_id = f"{uid}-remove-none"
    return (
        '<fieldset class="mhbook-viewer-ablation-panel">'
        "<legend>Remove one head (the ablation of chapter 7)</legend>"
        f'<p class="mhbook-viewer-note"><input type="radio" name="{uid}-remove" id="{none_id}" '
        f'value="-1"{" checked" if remove < 0 else ""}>'
        f'<label for="{none_id}">keep every head</label>. Each head below: the drop in '
        f"exact match (points, over the {len(payload['numbers']):,} {payload['split']} numbers) "
        "and the rise of the test loss when it alone is removed. Arrow keys move between "
        "heads.</p>"
        '<table class="mhbook-viewer-table"><thead><tr><th scope="col">layer</th>'
        f"{head_cols}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        "</fieldset>"
    )


def _colour_bar(uid: str) -> str:
    lut = colour_table()
    stops = "".join(
        f'<stop offset="{k / 10:.1f}" stop-color="{lut[round(k * 10)]}"/>' for k in range(11)
    )
    ticks = "".join(
        f'<text x="{10 + 220 * v:.0f}" y="36" text-anchor="middle" font-size="11">{v:g}</text>'
        for v in (0.0, 0.25, 0.5, 0.75, 1.0)
    )
    return (
        f'<svg class="mhbook-viewer-scale" width="240" height="40" viewBox="0 0 240 40" '
        'role="img" aria-label="colour scale of the attention weights, from 0 (white) to '
        '1 (dark red)" font-family="DejaVu Sans, Arial, sans-serif">'
        f'<defs><linearGradient id="{uid}-bar" x1="0" y1="0" x2="1" y2="0">{stops}'
        "</linearGradient></defs>"
        f'<rect x="10" y="4" width="220" height="14" fill="url(#{uid}-bar)" stroke="#333" '
        f'stroke-width="0.5"/>{ticks}</svg>'
    )


def _head_index(view_or_payload, remove) -> int:
    """``remove`` as an index into the viewer's heads: -1 for None."""
    if remove is None:
        return -1
    name, i = remove
    heads = [(h["name"], h["head"]) for h in view_or_payload["heads"]]
    if (name, i) not in heads:
        raise ValueError(f"remove must be (layer name, head index) of one of {heads}, got {remove}")
    return heads.index((name, i))


def attention_viewer_html(
    view: ViewerData,
    number: int | None = None,
    kind: str = "cross-attention",
    layer: int | None = None,
    head: int | None = None,
    remove: tuple[str, int] | None = None,
    ablation_first: bool = False,
):
    """The viewer as self-contained HTML and JavaScript: no kernel, no download.

    Type or pick a number of the split; choose the kind of attention, a layer (or all) and a
    head (or all); the maps show the weights (rows: queries, columns: keys, each labelled
    with its token) on one colour scale from 0 to 1. Choose a head to remove: the viewer
    says what removing it costs on the whole split (exact match, loss) and how the chosen
    number is translated without it, and lists the numbers whose translation it changes.

    Elements a test can use (``{id}`` is the root's id, ``mhbook-viewer-1``, ... in a fresh
    kernel): the root ``div.mhbook-explorer.mhbook-viewer`` (``data-ready="true"`` once the
    data is unpacked and drawn), its data ``script.mhbook-explorer-data``
    (``viewer_payload``), ``input#{id}-number``, ``select#{id}-pick`` (values: indices
    into the split), ``select#{id}-kind`` (0, 1, 2), ``select#{id}-layer`` and
    ``select#{id}-head`` (``all`` or 0, 1, ...), the radio buttons ``input[name={id}-remove]``
    (value -1 or a head index), ``.mhbook-viewer-sentence`` and ``.mhbook-viewer-effect``
    (text), and one ``svg.mhbook-viewer-map`` per map drawn, with ``data-index``,
    ``data-kind``, ``data-layer``, ``data-head`` and ``data-weights`` (rounded to 4 decimals).

    Args:
        view: from ``viewer_data``.
        number: the number shown first (default: the smallest of the split).
        kind: the kind shown first, one of the names in ``KINDS``.
        layer, head: shown first, 0-based; ``None`` = all.
        remove: the head removed first, ``(layer name, head index)``, or ``None``.
        ablation_first: put the ablation panel above the maps (chapter 7).

    Returns:
        An ``IPython.display.HTML`` object (its ``data`` attribute is the HTML string).
    """
    from IPython.display import HTML

    kinds = [k.name for k in KINDS]
    if kind not in kinds:
        raise ValueError(f"kind must be one of {kinds}, got {kind!r}")
    for name, value, size in [("layer", layer, view.num_layers), ("head", head, view.num_heads)]:
        if value is not None and not 0 <= value < size:
            raise ValueError(f"{name} must be None or in [0, {size}), got {value}")
    order = sorted(range(len(view)), key=lambda n: view.numbers[n])
    if number is None:
        number = view.numbers[order[0]]
    if number not in view.numbers:
        raise ValueError(f"number {number} is not in the {view.split} split")
    index = view.numbers.index(number)
    payload = viewer_payload(view)
    remove_index = _head_index(payload, remove)
    uid = f"mhbook-viewer-{next(_viewer_ids)}"
    payload["initial"] = {
        "index": index,
        "kind": kinds.index(kind),
        "layer": -1 if layer is None else layer,
        "head": -1 if head is None else head,
        "remove": remove_index,
    }
    e = html.escape
    datalist = "".join(f'<option value="{view.numbers[n]}">' for n in order)
    picks = [(str(n), f"{_format_number(view.numbers[n])}: {view.english[n]}") for n in order]
    controls = (
        '<div class="mhbook-viewer-controls">'
        f'<label class="mhbook-viewer-field" for="{uid}-number">type a {e(view.split)} number '
        f'<input id="{uid}-number" class="mhbook-viewer-number" type="text" inputmode="numeric" '
        f'list="{uid}-numbers" autocomplete="off" size="9" value="{number}"></label>'
        f'<datalist id="{uid}-numbers">{datalist}</datalist>'
        + select(uid, "pick", "or pick one", picks, str(index))
        + '<span class="mhbook-viewer-hint" aria-live="polite"></span></div>'
        '<div class="mhbook-viewer-controls">'
        + select(
            uid,
            "kind",
            "attention",
            [(str(k), n) for k, n in enumerate(kinds)],
            str(kinds.index(kind)),
        )
        + select(
            uid,
            "layer",
            "layer",
            [("all", "all layers")] + [(str(i), f"{i + 1}") for i in range(view.num_layers)],
            "all" if layer is None else str(layer),
        )
        + select(
            uid,
            "head",
            "head",
            [("all", "all heads")] + [(str(i), f"{i + 1}") for i in range(view.num_heads)],
            "all" if head is None else str(head),
        )
        + "</div>"
    )
    maps = (
        '<p class="mhbook-viewer-sentence" aria-live="polite"></p>'
        f'<div class="mhbook-viewer-maps" id="{uid}-maps">'
        '<p class="mhbook-viewer-loading">Unpacking the attention weights&hellip; '
        "(this needs JavaScript and a browser with DecompressionStream)</p></div>"
        f'<div class="mhbook-viewer-legend">weight {_colour_bar(uid)}</div>'
    )
    ablation = (
        _ablation_table(uid, payload, remove_index)
        + '<p class="mhbook-viewer-effect" aria-live="polite"></p>'
        '<div class="mhbook-viewer-broken"></div>'
    )
    parts = [controls, ablation, maps] if ablation_first else [controls, maps, ablation]
    body = f"<style>{static_text('viewer.css')}</style>" + "".join(parts)
    html_text = embed(uid, body, ["heatmap.js", "viewer.js"], payload)
    return HTML(
        html_text.replace('class="mhbook-explorer"', 'class="mhbook-explorer mhbook-viewer"', 1)
    )


# ------------------------------------------------------------------------------ ipywidgets


def attention_viewer(view: ViewerData):
    """The viewer as ipywidgets (needs a running kernel, e.g. Jupyter or Colab).

    A combobox to type a number (with completion) and menus for the kind of attention and
    the head to remove; the grid of every layer and head of that kind is redrawn with
    :func:`mhbook.viz.plot.plot_attention_grid` (the weights of the full model), with the
    translation with and without the removed head above it.

    Returns:
        An ``ipywidgets.VBox``; its ``state`` attribute holds what is shown:
        ``{"index", "kind", "remove"}``.

    Raises:
        ImportError: If ipywidgets is not installed (``pip install ipywidgets``).
    """
    widgets = widget_modules("attention_viewer")

    from ..plot import plot_attention_grid

    heads = view.heads
    by_number = {str(n): i for i, n in enumerate(view.numbers)}
    number = widgets.Combobox(
        options=sorted(by_number, key=int),
        value=str(min(view.numbers)),
        description=f"{view.split} number",
        ensure_option=True,
        style={"description_width": "initial"},
    )
    kind = widgets.Dropdown(
        options=[(k.name, i) for i, k in enumerate(KINDS)], value=2, description="attention"
    )
    remove = widgets.Dropdown(
        options=[("keep every head", -1)]
        + [
            (
                f"{KINDS[j // (view.num_layers * view.num_heads)].name}, layer "
                f"{(j // view.num_heads) % view.num_layers + 1}, head {j % view.num_heads + 1}",
                j,
            )
            for j in range(len(heads))
        ],
        value=-1,
        description="remove",
    )
    text = widgets.HTML()
    out = widgets.Output()
    box = widgets.VBox([widgets.HBox([number, kind, remove]), text, out])
    box.state = {}

    def draw():
        if number.value not in by_number:
            return  # still typing
        n, k, j = by_number[number.value], kind.value, remove.value
        box.state = {"index": n, "kind": k, "remove": j}
        lines = [
            f"<b>{html.escape(view.english[n])}</b> &rarr; {html.escape(view.translation[n])} "
            f"({'right' if view.translation[n] == view.reference[n] else 'wrong'})"
        ]
        if j >= 0:
            fr = view.head_translation[heads[j]][n]
            lines.append(
                f"without {html.escape(remove.label)}: {html.escape(fr)} "
                f"({'right' if fr == view.reference[n] else 'wrong'}); on the whole split: "
                f"exact match {100 * view.exact:.1f}% &rarr; "
                f"{100 * view.head_exact(heads[j]):.1f}%,"
                f" loss {view.loss:.3f} &rarr; {view.head_loss[heads[j]]:.3f}"
            )
        text.value = "<br>".join(lines)
        rows, cols = {
            0: (view.src_tokens[n], view.src_tokens[n]),
            1: (view.tgt_in_tokens(n), view.tgt_in_tokens(n)),
            2: (view.out_tokens[n], view.src_tokens[n]),
        }[k]
        maps = [view.weights[n][layer_name(k, layer)] for layer in range(view.num_layers)]
        fig = plot_attention_grid(
            maps,
            rows,
            cols,
            title=f"{KINDS[k].name}: {view.english[n]}",
            xlabel=KINDS[k].keys,
            ylabel=KINDS[k].queries,
            vmin=0.0,
            vmax=1.0,
        )
        return fig

    redraw_on((number, kind, remove), out, draw)
    return box
