"""What the browser tests share: Debian's Chromium driven by Playwright (nothing is
downloaded), a tab that records every request, console error and failed response, and the
accessibility checks (axe-core, as the pinned ``axe-playwright-python`` ships it, and text
contrast checked colour by colour).

Used by ``tests/book/test_browser.py`` (the built book) and the tests of single panels
(``tests/viz/test_browser_passages.py``, ``tests/viz/test_browser_live_lm.py``). Without
Chromium the browser checks are skipped, unless ``CI`` is set: then they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from book_server import ROOT

SCREENSHOTS = Path(os.environ.get("MHBOOK_SCREENSHOTS") or ROOT / "_build" / "screenshots")
FULL_SCREENSHOTS = os.environ.get("MHBOOK_FULL_SCREENSHOTS", "").strip() not in ("", "0")
CHROMIUM = (
    os.environ.get("MHBOOK_CHROMIUM")
    or shutil.which("chromium")
    or shutil.which("chromium-browser")
)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
TIMEOUT_MS = 30_000


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def no_browser(reason: str):
    if in_ci():
        pytest.fail(f"{reason} (CI is set, so the browser test may not be skipped)", pytrace=False)
    pytest.skip(reason)


def launch_chromium():
    """Debian's Chromium, headless, driven by Playwright: a generator that yields the browser
    and closes it afterwards (``yield from launch_chromium()`` in a fixture). Skips, or fails
    when ``CI`` is set, where Chromium or Playwright is missing."""
    if CHROMIUM is None or not Path(CHROMIUM).exists():
        no_browser("Chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        no_browser("the playwright package is not installed")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        yield browser
        browser.close()


# MathJax 2 is half of what a chapter costs to open (3 CPU-s of its typesetting). A test that
# drives a panel, or checks an edition's page (whose math is the English page's, kept verbatim
# by ``editions.py lint``), opens its pages with ``Visit(..., typeset=False)``: MathJax.js is
# answered by this stand-in, which says it is done (WAIT_FOR_MATHJAX's v3 branch), and the math
# stays TeX. test_page opens every page with MathJax and checks its typesetting.
MATHJAX_STAND_IN = "window.MathJax = {startup: {promise: Promise.resolve()}};"


class Visit:
    """A browser tab that records what a page asked for and what went wrong in it.

    Nothing is excused: every console error, uncaught exception, response of 400 or more
    (``/favicon.ico`` included) and failed request (``about:blank`` included) is recorded, each
    with the page it happened on. The book's build leaves none (``_ext/mhbook_sphinx.py``:
    the theme's mode, MathJax 2's blank font, the book's icon).

    ``open`` leaves a page only once it is typeset and its requests are done (:meth:`settle`):
    a request the test's own navigation cut short (the icon Chromium asks for after ``load``,
    a font MathJax asks for while it typesets) is not the book's failure, and one that never
    finishes is recorded as one.
    """

    def __init__(self, browser, base_url: str, typeset: bool = True):
        self.base_url = base_url
        self.typeset = typeset
        self.external: list[str] = []
        self.failed: list[str] = []
        self.js_errors: list[str] = []
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.page.on(
            "pageerror", lambda err: self.js_errors.append(f"{self.where}: uncaught: {err}")
        )
        self.page.on("console", self._console)
        self.page.on("response", self._response)
        self.page.on("requestfailed", self._request_failed)
        self.in_flight: set = set()
        self.page.on("request", lambda request: self.in_flight.add(request))
        self.page.on("requestfinished", lambda request: self.in_flight.discard(request))

    @property
    def where(self) -> str:
        """The page now open, relative to the book (``chapters/01-....html``)."""
        url = self.page.url
        return url[len(self.base_url) :] if url.startswith(self.base_url) else url

    def _console(self, message):
        if message.type == "error":
            source = message.location.get("url") or "?"
            self.js_errors.append(f"{self.where}: console error: {message.text} (from {source})")

    def _route(self, route):
        url = route.request.url
        parts = urlsplit(url)
        if parts.scheme in ("http", "https", "ws", "wss") and parts.hostname not in LOCAL_HOSTS:
            self.external.append(url)
            route.abort()
        elif not self.typeset and parts.path.endswith("/mathjax/MathJax.js"):
            route.fulfill(body=MATHJAX_STAND_IN, content_type="text/javascript")
        else:
            route.continue_()

    def _response(self, response):
        if response.status >= 400:
            self.failed.append(f"{self.where}: {response.status} {response.url}")

    def _request_failed(self, request):
        self.in_flight.discard(request)
        if request.url not in self.external:  # those are reported as leaving 127.0.0.1
            self.failed.append(f"{self.where}: {request.failure} {request.url}")

    def settle(self, quiet_ms: int = 50, limit_s: float = 30.0):
        """Wait until the open page's MathJax has typeset it (its fonts load for seconds, one
        after another, between stretches of work) and no request of the page has been in
        flight for ``quiet_ms`` (the pause lets one that starts just after another, or after
        ``load``, be seen). What is still loading after ``limit_s`` is recorded as failed."""
        if self.typeset:
            self.page.evaluate(WAIT_FOR_MATHJAX)
        deadline, quiet_since = time.monotonic() + limit_s, None
        while time.monotonic() < deadline:
            if self.in_flight:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_ms / 1000:
                return
            self.page.wait_for_timeout(10)  # lets Playwright deliver the page's events
        self.failed += [
            f"{self.where}: still loading after {limit_s:g} s: {request.url}"
            for request in self.in_flight
        ]

    def open(self, html: str):
        if self.page.url != "about:blank":
            self.settle()
        self.page.goto(self.base_url + html, wait_until="load")
        return self.page

    def close(self):
        self.context.close()


# Resolves when MathJax (2 or 3) has typeset the page, "none" when the page has no math,
# or a sentence saying what went wrong: it never hangs.
WAIT_FOR_MATHJAX = """
() => new Promise((resolve) => {
  if (!document.querySelector(".math")) { resolve("none"); return; }
  setTimeout(() => resolve("MathJax did not finish typesetting in 30 s"), 30000);
  const start = Date.now();
  (function poll() {
    const MJ = window.MathJax;
    if (MJ && MJ.Hub && MJ.Hub.Register) {
      MJ.Hub.Register.StartupHook("End", () => resolve("v2"));  // the first typeset is done
      return;
    }
    if (MJ && MJ.startup && MJ.startup.promise) {
      MJ.startup.promise.then(() => resolve("v3"));
      return;
    }
    if (Date.now() - start > 20000) { resolve("MathJax never loaded"); return; }
    setTimeout(poll, 50);
  })();
})
"""


# --------------------------------------------------------------------------- accessibility

# axe-core, the accessibility engine of Deque, as the pinned axe-playwright-python ships it
# (its axe.min.js is injected into the page: nothing is fetched). Violations of impact
# "serious" or "critical" fail the test.
AXE_FAILING_IMPACTS = {"serious", "critical"}
# So axe runs only the rules that can report such a violation: a node's impact is the highest
# among its rule's and its failed checks' impacts, and a quarter of axe's time went to rules
# that can only say "minor" or "moderate" (region, landmarks, heading order...), which never
# failed the test. Read from the injected axe (its rule and check metadata), as it is pinned.
AXE_QUIET_RULES = """
(failing) => axe._audit.rules.filter((rule) => {
  const checks = [...rule.any, ...rule.all, ...rule.none]
    .map((c) => axe._audit.checks[typeof c === "string" ? c : c.id]);
  const impacts = [rule.impact, ...checks.map((c) => c && c.metadata && c.metadata.impact)];
  return !impacts.some((impact) => failing.includes(impact));
}).map((rule) => rule.id)
"""
# Known violations that come from the theme (sphinx-book-theme / pydata-sphinx-theme), not from
# the book's content, as {rule id: reason}; each is checked against the CSS selectors of the
# elements it flags, so a new violation of the same rule in the book's own content still fails.
AXE_THEME_ALLOWED: dict[str, tuple[str, str]] = {}

# Text contrast is checked by colour on every page (_colour_problems): every distinct text
# colour, background, size and weight among the visible text must reach the ratio axe requires.
# It costs 0.3 s for chapter 7, where axe's own color-contrast rule costs 4 s even outside the
# highlighted code (2 to 15 s a page: it lays out a grid of every element first), which was the
# largest part of the browser test. test_colour_check_agrees_with_axe shows both finding the same
# planted problems, and axe's rule still runs on the pages of AXE_CONTRAST_PAGES (the theme's
# chrome, the quiz, the review page, a chapter's explorers), outside the regions named there:
# highlighted code, API signatures and inline code, thousands of spans in a few theme colours.
CODE_REGIONS = (".highlight", ".sig", "code")
AXE_CONTRAST_PAGES = {
    "intro": CODE_REGIONS,
    "review": CODE_REGIONS,
    "chapters/03-masking": CODE_REGIONS,
}

# {"[colour, [backgrounds from the element up to an opaque one], size, weight, opacity]": an
# element that has it} for the visible text inside the elements matching the selectors.
COLOUR_PAIRS = r"""
(selectors) => {
  const transparent = (c) => c === "transparent" || /^rgba\(.*,\s*0\)$/.test(c);
  const layersOf = new Map();
  const layers = (el) => {
    if (!el) return ["rgb(255, 255, 255)"];  // the canvas
    if (!layersOf.has(el)) {
      const c = getComputedStyle(el).backgroundColor;
      const up = c.startsWith("rgba") || transparent(c) ? layers(el.parentElement) : [];
      layersOf.set(el, transparent(c) ? up : [c, ...up]);
    }
    return layersOf.get(el);
  };
  const found = {};
  for (const el of document.querySelectorAll(selectors.map((s) => `${s}, ${s} *`).join(", "))) {
    if (el.closest("svg") || !el.getClientRects().length) continue;  // not rendered as text
    if (!Array.from(el.childNodes).some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
    const s = getComputedStyle(el);
    if (s.visibility !== "visible") continue;
    const key = JSON.stringify([s.color, layers(el), s.fontSize, s.fontWeight, s.opacity]);
    const id = el.id ? ` id="${el.id}"` : "";
    if (!(key in found)) found[key] = `<${el.tagName.toLowerCase()}${id} class="${el.className}">`;
  }
  return found;
}
"""


def _rgba(css: str) -> tuple[float, float, float, float]:
    m = re.fullmatch(r"rgba?\(([\d.]+), ([\d.]+), ([\d.]+)(?:, ([\d.]+))?\)", css)
    if m is None:
        raise ValueError(f"a colour this test cannot read: {css!r}")
    r, g, b, a = m.groups()
    return float(r), float(g), float(b), 1.0 if a is None else float(a)


def _over(top: tuple, bottom: tuple) -> tuple:
    """``top`` (with its alpha) painted over the opaque ``bottom``."""
    a = top[3]
    return (*(a * t + (1 - a) * b for t, b in zip(top[:3], bottom[:3])), 1.0)


def _luminance(rgb: tuple) -> float:
    """WCAG 2's relative luminance of an sRGB colour (channels 0-255)."""
    c = [v / 255 for v in rgb[:3]]
    c = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in c]
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]


def contrast_ratio(colour: str, backgrounds: list[str], opacity: float = 1.0) -> float:
    """WCAG 2's contrast ratio of text in CSS ``colour`` over ``backgrounds`` (the element's
    own first, down to an opaque one)."""
    background = _rgba(backgrounds[-1])
    for layer in reversed(backgrounds[:-1]):
        background = _over(_rgba(layer), background)
    r, g, b, a = _rgba(colour)
    text = _over((r, g, b, a * opacity), background)
    lighter, darker = sorted((_luminance(text), _luminance(background)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def _colour_problems(tab, selectors: tuple[str, ...] = ("body",)) -> list[str]:
    """Text inside the elements that match ``selectors`` below axe's color-contrast thresholds
    (WCAG AA: 4.5, or 3 for large text: 24 px, or 18.66 px bold)."""
    problems = []
    for key, element in tab.evaluate(COLOUR_PAIRS, list(selectors)).items():
        colour, backgrounds, size, weight, opacity = json.loads(key)
        size, weight = float(size.removesuffix("px")), int(weight)
        needed = 3.0 if size >= 24 or (size >= 18.66 and weight >= 700) else 4.5
        ratio = contrast_ratio(colour, backgrounds, float(opacity))
        if ratio < needed:
            problems.append(
                f"contrast {ratio:.2f} < {needed} for {colour} on {backgrounds[0]} "
                f"({size:g}px, weight {weight}), e.g. {element}"
            )
    return problems


def _axe_violations(tab, axe_contrast_outside: tuple[str, ...] | None = None) -> list[dict]:
    try:
        from axe_playwright_python.sync_playwright import Axe
    except ImportError:
        no_browser("axe-playwright-python is not installed (pip install -r requirements.txt)")
    tab.evaluate(WAIT_FOR_MATHJAX)  # judge the page as the reader sees it, math typeset
    tab.evaluate(Axe().axe_script)  # once: both runs below call the injected axe
    quiet = tab.evaluate(AXE_QUIET_RULES, sorted(AXE_FAILING_IMPACTS))
    everything_else = {
        "resultTypes": ["violations"],
        "rules": {rule: {"enabled": False} for rule in ["color-contrast", *quiet]},
    }
    contrast = {
        "resultTypes": ["violations"],
        "runOnly": {"type": "rule", "values": ["color-contrast"]},
    }
    run = "([context, options]) => axe.run(context || document, options)"
    violations = tab.evaluate(run, [None, everything_else])["violations"]
    if axe_contrast_outside is not None:
        outside = {"exclude": [[selector] for selector in axe_contrast_outside]}
        violations += tab.evaluate(run, [outside, contrast])["violations"]
    found = []
    for violation in violations:
        if violation["impact"] not in AXE_FAILING_IMPACTS:
            continue
        allowed = AXE_THEME_ALLOWED.get(violation["id"])
        nodes = [
            node
            for node in violation["nodes"]
            if allowed is None or not any(allowed[0] in target for target in node["target"])
        ]
        if nodes:
            found.append({**violation, "nodes": nodes})
    return found


def axe_problems(tab, axe_contrast_outside: tuple[str, ...] | None = None) -> list[str]:
    """axe-core's serious or critical violations on the page (theme issues aside), and text of
    too little contrast found by colour, as lines. ``axe_contrast_outside`` (CSS selectors) runs
    axe's color-contrast rule as well, on the page outside those elements."""
    lines = [f"colour contrast: {problem}" for problem in _colour_problems(tab)]
    for v in _axe_violations(tab, axe_contrast_outside):
        lines.append(f"axe-core: {v['id']} ({v['impact']}, {len(v['nodes'])}x): {v['help']}")
        for node in v["nodes"][:3]:
            lines.append(f"    {', '.join(node['target'])}: {node['html'][:160]}")
    return lines


# --------------------------------------------------------------------------- the step-through


def step_differences(tab, lm, prompts, temperature=0.8, top_p=0.9) -> dict[str, float]:
    """The page's step-through (``window.mhbookLive.lmStep``) against PyTorch's
    (``live_step.step_reference``: forward hooks on ``lm``, the model of the page's weights,
    its characters ``lm.chars``) for each ``(prompt, position)``: the worst |JS - PyTorch|
    (relative above 1) of each operation. Asserts that the page records exactly the operations
    of STEP_OPS, in their order, each of PyTorch's shape."""
    import torch

    from mhbook.viz.explorers.live_step import step_keys, step_reference

    keys = step_keys(lm.config.num_layers)
    worst: dict[str, float] = {}
    for prompt, position in prompts:
        got = tab.evaluate(
            "([p, i, t, q]) => window.mhbookLive.lmStep(p, i, {temperature: t, topP: q})",
            [prompt, position, temperature, top_p],
        )
        assert got["order"] == keys
        assert sorted(got["values"]) == sorted(keys), "the page records other operations"
        ids = [lm.chars.index(c) for c in prompt]
        ref = step_reference(lm, ids, position, temperature=temperature, top_p=top_p)
        for key in keys:
            js = torch.tensor(got["values"][key], dtype=torch.float32)
            assert js.shape == ref[key].shape, (key, js.shape, ref[key].shape)
            diff = ((js - ref[key]).abs() / ref[key].abs().clamp(min=1)).max().item()
            op = key.rsplit(".", 1)[-1]
            worst[op] = max(worst.get(op, 0.0), diff)
    return worst
