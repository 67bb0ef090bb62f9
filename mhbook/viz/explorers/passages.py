"""The passage explorer: a language model's heads on a few text passages, without a kernel.

:func:`mhbook.viz.attention_records.passage_attention` runs a decoder-only model on
``P`` passages of ``T`` tokens and returns the weights of its ``L`` layers and ``H`` heads,
``(P, L, H, T, T)``; this module only shows them. ``passage_explorer_html`` writes
self-contained HTML and JavaScript (``static/passages.js``) for the static book: pick a
passage, a layer and a head, and point at a token (hover it, or move to it with Tab and the
arrow keys): it becomes the query, and every token before it is shaded by the weight it
receives. A row of small maps shows every head of the layer at once; clicking one picks it.

The weights travel as the attention viewer's do (:mod:`mhbook.viz.explorers.viewer`): quantised
to ``uint8`` (``round(255 w)``, within ``1/510``), deflated and base64-encoded.
``passage_payload`` builds that data and ``passage_payload_weights`` decodes it again, the
way the JavaScript does, for the tests. Size: ``P L H T^2`` bytes before deflating; 4
passages of 256 characters and 6 layers of 6 heads (9.4 MB) made 1.7 MB of page with random
weights, written in 2 s.
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from ..colours import COLOURMAP
from .svg import colour_scale, colour_table, embed
from .viewer import pack, quantise, select, unpack

__all__ = [
    "GLYPHS",
    "token_glyphs",
    "passage_payload",
    "passage_payload_weights",
    "passage_explorer_html",
]

_ids = itertools.count(1)  # deterministic ids: a fresh kernel prints the same HTML

#: How the explorer writes characters that would not show: a space, a newline, a tab.
GLYPHS = {" ": "\u2423", "\n": "\u21b5", "\t": "\u21e5"}


def token_glyphs(token: str) -> str:
    """A token as the explorer shows it: ``" "`` -> ``"␣"``, ``"\\n"`` -> ``"↵"``, tab -> ``"⇥"``.
    (A token holding a newline also ends its line in the page.)"""
    return "".join(GLYPHS.get(c, c) for c in token)


def _contrast_text(lut: Sequence[str]) -> list[str]:
    """Black or white on each colour of ``lut``: whichever contrasts more (WCAG 2), so that
    text on any shade of the book's map reaches 4.5:1."""
    from matplotlib.colors import to_rgb

    def luminance(colour: str) -> float:
        c = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in to_rgb(colour)]
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]

    # (L + 0.05) / 0.05 against black, 1.05 / (L + 0.05) against white
    return ["black" if (luminance(c) + 0.05) ** 2 > 0.0525 else "white" for c in lut]


def _check(tokens: Sequence[Sequence[str]], weights) -> np.ndarray:
    """``weights`` as a ``(P, L, H, T, T)`` array that fits ``tokens``, else ValueError."""
    if not tokens:
        raise ValueError("the explorer needs at least one passage of tokens, got none")
    lengths = [len(t) for t in tokens]
    if len(set(lengths)) != 1 or lengths[0] == 0:
        raise ValueError(f"every passage needs the same number T > 0 of tokens, got {lengths}")
    weights = np.asarray(weights)
    P, T = len(tokens), lengths[0]
    if weights.ndim != 5 or weights.shape[0] != P or weights.shape[3:] != (T, T):
        raise ValueError(
            f"weights must have shape (P, L, H, T, T) = ({P}, L, H, {T}, {T}) for {P} "
            f"passages of {T} tokens, got {weights.shape}"
        )
    return weights


def passage_payload(tokens: Sequence[Sequence[str]], weights) -> dict:
    """The JSON the JavaScript gets.

    Args:
        tokens: ``P`` lists of ``T`` token strings (characters, for a character model).
        weights: ``(P, L, H, T, T)``, from ``passage_attention``.

    Returns:
        ``{"tokens", "numPassages", "numLayers", "numHeads", "length", "glyphs", "scale",
        "weights"}``: ``weights`` is the ``uint8`` weights (``quantise``) in C order,
        passage by passage, layer by layer, head by head, query by query (byte
        ``(((p L + l) H + h) T + q) T + k``), deflated and base64-encoded; ``scale`` is
        ``colour_scale()`` with ``text``, black or white per colour. Decode the weights with
        ``passage_payload_weights``.
    """
    weights = _check(tokens, weights)
    P, L, H, T, _ = weights.shape
    scale = colour_scale()
    scale["text"] = _contrast_text(scale["colours"])
    return {
        "tokens": [[str(t) for t in passage] for passage in tokens],
        "numPassages": P,
        "numLayers": L,
        "numHeads": H,
        "length": T,
        "glyphs": GLYPHS,
        "scale": scale,
        "weights": pack(quantise(weights).tobytes(), level=6),
    }


def passage_payload_weights(payload: dict) -> np.ndarray:
    """The weights of ``passage_payload``, unpacked as the JavaScript reads them:
    ``(P, L, H, T, T)`` ``uint8`` (divide by 255 for the weights)."""
    raw = np.frombuffer(unpack(payload["weights"]), dtype=np.uint8)
    shape = tuple(payload[k] for k in ("numPassages", "numLayers", "numHeads", "length"))
    shape += (payload["length"],)
    if raw.size != np.prod(shape):
        raise ValueError(f"the weights hold {raw.size} bytes, the shape {shape} needs more")
    return raw.reshape(shape)


def _passage_name(i: int, passage: Sequence[str], width: int = 40) -> str:
    text = " / ".join(line.strip() for line in "".join(passage).splitlines() if line.strip())
    return f"{i + 1}: {text[:width]}{'…' if len(text) > width else ''}"


def _colour_bar(uid: str) -> str:
    """A horizontal colour bar from 0 to the row's largest weight (``passages.js`` writes it)."""
    lut = colour_table(COLOURMAP)
    stops = "".join(f'<stop offset="{k / 10:.1f}" stop-color="{lut[k * 10]}"/>' for k in range(11))
    return (
        '<svg class="mhbook-passages-scale" width="240" height="40" viewBox="0 0 240 40" '
        'role="img" aria-label="colour scale: white is 0, dark red the largest weight of the '
        'query" font-family="DejaVu Sans, Arial, sans-serif" font-size="11">'
        f'<defs><linearGradient id="{uid}-bar" x1="0" y1="0" x2="1" y2="0">{stops}'
        "</linearGradient></defs>"
        f'<rect x="10" y="4" width="220" height="14" fill="url(#{uid}-bar)" stroke="#333" '
        'stroke-width="0.5"/><text x="10" y="34">0</text>'
        '<text class="mhbook-passages-max" x="230" y="34" text-anchor="end">1</text></svg>'
    )


def passage_explorer_html(
    tokens: Sequence[Sequence[str]],
    weights,
    *,
    title: str,
    head_labels: Mapping[tuple[int, int], str] | None = None,
    caption: str | None = None,
    passage: int = 0,
    layer: int = 0,
    head: int = 0,
):
    """The passage explorer as self-contained HTML and JavaScript: no kernel, no download.

    The reader picks a passage, a layer and a head (menus), and sees the passage one box
    per token (a space shown as ``␣``, a newline as ``↵`` and a line break). Hovering a
    token, or moving to it (Tab into the passage, then the arrow keys, Home and End), makes
    it the query: every token up to it is shaded by the weight it receives from the query,
    on the book's colour map from 0 to the largest of them (the colour bar says how much
    that is), and that largest one is outlined. Below, a small map (queries x keys, 0 to 1)
    of every head of the layer; clicking one (or Enter on it) picks that head.

    Elements a test can use (``{id}`` is the root's id, ``mhbook-passages-1``, ... in a fresh
    kernel): the root ``div.mhbook-explorer.mhbook-passages`` (``data-ready="true"`` once
    drawn; ``data-passage``, ``data-layer``, ``data-head``, ``data-query`` say what is
    shown), its data ``script.mhbook-explorer-data`` (``passage_payload``), the menus
    ``select#{id}-passage``, ``#{id}-layer`` and ``#{id}-head`` (values 0, 1, ...), one
    ``span.mhbook-passages-token`` per token (``data-t``; ``data-weight``, the weight from
    the query rounded to 4 decimals, on tokens up to the query, absent after it; the class
    ``mhbook-passages-query`` and ``mhbook-passages-argmax``), ``.mhbook-passages-readout``
    (text), and one ``button.mhbook-passages-thumb`` per head (``data-head``,
    ``aria-pressed``).

    Args:
        tokens: ``P`` lists of ``T`` token strings.
        weights: ``(P, L, H, T, T)``, from ``passage_attention``.
        title: shown above the explorer, and its accessible name.
        head_labels: ``{(layer, head): label}`` (0-based) for heads worth a name, e.g.
            ``{(0, 2): "previous token"}``; shown in the menu and under the small maps.
        caption: a sentence under the title.
        passage, layer, head: shown first (0-based).

    Returns:
        An ``IPython.display.HTML`` object (its ``data`` attribute is the HTML string).
    """
    from IPython.display import HTML

    weights = _check(tokens, weights)
    P, L, H, T, _ = weights.shape
    for name, value, size in [("passage", passage, P), ("layer", layer, L), ("head", head, H)]:
        if not 0 <= value < size:
            raise ValueError(f"{name} must be in [0, {size}), got {value}")
    labels = dict(head_labels or {})
    for key in labels:
        if not (isinstance(key, tuple) and len(key) == 2 and 0 <= key[0] < L and 0 <= key[1] < H):
            raise ValueError(
                f"head_labels keys must be (layer, head) with layer < {L} and "
                f"head < {H}, 0-based; got {key!r}"
            )
    payload = passage_payload(tokens, weights)
    payload["headLabels"] = [[labels.get((i, h), "") for h in range(H)] for i in range(L)]
    payload["initial"] = {"passage": passage, "layer": layer, "head": head}
    uid = f"mhbook-passages-{next(_ids)}"
    e = html.escape

    def head_name(h: int) -> str:
        return f"{h + 1}: {labels[layer, h]}" if (layer, h) in labels else str(h + 1)

    controls = (
        '<div class="mhbook-viewer-controls">'
        + select(
            uid,
            "passage",
            "passage",
            [(str(i), _passage_name(i, t)) for i, t in enumerate(tokens)],
            str(passage),
        )
        + select(uid, "layer", "layer", [(str(i), str(i + 1)) for i in range(L)], str(layer))
        + select(uid, "head", "head", [(str(h), head_name(h)) for h in range(H)], str(head))
        + "</div>"
    )
    body = (
        f'<p class="mhbook-passages-title" id="{uid}-title">{e(title)}</p>'
        + (f'<p class="mhbook-passages-caption">{e(caption)}</p>' if caption else "")
        + controls
        + f'<div class="mhbook-passages-text" id="{uid}-text" role="listbox" '
        f'aria-labelledby="{uid}-title" aria-describedby="{uid}-help">'
        '<span class="mhbook-passages-loading">Unpacking the attention weights&hellip; '
        "(this needs JavaScript and a browser with DecompressionStream)</span></div>"
        f'<p class="mhbook-passages-help" id="{uid}-help">Hover a token, or Tab into the '
        "passage and move with the arrow keys, Home and End: it becomes the query, and each "
        "token up to it is shaded by the weight it gets; the largest is outlined.</p>"
        f'<div class="mhbook-viewer-legend">weight {_colour_bar(uid)}'
        '<p class="mhbook-passages-readout" aria-live="polite"></p></div>'
        f'<div class="mhbook-passages-thumbs" role="group" aria-label="every head of the '
        'layer: queries down, keys across, 0 to 1; pick one"></div>'
    )
    html_text = embed(
        uid, body, ["passages.js"], payload, css=["explorer.css", "viewer.css", "passages.css"]
    )
    return HTML(
        html_text.replace('class="mhbook-explorer"', 'class="mhbook-explorer mhbook-passages"', 1)
    )
