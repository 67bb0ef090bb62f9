"""The live panels: the book's trained models running in the reader's browser, no kernel.

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
(``tests/book/test_browser_panels.py``).

Part V's language model runs live the same way (chapter 14): :func:`export_lm` writes the small
Llama's weights and its 65 characters (:data:`LIVE_LM_FILE`), :func:`shipped_lm` is the PyTorch
model of exactly those weights, and :func:`live_lm_html` is the panel, whose plain JavaScript
forward (``static/live_lm.js``: ``rmsNorm``, ``swiglu``, ``rope``, ``attention`` with grouped-query
heads and the rolling KV cache of the sliding window, ``decoderOnlyBlock``, ``decoderOnlyLM``)
continues the reader's prompt, sampled at a temperature from a seeded generator (the panel
opens on 0.8 and seed 0, as chapter 14 samples, since greedy decoding loops) or greedily,
character by character, with the attention of the last character drawn
(``tests/viz/test_browser_live_lm.py`` compares it with PyTorch). What both panels share (the
weights' loading, ``linear``, ``softmax``, ``argmax``, attention head by head, ``addNorm`` as
:class:`~mhbook.AddNorm` with ``norm_first``, the cache's bytes, the heatmap, the load on open
and the console API) is ``static/live_core.js``. Each panel's HTML is a template in ``static/``
(``live.html``, ``live_lm.html``), filled by ``string.Template`` with HTML-escaped values.

The choice of a plain JavaScript forward over ``onnxruntime-web`` is recorded in CONTRIBUTING.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
from importlib import resources
from pathlib import Path
from string import Template

import numpy as np
import torch

from ...core.config import LLAMA_SHAPE, ModelConfig
from ...models.lm import DecoderOnlyLM
from ...models.transformer import Transformer
from ...tasks.numbers import NumberTranslation
from .live_step import step_ops_data
from .passages import GLYPHS
from .svg import colour_scale, embed

__all__ = [
    "LIVE_FILE",
    "LIVE_LM_FILE",
    "LM_WINDOW",
    "live_path",
    "export_translator",
    "shipped_model",
    "live_translator_html",
    "export_lm",
    "shipped_lm",
    "live_lm_html",
]

#: Where chapter 6 writes the weights, relative to the chapter, and where the book serves them.
LIVE_FILE = "live/translator.json"
#: Where chapter 14 writes the language model's weights, as :data:`LIVE_FILE`.
LIVE_LM_FILE = "live/shakespeare.json"
#: The window the language model samples through unless its config has one: the context
#: Part V's model is trained at (:data:`mhbook.training.shakespeare_lm.SHAKESPEARE_CONTEXT`).
LM_WINDOW = 64
MAX_NUMBER = 999_999
_CONFIG_FIELDS = ("d_model", "num_heads", "num_layers", "d_ff", "norm_eps", "scale_embeddings")


def fill_panel(template: str, **values: str) -> str:
    """``static/template`` (HTML) with its ``${name}`` placeholders filled by ``values``, each
    HTML-escaped (quotes too: a value may stand in an attribute). A placeholder without a value,
    or a stray ``$``, raises. The template's leading ``<!-- ... -->`` note is for its readers
    and is dropped."""
    text = resources.files(__package__).joinpath("static", template).read_text(encoding="utf-8")
    if text.startswith("<!--"):
        text = text[text.index("-->") + 3 :]
    return Template(text).substitute({k: html.escape(v, quote=True) for k, v in values.items()})


def _check_supported(config: ModelConfig) -> None:
    """The JavaScript forward implements the book's translator: post-norm LayerNorm, ReLU,
    biases, sinusoidal positions, multi-head attention. Anything else is refused by name."""
    if config.kv_heads == config.num_heads:  # num_kv_heads = num_heads is multi-head too
        config = config.replace(num_kv_heads=None)
    config.require(
        {
            "norm_first": (False, "post-norm"),
            "norm": ("layer", "LayerNorm"),
            "ffn": ("relu", "a ReLU feed-forward network"),
            "bias": (True, "biases"),
            "position": ("sinusoidal", "sinusoidal positions"),
            "num_kv_heads": (None, "one key/value head per query head"),
            "d_latent": (None, "no latent attention"),
            "window": (None, "full attention"),
            "head_dim": (None, "heads of d_model // num_heads"),
            "tie_embeddings": (False, "untied embeddings"),
        },
        "the live translator's JavaScript",
    )


def live_path(name: str = LIVE_FILE) -> Path:
    """Where :func:`export_translator` (and :func:`export_lm`, with ``name`` =
    :data:`LIVE_LM_FILE`) write by default: ``name`` below the folder ``$MHBOOK_LIVE_DIR``
    names, else below the current folder (a chapter's). The chapters' nbval run sets
    ``MHBOOK_LIVE_DIR`` (``chapters/conftest.py``), so that testing chapters 6 and 14 never
    rewrites the committed files, which are the committed runs'."""
    return Path(os.environ.get("MHBOOK_LIVE_DIR") or ".") / name


def _float16_tensors(model: torch.nn.Module) -> tuple[dict, int, float]:
    """``(tensors, parameters, max_rounding)``: every tensor of ``model.state_dict()`` as
    little-endian float16 in base64 (``{"shape", "data"}``), how many numbers, and the
    largest ``|float16(w) - w|``."""
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
    return tensors, parameters, rounding


def _write(payload: dict, path: Path, parameters: int, rounding: float) -> dict:
    """Write ``payload`` as compact ASCII JSON to ``path``; what was written, and its sha256."""
    text = json.dumps(payload, separators=(",", ":"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="ascii")
    return {
        "path": str(path),
        "bytes": len(text),
        "sha256": hashlib.sha256(text.encode("ascii")).hexdigest(),
        "parameters": parameters,
        "max_rounding": rounding,
    }


def _read_tensors(tensors: dict) -> dict[str, torch.Tensor]:
    """The float16 tensors of a live file, widened to float32."""
    state = {}
    for name, tensor in tensors.items():
        half = np.frombuffer(base64.b64decode(tensor["data"]), dtype="<f2")
        state[name] = torch.from_numpy(half.astype(np.float32).reshape(tensor["shape"]))
    return state


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
    tensors, parameters, rounding = _float16_tensors(model)
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
    path = live_path() if path is None else Path(path)
    return _write(payload, path, parameters, rounding)


def shipped_model(path: str | os.PathLike) -> tuple[Transformer, dict]:
    """The PyTorch model of exactly the weights in ``path`` (float16 widened to float32), in
    eval mode, and the file's JSON (vocabularies, special ids) without the tensors."""
    payload = json.loads(Path(path).read_text(encoding="ascii"))
    if payload.get("format") != 1:
        raise ValueError(f"{path} is not a live translator file of format 1")
    config = ModelConfig(**payload["config"])
    model = Transformer(config, len(payload["src_vocab"]), len(payload["tgt_vocab"]))
    model.load_state_dict(_read_tensors(payload.pop("tensors")))
    return model.eval(), payload


def live_translator_html(url: str = f"../_static/{LIVE_FILE}", example: str = "71") -> str:
    """The live panel's HTML, with its JavaScript: a folded ``<details>`` that loads the
    weights from ``url`` when the reader opens it. ``window.mhbookLive`` holds its API:
    ``translate(text)``, ``logits(srcIds, tgtIds)``, ``numberToWords(n)``, ``load()``; on a
    page without :func:`live_lm_html`'s panel, ``complete`` rejects with a pointer to
    chapter 14's.

    Returns:
        An ``IPython.display.HTML`` object (its ``data`` attribute is the HTML string).
    """
    from IPython.display import HTML

    uid = "mhbook-live-" + hashlib.sha1(url.encode()).hexdigest()[:8]
    body = fill_panel("live.html", uid=uid, example=example)
    data = {"url": url, "scale": colour_scale(), "maxNumber": MAX_NUMBER}
    return HTML(
        embed(uid, body, ["live_core.js", "live.js"], data, css=["explorer.css", "live.css"])
    )


# --------------------------------------------------------------------------- the language model

#: The fields of :class:`mhbook.ModelConfig` the language model's file keeps (as they are,
#: ``None`` included: :func:`shipped_lm` rebuilds the same config). ``live_lm.js`` reads
#: ``d_model``, ``num_heads``, ``num_kv_heads``, ``head_dim``, ``num_layers``, ``norm_eps``,
#: ``rope_theta``, ``scale_embeddings`` and ``window``; the others say what it implements.
_LM_CONFIG_FIELDS = (
    "d_model",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "num_layers",
    "d_ff",
    "norm_eps",
    "norm_first",
    "norm",
    "ffn",
    "bias",
    "position",
    "rope_theta",
    "tie_embeddings",
    "scale_embeddings",
    "window",
)


def _check_lm_supported(config: ModelConfig) -> None:
    """The JavaScript forward implements a Llama-shaped :class:`~mhbook.DecoderOnlyLM`
    (:data:`~mhbook.LLAMA_SHAPE`, dropout aside, which inference does not use) with
    unscaled RoPE in the rotate-half layout and grouped-query (or multi-head, or
    multi-query) attention in one sliding window. Anything else is refused by name."""
    shape = {k: v for k, v in LLAMA_SHAPE.items() if k != "dropout"}
    shape["rope_scaling"] = (None, "unscaled RoPE")
    config.require(shape, "the live language model's JavaScript")


def export_lm(
    model: DecoderOnlyLM,
    tokenizer,
    path: str | os.PathLike | None = None,
    *,
    window: int | None = None,
) -> dict:
    """Write a character language model's weights and characters for the live panel
    (:func:`live_lm_html`), to ``path`` (default :func:`live_path` of :data:`LIVE_LM_FILE`).

    As :func:`export_translator`: every tensor of ``model.state_dict()`` as little-endian
    float16 in base64; beside them the config (``_LM_CONFIG_FIELDS``) and the
    characters, ``chars[i]`` being token ``i``.

    Args:
        model: a Llama-shaped :class:`mhbook.DecoderOnlyLM` (anything else is refused with a
            ``ValueError`` naming the fields).
        tokenizer: a :class:`mhbook.tasks.shakespeare.CharTokenizer` (its ``chars``), or the list of
            characters itself.
        window: the sliding window the page samples through (the rolling KV cache keeps the
            last ``window`` characters; RoPE's positions keep counting). Default:
            ``model.config.window``, else :data:`LM_WINDOW` (64, the context Part V's model
            is trained at, as chapter 14 samples).

    Returns:
        ``{"path", "bytes", "sha256", "parameters", "max_rounding"}``, as
        :func:`export_translator`.
    """
    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model must be a mhbook.DecoderOnlyLM, got {type(model).__name__}")
    _check_lm_supported(model.config)
    chars = list(getattr(tokenizer, "chars", tokenizer))
    if not all(isinstance(c, str) and len(c) == 1 for c in chars) or len(set(chars)) != len(chars):
        raise ValueError("tokenizer must be a CharTokenizer or a list of distinct characters")
    if len(chars) != model.vocab_size:
        raise ValueError(
            f"the tokenizer has {len(chars)} characters but the model {model.vocab_size} tokens"
        )
    window = window or model.config.window or LM_WINDOW
    config = model.config.replace(window=window)  # checked as a config is
    tensors, parameters, rounding = _float16_tensors(model)
    payload = {
        "format": 1,
        "model": "DecoderOnlyLM",
        "config": {f: getattr(config, f) for f in _LM_CONFIG_FIELDS},
        "chars": chars,
        "tensors": tensors,
    }
    path = live_path(LIVE_LM_FILE) if path is None else Path(path)
    return _write(payload, path, parameters, rounding)


def shipped_lm(path: str | os.PathLike) -> DecoderOnlyLM:
    """The PyTorch model of exactly the weights in ``path`` (float16 widened to float32), in
    eval mode, on the CPU, with the window the page samples through in its config (so its
    ``generate`` is what the page computes); its characters are ``model.chars``."""
    payload = json.loads(Path(path).read_text(encoding="ascii"))
    if payload.get("format") != 1 or payload.get("model") != "DecoderOnlyLM":
        raise ValueError(f"{path} is not a live language model file of format 1")
    model = DecoderOnlyLM(ModelConfig(**payload["config"]), len(payload["chars"]))
    model.load_state_dict(_read_tensors(payload["tensors"]))
    model.chars = list(payload["chars"])
    return model.eval()


def live_lm_html(
    url: str = f"../_static/{LIVE_LM_FILE}",
    prompt: str = "ROMEO:\n",
    api: str = "../api.html",
    code: str = "../_modules/",
) -> str:
    """The live language model's panel: a folded ``<details>`` that loads the weights from
    ``url`` when the reader opens it; a prompt, a temperature (0: greedy), a seed and a
    number of characters; the continuation streamed into the page as it is generated; the
    KV cache; the attention of the last character over its window, for a layer and head the
    reader picks. It opens on temperature 0.8 and seed 0, as chapter 14's samples, with a line
    saying why: greedy decoding takes the same character after the same text, and loops.

    ``window.mhbookLive`` gains ``complete(prompt, n, {temperature, seed})`` (a promise of
    the ``n`` new characters: greedy by default, else sampled with the seeded generator
    mulberry32), ``lmLogits(prompt)`` (the next character's logits after the prompt),
    ``lmAttention(prompt)`` (the last character's weights ``[layer][head][key]`` over its
    window), ``lmStep(prompt, position, {temperature, topP})`` (every operation of that
    character's forward pass, as the step-through shows them) and ``lmLoad()``.

    Inside, a second fold steps through one character's forward pass, one operation of
    :data:`~mhbook.viz.explorers.live_step.STEP_OPS` at a time, each linked to its entry in
    the API page at ``api`` and to its lines in the book's highlighted source under ``code``
    (Sphinx's viewcode pages); "next character" feeds the next one through the same cache.

    Returns:
        An ``IPython.display.HTML`` object (its ``data`` attribute is the HTML string).
    """
    from IPython.display import HTML

    uid = "mhbook-live-lm-" + hashlib.sha1(url.encode()).hexdigest()[:8]
    body = fill_panel("live_lm.html", uid=uid, prompt=prompt)
    data = {"url": url, "scale": colour_scale(), "glyphs": GLYPHS, "ops": step_ops_data()}
    data["api"], data["code"] = api, code
    return HTML(
        embed(
            uid,
            body,
            ["live_core.js", "live_lm.js"],
            data,
            css=["explorer.css", "live.css", "live_lm.css"],
        )
    )
