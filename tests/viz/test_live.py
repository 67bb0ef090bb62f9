"""The live translator's weights file (``mhbook.viz.explorers.live``), without a browser.

The browser test (``tests/book/test_browser_panels.py::test_live_translator``) runs the
JavaScript forward and compares it with PyTorch; these tests check the file it loads: written
by chapter 6's own run, small, and exactly the chapter's model rounded to float16.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import nbformat
import pytest
import torch

import mhbook
from mhbook.viz.explorers import live

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "chapters" / live.LIVE_FILE
CHAPTER = ROOT / "chapters" / "06-transformer.ipynb"


def test_the_committed_file_is_chapter_6s_run():
    """The sha256 that chapter 6 printed when it wrote the file is the committed file's: the
    weights are those of the model the committed run trained, not written by hand."""
    notebook = nbformat.read(CHAPTER, as_version=4)
    printed = [
        match.group(1)
        for cell in notebook.cells
        if cell.cell_type == "code" and "export_translator" in cell.source
        for output in cell.outputs
        for match in re.finditer(r"sha256 ([0-9a-f]{64})", output.get("text", ""))
    ]
    assert len(printed) == 1, printed
    assert hashlib.sha256(COMMITTED.read_bytes()).hexdigest() == printed[0]
    assert COMMITTED.stat().st_size < 5 * 2**20


def test_export_round_trips_within_float16(tmp_path):
    torch.manual_seed(0)
    data = mhbook.make_data(mhbook.FAST_CONFIG)
    model = mhbook.Transformer(mhbook.BOOK_CONFIG.model, len(data.src_vocab), len(data.tgt_vocab))
    info = live.export_translator(model, data, tmp_path / "t.json")
    shipped, meta = live.shipped_model(info["path"])
    assert meta["src_vocab"] == data.src_vocab.id_to_token
    assert meta["specials"]["eos"] == data.tgt_vocab.eos_id
    for name, value in model.state_dict().items():
        back = shipped.state_dict()[name]
        assert torch.equal(back, value.half().float()), name  # float16, exactly
    assert info["max_rounding"] < 1e-2 and info["parameters"] == sum(
        p.numel() for p in model.state_dict().values()
    )
    assert json.loads(Path(info["path"]).read_text())["format"] == 1


def test_nbval_runs_write_elsewhere(monkeypatch, tmp_path):
    monkeypatch.setenv("MHBOOK_LIVE_DIR", str(tmp_path))
    assert live.live_path() == tmp_path / live.LIVE_FILE
    monkeypatch.delenv("MHBOOK_LIVE_DIR")
    assert live.live_path() == Path(".") / live.LIVE_FILE


@pytest.mark.parametrize(
    "change, named",
    [({"norm_first": True}, "norm_first"), ({"ffn": "swiglu"}, "ffn"),
     ({"position": "rope"}, "position"), ({"num_kv_heads": 1}, "num_kv_heads")],
)  # fmt: skip
def test_a_model_the_javascript_does_not_run_is_refused_by_name(change, named, tmp_path):
    data = mhbook.make_data(mhbook.FAST_CONFIG)
    config = mhbook.BOOK_CONFIG.model.replace(**change)
    model = mhbook.Transformer(config, len(data.src_vocab), len(data.tgt_vocab))
    with pytest.raises(ValueError, match=named):
        live.export_translator(model, data, tmp_path / "t.json")


@pytest.mark.parametrize(
    "chapter, call",
    [
        ("06-transformer.ipynb", "live.live_translator_html()"),
        ("07-why-several-heads.ipynb", 'live.live_translator_html(example="seventy-one thousand'),
    ],
)
def test_the_committed_panel_is_the_current_code(chapter, call):
    """The panel's HTML and JavaScript live in the chapters' committed outputs: editing
    static/live.js or live.css without running chapters 6 and 7 again must fail here."""
    notebook = nbformat.read(ROOT / "chapters" / chapter, as_version=4)
    shown = [
        output["data"]["text/html"]
        for cell in notebook.cells
        if cell.cell_type == "code" and call in cell.source  # (a prefix of the call)
        for output in cell.outputs
        if "text/html" in output.get("data", {})
    ]
    assert len(shown) == 1, f"{chapter}: {len(shown)} outputs of {call}"
    line = next(s for c in notebook.cells for s in c.source.splitlines() if call in s)
    now = eval(line.strip(), {"live": live}).data  # noqa: S307 - the call the chapter makes
    assert shown[0] == now, f"{chapter} shows an older live panel: run the chapter again"


# ---- the live language model (chapter 14): mhbook.viz.explorers.live.export_lm and live_lm_html

LM_CHAPTER = ROOT / "chapters" / "14-a-small-llama.ipynb"
LM_COMMITTED = ROOT / "chapters" / live.LIVE_LM_FILE
LM_TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET:\nAy me!\n"


def _lm(**change):
    from mhbook.tasks.shakespeare import CharTokenizer
    from mhbook.training.shakespeare_lm import SHAKESPEARE_MODEL

    chars = CharTokenizer(LM_TEXT)
    config = SHAKESPEARE_MODEL.replace(d_model=32, num_layers=2, d_ff=64, **change)
    torch.manual_seed(0)
    return mhbook.DecoderOnlyLM(config, chars.vocab_size), chars


def test_lm_export_round_trips_within_float16(tmp_path):
    model, chars = _lm()
    info = live.export_lm(model, chars, tmp_path / "lm.json")
    shipped = live.shipped_lm(info["path"])
    assert shipped.config == model.config.replace(window=live.LM_WINDOW)  # samples through 64
    assert shipped.chars == chars.chars and not shipped.training
    for name, value in model.state_dict().items():
        assert torch.equal(shipped.state_dict()[name], value.half().float()), name
    assert info["max_rounding"] < 1e-2 and info["parameters"] == sum(
        p.numel() for p in model.state_dict().values()
    )
    written = Path(info["path"]).read_bytes()
    assert hashlib.sha256(written).hexdigest() == info["sha256"] and len(written) == info["bytes"]
    payload = json.loads(written)
    assert (payload["format"], payload["model"], payload["chars"]) == (
        1,
        "DecoderOnlyLM",
        chars.chars,
    )
    assert payload["config"]["num_kv_heads"] == 2 and payload["config"]["window"] == 64
    # the same file again: the export is deterministic (the sha256 a chapter prints means something)
    assert live.export_lm(model, chars, tmp_path / "again.json")["sha256"] == info["sha256"]
    # a window: the model's own, else the argument's
    windowed, _ = _lm(window=32)
    assert (
        live.shipped_lm(
            live.export_lm(windowed, chars.chars, tmp_path / "w.json")["path"]
        ).config.window
        == 32
    )
    assert (
        live.shipped_lm(
            live.export_lm(model, chars, tmp_path / "w.json", window=16)["path"]
        ).config.window
        == 16
    )


@pytest.mark.parametrize(
    "change, named",
    [({"norm_first": False}, "norm_first"), ({"norm": "layer"}, "norm"), ({"ffn": "gelu"}, "ffn"),
     ({"position": "alibi"}, "position"), ({"bias": True}, "bias"),
     ({"window": 8, "sinks": 2}, "sinks"), ({"window": 8, "global_every": 2}, "global_every"),
     ({"d_latent": 16, "num_kv_heads": None}, "d_latent"),
     ({"rope_scaling": mhbook.RopeScaling("linear", 2.0, 64)}, "rope_scaling")],
)  # fmt: skip
def test_a_language_model_the_javascript_does_not_run_is_refused_by_name(change, named, tmp_path):
    model, chars = _lm(**change)
    with pytest.raises(ValueError, match=named):
        live.export_lm(model, chars, tmp_path / "lm.json")
    assert not (tmp_path / "lm.json").exists()


def test_lm_export_refuses_other_models_and_vocabularies(tmp_path):
    model, chars = _lm()
    data = mhbook.make_data(mhbook.FAST_CONFIG)
    translator = mhbook.Transformer(
        mhbook.BOOK_CONFIG.model, len(data.src_vocab), len(data.tgt_vocab)
    )
    with pytest.raises(TypeError, match="DecoderOnlyLM"):
        live.export_lm(translator, chars, tmp_path / "lm.json")
    with pytest.raises(ValueError, match="characters but the model"):
        live.export_lm(model, chars.chars[:-1], tmp_path / "lm.json")
    with pytest.raises(ValueError, match="not a live language model"):
        live.shipped_lm(live.export_translator(translator, data, tmp_path / "t.json")["path"])


def test_lm_export_honours_the_nbval_folder(monkeypatch, tmp_path):
    model, chars = _lm()
    monkeypatch.setenv("MHBOOK_LIVE_DIR", str(tmp_path))
    assert live.live_path(live.LIVE_LM_FILE) == tmp_path / live.LIVE_LM_FILE
    assert live.export_lm(model, chars)["path"] == str(tmp_path / "live" / "shakespeare.json")


def test_the_lm_panel_is_deterministic_and_small():
    page = live.live_lm_html().data
    assert page == live.live_lm_html().data
    other = live.live_lm_html(url="elsewhere.json", prompt="JULIET:\n<b>").data
    assert f'"../_static/{live.LIVE_LM_FILE}"' in page and '"elsewhere.json"' in other
    ids = set(re.findall(r'id="([^"]+)"', page))
    assert len(ids) == 12 and all(i.startswith("mhbook-live-lm-") for i in ids)
    assert ids.isdisjoint(re.findall(r'id="([^"]+)"', other))  # two panels on one page
    assert ">ROMEO:\n</textarea>" in page and "JULIET:\n&lt;b&gt;</textarea>" in other
    assert "function decoderOnlyLM" in page and "function loadWeights" in page
    assert '"tensors":' not in page and len(page) < 64_000  # the weights (2 MB) are fetched
    translator = live.live_translator_html().data  # the shared code, once in each panel
    assert translator.count("function loadWeights") == 1 and "decoderOnlyLM" not in translator


def test_the_lm_panel_opens_sampling_and_says_why():
    """Greedy decoding loops ("the seen the seen ..."): the panel opens on chapter 14's
    temperature, 0.8, with seed 0, and one line of help says why not 0."""
    page = live.live_lm_html().data
    slider = re.search(r'<input id="([^"]+)-temperature"[^>]*>', page).group(0)
    assert 'value="0.8"' in slider and 'aria-describedby="' in slider
    assert re.search(r'class="mhbook-live-lm-temperature-value"[^>]*>0\.8</output>', page)
    assert re.search(r'class="mhbook-live-lm-seed"[^>]*value="0"', page)
    why = re.search(r'class="mhbook-live-lm-help">(.*?)</p>', page, re.S).group(1)
    assert "greedy" in why and "loops" in why
    chapter = "\n".join(
        c.source for c in nbformat.read(LM_CHAPTER, as_version=4).cells if c.cell_type == "code"
    )
    assert "for temperature in (0.5, 0.8, 1.0, 1.5)" in chapter and "manual_seed(0)" in chapter


# ---- what the panels share: live_core.js, and the HTML templates

STATIC = Path(live.__file__).parent / "static"
SHARED = ("attendHeads", "addNorm", "argmax", "cacheBytes", "registerConsoleApi", "loadOnce",
          "showError", "loadWeights", "linear", "softmax", "heatmap", "mulberry32",
          "linearRows", "rmsNormRows", "ropeFrequencies", "ropeRows", "numberIn")  # fmt: skip
PANELS = ("live_core.js", "live.js", "live_lm.js", "live_train.js")


def test_the_two_forwards_share_their_core():
    """One head-by-head attention, one addNorm (post- or pre-norm, as AddNorm(norm_first=)),
    one argmax, one cacheBytes, one load-on-open and console-API tail: live_core.js's, which
    both panels carry once and neither panel's own script defines again."""
    core = (STATIC / "live_core.js").read_text()
    for name in SHARED:
        assert f"function {name}(" in core, name
        for own in ("live.js", "live_lm.js", "live_train.js"):
            assert not re.search(rf"\b(function|const|let) {name}\b", (STATIC / own).read_text()), (
                f"{own} defines {name} again"
            )
    # and no function of one panel's script is written again in another's (but each panel's own
    # draw, and each model's newCache, as each mhbook model has its new_cache)
    defined = {
        own: set(re.findall(r"^function (\w+)\(", (STATIC / own).read_text(), flags=re.M))
        - {"draw", "newCache"}
        for own in PANELS
    }
    for i, a in enumerate(PANELS):
        for b in PANELS[i + 1 :]:
            assert not defined[a] & defined[b], f"{a} and {b} both define {defined[a] & defined[b]}"
    assert "function addNorm(x, sublayer, norm, normFirst)" in core
    post, pre = ("norm(P, `${name}.addnorm1`, eps), " + b + ")" for b in ("false", "true"))
    assert post in (STATIC / "live.js").read_text()  # the translator: post-norm
    assert pre in (STATIC / "live_lm.js").read_text()  # the language model: pre-norm
    for page in (live.live_translator_html().data, live.live_lm_html().data):
        for name in SHARED:
            assert page.count(f"function {name}(") == 1, name
        assert page.count("window.mhbookLive = ") == 1


def test_the_panels_are_templates_filled_safely():
    """The panels' HTML is static/live.html and static/live_lm.html, filled by string.Template:
    every placeholder filled, every value escaped (an attribute's quotes too), the templates'
    notes to their readers left out."""
    odd = '7" onfocus="alert(1)'
    page = live.live_translator_html(example=odd).data
    assert 'value="7&quot; onfocus=&quot;alert(1)"' in page and 'onfocus="alert' not in page
    lm = live.live_lm_html(prompt="$uid ${uid} </textarea><b>").data
    assert "$uid ${uid} &lt;/textarea&gt;&lt;b&gt;</textarea>" in lm
    for name, built in (("live.html", page), ("live_lm.html", lm)):
        template = (STATIC / name).read_text()
        assert template.startswith("<!--") and "<!--" not in built.split("<script")[0]
        body = template[template.index("-->") + 3 :]
        for line in body.splitlines():
            if "<" in line and "$" not in line:
                assert line.strip() in built, line  # the rest is the template's, as it is
        assert set(re.findall(r"\$\{?(\w+)", body)) <= {"uid", "example", "prompt"}


def _lm_cells():
    """Chapter 14's code cells that export the language model (found by their content)."""
    notebook = nbformat.read(LM_CHAPTER, as_version=4)
    return [c for c in notebook.cells if c.cell_type == "code" and "export_lm(" in c.source]


def test_the_committed_lm_file_is_chapter_14s_run():
    """As for chapter 6: the sha256 chapter 14 printed when it wrote ``live/shakespeare.json``
    is the committed file's, and the panel in its output is the current code's."""
    cells = _lm_cells()
    if not cells:
        pytest.skip("chapter 14 has no export_lm cell yet (the live language model's panel)")
    assert len(cells) == 1, f"{len(cells)} cells of chapter 14 call export_lm"
    printed = [
        match.group(1)
        for output in cells[0].outputs
        for match in re.finditer(r"sha256 ([0-9a-f]{64})", output.get("text", ""))
    ]
    assert len(printed) == 1, printed
    assert LM_COMMITTED.is_file(), f"chapters/{live.LIVE_LM_FILE} is not committed"
    assert hashlib.sha256(LM_COMMITTED.read_bytes()).hexdigest() == printed[0]
    assert LM_COMMITTED.stat().st_size < 5 * 2**20
    shown = [o["data"]["text/html"] for o in cells[0].outputs if "text/html" in o.get("data", {})]
    line = next(s for s in cells[0].source.splitlines() if "live_lm_html(" in s)
    now = eval(line.strip(), {"live": live}).data  # noqa: S307 - the call the chapter makes
    assert shown == [now], "chapter 14 shows an older live panel: run the chapter again"
