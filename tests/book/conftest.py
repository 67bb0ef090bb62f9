"""The built book's fixtures, shared by tests/book/test_browser.py (every page) and
tests/book/test_browser_panels.py (the explorers, live models and quizzes, driven).

The two files run on two pytest-xdist workers at once; the book is built once per run: the
first worker to ask builds it (under a file lock), the other waits and reuses it.
"""

from __future__ import annotations

import fcntl
import pickle
from pathlib import Path

import pytest
from book_server import BUILD_DIR, build_book, serve
from browser import SCREENSHOTS, Visit, launch_chromium


class _ScreenshotNote:
    """Prints where the screenshots went, in pytest's summary, whatever ``-s`` says."""

    def __init__(self, folder: Path):
        self.folder = folder

    def pytest_terminal_summary(self, terminalreporter):
        shots = sorted(self.folder.glob("*.png"))
        terminalreporter.write_line(f"browser test: {len(shots)} screenshots in {self.folder}")


@pytest.fixture(scope="session")
def build(testrun_uid):
    """The book, built once in this test run (``testrun_uid`` is the same on every worker)."""
    BUILD_DIR.parent.mkdir(parents=True, exist_ok=True)
    done = BUILD_DIR.parent / f"{BUILD_DIR.name}.built"
    with open(BUILD_DIR.parent / f"{BUILD_DIR.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if done.is_file():
            run, result = pickle.loads(done.read_bytes())
            if run == testrun_uid:
                return result
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        for old in SCREENSHOTS.glob("*.png"):
            old.unlink(missing_ok=True)
        result = build_book(BUILD_DIR)
        done.write_bytes(pickle.dumps((testrun_uid, result)))
        return result


@pytest.fixture(scope="module")
def site(build):
    if not (build.html_dir / "index.html").is_file():
        pytest.fail(f"the build made no HTML (see test_book_builds):\n{build.tail(40)}")
    with serve(build.html_dir) as url:
        yield url


@pytest.fixture(scope="module")
def browser(request):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    if not request.config.pluginmanager.has_plugin("mhbook-screenshots"):
        request.config.pluginmanager.register(_ScreenshotNote(SCREENSHOTS), "mhbook-screenshots")
    yield from launch_chromium()


@pytest.fixture
def visit(browser, site, request):
    """A tab on the built book; with MathJax unless the test is marked ``without_mathjax``
    (tests/browser.py, MATHJAX_STAND_IN)."""
    tab = Visit(browser, site, typeset=request.node.get_closest_marker("without_mathjax") is None)
    yield tab
    tab.close()
