"""The live translator's weights file (``mhbook.explorers.live``), without a browser.

The browser test (``tests/test_browser.py::test_live_translator``) runs the JavaScript forward
and compares it with PyTorch; these tests check the file it loads: written by chapter 6's own
run, small, and exactly the chapter's model rounded to float16.
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
from mhbook.explorers import live

ROOT = Path(__file__).resolve().parents[1]
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
