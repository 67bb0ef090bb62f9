"""The built book, in a real browser: every page of ``_toc.yml`` in headless Chromium.

The book is built from the committed outputs (no execution: nbval proves they equal a fresh
run) with ``-W -n --keep-going``, served on 127.0.0.1, and each page is checked: its title,
no traceback in any output, typeset math, loaded images, a Colab button that opens *this*
chapter (and a "Practice in Colab" button and a download that give its practice copy), no
request leaving 127.0.0.1, no console error and no failed request (each named with its page;
none is excused), and no serious or critical accessibility violation found by axe-core (the
copy that the pinned ``axe-playwright-python`` ships). The explorers, live models and quizzes
are driven in tests/book/test_browser_panels.py, on another worker, on the same build
(tests/book/conftest.py builds it once per run into ``_build/browser-test``, or
``$MHBOOK_BROWSER_BUILD``).

Chromium is Debian's (``apt-get install chromium``); Playwright only drives it, nothing is
downloaded. Without Chromium the browser checks are skipped, unless ``CI`` is set: then they
fail. Screenshots go to ``_build/screenshots/`` (or ``$MHBOOK_SCREENSHOTS``): the first screen
of every page, the whole page when the page fails its checks or when ``MHBOOK_FULL_SCREENSHOTS=1``
asks for all of them (whole pages are slow: 8 s for the API page, 113,000 pixels tall).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from book_server import PAGES, ROOT, colab_url, page_weight, toc_pages
from browser import (
    AXE_CONTRAST_PAGES,
    AXE_FAILING_IMPACTS,
    AXE_QUIET_RULES,
    FULL_SCREENSHOTS,
    SCREENSHOTS,
    WAIT_FOR_MATHJAX,
    _axe_violations,
    _colour_problems,
    axe_problems,
)

pytestmark = pytest.mark.slow(seconds=240)  # builds the book (or waits for it), opens every page

# --------------------------------------------------------------------------- in-page probes


# Everything the page checks need, read in one go.
PAGE_FACTS = """
() => {
  const article = document.querySelector("article") || document.querySelector("main") ||
    document.body;
  const h1 = article.querySelector("h1");
  const typeset = ".MathJax, .MathJax_Display, .MathJax_CHTML, .MathJax_SVG, .MathJax_MathML, " +
    "mjx-container";
  // Sphinx's math elements; MathJax 2 puts a span.math of its own inside its output.
  const maths = Array.from(document.querySelectorAll("span.math, div.math"))
    .filter((m) => !m.parentElement.closest(typeset));
  const prose = article.cloneNode(true);
  prose.querySelectorAll("pre, code, script, style, .cell_output, .highlight, .MathJax, " +
    "mjx-container, .MathJax_Preview").forEach((e) => e.remove());
  const outputs = Array.from(document.querySelectorAll(".cell_output, .output"));
  return {
    title: document.title,
    lang: document.documentElement.lang,
    // the language switcher's entries: [text, href or null for the page itself]
    languages: Array.from(document.querySelectorAll("nav.mhbook-languages li"))
      .map((li) => [li.textContent.trim(), li.querySelector("a")?.getAttribute("href") ?? null]),
    // without the headerlink (# or ¶) and the chapter number that multitoc numbering adds
    h1: h1 ? h1.innerText.replace(/[#\\u00b6]\\s*$/, "").trim()
      .replace(/^(\\d+\\.)+\\d*\\s+/, "") : null,
    mathCount: maths.length,
    untypeset: maths.filter((m) => !m.querySelector(typeset))
      .map((m) => m.textContent.trim().slice(0, 80)),
    mathErrors: Array.from(document.querySelectorAll(
      ".MathJax_Error, .mjx-merror, mjx-merror, .merror, .noError"))
      .map((e) => e.textContent.trim().slice(0, 80)),
    rawMath: (prose.innerText.match(/\\$\\$|\\$[^$\\s][^$\\n]{0,80}?\\$|\\\\\\(|\\\\\\[/g) || []),
    tracebacks: Array.from(new Set(
      Array.from(document.querySelectorAll(".output.traceback, .output.error, .traceback"))
        .concat(outputs.filter((o) => /Traceback \\(most recent call last\\)/.test(o.innerText)))
        .map((e) => e.innerText.slice(0, 300)))),
    images: Array.from(document.images).map((img) => ({
      src: img.currentSrc || img.src, complete: img.complete, width: img.naturalWidth })),
    colab: Array.from(document.querySelectorAll("a[href*='colab.research.google.com']"))
      .map((a) => a.href),
    practice: Array.from(document.querySelectorAll("a"))
      .filter((a) => a.textContent.trim() === "Practice in Colab").map((a) => a.href),
    practiceDownload: Array.from(document.querySelectorAll("a"))
      .filter((a) => a.textContent.trim() === "practice .ipynb").map((a) => a.href),
  };
}
"""

ALL_IMAGES_LOADED = """
() => Array.from(document.images).every((img) => img.complete)
"""


def _expected_title(source: Path) -> str | None:
    """The page's ``# Title`` as plain words, or None when it holds markup we cannot predict."""
    if source.suffix == ".ipynb":
        cells = json.loads(source.read_text(encoding="utf8"))["cells"]
        text = "\n".join(
            "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells
            if c["cell_type"] == "markdown"
        )
    else:
        text = source.read_text(encoding="utf8")
        text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)  # front matter
    match = re.search(r"^# +(.+?)\s*#*\s*$", text, flags=re.M)
    if match is None:
        return None
    title = match.group(1)
    if re.search(r"[$`{}\[\]<>\\]", title):
        return None
    return _words(title)


def _words(text: str) -> str:
    return " ".join(re.sub(r"[*_]", "", text).split())


def _shot_name(page) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", page.file) + ".png"


# --------------------------------------------------------------------------- tests


def test_toc_lists_pages():
    try:
        pages = toc_pages()
    except FileNotFoundError as err:
        pytest.fail(str(err), pytrace=False)
    assert pages, "_toc.yml lists no pages"


def test_book_builds(build):
    """``jupyter-book build -W -n --keep-going`` of the committed notebooks succeeds."""
    if not build.ok:
        pytest.fail(build.report(), pytrace=False)


def practice_url(page) -> str:
    """The address of the "Practice in Colab" button of ``page``: its practice copy in
    ``practice/`` (``_ext/practice_notebooks.py``), beside the reader copy's."""
    head, _, name = colab_url(page).rpartition("/notebooks/")
    return f"{head}/practice/{name}"


def test_downloads_are_reader_copies(build):
    """A chapter page's ``.ipynb`` download is its reader copy in ``notebooks/``, which exists,
    and its "practice .ipynb" download (``_sources/practice/``) is its practice copy."""
    chapters = [p for p in PAGES if p.is_notebook]
    assert chapters
    for page in chapters:
        name = Path(page.file).name + ".ipynb"
        copy = ROOT / "notebooks" / name
        assert copy.is_file(), f"no reader copy {copy} for {page.file} (make notebooks)"
        download = build.html_dir / "_sources" / "chapters" / name
        assert download.read_text() == copy.read_text(), f"{download} is not notebooks/{name}"
        practice = ROOT / "practice" / name
        assert practice.is_file(), f"no practice copy {practice} for {page.file} (make notebooks)"
        download = build.html_dir / "_sources" / "practice" / name
        assert download.is_file() and download.read_text() == practice.read_text(), (
            f"{download} is not practice/{name}"
        )


@pytest.mark.parametrize("page", PAGES, ids=[p.file for p in PAGES])
def test_page(page, visit):
    tab = visit.open(page.html)
    mathjax = tab.evaluate(WAIT_FOR_MATHJAX)
    tab.evaluate("() => { for (const img of document.images) img.loading = 'eager'; }")
    try:
        tab.wait_for_function(ALL_IMAGES_LOADED, timeout=15_000)
    except Exception:  # reported below, image by image
        pass
    facts = tab.evaluate(PAGE_FACTS)
    shot = SCREENSHOTS / _shot_name(page)
    tab.screenshot(path=str(shot), full_page=FULL_SCREENSHOTS)

    problems = []
    expected = _expected_title(page.source)
    if not facts["h1"]:
        problems.append("no <h1> title")
    elif expected is not None and _words(facts["h1"]) != expected:
        problems.append(f"<h1> is {facts['h1']!r}, the source's title is {expected!r}")
    title_words = _words(facts["h1"] or expected or "")
    if not facts["title"] or (title_words and title_words not in _words(facts["title"])):
        problems.append(f"<title> {facts['title']!r} does not hold the page title")
    if facts["lang"] != "en":
        problems.append(f"<html lang> is {facts['lang']!r}, not 'en'")
    up = "../" * page.file.count("/")
    switcher = [
        ["English", None],
        ["Português", f"{up}pt-BR/{page.file}.html"],
        ["中文", f"{up}zh-CN/{page.file}.html"],
    ]
    if facts["languages"] != switcher:
        problems.append(f"the language switcher is {facts['languages']}, not {switcher}")
    if facts["tracebacks"]:
        problems.append(f"tracebacks in outputs: {facts['tracebacks']}")
    if mathjax not in ("none", "v2", "v3"):
        problems.append(f"{facts['mathCount']} math elements: {mathjax}")
    if facts["untypeset"]:
        problems.append(f"math left untypeset: {facts['untypeset'][:5]}")
    if facts["mathErrors"]:
        problems.append(f"MathJax errors: {facts['mathErrors'][:5]}")
    if facts["rawMath"]:
        problems.append(f"raw TeX delimiters in the text: {facts['rawMath'][:5]}")
    broken = [img["src"] for img in facts["images"] if not img["complete"] or img["width"] == 0]
    if broken:
        problems.append(f"images that did not load: {broken}")
    if page.is_notebook:
        want = colab_url(page)
        if want not in facts["colab"]:
            problems.append(f"no Colab launch link to {want}; links found: {facts['colab']}")
        practice = practice_url(page)
        if facts["practice"] != [practice]:
            problems.append(
                f"no 'Practice in Colab' link to {practice}; found: {facts['practice']}"
            )
        download = f"{visit.base_url}_sources/practice/{Path(page.file).name}.ipynb"
        if facts["practiceDownload"] != [download]:
            problems.append(
                f"no 'practice .ipynb' download of {download}; found: {facts['practiceDownload']}"
            )
    if visit.external:
        problems.append(f"requests that left 127.0.0.1: {sorted(set(visit.external))}")
    # Every console error and failed request, by name (before axe-core, whose CSS preloading
    # asks for _static/basic.css at the wrong address: a 404 that the page never causes).
    problems += [f"failed request: {failed}" for failed in dict.fromkeys(visit.failed)]
    problems += [f"JavaScript: {error}" for error in dict.fromkeys(visit.js_errors)]
    # Accessibility in the same visit (loading and typesetting a page is the slow part).
    problems += axe_problems(tab, AXE_CONTRAST_PAGES.get(page.file))
    if problems:
        if not FULL_SCREENSHOTS:  # the whole page, to see what went wrong
            tab.screenshot(path=str(shot), full_page=True)
        pytest.fail(f"{page.html}:\n  " + "\n  ".join(problems), pytrace=False)


# ---- explorers ch1/2/3/5
# Each explorer of chapters 1, 2, 3 and 5 is driven with the keyboard (or by filling a field),
# must redraw, and must show the numbers of its Python reference in mhbook.viz.explorers.


# Text contrast is checked by colour on every page (tests/browser.py): planted text of too
# little contrast, by colour, size, a translucent background and opacity, must be found by the
# colour check exactly where axe-core's color-contrast rule finds it.
CONTRAST_SAMPLES = """
<main lang="en" style="background: white; font-family: sans-serif">
  <p id="grey-small" style="color: #999999; font-size: 14px">2.8 : 1, small</p>
  <p id="grey-enough" style="color: #767676; font-size: 14px">4.5 : 1, small</p>
  <p id="grey-large" style="color: #949494; font-size: 24px">3.0 : 1, large</p>
  <p id="grey-large-small" style="color: #949494; font-size: 14px">3.0 : 1, small</p>
  <div style="background: rgba(0, 0, 0, 0.5)">
    <p id="white-on-half-black" style="color: white; font-size: 14px">3.9 : 1</p>
  </div>
  <p id="faded" style="color: black; opacity: 0.3; font-size: 14px">black at 30 %</p>
  <p id="dark" style="color: #222222; font-size: 14px">15.9 : 1</p>
</main>
"""


def test_colour_check_agrees_with_axe(browser):
    from axe_playwright_python.sync_playwright import Axe

    tab = browser.new_page()
    tab.set_content(CONTRAST_SAMPLES)
    by_colour = {
        re.search(r'id="([\w-]+)"', line).group(1) if 'id="' in line else line
        for line in _colour_problems(tab, ("p",))
    }
    options = {"runOnly": {"type": "rule", "values": ["color-contrast"]}}
    found = Axe().run(tab, options=options).response["violations"]
    by_axe = {node["target"][0].lstrip("#") for v in found for node in v["nodes"]}
    tab.close()
    want = {"grey-small", "grey-large-small", "white-on-half-black", "faded"}
    assert by_axe == want, by_axe
    assert by_colour == want, by_colour


# Problems axe-core rates serious or critical (a button, an image, a link and a field without a
# name, an ARIA attribute with a wrong value, a list holding a paragraph) beside ones it rates
# minor or moderate (an empty heading, headings out of order, text outside a landmark). axe
# runs only the rules able to fail the test (AXE_QUIET_RULES): it must find what all of axe
# finds at those impacts.
AXE_SAMPLES = """
<h1>Samples</h1><h4></h4><h5>Out of order</h5>
<p>Outside any landmark.</p>
<main>
  <button id="unnamed-button"></button>
  <img id="no-alt" src="data:image/gif;base64,R0lGODlhAQABAAAAACw=">
  <a id="unnamed-link" href="#x"></a>
  <input id="unnamed-field" type="text">
  <div id="bad-aria" role="checkbox" aria-checked="maybe" tabindex="0">box</div>
  <ul id="bad-list"><p>not an item</p></ul>
</main>
"""


def test_axe_finds_what_all_its_rules_find(browser):
    from axe_playwright_python.sync_playwright import Axe

    tab = browser.new_page()
    tab.set_content(AXE_SAMPLES)
    found = {(v["id"], v["impact"]) for v in _axe_violations(tab)}
    everything = Axe().run(tab, options={"resultTypes": ["violations"]}).response["violations"]
    quiet = tab.evaluate(AXE_QUIET_RULES, sorted(AXE_FAILING_IMPACTS))
    tab.close()
    failing = {(v["id"], v["impact"]) for v in everything if v["impact"] in AXE_FAILING_IMPACTS}
    assert found == failing, (found, failing)
    assert {"button-name", "image-alt", "link-name", "label", "aria-valid-attr-value", "list"} <= {
        rule for rule, _ in found
    }, found
    # the rules left out flagged the minor and moderate samples, and are a good part of axe
    assert {"region", "heading-order"} <= {v["id"] for v in everything} - {r for r, _ in found}
    assert {"region", "heading-order", "landmark-one-main"} <= set(quiet)


def test_no_page_is_over_5_mb(build):
    """Every page with its images stays under 5 MB (the live panel's weights load apart)."""
    weights = {p.html: page_weight(build.html_dir / p.html) for p in PAGES}
    heavy = {page: size for page, size in weights.items() if size >= 5 * 2**20}
    assert not heavy, heavy
