"""The Portuguese and Chinese editions, in a real browser: one page per part in each.

Both editions are built (``_ext/editions.py``, from the committed outputs, as the English build
of tests/book/conftest.py is, with ``-W -n``; an edition's API page links to the English one)
and served inside the English build's HTML folder, as ``pt-BR/`` and ``zh-CN/``. On each page:
``<html lang>`` is the edition's, the language switcher leads to the same page in English and
back, the page says which English commit it follows, the panels' words are the edition's
(data left alone), Colab opens the edition's copies, no console error, no failed request,
nothing leaves 127.0.0.1, and axe-core finds nothing serious.
"""

from __future__ import annotations

import fcntl
import shutil
import sys
from pathlib import Path

import pytest
from book_server import BUILD_DIR, PAGES, ROOT, colab_url
from browser import WAIT_FOR_MATHJAX, axe_problems

sys.path.insert(0, str(ROOT / "_ext"))
import editions  # noqa: E402

# Without MathJax: an edition's math is the English page's (test_page typesets and checks it).
pytestmark = [pytest.mark.slow(seconds=150), pytest.mark.without_mathjax]

# One page per part, the book's front page and the review page.
SAMPLE = ["intro"] + [
    page.file
    for page in PAGES
    if Path(page.file).name[:2] in ("01", "05", "09", "13", "14") or page.file == "review"
]


# Built beside the English book's build folder, without waiting for it (the English build runs
# on another worker meanwhile), then linked into its HTML folder.
EDITIONS_DIR = BUILD_DIR.parent / f"{BUILD_DIR.name}-editions"


@pytest.fixture(scope="module")
def built(testrun_uid, request):
    """Both editions, built once per run, served beside the English book."""
    EDITIONS_DIR.parent.mkdir(parents=True, exist_ok=True)
    done = EDITIONS_DIR / "built"
    with open(EDITIONS_DIR.parent / f"{EDITIONS_DIR.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (done.is_file() and done.read_text() == testrun_uid):
            shutil.rmtree(EDITIONS_DIR, ignore_errors=True)
            EDITIONS_DIR.mkdir()
            for language in editions.EDITIONS:
                proc = editions.build_edition(language, EDITIONS_DIR, execute="off")
                assert proc.returncode == 0, f"the {language} edition:\n{proc.stdout[-4000:]}"
            done.write_text(testrun_uid)
    build = request.getfixturevalue("build")
    for folder, _ in editions.EDITIONS.values():
        link = build.html_dir / folder
        if not link.exists():
            link.symlink_to(EDITIONS_DIR / folder, target_is_directory=True)
    return build


@pytest.mark.parametrize("language", list(editions.EDITIONS))
@pytest.mark.parametrize("page", SAMPLE)
def test_edition_page(built, visit, language, page):
    folder, name = editions.EDITIONS[language]
    strings = editions.strings(language)
    tab = visit.open(f"{folder}/{page}.html")
    tab.evaluate(WAIT_FOR_MATHJAX)
    assert tab.evaluate("() => document.documentElement.lang") == folder
    switcher = tab.locator("nav.mhbook-languages")
    assert switcher.count() == 1
    assert switcher.locator("[aria-current=page]").text_content() == name
    assert "commit" in switcher.text_content() or "提交" in switcher.text_content()
    if page.startswith("chapters/"):
        # Colab opens the edition's reader and practice copies
        colab = tab.evaluate(
            "() => Array.from(document.querySelectorAll(\"a[href*='colab.research']\"),"
            " (a) => a.href)"
        )
        stem = Path(page).name
        want = colab_url(next(p for p in PAGES if p.file == page))
        want = want.replace(f"/notebooks/{stem}", f"/notebooks/{folder}/{stem}")
        assert want in colab, colab
        assert want.replace("/notebooks/", "/practice/") in colab, colab
        assert (ROOT / "notebooks" / folder / f"{stem}.ipynb").is_file()
        # the panels' own words in the edition's language (mhbook-i18n.js), data left alone
        check = tab.locator("div.mhbook-quiz button[type=submit]").first
        assert check.text_content().strip() == strings["Check"]
    if page.endswith("14-a-small-llama"):  # the live language model's panel
        live = tab.locator("div.mhbook-explorer button[type=submit]", has_text=strings["Generate"])
        assert live.count() >= 1
        _step_links_lead_to_the_english_book(tab, visit, strings)
    if page == "review":
        assert tab.get_by_role("button", name=strings["Export"]).count() == 1
    if page.endswith("01-queries-keys-values"):
        assert tab.locator(".mhbook-explorer svg text", has_text="watch").count() >= 1
    assert not visit.external, visit.external
    assert not visit.failed, visit.failed
    assert not visit.js_errors, visit.js_errors
    problems = axe_problems(tab)  # after the checks of failed requests: axe asks for a CSS
    assert not problems, problems  # file at a wrong address (tests/book/test_browser.py)
    # The switcher both ways: to the same page in English, and back. Followed by a click on the
    # front page; elsewhere its link is read (a chapter loads and typesets for seconds, and the
    # English page's own link back is test_browser.py's test_page).
    english = switcher.get_by_text("English")
    if page != "intro":
        href = english.evaluate("(a) => a.href")
        assert href == f"{visit.base_url}{page}.html", href
        assert tab.request.get(href).ok, href
        return
    english.click()
    tab.wait_for_load_state("load")
    assert tab.url.endswith(f"/{page}.html") and f"/{folder}/" not in tab.url, tab.url
    assert tab.evaluate("() => document.documentElement.lang") == "en"
    tab.locator("nav.mhbook-languages").get_by_text(name).click()
    tab.wait_for_load_state("load")
    assert tab.url.endswith(f"/{folder}/{page}.html"), tab.url


def _step_links_lead_to_the_english_book(tab, visit, strings):
    """The step-through's links (an operation's API entry and its code): an edition has no API
    page or source of its own, so they lead to the English book's, which exist."""
    panel = tab.locator("div.mhbook-explorer[id^='mhbook-live-lm-']")
    panel.locator("summary").first.click()
    tab.evaluate("async () => { await window.mhbookLive.lmLoad(); }")  # the weights
    step = panel.locator("details.mhbook-live-step")
    step.locator("summary").click()
    step.locator("button[type=submit]").click()
    view = step.locator(".mhbook-live-step-view")
    view.locator("h4").wait_for()
    api, code = (view.locator("a").nth(i).get_attribute("href") for i in range(2))
    assert api == visit.base_url + "api.html#mhbook.models.lm.DecoderOnlyLM.forward", api
    assert code == visit.base_url + "_modules/mhbook/models/lm.html#DecoderOnlyLM.forward", code
    assert view.locator("a", has_text=strings["its code"]).count() == 1
    for href in (api, code):
        assert tab.request.get(href).ok, href
