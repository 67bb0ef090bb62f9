"""The passage explorer (mhbook/viz/explorers/passages.py) in headless Chromium, on a page of its
own (no book build): driven with the keyboard and the mouse, every token it shades must hold
Python's weight of that query, in the colour of the book's map, and axe-core must find nothing.

Chromium, Playwright and axe as in tests/book/test_browser.py (whose helpers this file imports):
without Chromium the test is skipped, unless ``CI`` is set. The explorer's screenshot goes to
``$MHBOOK_SCREENSHOTS/passages.png`` (default ``_build/screenshots``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from browser import CODE_REGIONS, SCREENSHOTS, Visit, axe_problems

import mhbook
from mhbook.training.shakespeare_lm import SHAKESPEARE_MODEL
from mhbook.viz import attention_records as analysis
from mhbook.viz.explorers import passages

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n"
)
T = 48
STARTS = (0, 60, 100)


@pytest.fixture(scope="module")
def shown():
    """(tokens, weights): three passages of a random Llama-shaped character model."""
    chars = sorted(set(TEXT))
    mhbook.set_seed(0)
    config = SHAKESPEARE_MODEL.replace(
        d_model=32, num_heads=4, num_kv_heads=None, num_layers=2, d_ff=64
    )
    model = mhbook.DecoderOnlyLM(config, len(chars))
    with torch.no_grad():  # sharper queries: a more varied picture than a random model's
        for block in model.blocks:
            block.self_attn.W_q.weight.mul_(6)
    tokens = [list(TEXT[s : s + T]) for s in STARTS]
    weights = analysis.passage_attention(model, [[chars.index(c) for c in p] for p in tokens])
    return tokens, weights


READ = """
(root) => {
  const spans = Array.from(root.querySelectorAll(".mhbook-passages-token"));
  const focused = document.activeElement;
  return {
    state: { ...root.dataset },
    focused: focused && focused.dataset ? focused.dataset.t ?? null : null,
    tokens: spans.map((s) => ({
      text: s.textContent,
      weight: s.dataset.weight ?? null,
      query: s.classList.contains("mhbook-passages-query"),
      argmax: s.classList.contains("mhbook-passages-argmax"),
      background: getComputedStyle(s).backgroundColor,
      colour: getComputedStyle(s).color,
      tabIndex: s.tabIndex,
    })),
    breaks: root.querySelectorAll(".mhbook-passages-text br").length,
    max: root.querySelector(".mhbook-passages-max").textContent,
    readout: root.querySelector(".mhbook-passages-readout").textContent,
    heads: Array.from(root.querySelectorAll("button.mhbook-passages-thumb"))
      .map((b) => b.getAttribute("aria-pressed")),
  };
}
"""

# Every pixel of head h's small map, as [r, g, b], row by row.
THUMB_PIXELS = """
([root, h]) => {
  const canvas = root.querySelectorAll("button.mhbook-passages-thumb canvas")[h];
  const d = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  const out = [];
  for (let i = 0; i < d.length; i += 4) out.push([d[i], d[i + 1], d[i + 2]]);
  return out;
}
"""


def _css_rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def _agrees(state: dict, tokens, weights, payload) -> None:
    """What the page shows is row ``query`` of the head on show, as Python has it."""
    p, layer, h, q = (int(state["state"][k]) for k in ("passage", "layer", "head", "query"))
    row = weights[p, layer, h, q, : q + 1]
    quantised = passages.passage_payload_weights(payload)[p, layer, h, q, : q + 1]
    shown = state["tokens"]
    assert [t["text"] for t in shown] == [passages.token_glyphs(c) for c in tokens[p]]
    assert state["breaks"] == "".join(tokens[p]).count("\n")
    drawn = np.array([float(t["weight"]) for t in shown[: q + 1]])
    np.testing.assert_allclose(drawn, row, atol=1 / 510 + 5e-5)  # the weights of that row
    assert all(t["weight"] is None for t in shown[q + 1 :]), "a token after the query is shaded"
    assert [t["query"] for t in shown] == [k == q for k in range(len(shown))]
    assert [t["tabIndex"] for t in shown] == [0 if k == q else -1 for k in range(len(shown))]
    best = int(np.argmax(quantised))
    assert [t["argmax"] for t in shown] == [k == best for k in range(len(shown))]
    top = max(quantised[best] / 255, 1 / 255)
    lut, text = payload["scale"]["colours"], payload["scale"]["text"]
    for k, t in enumerate(shown[: q + 1]):
        c = round(min(1.0, quantised[k] / 255 / top) * (len(lut) - 1))
        assert t["background"] == _css_rgb(lut[c]), (k, t)
        assert t["colour"] == {"black": "rgb(0, 0, 0)", "white": "rgb(255, 255, 255)"}[text[c]]
    assert state["max"] == f"{top:.2f}"
    assert f"token {best + 1} " in state["readout"]
    assert state["heads"] == ["true" if i == h else "false" for i in range(len(state["heads"]))]


def test_passage_explorer_in_a_browser(chromium, shown, tmp_path):
    tokens, weights = shown
    html = passages.passage_explorer_html(
        tokens,
        weights,
        title="Every head of a small character model on three passages",
        head_labels={(1, 3): "a head worth a name"},
        caption="A random model: the picture, not the heads, is what this page tests.",
    ).data
    (tmp_path / "page.html").write_text(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<title>Passage explorer</title></head><body><main><h1>Passage explorer</h1>"
        f"{html}</main></body></html>",
        encoding="utf-8",
    )
    visit = Visit(chromium, tmp_path.as_uri() + "/")
    try:
        tab = visit.open("page.html")
        root = tab.locator("div.mhbook-passages")
        uid = root.get_attribute("id")
        tab.wait_for_selector(f"#{uid}[data-ready='true']")
        payload = passages.passage_payload(tokens, weights)
        first = root.evaluate(READ)
        assert first["state"]["query"] == str(T - 1)  # the last token asks first
        _agrees(first, tokens, weights, payload)

        # Passage 3, layer 2, head 3 from the menus' arrow keys; Tab into the passage, Home,
        # then five steps right: token 6 is the query.
        for menu, times in [("passage", 2), ("layer", 1), ("head", 2)]:
            tab.locator(f"#{uid}-{menu}").focus()
            for _ in range(times):
                tab.keyboard.press("ArrowDown")
        tab.keyboard.press("Tab")
        tab.keyboard.press("Home")
        for _ in range(5):
            tab.keyboard.press("ArrowRight")
        moved = root.evaluate(READ)
        assert {k: moved["state"][k] for k in ("passage", "layer", "head", "query")} == {
            "passage": "2",
            "layer": "1",
            "head": "2",
            "query": "5",
        }
        assert moved["focused"] == "5"
        _agrees(moved, tokens, weights, payload)

        # The mouse: hovering token 31 makes it the query.
        root.locator(".mhbook-passages-token[data-t='30']").hover()
        hovered = root.evaluate(READ)
        assert hovered["state"]["query"] == "30"
        _agrees(hovered, tokens, weights, payload)

        # A small map, picked with Enter, shows head 4 (its name in the menu); every pixel of
        # it is its weight's colour.
        tab.locator(f"#{uid} button.mhbook-passages-thumb[data-head='3']").focus()
        tab.keyboard.press("Enter")
        picked = root.evaluate(READ)
        assert picked["state"]["head"] == "3"
        assert tab.locator(f"#{uid}-head").input_value() == "3"
        assert "4: a head worth a name" in tab.locator(f"#{uid}-head").inner_text()
        _agrees(picked, tokens, weights, payload)
        quantised = passages.passage_payload_weights(payload)[2, 1, 3]
        lut = payload["scale"]["colours"]
        want = [
            [int(lut[round(v / 255 * 100)][i : i + 2], 16) for i in (1, 3, 5)]
            for v in quantised.ravel()
        ]
        pixels = tab.evaluate(THUMB_PIXELS, [root.element_handle(), 3])
        assert pixels == want, "the small map is not the head's weights"

        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        root.screenshot(path=str(SCREENSHOTS / "passages.png"))
        assert not visit.js_errors, f"JavaScript errors: {visit.js_errors}"
        problems = axe_problems(tab, CODE_REGIONS)
        assert not problems, "\n".join(problems)
    finally:
        visit.close()
