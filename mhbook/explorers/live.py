"""The live translator: the book's trained Transformer running in the reader's browser.

The explorers of Parts I and II move sliders over hand-set matrices, and the viewer shows the
trained model's attention on the 1,000 test numbers computed in advance. This panel lets the
reader give the trained model an input of their own: a number from 0 to 999,999, in digits or
in English words, translated greedily by a forward pass written in plain JavaScript
(``static/live.js``), one function per piece named as in ``mhbook``, with the KV cache, step
by step if the reader wants, and every head's attention drawn.

Chapter 6 calls :func:`export_translator` on the model it trained, which writes the weights
(float16 on the wire, computed in float32 in the browser) and the vocabularies to a JSON file
beside the chapter; the book build copies it into the HTML book (``_ext/mhbook_sphinx.py``),
and the panel fetches it when the reader opens it. :func:`shipped_model` builds the PyTorch
model of exactly those weights, which the browser test compares with the JavaScript forward
(``tests/test_browser.py``).

The choice of a plain JavaScript forward over ``onnxruntime-web`` is recorded in CONTRIBUTING.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from ..config import ModelConfig
from ..data import NumberTranslation
from ..transformer import Transformer
from .svg import colour_scale, embed

__all__ = ["LIVE_FILE", "live_path", "export_translator", "shipped_model", "live_translator_html"]

#: Where chapter 6 writes the weights, relative to the chapter, and where the book serves them.
LIVE_FILE = "live/translator.json"
MAX_NUMBER = 999_999
_CONFIG_FIELDS = ("d_model", "num_heads", "num_layers", "d_ff", "norm_eps", "scale_embeddings")


def _check_supported(config: ModelConfig) -> None:
    """The JavaScript forward implements the book's translator: post-norm LayerNorm, ReLU,
    biases, sinusoidal positions, multi-head attention. Anything else is refused by name."""
    wanted = {
        "norm_first": False,
        "norm": "layer",
        "ffn": "relu",
        "position": "sinusoidal",
        "num_kv_heads": None,
        "d_latent": None,
        "window": None,
        "head_dim": None,
        "tie_embeddings": False,
    }
    wrong = {f: getattr(config, f) for f, v in wanted.items() if getattr(config, f) != v}
    if config.num_kv_heads == config.num_heads:
        wrong.pop("num_kv_heads", None)
    if config.bias is False:
        wrong["bias"] = False
    if wrong:
        raise ValueError(
            "the live translator's JavaScript runs the book's Transformer (post-norm LayerNorm, "
            f"ReLU, biases, sinusoidal positions, multi-head attention); not {wrong}"
        )


def live_path() -> Path:
    """Where :func:`export_translator` writes by default: :data:`LIVE_FILE` below the folder
    ``$MHBOOK_LIVE_DIR`` names, else below the current folder (a chapter's). The chapters'
    nbval run sets ``MHBOOK_LIVE_DIR`` (``chapters/conftest.py``), so that testing chapter 6
    never rewrites the committed file, which is the committed run's."""
    return Path(os.environ.get("MHBOOK_LIVE_DIR") or ".") / LIVE_FILE


def export_translator(
    model: Transformer,
    data: NumberTranslation,
    path: str | os.PathLike | None = None,
    max_new_tokens: int = 40,
) -> dict:
    """Write ``model``'s weights and ``data``'s vocabularies for the live panel, to ``path``
    (default :func:`live_path`).

    Every tensor of ``model.state_dict()`` is stored as little-endian float16 in base64
    (``{"shape", "data"}``); the config fields the forward needs, both vocabularies and the
    special ids go beside them.

    Returns:
        ``{"path", "bytes", "sha256", "parameters", "max_rounding"}``: ``max_rounding`` is the
        largest ``|float16(w) - w|`` over all weights.
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a mhbook.Transformer, got {type(model).__name__}")
    _check_supported(model.config)
    tensors, parameters, rounding = {}, 0, 0.0
    for name, tensor in model.state_dict().items():
        values = tensor.detach().to("cpu", torch.float32).numpy()
        half = values.astype("<f2")
        rounding = max(rounding, float(np.abs(half.astype(np.float32) - values).max()))
        tensors[name] = {
            "shape": list(values.shape),
            "data": base64.b64encode(half.tobytes()).decode("ascii"),
        }
        parameters += values.size
    src, tgt = data.src_vocab, data.tgt_vocab
    payload = {
        "format": 1,
        "config": {f: getattr(model.config, f) for f in _CONFIG_FIELDS},
        "src_vocab": list(src.id_to_token),
        "tgt_vocab": list(tgt.id_to_token),
        "specials": {"bos": tgt.bos_id, "eos": tgt.eos_id, "pad": tgt.pad_id},
        "max_new_tokens": max_new_tokens,
        "tensors": tensors,
    }
    if src.eos_id != tgt.eos_id:
        raise ValueError(f"the vocabularies' <eos> ids differ: {src.eos_id} and {tgt.eos_id}")
    text = json.dumps(payload, separators=(",", ":"))
    path = live_path() if path is None else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="ascii")
    return {
        "path": str(path),
        "bytes": len(text),
        "sha256": hashlib.sha256(text.encode("ascii")).hexdigest(),
        "parameters": parameters,
        "max_rounding": rounding,
    }


def shipped_model(path: str | os.PathLike) -> tuple[Transformer, dict]:
    """The PyTorch model of exactly the weights in ``path`` (float16 widened to float32), in
    eval mode, and the file's JSON (vocabularies, special ids) without the tensors."""
    payload = json.loads(Path(path).read_text(encoding="ascii"))
    if payload.get("format") != 1:
        raise ValueError(f"{path} is not a live translator file of format 1")
    config = ModelConfig(**payload["config"])
    model = Transformer(config, len(payload["src_vocab"]), len(payload["tgt_vocab"]))
    state = {}
    for name, tensor in payload.pop("tensors").items():
        half = np.frombuffer(base64.b64decode(tensor["data"]), dtype="<f2")
        state[name] = torch.from_numpy(half.astype(np.float32).reshape(tensor["shape"]))
    model.load_state_dict(state)
    return model.eval(), payload


def live_translator_html(url: str = f"../_static/{LIVE_FILE}", example: str = "71") -> str:
    """The live panel's HTML, with its JavaScript: a folded ``<details>`` that loads the
    weights from ``url`` when the reader opens it. ``window.mhbookLive`` holds its API:
    ``translate(text)``, ``logits(srcIds, tgtIds)``, ``numberToWords(n)``, and ``complete``
    for the language model of Part V (which rejects until that part exists).

    Returns:
        An ``IPython.display.HTML`` object (its ``data`` attribute is the HTML string).
    """
    from IPython.display import HTML

    uid = "mhbook-live-" + hashlib.sha1(url.encode()).hexdigest()[:8]
    body = f"""
<details class="mhbook-live">
  <summary>Try the trained model: type a number and watch every head translate it</summary>
  <div class="mhbook-live-body">
    <p class="mhbook-live-status" role="status" aria-live="polite">Open to load the weights.</p>
    <form class="mhbook-live-form">
      <label for="{uid}-input">A number from 0 to 999,999, in digits or English words</label>
      <input id="{uid}-input" class="mhbook-live-input" type="text" value="{example}"
        autocomplete="off" spellcheck="false">
      <button type="submit">Translate</button>
      <button type="button" class="mhbook-live-step">Step</button>
      <button type="button" class="mhbook-live-reset">Start over</button>
    </form>
    <p class="mhbook-live-error" role="alert" hidden></p>
    <p>English: <span class="mhbook-live-english"></span></p>
    <p>French: <output class="mhbook-live-french" for="{uid}-input"></output></p>
    <table class="mhbook-live-cache">
      <caption>The KV cache, step by step (float32 numbers held by all decoder layers)</caption>
      <thead><tr><th scope="col">step</th><th scope="col">fed</th><th scope="col">wrote</th>
        <th scope="col">French tokens cached per layer</th>
        <th scope="col">English tokens cached per layer (cross)</th>
        <th scope="col">bytes</th></tr></thead>
      <tbody></tbody>
    </table>
    <div class="mhbook-live-maps"></div>
  </div>
</details>"""
    data = {"url": url, "scale": colour_scale(), "maxNumber": MAX_NUMBER}
    return HTML(embed(uid, body, ["live.js"], data, css=["explorer.css", "live.css"]))
