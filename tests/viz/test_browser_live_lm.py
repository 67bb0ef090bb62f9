"""The live language model (mhbook/viz/explorers/live.py: export_lm, live_lm_html) in headless
Chromium, on a page of its own (no book build): a small Llama trained for a few steps on Tiny
Shakespeare, exported as chapter 14 exports its model, served on 127.0.0.1 (the panel fetches its
weights), and driven from the keyboard. The JavaScript forward (static/live_lm.js) must give
PyTorch's logits (``live.shipped_lm``, the same float16 weights, in float32) within 1e-4, and
PyTorch's greedy text through the rolling window of 64, past its 64th character; its attention
must be PyTorch's; a character outside the 65 must be refused by name; the panel must open on
temperature 0.8 and seed 0 (greedy decoding loops); a seed must give the same sample twice, and
another seed another; no JavaScript error, and axe-core must find nothing.

Chromium, Playwright and axe as in tests/book/test_browser.py (whose helpers this file imports):
without Chromium the test is skipped, unless ``CI`` is set. The panel's screenshot goes to
``$MHBOOK_SCREENSHOTS/live-lm.png`` (default ``_build/screenshots``).
"""

from __future__ import annotations

import pytest
import torch
from book_server import serve
from browser import CODE_REGIONS, SCREENSHOTS, Visit, axe_problems, step_differences

from mhbook.training.shakespeare_lm import SHAKESPEARE_MODEL, SHAKESPEARE_TRAIN, shakespeare_model
from mhbook.viz.attention_records import passage_attention
from mhbook.viz.explorers import live, live_step

pytestmark = pytest.mark.slow(seconds=30)  # trains a small model, then drives Chromium

# The Llama block of Part V (4 query heads, 2 key/value heads, RMSNorm, SwiGLU, RoPE), smaller.
TINY = SHAKESPEARE_MODEL.replace(d_model=32, num_layers=2, d_ff=64)
FEW_STEPS = SHAKESPEARE_TRAIN.replace(num_steps=40, batch_size=4, eval_every=0)
PROMPT = "ROMEO:\nBut soft, what light"  # 27 characters, then 120 more: past the window of 64
LENGTH = 120
LONG = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n"
)  # 144 characters


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """(folder, the PyTorch model of the shipped weights, tokenizer): the folder holds the
    weights (as chapter 14 writes them) and a page with the panel."""
    folder = tmp_path_factory.mktemp("live-lm")
    model, data, _ = shakespeare_model(
        None, config=TINY, train=FEW_STEPS, progress=False, device="cpu"
    )
    chars = data.tokenizer
    info = live.export_lm(model, chars, folder / live.LIVE_LM_FILE)
    html = live.live_lm_html(url=live.LIVE_LM_FILE).data
    (folder / "page.html").write_text(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<title>Live language model</title></head><body><main><h1>Live language model</h1>"
        f"{html}</main></body></html>",
        encoding="utf-8",
    )
    lm = live.shipped_lm(info["path"])
    assert lm.config == model.config.replace(window=64)  # the window chapter 14 samples through
    return folder, lm, chars


def _greedy(lm, chars, prompt: str, n: int) -> str:
    return chars.decode(lm.generate(torch.tensor([chars.encode(prompt)]), n)[0])


def _generate(tab, panel) -> str:
    """Press Generate (focused), wait for the end; the text the panel wrote."""
    status = panel.locator(".mhbook-live-status")
    tab.evaluate("(el) => { el.textContent = ''; }", status.element_handle())
    tab.keyboard.press("Enter")
    tab.wait_for_function(
        "(el) => el.textContent.startsWith('Generated')", arg=status.element_handle()
    )
    return panel.locator(".mhbook-live-lm-new").text_content()


def test_live_language_model_in_a_browser(chromium, shipped):
    folder, lm, chars = shipped
    with serve(folder) as url:
        visit = Visit(chromium, url)
        try:
            _drive(visit, lm, chars)
        finally:
            visit.close()


def _drive(visit, lm, chars):
    tab = visit.open("page.html")
    panel = tab.locator("div.mhbook-explorer[id^='mhbook-live-lm-']")
    requested = []
    tab.on("request", lambda r: requested.append(r.url))
    # The keyboard opens the panel, which loads the weights (not before).
    panel.locator("summary").first.focus()
    tab.keyboard.press("Enter")
    status = panel.locator(".mhbook-live-status")
    tab.wait_for_function(
        "(el) => el.textContent.startsWith('Loaded')", arg=status.element_handle()
    )
    assert [u for u in requested if u.endswith(live.LIVE_LM_FILE)], requested
    # It opens sampling, at chapter 14's temperature and seed (greedy decoding loops).
    assert panel.locator(".mhbook-live-lm-temperature").input_value() == "0.8"
    assert panel.locator(".mhbook-live-lm-temperature-value").text_content() == "0.8"
    assert panel.locator(".mhbook-live-lm-seed").input_value() == "0"

    # Greedy from the keyboard: the prompt, temperature 0 (Home), the number of characters,
    # Generate. PyTorch's generate through the window of 64 writes the same text.
    tab.keyboard.press("Tab")
    assert tab.evaluate("() => document.activeElement.classList.contains('mhbook-live-lm-prompt')")
    tab.keyboard.press("Control+A")
    tab.keyboard.type(PROMPT)
    tab.keyboard.press("Tab")
    tab.keyboard.press("End")
    tab.keyboard.press("Home")
    assert panel.locator(".mhbook-live-lm-temperature").input_value() == "0"
    assert panel.locator(".mhbook-live-lm-temperature-value").text_content() == "0 (greedy)"
    tab.keyboard.press("Tab")  # the seed: greedy ignores it
    tab.keyboard.press("Tab")
    tab.keyboard.press("Control+A")
    tab.keyboard.type(str(LENGTH))
    tab.keyboard.press("Tab")
    greedy = _generate(tab, panel)
    want = _greedy(lm, chars, PROMPT, LENGTH)
    assert len(PROMPT) + LENGTH > 64 + 64  # the cache rolled many times
    assert greedy == want, f"JavaScript {greedy!r}\n PyTorch {want!r}"
    assert panel.locator(".mhbook-live-lm-given").text_content() == PROMPT
    api = tab.evaluate("([p, n]) => window.mhbookLive.complete(p, n)", [PROMPT, LENGTH])
    assert api == want
    cache = panel.locator(".mhbook-live-lm-cache").text_content()
    assert "the last 64 characters" in cache and f"position is {len(PROMPT) + LENGTH}" in cache
    assert f"{2 * 2 * 2 * 8 * 64 * 4:,} bytes" in cache  # layers, k and v, kv heads, d_head, 64

    # The logits after a prompt, short and past the window: PyTorch's within 1e-4.
    worst = 0.0
    for prompt in [PROMPT, LONG, PROMPT + want, "A"]:
        js = torch.tensor(tab.evaluate("(p) => window.mhbookLive.lmLogits(p)", prompt))
        with torch.no_grad():
            ref = lm(torch.tensor([chars.encode(prompt)]))[0, -1]
        worst = max(worst, (js - ref).abs().max().item())
    print(f"live LM: max |JS - PyTorch| logit {worst:.2e}")
    assert worst < 1e-4, worst

    # The map: layer 2, head 3 from the keyboard (Tab past Stop and the text), the last
    # character's attention over its 64, as PyTorch's layers have it.
    tab.keyboard.press("Tab")
    tab.keyboard.press("Tab")
    tab.keyboard.press("Tab")
    assert tab.evaluate("() => document.activeElement.classList.contains('mhbook-live-lm-layer')")
    tab.keyboard.press("ArrowDown")
    tab.keyboard.press("Tab")
    tab.keyboard.press("ArrowDown")
    tab.keyboard.press("ArrowDown")
    assert panel.locator(".mhbook-live-lm-layer").input_value() == "2"
    assert panel.locator(".mhbook-live-lm-head").input_value() == "3"
    caption = panel.locator(".mhbook-live-map figcaption").text_content()
    assert caption.startswith("Layer 2, head 3: the last character") and "64 in" in caption
    drawn = [
        float(t.rsplit(": ", 1)[1])
        for t in panel.locator(".mhbook-live-map rect title").all_text_contents()
    ]
    full = PROMPT + want
    ref = passage_attention(lm, [chars.encode(full)])[0, 1, 2, -1, -64:]
    assert len(drawn) == 64 and max(abs(a - b) for a, b in zip(drawn, ref.tolist())) <= 0.0051
    js = tab.evaluate("(p) => window.mhbookLive.lmAttention(p)", full)
    ours = passage_attention(lm, [chars.encode(full)])[0, :, :, -1, -64:]
    assert (torch.tensor(js) - torch.from_numpy(ours)).abs().max().item() < 1e-5
    assert panel.locator(".mhbook-live-lm-readout").text_content().startswith("Most weight: ")

    # A character outside the 65 is refused, by name.
    prompt_box = panel.locator(".mhbook-live-lm-prompt")
    prompt_box.focus()
    tab.keyboard.press("Control+A")
    tab.keyboard.type("Café au lait")
    tab.keyboard.press("Control+Enter")
    error = panel.locator(".mhbook-live-error")
    error.wait_for()
    assert "\u201c\u00e9\u201d" in error.text_content() and "position 4" in error.text_content()
    with pytest.raises(ValueError, match="'é'"):  # as CharTokenizer.encode refuses it
        chars.encode("Café au lait")

    # Sampling at 0.8: the same seed gives the same text twice, another seed another.
    prompt_box.focus()
    tab.keyboard.press("Control+A")
    tab.keyboard.type("JULIET:\n")
    samples = {}
    for seed in (7, 7, 8):
        panel.locator(".mhbook-live-lm-temperature").focus()
        tab.keyboard.press("Home")
        for _ in range(8):
            tab.keyboard.press("ArrowRight")
        tab.keyboard.press("Tab")
        tab.keyboard.press("Control+A")
        tab.keyboard.type(str(seed))
        tab.keyboard.press("Tab")
        tab.keyboard.press("Tab")  # past the number of characters (120) to Generate
        samples.setdefault(seed, []).append(_generate(tab, panel))
    assert panel.locator(".mhbook-live-lm-temperature-value").text_content() == "0.8"
    assert samples[7][0] == samples[7][1] and samples[7][0] != samples[8][0]
    assert samples[7][0] != _greedy(lm, chars, "JULIET:\n", LENGTH)
    api = tab.evaluate(
        "(p) => window.mhbookLive.complete(p, 120, {temperature: 0.8, seed: 7})", "JULIET:\n"
    )
    assert api == samples[7][0]

    # Stop, from the keyboard, ends a long generation where it is.
    panel.locator(".mhbook-live-lm-length").focus()
    tab.keyboard.press("Control+A")
    tab.keyboard.type("2000")
    tab.keyboard.press("Tab")
    tab.keyboard.press("Enter")
    written = panel.locator(".mhbook-live-lm-new")
    tab.wait_for_function("(el) => el.textContent.length >= 5", arg=written.element_handle())
    tab.keyboard.press("Tab")
    tab.keyboard.press("Enter")
    tab.wait_for_function(
        "(el) => el.textContent.startsWith('Stopped after')", arg=status.element_handle()
    )
    stopped = written.text_content()
    tab.wait_for_timeout(300)
    assert written.text_content() == stopped and len(stopped) < 2000

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    panel.screenshot(path=str(SCREENSHOTS / "live-lm.png"))
    assert not visit.js_errors, f"JavaScript errors: {visit.js_errors}"
    assert not visit.failed and not visit.external, (visit.failed, visit.external)
    problems = axe_problems(tab, CODE_REGIONS)
    assert not problems, "\n".join(problems)


# ---- the step-through: every operation of one character, against PyTorch's
# Held back from the panel's own prompts: a short one, one past the window of 64 (the rolling
# cache dropped keys), and one with the characters the map labels (" ", "\n").
STEP_PROMPTS = [
    ("KING RICHARD III:\nNow is the winter", 20),
    (LONG, 100),
    ("O, she doth\nteach", 11),
]


def test_step_through_in_a_browser(chromium, shipped):
    folder, lm, chars = shipped
    with serve(folder) as url:
        visit = Visit(chromium, url)
        try:
            _drive_step(visit, lm, chars)
        finally:
            visit.close()


def _drive_step(visit, lm, chars):
    tab = visit.open("page.html")
    panel = tab.locator("div.mhbook-explorer[id^='mhbook-live-lm-']")
    panel.locator("summary").first.focus()
    tab.keyboard.press("Enter")
    status = panel.locator(".mhbook-live-status")
    tab.wait_for_function(
        "(el) => el.textContent.startsWith('Loaded')", arg=status.element_handle()
    )
    # Every operation the page records is one of STEP_OPS, in its order, and equals PyTorch's
    # (forward hooks on the model of the same weights) within 1e-4 (relative above 1).
    want_keys = live_step.step_keys(lm.config.num_layers)
    worst = step_differences(tab, lm, STEP_PROMPTS)
    print("step-through, worst |JS - PyTorch| by operation:", worst)
    assert max(worst.values()) < 1e-4, worst

    # The panel, from the keyboard: open the fold, the character number, Step through.
    step = panel.locator("details.mhbook-live-step")
    step.locator("summary").focus()
    tab.keyboard.press("Enter")
    prompt, position = STEP_PROMPTS[0]
    box = panel.locator(".mhbook-live-lm-prompt")
    box.focus()
    tab.keyboard.press("Control+A")
    tab.keyboard.type(prompt)
    number = step.locator(".mhbook-live-step-position")
    number.focus()
    tab.keyboard.press("Control+A")
    tab.keyboard.type(str(position + 1))
    tab.keyboard.press("Enter")  # submits the step form
    view = step.locator(".mhbook-live-step-view")
    view.locator("h4").wait_for()
    assert view.locator("h4").text_content() == "Token embedding"
    where = view.locator(".mhbook-live-step-where").text_content()
    assert f"Character {position + 1} of {len(prompt)}" in where
    assert f"operation 1 of {len(want_keys)}" in where
    # Next, twice: layer 1's RMSNorm, then its queries; the link names the source.
    step.locator(".mhbook-live-step-forward").focus()
    tab.keyboard.press("Enter")
    tab.keyboard.press("Enter")
    assert view.locator("h4").text_content() == "Layer 1 of 2: Query projection"
    links = [view.locator("a").nth(i).get_attribute("href") for i in range(2)]
    assert links == [
        "../api.html#mhbook.attention.multihead.MultiHeadAttention.forward",
        "../_modules/mhbook/attention/multihead.html#MultiHeadAttention.forward",
    ], links
    # The operation list: layer 2's keys in the cache; then the next character, with the cache.
    index = want_keys.index("blocks.1.keys")
    step.locator(".mhbook-live-step-op").select_option(str(index))
    titles = view.locator("rect title").all_text_contents()
    assert any("(cached)" in t for t in titles) and any("(new)" in t for t in titles)
    step.locator(".mhbook-live-step-next-char").focus()
    tab.keyboard.press("Enter")
    where = view.locator(".mhbook-live-step-where").text_content()
    assert f"Character {position + 2} of {len(prompt)}" in where
    rows = {t.split(", feature")[0] for t in view.locator("rect title").all_text_contents()}
    assert len(rows) == position + 2  # one key more: the cached ones and the new one
    got = tab.evaluate(
        "([p, i]) => window.mhbookLive.lmStep(p, i, {temperature: 0.8, topP: 0.9})",
        [prompt, position + 1],
    )
    drawn = [float(t.rsplit(": ", 1)[1]) for t in view.locator("rect title").all_text_contents()]
    flat = torch.tensor(got["values"]["blocks.1.keys"]).flatten()
    assert torch.allclose(torch.tensor(drawn), flat, atol=1e-5)  # what it draws is what it checks
    # The probabilities, last: the top 10 characters.
    step.locator(".mhbook-live-step-op").select_option(str(len(want_keys) - 1))
    assert view.locator(".mhbook-live-step-probs li").count() == 10

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    step.locator(".mhbook-live-step-op").select_option(str(want_keys.index("blocks.0.scores")))
    step.screenshot(path=str(SCREENSHOTS / "live-lm-step.png"))
    assert not visit.js_errors, f"JavaScript errors: {visit.js_errors}"
    assert not visit.failed and not visit.external, (visit.failed, visit.external)
    problems = axe_problems(tab, CODE_REGIONS)
    assert not problems, "\n".join(problems)
