"""The attention viewer of chapters 6 and 7: the trained model's attention on every test number.

``viewer_data`` runs the book's model over a whole split (the 1,000 test numbers) once
and keeps, for every number:

* the English tokens and the model's own greedy translation (its French tokens);
* the attention weights of every layer, every head and the three kinds of attention
  (encoder self-attention, decoder self-attention, cross-attention), recorded with
  :func:`mhbook.record_attention` in one teacher-forced pass on the model's *own* output
  tokens: the decoder reads ``<bos>`` and the tokens it generated, so the weights are those
  it used while translating (not those of the reference translation);
* for every single head removed (its ``head_mask`` entry set to 0, as in chapter 7), the
  greedy translation without that head,

and, per head, the teacher-forced loss of the split (on the reference translations) with
that head removed. Two views show it:

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ..data import detokenize, tokenize
from ..transformer import record_attention
from .svg import _static, colour_scale, colour_table, embed
from .twin import widget_modules

__all__ = [
    "KINDS",
    "ViewerData",
    "viewer_data",
    "viewer_payload",
    "payload_weights",
    "payload_text",
    "attention_viewer_html",
    "attention_viewer",
]


class Kind(NamedTuple):
    """One kind of attention: its name, where its layers are, and what its axes hold."""

    name: str  # e.g. "cross-attention"
    stack: str  # "encoder" or "decoder"
    attr: str  # the attribute of a block: "self_attn" or "cross_attn"
    queries: str  # what the rows (queries) are
    keys: str  # what the columns (keys) are


#: The three kinds of attention of the encoder-decoder Transformer, in the viewer's order.
KINDS = (
    Kind("encoder self-attention", "encoder", "self_attn", "English (queries)", "English (keys)"),
    Kind(
        "decoder self-attention",
        "decoder",
        "self_attn",
        "French read (queries)",
        "French read (keys)",
    ),
    Kind("cross-attention", "decoder", "cross_attn", "French predicted", "English (keys)"),
)

_viewer_ids = itertools.count(1)  # deterministic ids: a fresh kernel prints the same HTML


def layer_name(kind: int, layer: int) -> str:
    """The module name of layer ``layer`` (0-based) of ``KINDS[kind]``, e.g.
    ``"decoder.blocks.1.cross_attn"``, as :func:`mhbook.record_attention` names it."""
    k = KINDS[kind]
    return f"{k.stack}.blocks.{layer}.{k.attr}"


def quantise(weights) -> np.ndarray:
    """Attention weights in ``[0, 1]`` -> ``uint8`` ``round(255 w)``; ``q / 255`` is within
    ``1/510`` of ``w``."""
    w = np.asarray(weights, dtype=np.float64)
    return np.rint(np.clip(w, 0.0, 1.0) * 255).astype(np.uint8)


@dataclass
class ViewerData:
    """What ``viewer_data`` recorded for every number of a split.

    Per number ``n`` (lists in the split's order): ``english[n]``, ``reference[n]`` and the
    model's greedy ``translation[n]`` (strings); ``src_tokens[n]``, the ``S`` English tokens
    with ``<eos>``; ``out_tokens[n]``, the ``T`` French tokens the model generated, ending
    with ``<eos>`` (what the decoder *predicts*; it *reads* ``tgt_in_tokens``);
    ``weights[n]``, ``{layer name: (num_heads, Lq, Lk) float32}`` for the six attention
    layers, with ``(Lq, Lk)`` = ``(S, S)``, ``(T, T)`` or ``(T, S)`` by kind.

    Per head ``(layer name, i)`` (``i`` from 0): ``head_loss``, the teacher-forced loss of
    the split (reference translations) without that head, and ``head_translation``, the
    greedy translations of every number without it. ``loss`` is the loss with all heads.
    """

    split: str
    numbers: list[int]
    english: list[str]
    reference: list[str]
    translation: list[str]
    src_tokens: list[list[str]]
    out_tokens: list[list[str]]
    weights: list[dict[str, np.ndarray]]
    num_layers: int
    num_heads: int
    loss: float
    head_loss: dict[tuple[str, int], float]
    head_translation: dict[tuple[str, int], list[str]]

    def __len__(self) -> int:
        return len(self.numbers)

    @property
    def heads(self) -> list[tuple[str, int]]:
        """Every head as ``(layer name, i)``, kind by kind, layer by layer (the viewer's order)."""
        return [
            (layer_name(k, layer), i)
            for k in range(len(KINDS))
            for layer in range(self.num_layers)
            for i in range(self.num_heads)
        ]

    def tgt_in_tokens(self, n: int) -> list[str]:
        """The ``T`` French tokens the decoder reads for number ``n``: ``<bos>`` and its output."""
        return ["<bos>"] + self.out_tokens[n][:-1]

    @property
    def exact(self) -> float:
        """The fraction of the split the model translates exactly right."""
        return _exact(self.translation, self.reference)

    def head_exact(self, head: tuple[str, int]) -> float:
        """The fraction translated exactly right without ``head``."""
        return _exact(self.head_translation[head], self.reference)


def _exact(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    return sum(h == r for h, r in zip(hypotheses, references)) / max(1, len(references))


# ------------------------------------------------------------------------------ recording


def _attention_layers(model) -> dict[str, torch.nn.Module]:
    layers = {}
    for k in range(len(KINDS)):
        for layer in range(len(model.encoder.blocks)):
            name = layer_name(k, layer)
            layers[name] = model.get_submodule(name)
    return layers


def _greedy_ids(model, data, english, device, max_len, batch_size) -> list[list[int]]:
    """The generated French ids of each sentence, up to and with its first ``<eos>``."""
    eos = data.tgt_vocab.eos_id
    out = []
    for start in range(0, len(english), batch_size):
        src, lens = data.encode_source(english[start : start + batch_size], device)
        ids = model.greedy_decode(src, lens, data.tgt_vocab.bos_id, eos, max_len).tolist()
        out += [row[: row.index(eos) + 1] if eos in row else row for row in ids]
    return out


def _teacher_forced_weights(model, data, english, out_ids, device, batch_size):
    """``[{layer name: (h, Lq, Lk) float32}]``, one dict per sentence, on the given outputs."""
    bos, pad = data.tgt_vocab.bos_id, data.tgt_vocab.pad_id
    result = []
    for start in range(0, len(english), batch_size):
        chunk = english[start : start + batch_size]
        outs = out_ids[start : start + batch_size]
        src, src_lens = data.encode_source(chunk, device)
        T = max(len(o) for o in outs)
        tgt_in = torch.full((len(outs), T), pad, dtype=torch.long)
        for b, o in enumerate(outs):
            tgt_in[b, : len(o)] = torch.tensor([bos] + o[:-1], dtype=torch.long)
        with torch.no_grad(), record_attention(model) as recorded:
            model(src, tgt_in.to(device), src_lens)
        weights = {name: w.float().cpu().numpy() for name, w in recorded().items()}
        for b, o in enumerate(outs):
            S, T_b = int(src_lens[b]), len(o)
            sizes = {"encoder": (S, S), "self_attn": (T_b, T_b), "cross_attn": (T_b, S)}
            one = {}
            for name, w in weights.items():
                attr = name.rsplit(".", 1)[1]
                lq, lk = sizes["encoder"] if name.startswith("encoder") else sizes[attr]
                one[name] = np.ascontiguousarray(w[b, :, :lq, :lk])
            result.append(one)
    return result


def viewer_data(
    model,
    data,
    split: str = "test",
    batch_size: int = 500,
    max_len: int | None = None,
    num_threads: int | None = 1,
) -> ViewerData:
    """Record what the viewer shows, for every number of ``split`` (see ``ViewerData``).

    The weights come from one teacher-forced pass over the model's own greedy output. Each
    head is then removed in turn with ``head_mask``, as chapter 7 does: one teacher-forced
    pass for its loss (:func:`mhbook.train.valid_loss`) and one batched greedy decoding of
    the split. For the book's model and the 1,000 test numbers that is 25 passes and 25
    decodings, about 20 s on one CPU thread.

    Args:
        model: a trained :class:`mhbook.Transformer` (the book's model).
        data: its :class:`mhbook.data.NumberTranslation`.
        split: ``"test"`` (default), ``"valid"`` or ``"train"``.
        batch_size: sentences per batch.
        max_len: at most this many French tokens; default: the longest target plus 5.
        num_threads: on a CPU, run PyTorch on this many threads meanwhile (``None``: as it
            is). One thread, the default, as :func:`mhbook.train.fit` trains: small batches
            gain little from more, and threads that wait for a busy core lose a lot.
    """
    from ..train import cpu_threads, valid_loss  # here: explorers do not import training

    device = next(model.parameters()).device
    if max_len is None:
        max_len = data.max_target_len() + 5
    was_training = model.training
    model.eval()
    layers = _attention_layers(model)
    saved_masks = {name: layer.head_mask for name, layer in layers.items()}
    if any(m is not None for m in saved_masks.values()):
        raise ValueError("viewer_data needs a model with every head on (head_mask None)")
    num_layers = len(model.encoder.blocks)
    num_heads = next(iter(layers.values())).num_heads
    pairs = data.pairs(split)
    english = [en for en, _ in pairs]
    tgt_tokens = data.tgt_vocab.id_to_token
    with cpu_threads(num_threads if device.type == "cpu" else None):
        try:
            out_ids = _greedy_ids(model, data, english, device, max_len, batch_size)
            weights = _teacher_forced_weights(model, data, english, out_ids, device, batch_size)

            specials = {data.tgt_vocab.pad_id, data.tgt_vocab.bos_id, data.tgt_vocab.eos_id}

            def words(ids: list[int]) -> str:  # as data.translate writes them
                return detokenize(tgt_tokens[i] for i in ids if i not in specials)

            view = ViewerData(
                split=split,
                numbers=list(data.numbers[split]),
                english=english,
                reference=[fr for _, fr in pairs],
                translation=[words(o) for o in out_ids],
                src_tokens=[
                    data.src_vocab.decode(data.src_vocab.encode(tokenize(en))) + ["<eos>"]
                    for en in english
                ],
                out_tokens=[[tgt_tokens[i] for i in o] for o in out_ids],
                weights=weights,
                num_layers=num_layers,
                num_heads=num_heads,
                loss=valid_loss(model, data, split, batch_size),
                head_loss={},
                head_translation={},
            )
            for name, i in view.heads:  # remove one head at a time, as chapter 7 does
                mask = torch.ones(num_heads, device=device)
                mask[i] = 0.0
                layers[name].head_mask = mask
                view.head_loss[name, i] = valid_loss(model, data, split, batch_size)
                ablated = _greedy_ids(model, data, english, device, max_len, batch_size)
                view.head_translation[name, i] = [words(o) for o in ablated]
                layers[name].head_mask = None
        finally:
            for name, layer in layers.items():
                layer.head_mask = saved_masks[name]
            model.train(was_training)
    return view


# ------------------------------------------------------------------------------ the payload


def _pack(raw: bytes) -> str:
    """zlib (what ``DecompressionStream("deflate")`` reads), then base64."""
    return base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def _unpack(text: str) -> bytes:
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
        "text": _pack(json.dumps(text, ensure_ascii=False, separators=(",", ":")).encode()),
        "weights": _pack(b"".join(blobs)),
    }


def payload_text(payload: dict) -> dict:
    """The ``text`` blob of ``viewer_payload``, unpacked."""
    return json.loads(_unpack(payload["text"]).decode("utf-8"))


def payload_weights(payload: dict) -> list[dict[str, np.ndarray]]:
    """The weights of ``viewer_payload``, unpacked as the JavaScript reads them:
    ``[{layer name: (num_heads, Lq, Lk) uint8}]``, one dict per number."""
    raw = np.frombuffer(_unpack(payload["weights"]), dtype=np.uint8)
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


def _select(uid: str, name: str, label: str, options: list[tuple[str, str]], value: str) -> str:
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
        + _select(uid, "pick", "or pick one", picks, str(index))
        + '<span class="mhbook-viewer-hint" aria-live="polite"></span></div>'
        '<div class="mhbook-viewer-controls">'
        + _select(
            uid,
            "kind",
            "attention",
            [(str(k), n) for k, n in enumerate(kinds)],
            str(kinds.index(kind)),
        )
        + _select(
            uid,
            "layer",
            "layer",
            [("all", "all layers")] + [(str(i), f"{i + 1}") for i in range(view.num_layers)],
            "all" if layer is None else str(layer),
        )
        + _select(
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
    body = f"<style>{_static('viewer.css')}</style>" + "".join(parts)
    html_text = embed(uid, body, ["heatmap.js", "viewer.js"], payload)
    return HTML(
        html_text.replace('class="mhbook-explorer"', 'class="mhbook-explorer mhbook-viewer"', 1)
    )


# ------------------------------------------------------------------------------ ipywidgets


def attention_viewer(view: ViewerData):
    """The viewer as ipywidgets (needs a running kernel, e.g. Jupyter or Colab).

    A combobox to type a number (with completion) and menus for the kind of attention and
    the head to remove; the grid of every layer and head of that kind is redrawn with
    :func:`mhbook.plot.plot_attention_grid` (the weights of the full model), with the
    translation with and without the removed head above it.

    Returns:
        An ``ipywidgets.VBox``; its ``state`` attribute holds what is shown:
        ``{"index", "kind", "remove"}``.

    Raises:
        ImportError: If ipywidgets is not installed (``pip install ipywidgets``).
    """
    widgets, display = widget_modules("attention_viewer")
    import matplotlib.pyplot as plt

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

    def redraw(*_):
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
        with out:
            out.clear_output(wait=True)
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
            display(fig)
            plt.close(fig)

    for w in (number, kind, remove):
        w.observe(redraw, names="value")
    redraw()
    return box
