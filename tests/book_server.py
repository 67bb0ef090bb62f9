"""Build the book from its committed outputs and serve it on 127.0.0.1.

Used by ``tests/book/test_browser.py``; also handy by hand::

    python tests/book_server.py          # build into _build/browser-test, serve, print the URL

The build does not execute the notebooks: nbval already proves that the committed outputs equal a
fresh run, so the browser test renders exactly what is committed. It runs with ``-W -n
--keep-going``, so a broken reference or a missing citation still fails it.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCE_SUFFIXES = (".ipynb", ".md", ".rst")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Page:
    """One page of the book: ``file`` as written in ``_toc.yml`` (no suffix), its source file."""

    file: str
    source: Path

    @property
    def html(self) -> str:
        """The page's path inside the HTML folder, e.g. ``chapters/01-intro.html``."""
        return f"{self.file}.html"

    @property
    def is_notebook(self) -> bool:
        return self.source.suffix == ".ipynb"


def load_yaml(path: Path) -> dict:
    with open(path, encoding="utf8") as handle:
        return yaml.safe_load(handle) or {}


def _toc_files(node) -> Iterator[str]:
    """Every ``root`` / ``file`` entry of a ``_toc.yml`` tree, in reading order."""
    if isinstance(node, dict):
        for key in ("root", "file"):
            if key in node:
                yield str(node[key])
        for value in node.values():
            if isinstance(value, (dict, list)):
                yield from _toc_files(value)
    elif isinstance(node, list):
        for item in node:
            yield from _toc_files(item)


def toc_files(root: Path = ROOT) -> list[str]:
    """The ``file`` entries of ``root/_toc.yml`` (the root page first), as written there."""
    return list(_toc_files(load_yaml(root / "_toc.yml")))


def toc_pages(root: Path = ROOT, missing_ok: bool = False) -> list[Page]:
    """The pages listed in ``root/_toc.yml``.

    A listed page without a source file raises FileNotFoundError naming it, or is left out
    when ``missing_ok``.
    """
    pages = []
    for entry in toc_files(root):
        stem = entry
        for suffix in SOURCE_SUFFIXES:
            if entry.endswith(suffix):
                stem = entry[: -len(suffix)]
        candidates = [root / f"{stem}{suffix}" for suffix in SOURCE_SUFFIXES]
        found = [path for path in candidates if path.is_file()]
        if not found and missing_ok:
            continue
        if not found:
            raise FileNotFoundError(f"_toc.yml lists {entry!r} but none of {candidates} exists")
        pages.append(Page(file=stem, source=found[0]))
    return pages


def repository(root: Path = ROOT) -> tuple[str, str, str]:
    """``(url, branch, path_to_book)`` from the ``repository`` section of ``_config.yml``."""
    repo = load_yaml(root / "_config.yml").get("repository") or {}
    url = str(repo.get("url", "")).rstrip("/")
    url = url[: -len(".git")] if url.endswith(".git") else url
    return url, str(repo.get("branch", "main")), str(repo.get("path_to_book", "") or "").strip("/")


def colab_url(page: Page, root: Path = ROOT) -> str:
    """The Colab address that the launch button of ``page`` must point at: the chapter's reader
    copy in ``notebooks/`` (``_ext/reader_notebooks.py``), where MyST's roles are plain text."""
    url, branch, path_to_book = repository(root)
    org_repo = url.split("github.com/", 1)[-1]
    prefix = f"{path_to_book}/" if path_to_book else ""
    name = Path(page.file).name
    return f"https://colab.research.google.com/github/{org_repo}/blob/{branch}/{prefix}notebooks/{name}.ipynb"


def no_execute_config(root: Path, out_dir: Path) -> Path:
    """Write a copy of ``_config.yml`` into ``out_dir`` with notebook execution turned off.

    ``sphinx.local_extensions`` paths are made absolute: jupyter-book resolves them relative to
    the config file, which now lives elsewhere.
    """
    config = load_yaml(root / "_config.yml")
    config.setdefault("execute", {})["execute_notebooks"] = "off"
    local = (config.get("sphinx") or {}).get("local_extensions") or {}
    for name, path in local.items():
        local[name] = str((root / path).resolve())
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "_config.no-execute.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf8")
    return path


@dataclass
class BuildResult:
    returncode: int
    output: str
    html_dir: Path
    command: list[str]

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, lines: int = 150) -> str:
        return "\n".join(self.output.splitlines()[-lines:])

    def problems(self) -> list[str]:
        """The build's warning and error lines."""
        return [
            line
            for line in self.output.splitlines()
            if re.search(r"\b(WARNING|ERROR|CRITICAL|SEVERE)\b|Traceback|Exception", line)
        ]

    def report(self) -> str:
        """What a failed build said: its warnings first, then the end of its output."""
        warnings = "\n".join(self.problems()) or "(no WARNING/ERROR lines)"
        return (
            f"the book build failed (exit {self.returncode}):\n  {' '.join(self.command)}\n"
            f"--- warnings and errors ---\n{warnings}\n--- end of the output ---\n"
            f"{self.tail(60)}"
        )


#: Where the browser tests build the book (tests/book/conftest.py).
BUILD_DIR = Path(os.environ.get("MHBOOK_BROWSER_BUILD") or ROOT / "_build" / "browser-test")


def _toc_pages_or_none():
    try:  # the pages that exist; test_toc_lists_pages fails on a missing one
        return toc_pages(missing_ok=True)
    except (OSError, ValueError):
        return []


def build_book(out_dir: Path, root: Path = ROOT, timeout: float = 900) -> BuildResult:
    """``jupyter-book build`` the committed notebooks (no execution) into ``out_dir``.

    ``out_dir`` is emptied first, so every build is a full one and every warning is seen.
    The HTML ends up in ``out_dir/_build/html``.
    """
    out_dir = Path(out_dir).resolve()
    if out_dir.exists():
        shutil.rmtree(out_dir)
    config = no_execute_config(root, out_dir)
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    command = [
        str(jupyter_book) if jupyter_book.exists() else "jupyter-book",
        "build",
        str(root),
        "--path-output",
        str(out_dir),
        "--config",
        str(config),
        "-W",
        "-n",
        "--keep-going",
    ]
    proc = subprocess.run(
        command,
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"},
    )
    output = ANSI_ESCAPE.sub("", proc.stdout)
    return BuildResult(proc.returncode, output, out_dir / "_build" / "html", command)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the stdlib's signature
        pass


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on a free port of 127.0.0.1; yields the base URL (ends in ``/``)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


if __name__ == "__main__":
    result = build_book(ROOT / "_build" / "browser-test")
    print(result.tail())
    if not result.ok:
        sys.exit(f"build failed ({result.returncode})")
    with serve(result.html_dir) as url:
        print(f"serving {result.html_dir} at {url}  (Ctrl-C to stop)")
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


#: The book's pages (``_toc.yml``) that exist, for the browser tests' parametrisation.
PAGES = _toc_pages_or_none()


def page_weight(html: Path) -> int:
    """Bytes of a built page: its HTML and the images it shows (the theme's shared files aside)."""
    text = html.read_text(encoding="utf8")
    images = {(html.parent / src).resolve() for src in re.findall(r'<img[^>]+src="([^"]+)"', text)}
    return html.stat().st_size + sum(f.stat().st_size for f in images if f.is_file())
