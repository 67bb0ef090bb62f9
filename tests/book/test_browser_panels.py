"""The built book's interactive parts in Chromium, driven as a reader drives them: the explorers
of chapters 1, 2, 3 and 5 (moved with the keyboard, redrawn with the numbers of their Python
references), chapter 6's attention viewer and live translator, chapter 14's step-through,
the Train panel's page, and the quizzes with the review page. The book is the one
tests/book/test_browser.py checks page by page (tests/book/conftest.py builds it once per run).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from book_server import PAGES, page_weight
from browser import (
    CODE_REGIONS,
    SCREENSHOTS,
    WAIT_FOR_MATHJAX,
    Visit,
    axe_problems,
    step_differences,
)

pytestmark = pytest.mark.slow(seconds=230)  # waits for the book's build, then drives its panels


def _chapter_explorer(visit, prefix: str, kind: str):
    """Open chapter ``prefix`` ("01", ...) and return (tab, the root of its ``kind`` explorer)."""
    chapter = [p for p in PAGES if Path(p.file).name.startswith(prefix)]
    assert chapter, f"no chapter {prefix} in _toc.yml"
    tab = visit.open(chapter[0].html)
    roots = tab.locator(f"div.mhbook-explorer[id^='mhbook-{kind}-']")
    assert roots.count() >= 1, f"{chapter[0].html} holds no {kind} explorer"
    root = roots.first
    root.scroll_into_view_if_needed()
    return tab, root


def _explorer_json(root) -> dict:
    return json.loads(root.locator("script.mhbook-explorer-data").text_content())


def _drawn(locator, attribute: str = "data-weights") -> np.ndarray:
    return np.array(json.loads(locator.get_attribute(attribute)))


READ_ATTENTION_EXPLORER = """
(root) => {
  const matrix = (m) => {
    const W = [[0, 0, 0], [0, 0, 0], [0, 0, 0]];
    root.querySelectorAll(`input[data-matrix='${m}']`).forEach(
      (e) => (W[+e.dataset.i][+e.dataset.j] = +e.value));
    return W;
  };
  return {
    weights: JSON.parse(root.querySelector("svg[id$='-heatmap']").getAttribute("data-weights")),
    output: JSON.parse(root.querySelector("svg[id$='-output']").getAttribute("data-weights")),
    svg: root.querySelector("svg[id$='-heatmap']").innerHTML,
    q: matrix("q"), k: matrix("k"), v: matrix("v"),
  };
}
"""


def _attention_agrees_with_python(state: dict, X: np.ndarray) -> None:
    from mhbook.viz.explorers import explorer_attention

    out, weights = explorer_attention(
        X, np.array(state["q"]), np.array(state["k"]), np.array(state["v"])
    )
    np.testing.assert_allclose(np.array(state["weights"]), weights, atol=1.5e-4)
    np.testing.assert_allclose(np.array(state["output"]), out, atol=1.5e-4)


@pytest.mark.without_mathjax  # the panels, not the math
def test_attention_explorer_moves(visit):
    """Chapter 1's explorer redraws when an entry of W_query, W_key or W_value changes and
    computes what Python computes; presets and the reset button work."""
    tab, root = _chapter_explorer(visit, "01", "explorer")
    X = np.array(_explorer_json(root)["X"])
    before = root.evaluate(READ_ATTENTION_EXPLORER)
    _attention_agrees_with_python(before, X)
    # the user raises W_query's (time -> entertainment) entry with the keyboard: off-diagonal
    entry = root.locator("input.mhbook-explorer-entry[data-matrix='q'][data-i='1'][data-j='0']")
    entry.focus()
    for _ in range(10):
        tab.keyboard.press("ArrowUp")
    after = root.evaluate(READ_ATTENTION_EXPLORER)
    assert after["q"][1][0] == pytest.approx(1.0), "the W_query entry did not move"
    assert after["weights"] != before["weights"], "moving W_query left the weights unchanged"
    assert after["svg"] != before["svg"], "moving W_query left the picture unchanged"
    _attention_agrees_with_python(after, X)
    root.locator("input.mhbook-explorer-entry[data-matrix='v'][data-i='0'][data-j='1']").fill("2")
    valued = root.evaluate(READ_ATTENTION_EXPLORER)
    assert valued["weights"] == after["weights"], "W_value moved the weights"
    assert valued["output"] != after["output"], "W_value left the outputs unchanged"
    _attention_agrees_with_python(valued, X)
    root.locator("select.mhbook-explorer-preset").select_option(
        label="time words ask for entertainment"
    )
    asked = root.evaluate(READ_ATTENTION_EXPLORER)
    _attention_agrees_with_python(asked, X)
    assert asked["weights"][3] == asked["weights"][2], "row after should ask what movies asks"
    root.screenshot(path=str(SCREENSHOTS / "explorer-01-attention.png"))
    root.locator("button.mhbook-explorer-reset").press("Enter")
    reset = root.evaluate(READ_ATTENTION_EXPLORER)
    assert reset["weights"] == before["weights"] and reset["output"] == before["output"]
    assert not visit.js_errors, f"JavaScript errors: {visit.js_errors}"


# ---- viewer ch6
# Chapter 6's attention viewer (mhbook/viz/explorers/viewer.py): typed into, switched and ablated
# with the keyboard; every map it draws must hold the payload's weights and tokens.

READ_VIEWER = """
(root) => ({
  maps: Array.from(root.querySelectorAll("svg.mhbook-viewer-map")).map((svg) => ({
    index: Number(svg.dataset.index),
    kind: Number(svg.dataset.kind),
    layer: Number(svg.dataset.layer),
    head: Number(svg.dataset.head),
    weights: JSON.parse(svg.getAttribute("data-weights")),
    values: Array.from(svg.querySelectorAll(".mhbook-explorer-value")).map((t) => t.textContent),
    rows: Array.from(svg.querySelectorAll(".mhbook-explorer-query")).map((t) => t.textContent),
    cols: Array.from(svg.querySelectorAll(".mhbook-explorer-key")).map((t) => t.textContent),
    role: svg.getAttribute("role"),
    label: svg.getAttribute("aria-label"),
    removed: svg.classList.contains("mhbook-viewer-removed"),
  })),
  picture: root.querySelector(".mhbook-viewer-maps").innerHTML,
  sentence: root.querySelector(".mhbook-viewer-sentence").textContent,
  effect: root.querySelector(".mhbook-viewer-effect").textContent,
  broken: Array.from(root.querySelectorAll(".mhbook-viewer-broken button"))
    .map((b) => Number(b.dataset.index)),
  number: root.querySelector("input.mhbook-viewer-number").value,
  pick: root.querySelector("select.mhbook-viewer-pick").value,
})
"""


def _viewer_maps_agree(state: dict, payload: dict) -> None:
    """Every map drawn holds the payload's weights (data-weights, rounded to 4 decimals) and
    its tokens on both axes."""
    from mhbook.viz.explorers import viewer

    decoded = viewer.payload_weights(payload)
    text = viewer.payload_text(payload)
    assert state["maps"], "the viewer drew no map"
    for m in state["maps"]:
        n, kind = m["index"], m["kind"]
        want = decoded[n][viewer.layer_name(kind, m["layer"])][m["head"]] / 255
        np.testing.assert_allclose(np.array(m["weights"]), want, atol=5.1e-5)
        src, out = text["src"][n], text["out"][n]
        read = ["<bos>"] + out[:-1]
        assert (m["rows"], m["cols"]) == [(src, src), (read, read), (out, src)][kind]
        assert m["role"] == "img" and payload["kinds"][kind]["name"] in m["label"]


@pytest.mark.without_mathjax  # the panels, not the math
def test_attention_viewer_ch6(visit):
    """Chapter 6's viewer: type a test number, change layer, head and kind, remove a head, all
    with the keyboard; the picture and the text follow, with the payload's weights."""
    from mhbook.viz.explorers import viewer

    chapter6 = [p for p in PAGES if Path(p.file).name.startswith("06")]
    assert chapter6, "no chapter 06 in _toc.yml"
    tab = visit.open(chapter6[0].html)
    roots = tab.locator("div.mhbook-viewer")
    assert roots.count() >= 1, f"{chapter6[0].html} holds no div.mhbook-viewer"
    root = roots.first
    root.scroll_into_view_if_needed()
    uid = root.get_attribute("id")
    tab.wait_for_selector(f"#{uid}[data-ready='true']")
    payload = json.loads(root.locator("script.mhbook-explorer-data").text_content())
    text = viewer.payload_text(payload)
    L, H = payload["numLayers"], payload["numHeads"]
    first = root.evaluate(READ_VIEWER)
    assert len(first["maps"]) == L * H  # all layers and heads of one kind
    _viewer_maps_agree(first, payload)
    root.screenshot(path=str(SCREENSHOTS / "viewer-ch6-first.png"))

    # Type another test number (the longest sentence) and press Enter.
    n = max(range(len(payload["numbers"])), key=lambda i: len(text["src"][i]))
    number_box = root.locator("input.mhbook-viewer-number")
    number_box.focus()
    tab.keyboard.press("Control+A")
    tab.keyboard.type(f"{payload['numbers'][n]:,}".replace(",", " "))
    tab.keyboard.press("Enter")
    typed = root.evaluate(READ_VIEWER)
    assert {m["index"] for m in typed["maps"]} == {n}, "typing a number did not show it"
    assert typed["pick"] == str(n) and text["english"][n] in typed["sentence"]
    assert typed["picture"] != first["picture"]
    _viewer_maps_agree(typed, payload)

    # One layer, one head, another kind: arrow keys on the menus.
    for menu, key, times in [
        ("layer", "ArrowDown", 2),
        ("head", "ArrowDown", 2),
        ("kind", "ArrowUp", 1),
    ]:
        root.locator(f"select.mhbook-viewer-{menu}").focus()
        for _ in range(times):
            tab.keyboard.press(key)
    one = root.evaluate(READ_VIEWER)
    assert [(m["kind"], m["layer"], m["head"]) for m in one["maps"]] == [(1, 1, 1)], one["maps"]
    assert one["picture"] != typed["picture"]
    m = one["maps"][0]
    assert m["values"] == [f"{v:.2f}" for row in m["weights"] for v in row]  # values written
    _viewer_maps_agree(one, payload)

    # Remove the head on show: focus its radio button and press Space.
    j = (1 * L + 1) * H + 1
    info = payload["heads"][j]
    assert (info["kind"], info["layer"], info["head"]) == (1, 1, 1)
    root.locator(f"#{uid}-remove-{j}").focus()
    tab.keyboard.press("Space")
    removed = root.evaluate(READ_VIEWER)
    assert removed["effect"] != one["effect"] and info["label"] in removed["effect"]
    assert f"{100 * info['exact']:.1f}%" in removed["effect"]
    ablated = dict(text["ablated"][j]).get(n, text["translation"][n])
    assert f"becomes {ablated} (" in removed["effect"]
    assert removed["maps"][0]["removed"] and "(removed)" in removed["picture"]
    # the numbers it changes, those it makes wrong first, at most 12
    changes = [(m, fr != text["reference"][m]) for m, fr in text["ablated"][j]]
    changes.sort(key=lambda c: (not c[1], payload["numbers"][c[0]]))
    assert removed["broken"] == [m for m, _ in changes[:12]]
    root.screenshot(path=str(SCREENSHOTS / "viewer-ch6-ablated.png"))

    # A number the removal changes: its button, pressed with Enter, shows it.
    if removed["broken"]:
        other = removed["broken"][0]
        root.locator(f".mhbook-viewer-broken button[data-index='{other}']").focus()
        tab.keyboard.press("Enter")
        shown = root.evaluate(READ_VIEWER)
        assert {m["index"] for m in shown["maps"]} == {other}
        assert shown["number"] == str(payload["numbers"][other])
        assert f"becomes {dict(text['ablated'][j])[other]} (" in shown["effect"]
        _viewer_maps_agree(shown, payload)
    assert not visit.js_errors, f"JavaScript errors: {visit.js_errors}"


# ---- end viewer ch6


@pytest.mark.without_mathjax  # the panels, not the math
def test_softmax_explorer_moves(visit):
    """Chapter 2's explorer: raising d_k without scaling saturates the softmax; its weights,
    Jacobian norms and gradient equal mhbook.viz.explorers.softmax_stats."""
    from mhbook.viz.explorers import softmax_stats

    tab, root = _chapter_explorer(visit, "02", "softmax")
    data = _explorer_json(root)
    bars = root.locator("svg[id$='-weights']")
    before = bars.inner_html()
    root.locator("input[id$='-dk']").focus()
    tab.keyboard.press("End")  # the widest d_k
    root.locator("input[id$='-scaled']").uncheck()
    root.locator("input[id$='-query']").fill("1")
    assert bars.inner_html() != before, "the bars did not move"
    shown = json.loads(root.locator(".mhbook-explorer-readouts").get_attribute("data-stats"))
    n = len(data["dims"]) - 1
    want = softmax_stats(data["raw"][n][1], data["upstream"][n][1], data["dims"][n], False, 1.0)
    for name, value in want.items():
        np.testing.assert_allclose(shown[name], value, rtol=1e-5, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(_drawn(bars, "data-values"), want["weights"], atol=1e-4)
    root.screenshot(path=str(SCREENSHOTS / "explorer-02-softmax.png"))
    assert not visit.js_errors, f"JavaScript errors: {visit.js_errors}"


@pytest.mark.without_mathjax  # the panels, not the math
def test_mask_explorer_moves(visit):
    """Chapter 3's mask builder: Lq > Lk with bottom-right alignment leaves rows without a
    key, whose weights are zeros; mask and weights equal mhbook's."""
    from mhbook.viz.explorers import explorer_mask, masked_weights

    tab, root = _chapter_explorer(visit, "03", "masks")
    scores = np.array(_explorer_json(root)["scores"])
    mask_svg, weights_svg = root.locator("svg[id$='-mask']"), root.locator("svg[id$='-weights']")
    before = mask_svg.inner_html()
    root.locator("input[id$='-lq']").fill("6")
    root.locator("input[id$='-lk']").focus()
    tab.keyboard.press("ArrowLeft")
    tab.keyboard.press("ArrowLeft")  # Lk = 4
    root.locator("select[id$='-causal']").select_option("bottom-right")
    assert mask_svg.inner_html() != before, "the mask did not change"
    valid = int(root.locator("input[id$='-valid']").input_value())
    mask = explorer_mask(6, 4, valid, "bottom-right")
    assert _drawn(mask_svg).tolist() == mask.double().tolist()
    weights = _drawn(weights_svg)
    np.testing.assert_allclose(weights, masked_weights(scores[:6, :4], mask), atol=1e-4)
    assert (weights[0] == 0).all(), "a query with no key must get zero weights"
    root.screenshot(path=str(SCREENSHOTS / "explorer-03-masks.png"))
    assert not visit.js_errors, f"JavaScript errors: {visit.js_errors}"


@pytest.mark.without_mathjax  # the panels, not the math
def test_positional_explorer_moves(visit):
    """Chapter 5's explorer: the code of the chosen position and the dot products of two
    positions equal mhbook.sinusoidal_encoding's."""
    from mhbook.viz.explorers.positional import encoding, offset_dots

    tab, root = _chapter_explorer(visit, "05", "positional")
    data = _explorer_json(root)
    code = root.locator("svg[id$='-code']")
    before = code.inner_html()
    root.locator("input[id$='-t']").fill("30")
    root.locator("input[id$='-i']").focus()
    tab.keyboard.press("ArrowRight")
    assert code.inner_html() != before, "the code did not change"
    P = encoding(data["L"], data["d"])
    s = int(root.locator("input[id$='-s']").input_value())
    i = int(root.locator("input[id$='-i']").input_value())
    np.testing.assert_allclose(_drawn(code, "data-values"), P[30], atol=1e-4)
    shown = json.loads(root.locator(".mhbook-explorer-readouts").get_attribute("data-stats"))
    np.testing.assert_allclose(shown["dot"], P[30] @ P[s], rtol=1e-6)
    np.testing.assert_allclose(shown["value"], P[30, i], atol=1e-7)
    np.testing.assert_allclose(shown["dots"], offset_dots(30, data["L"], data["d"])[1], rtol=1e-6)
    root.screenshot(path=str(SCREENSHOTS / "explorer-05-positional.png"))
    assert not visit.js_errors, f"JavaScript errors: {visit.js_errors}"


# ---- end of explorers ch1/2/3/5


# ---- the live translator (chapter 6)
# The JavaScript forward of mhbook/viz/explorers/static/live.js against PyTorch's forward of the
# same float16 weights (mhbook.viz.explorers.live.shipped_model), driven from the keyboard.

LIVE_BATCH = """
async (numbers) => {
  const out = [];
  for (const n of numbers) {
    const r = await window.mhbookLive.translate(String(n));
    out.push({ n, ids: r.ids, srcIds: r.srcIds, text: r.text, ms: r.ms,
      logits: await window.mhbookLive.logits(r.srcIds, [BOS, ...r.ids.slice(0, -1)]) });
  }
  return out;
}
"""


def _live_numbers(data, count: int = 60) -> list[int]:
    """Numbers the test set never held: edge cases and random ones of every size."""
    seen = set(data.numbers["test"])
    rng = np.random.default_rng(2026)
    picked = [0, 7, 13, 80, 100, 101, 1_000, 1_001, 71_080, 100_000, 999_999]
    while len(picked) < count:
        n = int(rng.integers(0, 10 ** int(rng.integers(1, 7))))
        if n not in seen and n not in picked:
            picked.append(n)
    return [n for n in picked if n not in seen]


@pytest.mark.without_mathjax  # the panels, not the math
def test_live_step_through_ch14(visit, build):
    """Chapter 14's step-through in the built book, as a reader uses it: every operation's
    links are anchors of the built API page and of the book's highlighted source (Sphinx's
    viewcode); open the live panel (the weights load), open the step-through, Step through,
    move to layer 1's keys, step the next character with the cache (one key more), follow the
    operation's link to its code. No console error, no failed request, axe finds nothing. And
    every operation's values, for three prompts from the validation text (the model never
    trained on them), equal PyTorch's on the shipped Shakespeare Llama itself (the weights the
    page loaded, as ``live.shipped_lm`` reads them), within 1e-4
    (tests/viz/test_browser_live_lm.py does the same on a small model, and plants bugs there).
    """

    from mhbook.tasks.shakespeare import load_shakespeare, split_text
    from mhbook.viz.explorers import live
    from mhbook.viz.explorers.live_step import step_keys, step_ops_data

    api = (build.html_dir / "api.html").read_text(encoding="utf-8")
    anchors = set(re.findall(r'id="([^"]+)"', api))
    missing = sorted({op["anchor"] for op in step_ops_data()} - anchors)
    assert not missing, f"no entry in api.html for {missing}"
    for code in {op["code"] for op in step_ops_data()}:  # viewcode's page of the module
        page, anchor = code.split("#")
        source = (build.html_dir / "_modules" / page).read_text(encoding="utf-8")
        assert f'class="viewcode-block" id="{anchor}"' in source, f"no {anchor} in {page}"
    chapter = [p for p in PAGES if Path(p.file).name.startswith("14")]
    assert chapter, "no chapter 14 in _toc.yml"
    tab = visit.open(chapter[0].html)
    panel = tab.locator("div.mhbook-explorer[id^='mhbook-live-lm-']")
    assert panel.count() == 1, "chapter 14 holds no live language model"
    panel.locator("summary").first.scroll_into_view_if_needed()
    panel.locator("summary").first.focus()
    tab.keyboard.press("Enter")
    status = panel.locator(".mhbook-live-status")
    tab.wait_for_function(
        "(el) => el.textContent.startsWith('Loaded')", arg=status.element_handle()
    )
    panel.locator(".mhbook-live-lm-prompt").fill("ROMEO:\nO Juliet")
    step = panel.locator("details.mhbook-live-step")
    step.locator("summary").focus()
    tab.keyboard.press("Enter")
    step.locator("button[type=submit]").focus()
    tab.keyboard.press("Enter")  # the prompt's 7th character (the panel opens on 7)
    view = step.locator(".mhbook-live-step-view")
    view.locator("h4").wait_for()
    keys = step_keys(4)
    step.locator(".mhbook-live-step-op").select_option(str(keys.index("blocks.0.keys")))
    assert "7 keys of layer 1: 6 from the cache, 1 new" in view.text_content()
    step.locator(".mhbook-live-step-next-char").click()  # the 8th, through the same cache
    assert "8 keys of layer 1: 7 from the cache, 1 new" in view.text_content()
    step.screenshot(path=str(SCREENSHOTS / "live-step-ch14.png"))

    lm = live.shipped_lm(build.html_dir / "_static" / live.LIVE_LM_FILE)
    _, valid = split_text(load_shakespeare())
    # A short prompt, one that fills the window of 64 and one that slides it (chars 90-130)
    held_back = [(valid[1000:1024], 23), (valid[5000:5070], 63), (valid[9000:9140], 129)]
    worst = max(step_differences(tab, lm, held_back).values())
    print(f"step-through of the shipped Llama, worst |JS - PyTorch|: {worst:.1e}")
    assert worst < 1e-4, worst
    assert not visit.js_errors and not visit.failed and not visit.external, visit.js_errors
    # Last, as test_live_translator: axe-core's CSS preloading asks for a basic.css the page
    # never asks for (a 404 in the console); then the operation's code, followed: the book's
    # highlighted source of LayerCache.update (its API entry is an anchor of api.html, above).
    problems = axe_problems(tab)
    assert not problems, problems
    api = view.locator("a").first
    assert api.get_attribute("href") == "../api.html#mhbook.attention.cache.LayerCache.update"
    link = view.locator("a.mhbook-live-step-code")
    href = link.get_attribute("href")
    assert href == "../_modules/mhbook/attention/cache.html#LayerCache.update", href
    link.click()
    tab.wait_for_load_state()
    assert tab.url.endswith(href.removeprefix("..")), (tab.url, href)
    block = tab.locator("div.viewcode-block[id='LayerCache.update']")
    assert "def update(" in block.text_content()
    problems = axe_problems(tab)
    assert not problems, problems


@pytest.mark.without_mathjax  # the panels, not the math
def test_train_explorer_page(visit):
    """The appendix's page of chapter 15's Train panel, as a reader finds it: chapter 15 links
    it, the panel is open at step 0, One step and Start train, Pause stops. No console error,
    no failed request (tests/viz/test_browser_live_train.py checks the training against
    PyTorch)."""
    explorer = [p for p in PAGES if Path(p.file).name == "train-in-the-page"]
    assert explorer, "no train-in-the-page in _toc.yml"
    chapter = [p for p in PAGES if Path(p.file).name.startswith("15")]
    assert chapter, "no chapter 15 in _toc.yml"
    tab = visit.open(chapter[0].html)
    link = tab.locator("a[href$='train-in-the-page.html']")
    assert link.count() >= 1, "chapter 15 does not link the explorer page"
    assert link.first.get_attribute("href") == "../" + explorer[0].html
    tab = visit.open(explorer[0].html)
    panel = tab.locator("div.mhbook-explorer[id^='mhbook-live-train-']")
    assert panel.locator("details[open]").count() == 1, "the page's panel is not open"
    status = panel.locator(".mhbook-live-status")
    tab.wait_for_function(
        "(el) => el.textContent.startsWith('Step 0')", arg=status.element_handle()
    )
    panel.locator(".mhbook-live-train-step").click()
    assert status.text_content().startswith("Step 1:"), status.text_content()
    panel.locator(".mhbook-live-train-start").click()
    tab.wait_for_function(
        "(el) => /^Step ([2-9]\\d|\\d{3,})/.test(el.textContent)", arg=status.element_handle()
    )
    panel.locator(".mhbook-live-train-start").click()  # Pause
    assert panel.locator(".mhbook-live-train-start").text_content() == "Start"
    tab.screenshot(path=str(SCREENSHOTS / "train-in-the-page.png"), full_page=True)
    assert not visit.js_errors and not visit.failed and not visit.external, visit.js_errors


def _answer(tab, quiz, right: bool) -> str:
    """Answer a built question right or wrong (the right choice or the first wrong one; the
    right number or one outside the tolerance) and return what the page says."""
    kind, answer = quiz.get_attribute("data-kind"), quiz.get_attribute("data-answer")
    result = quiz.locator(".mhbook-quiz-result")
    if kind == "number":
        value = float(answer) if right else _wrong_number(quiz)
        quiz.locator("input.mhbook-quiz-number").fill(f"{value:g}")
        quiz.locator("input.mhbook-quiz-number").press("Enter")
    else:
        n = int(answer) if right else (1 if int(answer) != 1 else 2)
        quiz.locator("input[type=radio]").nth(n - 1).check()
        quiz.locator("button[type=submit]").click()
    return result.text_content()


def _wrong_number(quiz) -> float:
    """A number outside the question's tolerance."""
    tolerance = float(quiz.get_attribute("data-tolerance") or 0)
    return float(quiz.get_attribute("data-answer")) + 1 + 10 * tolerance


PLAIN_TEXT = """(el) => {
  const copy = el.cloneNode(true);  // the text without its math, however MathJax drew it
  copy.querySelectorAll(".math, script, .MathJax, .MathJax_Preview, .MathJax_Display, math")
    .forEach((e) => e.remove());
  return copy.textContent.replace(/\\s+/g, " ").trim();
}"""


def _feedback(quiz, right: bool) -> tuple[str, str]:
    """The picked choice (its ``data-value``) and its explanation's text without math: what
    the page should show after :func:`_answer`."""
    kind, answer = quiz.get_attribute("data-kind"), quiz.get_attribute("data-answer")
    choices = quiz.locator(".mhbook-quiz-choice")
    values = [choices.nth(i).get_attribute("data-value") for i in range(choices.count())]
    if kind == "number":
        wrong = f"{_wrong_number(quiz):g}"
        pick = values.index("=") if right else values.index(wrong if wrong in values else "?")
    else:
        pick = int(answer) - 1 if right else (0 if int(answer) != 1 else 1)
    why = choices.nth(pick).locator(".mhbook-quiz-feedback").evaluate(PLAIN_TEXT)
    return values[pick], why


def test_quizzes_and_the_review(visit, tmp_path):
    """One quiz per part, answered as a reader does: its first question wrong (then right: only
    the first answer counts), its second right, and a number question wrong; the verdict and the
    picked choice's explanation shown in the live region,
    one question from the keyboard alone. Then the review page: the questions answered wrong
    first are due (FSRS brings them back within a minute), the right ones are not; after a
    reload they still are; answered right there, they leave; export, reset and import bring the
    history back. No console error, no failed request; axe finds nothing on the review page."""
    wrong_first = []
    visit.typeset = False  # the chapters' math aside: the review page typesets its questions
    for prefix in ("01", "05", "09", "13", "14"):
        chapter = [p for p in PAGES if Path(p.file).name.startswith(prefix)]
        assert chapter, f"no chapter {prefix} in _toc.yml"
        # A tab of its own, closed once answered: no wait for MathJax to typeset the whole
        # chapter (test_page checks that), and nothing it still loads counts as failed.
        tab, errors = visit.context.new_page(), []
        tab.on("console", lambda m, e=errors: e.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda err, e=errors: e.append(str(err)))
        tab.on("response", lambda r, e=errors: r.status < 400 or e.append(f"{r.status} {r.url}"))
        tab.goto(visit.base_url + chapter[0].html, wait_until="load")
        quizzes = tab.locator("div.mhbook-quiz")
        assert 5 <= quizzes.count() <= 8, f"chapter {prefix}: {quizzes.count()} questions"
        kinds = [quizzes.nth(i).get_attribute("data-kind") for i in range(quizzes.count())]
        number = kinds.index("number") if "number" in kinds else 0
        for i in sorted({0, 1, number}):  # wrong, right, and a number question wrong
            quiz = quizzes.nth(i)
            quiz.scroll_into_view_if_needed()
            right = i == 1
            said = " ".join(_answer(tab, quiz, right).split())
            verdict = "✓ Right." if right else "✗ Not right."
            assert said.startswith(verdict), (prefix, i, said)
            picked, why = _feedback(quiz, right)
            result = quiz.locator(".mhbook-quiz-result")
            assert result.get_attribute("data-choice") == picked, (prefix, i, picked)
            assert why and why in result.evaluate(PLAIN_TEXT), (prefix, i, why)
            if not right:
                wrong_first.append(quiz.get_attribute("data-quiz-id"))
                again = " ".join(_answer(tab, quiz, True).split())  # a second try: not recorded
                assert again.startswith("✓ Right."), again
            assert "comes back" in quiz.locator(".mhbook-quiz-next").text_content()
        if prefix == "14":  # the keyboard alone: focus a choice, arrows, Enter
            last = quizzes.nth(quizzes.count() - 1)
            if last.get_attribute("data-kind") != "number":
                last.locator("input[type=radio]").first.focus()
                tab.keyboard.press("ArrowDown")
                tab.keyboard.press("Enter")
                result = last.locator(".mhbook-quiz-result")
                assert result.get_attribute("role") == "status"
                assert result.text_content().startswith(("✓", "✗"))
                wrong_first += (
                    []
                    if result.text_content().startswith("✓")
                    else [last.get_attribute("data-quiz-id")]
                )
        assert not errors, (prefix, errors)
        tab.close()
    assert not visit.external, visit.external

    visit.typeset = True
    review = visit.open("review.html")
    review.evaluate(WAIT_FOR_MATHJAX)
    root = review.locator("#mhbook-review")
    shown = lambda: [  # noqa: E731
        q.get_attribute("data-quiz-id") for q in root.locator("div.mhbook-quiz").all()
    ]
    assert sorted(shown()) == sorted(wrong_first), (shown(), wrong_first)
    assert (
        root.locator(".mhbook-review-summary")
        .text_content()
        .startswith(f"{len(wrong_first)} questions to review now.")
    )
    review.screenshot(path=str(SCREENSHOTS / "review.png"), full_page=True)
    review.evaluate(WAIT_FOR_MATHJAX)
    review.reload()
    assert sorted(shown()) == sorted(wrong_first)
    with review.expect_download() as download:
        root.get_by_role("button", name="Export").click()
    saved = tmp_path / "history.json"
    download.value.save_as(saved)
    assert all(qid in saved.read_text() for qid in wrong_first)
    first = root.locator("div.mhbook-quiz").first
    gone = first.get_attribute("data-quiz-id")
    assert _answer(review, first, True).startswith("✓ Right.")
    review.evaluate(WAIT_FOR_MATHJAX)
    review.reload()
    assert gone not in shown()
    root.get_by_role("button", name="Reset…").click()
    root.get_by_role("button", name="Reset: forget every answer (press again)").click()
    assert shown() == [] and root.locator(".mhbook-review-summary").text_content().startswith(
        "0 questions to review now. You have answered 0"
    )
    root.locator("input[type=file]").set_input_files(str(saved))
    review.wait_for_function(
        "() => document.querySelectorAll('#mhbook-review .mhbook-quiz').length > 0"
    )
    assert sorted(shown()) == sorted(wrong_first)
    review.evaluate(WAIT_FOR_MATHJAX)
    assert not visit.js_errors and not visit.failed and not visit.external, visit.js_errors
    problems = axe_problems(review, CODE_REGIONS)
    assert not problems, problems


@pytest.mark.without_mathjax  # the panels, not the math
def test_live_translator(visit, build):
    import torch

    from mhbook.core.config import BOOK_CONFIG
    from mhbook.tasks.numbers import english_words
    from mhbook.training import make_data
    from mhbook.viz.explorers import live

    chapter = [p for p in PAGES if Path(p.file).name.startswith("06")]
    assert chapter, "no chapter 6 in _toc.yml"
    weights = build.html_dir / "_static" / live.LIVE_FILE
    assert weights.is_file(), f"the build did not copy {live.LIVE_FILE} into _static"
    model, meta = live.shipped_model(weights)
    data = make_data(BOOK_CONFIG)
    assert meta["src_vocab"] == data.src_vocab.id_to_token
    bos, eos = data.tgt_vocab.bos_id, data.tgt_vocab.eos_id

    tab = visit.open(chapter[0].html)
    panel = tab.locator("div.mhbook-explorer[id^='mhbook-live-']")
    assert panel.count() == 1, "chapter 6 holds no live panel"
    requested = []
    tab.on("request", lambda r: requested.append(r.url))
    assert not any(live.LIVE_FILE in url for url in requested)  # nothing loaded yet
    summary = panel.locator("summary")
    summary.scroll_into_view_if_needed()
    summary.focus()
    opened = time.perf_counter()
    tab.keyboard.press("Enter")  # the keyboard opens the panel, which loads the weights
    status = panel.locator(".mhbook-live-status")
    expect_text = "Loaded"
    tab.wait_for_function(
        "([el, t]) => el.textContent.includes(t)", arg=[status.element_handle(), expect_text]
    )
    load_ms = 1e3 * (time.perf_counter() - opened)
    assert any(url.endswith(live.LIVE_FILE) for url in requested)

    # From the keyboard: Tab to the field, type a number the test set never held, Enter.
    tab.keyboard.press("Tab")
    assert tab.evaluate("() => document.activeElement.classList.contains('mhbook-live-input')")
    number = next(n for n in range(123_457, 200_000) if n not in set(data.numbers["test"]))
    tab.keyboard.press("Control+A")
    tab.keyboard.type(f"{number:,}")
    tab.keyboard.press("Enter")
    tab.wait_for_function(
        "(el) => el.textContent.startsWith('Translated')", arg=status.element_handle()
    )
    src, lens = data.encode_source([number], "cpu")
    with torch.no_grad():
        want = model.generate(src, lens, 40, bos_id=bos, eos_id=eos)
    assert panel.locator(".mhbook-live-french").text_content() == data.decode_target(want)[0]
    assert panel.locator(".mhbook-live-english").text_content() == english_words(number)
    panel.screenshot(path=str(SCREENSHOTS / "live-translate.png"))

    # Step mode from the keyboard: Tab to Step (past Translate), Enter per step; the cache grows
    # by one French token a step, and its bytes are those of mhbook's KVCache.
    tab.keyboard.press("Tab")
    tab.keyboard.press("Tab")
    assert tab.evaluate("() => document.activeElement.classList.contains('mhbook-live-step')")
    with torch.no_grad():
        memory = model.encoder(src, lens)
        cache = model.decoder.new_cache()
        tokens, sizes = [bos], []
        for _ in range(3):
            logits = model.decoder(torch.tensor([tokens[-1:]]), memory, None, cache)
            tokens.append(int(logits[0, -1].argmax()))
            sizes.append(cache.nbytes)
    for step in range(3):
        tab.keyboard.press("Enter")
        rows = panel.locator(".mhbook-live-cache tbody tr")
        rows.nth(step).wait_for()
        cells = rows.nth(step).locator("td").all_text_contents()
        assert rows.count() == step + 1
        assert cells[3] == str(step + 1) and int(cells[5].replace(",", "")) == sizes[step]
    panel.screenshot(path=str(SCREENSHOTS / "live-step.png"))

    # Words outside the vocabulary get a message that names them.
    input_box = panel.locator(".mhbook-live-input")
    input_box.fill("seventy-one bananas")
    input_box.press("Enter")
    error = panel.locator(".mhbook-live-error")
    error.wait_for()
    assert '"bananas"' in error.text_content()

    # The same numbers as PyTorch: logits to 1e-4 and the same greedy tokens, 50+ inputs.
    numbers = _live_numbers(data)
    assert len(numbers) >= 50
    results = tab.evaluate(LIVE_BATCH.replace("BOS", str(bos)), numbers)
    worst, times = 0.0, []
    for r in results:
        src, lens = data.encode_source([r["n"]], "cpu")
        assert r["srcIds"] == src[0].tolist()
        with torch.no_grad():
            ids = model.generate(src, lens, 40, bos_id=bos, eos_id=eos)[0].tolist()
            tgt = torch.tensor([[bos] + ids[:-1]])
            ref = model.decoder(tgt, model.encoder(src, lens))[0]
        assert r["ids"] == ids, (r["n"], r["text"])
        worst = max(worst, (torch.tensor(r["logits"]) - ref).abs().max().item())
        times.append(r["ms"])
    assert worst < 1e-4, worst

    # Digits to words: the JavaScript against num2words, edge cases and thousands of numbers.
    rng = np.random.default_rng(0)
    check = [0, 1, 9, *range(10, 21), 21, 99, 100, 101, 110, 999, 1_000, 1_001, 1_010,
             1_100, 1_101, 10_000, 10_001, 100_000, 100_001, 100_100, 101_000, 110_000,
             999_999] + [int(n) for n in rng.integers(0, 1_000_000, 3_000)]  # fmt: skip
    words = tab.evaluate("(ns) => ns.map((n) => window.mhbookLive.numberToWords(n))", check)
    wrong = [(n, w, english_words(n)) for n, w in zip(check, words) if w != english_words(n)]
    assert not wrong, wrong[:5]

    # Chapter 7 repeats the panel beside its viewer: the same weights, the same model.
    chapter7 = [p for p in PAGES if Path(p.file).name.startswith("07")]
    tab7 = visit.open(chapter7[0].html)
    panel7 = tab7.locator("div.mhbook-explorer[id^='mhbook-live-']")
    panel7.locator("summary").focus()
    tab7.keyboard.press("Enter")
    tab7.keyboard.press("Tab")
    tab7.keyboard.press("Enter")  # translates the example, seventy-one thousand and eighty
    french = panel7.locator(".mhbook-live-french")
    tab7.wait_for_function("(el) => el.textContent.length > 0", arg=french.element_handle())
    assert french.text_content() == "soixante et onze mille quatre-vingts"

    assert not visit.js_errors, visit.js_errors
    assert not visit.external, visit.external
    assert not visit.failed, visit.failed
    tab = visit.open(chapter[0].html)  # back to chapter 6, the panel open and translated
    panel = tab.locator("div.mhbook-explorer[id^='mhbook-live-']")
    panel.locator("summary").focus()
    tab.keyboard.press("Enter")
    tab.keyboard.press("Tab")
    tab.keyboard.press("Enter")
    tab.locator(".mhbook-live-maps svg").first.wait_for()
    # Last, as test_page does: axe-core's CSS preloading asks for _static/basic.css, which the
    # theme @imports, at the wrong address (a 404 in the console that the page never causes).
    problems = axe_problems(tab)
    assert not problems, problems
    (SCREENSHOTS / "live-measured.txt").write_text(
        f"weights {weights.stat().st_size:,} bytes; chapter 6 page with its images "
        f"{page_weight(build.html_dir / chapter[0].html):,} bytes; "
        f"opened and loaded in {load_ms:.0f} ms; "
        f"max |JS - PyTorch| {worst:.2e} over {len(results)} inputs; translation median "
        f"{np.median(times):.1f} ms, max {max(times):.1f} ms\n"
    )


def test_live_models_from_file(browser, build):
    """The book opened from its files (``file://``, no server), as a reader may open it: a page
    may not fetch there, so the live models read their weights from the scripts the build writes
    beside them (``_ext/mhbook_sphinx.py``). Chapter 14's language model loads and gives
    PyTorch's logits (the shipped weights), and its step-through steps; chapter 6's translator
    loads and translates."""
    import torch

    from mhbook.viz.explorers import live

    visit = Visit(browser, build.html_dir.as_uri() + "/")
    chapter = next(p for p in PAGES if Path(p.file).name.startswith("14"))
    tab = visit.open(chapter.html)
    panel = tab.locator("div.mhbook-explorer[id^='mhbook-live-lm-']")
    panel.locator("summary").first.click()
    status = panel.locator(".mhbook-live-status")
    tab.wait_for_function(
        "(el) => el.textContent.startsWith('Loaded')", arg=status.element_handle()
    )
    lm = live.shipped_lm(build.html_dir / "_static" / live.LIVE_LM_FILE)
    prompt = "ROMEO:\nBut soft"
    js = torch.tensor(tab.evaluate("(p) => window.mhbookLive.lmLogits(p)", prompt))
    with torch.no_grad():
        ref = lm(torch.tensor([[lm.chars.index(c) for c in prompt]]))[0, -1]
    assert (js - ref).abs().max().item() < 1e-4
    step = tab.evaluate("(p) => window.mhbookLive.lmStep(p, 5, {})", prompt)
    assert len(step["order"]) == len(step["values"]) > 80
    tab = visit.open(next(p for p in PAGES if Path(p.file).name.startswith("06")).html)
    panel = tab.locator("div.mhbook-explorer[id^='mhbook-live-']")
    panel.locator("summary").click()
    status = panel.locator(".mhbook-live-status")
    tab.wait_for_function("(el) => el.textContent.includes('Loaded')", arg=status.element_handle())
    said = tab.evaluate("async () => (await window.mhbookLive.translate('71')).text")
    assert isinstance(said, str) and said.strip(), said  # its words: test_live_translator's check
    assert not visit.js_errors and not visit.failed and not visit.external, visit.js_errors
    visit.close()
