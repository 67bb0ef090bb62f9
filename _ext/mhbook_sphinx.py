"""Sphinx extension of the mhbook book: offline MathJax and the generated API reference.

Offline MathJax
    MathJax 2.7 is served from the built book, never from a CDN. Its files come from
    the ``jupyter-server-mathjax`` package (maintained by the Jupyter project, which
    ships MathJax for offline notebooks): after an HTML build they are copied to
    ``_build/html/_static/mathjax``, and ``mathjax_path`` points there.
    ``myst_update_mathjax`` must be ``false`` (see ``_config.yml``) so that MyST does
    not add a MathJax 3 configuration; :data:`MATHJAX2_CONFIG` tells MathJax 2 to
    typeset only the math that MyST marked, as MyST does for MathJax 3. The book
    has no thebe button, so sphinx-thebe's scripts (which name a CDN) are left out.
    MathJax 2's own blank font (``MathJax_Blank``, at ``url('about:blank')``, which Chromium
    refuses with two console errors) is declared with ``local()`` instead: no request.
    With ``html_context.default_mode`` and ``html.favicon`` in ``_config.yml``, no page logs
    a console error (tests/book/test_browser.py checks every page).

Bibliography labels
    The pybtex style ``mhbook_author_year`` labels the entries of the bibliography
    "Vaswani et al. 2017", like the author-year citations in the text.

Links to the source
    ``{source}`tests/models/test_lm.py``` (or
    ``{source}`the test <tests/models/test_lm.py::name>```) links a file of the repository,
    at the address and branch set once in ``_config.yml``; a path that does not exist is a
    build warning.

The live translator
    Chapter 6 writes its trained model's weights to ``chapters/live/``; after an HTML build they
    are copied to ``_build/html/_static/live/``, where the live panel fetches them.

Reader copies
    Jupyter and Colab render none of MyST's roles, so the chapters have plain copies in
    ``notebooks/`` (``_ext/reader_notebooks.py``). The Colab button of a chapter opens its copy,
    and the page's ``.ipynb`` download gives it.

Practice copies
    ``practice/`` holds each chapter with the code that builds a mechanism left as stubs, each
    followed by its ``mhbook.check`` (``_ext/practice_notebooks.py``). Beside the Colab button, a
    "Practice in Colab" button opens the chapter's practice copy, and the download menu offers it
    ("practice .ipynb", served from ``_sources/practice/``).

Panels on a page of their own
    ``{mhbook-panel} live-train`` puts chapter 15's Train panel on a page of the appendix,
    made at build time by the function the chapter calls (:data:`PANELS`): no kernel.

API reference
    The directive ``{mhbook-api}`` writes one section per module of the ``mhbook``
    package, found by :mod:`pkgutil` and documented with ``automodule``, so the
    reference follows the package without a list to keep up to date. References to
    re-exported names such as ``mhbook.MultiHeadAttention`` resolve to the object's
    own module, where it is documented.
"""

from __future__ import annotations

import html
import importlib
import json
import pkgutil
import re
import shutil
from pathlib import Path

import jupyter_server_mathjax
from docutils import nodes
from docutils.statemachine import StringList
from editions import translate  # siblings in _ext/, on the path
from mhbook_editions import EDITIONS
from pybtex.plugin import register_plugin
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from reader_notebooks import ROOT, authors, repository
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

PACKAGE = "mhbook"
STATIC = Path(__file__).parent / "static"
MATHJAX_SOURCE = Path(jupyter_server_mathjax.__file__).parent / "static"
MATHJAX_PATH = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
MATHJAX2_CONFIG = {
    "tex2jax": {
        "inlineMath": [["\\(", "\\)"]],
        "displayMath": [["\\[", "\\]"]],
        "processEscapes": False,
        "processEnvironments": False,
        "processRefs": False,
        "processClass": "tex2jax_process|mathjax_process|math|output_area",
        "ignoreClass": "tex2jax_ignore|mathjax_ignore",
    },
    "messageStyle": "none",
    "HTML-CSS": {
        # jupyter-server-mathjax ships the STIX-Web fonts only.
        "availableFonts": [],
        "webFont": "STIX-Web",
        "imageFont": None,
        "preferredFont": None,
        "linebreaks": {"automatic": True},
        # MathJax 2 declares a font "MathJax_Blank" at url('about:blank'), the fallback against
        # which it times its web fonts. Chromium refuses to fetch a font from about:blank and
        # logs two console errors per page (CORS, failed load); local() names a font that is
        # not installed: the same missing font, without a request.
        "styles": {"@font-face": {"font-family": "MathJax_Blank", "src": "local('MathJax_Blank')"}},
    },
    # The hidden MathML kept for screen readers is styled by the NativeMML output, whose
    # rules name TeX fonts that are not shipped; plain serif avoids requests for them.
    "NativeMML": {
        "styles": {
            selector: {"font-family": "serif"}
            for selector in (
                '[mathvariant="double-struck"]',
                '[mathvariant="script"]',
                '[mathvariant="fraktur"]',
                '[mathvariant="bold-script"]',
                '[mathvariant="bold-fraktur"]',
                '[class="MJX-tex-oldstyle"]',
                '[class="MJX-tex-oldstyle-bold"]',
                '[class="MJX-tex-caligraphic"]',
                '[class="MJX-tex-caligraphic-bold"]',
            )
        }
    },
}


def _use_offline_mathjax(app: Sphinx, config: Config) -> None:
    config.html_static_path = [*config.html_static_path, str(STATIC)]
    if config.mathjax_path.startswith(("http://", "https://", "//")):
        config.mathjax_path = MATHJAX_PATH
    if not config.mathjax2_config:
        config.mathjax2_config = MATHJAX2_CONFIG
    config.mathjax3_config = None  # a MathJax 3 configuration would confuse MathJax 2


def _drop_unused_thebe(app: Sphinx, pagename, templatename, context, doctree) -> None:
    """Leave out sphinx-thebe's scripts when the book has no thebe button.

    They would only name a CDN address, and sphinx-thebe 0.3 adds its configuration
    script twice, which makes the browser report a redeclared ``const``.
    """
    launch = (app.config.html_theme_options or {}).get("launch_buttons", {})
    if launch.get("thebe") or "script_files" not in context:
        return
    context["script_files"] = [
        js
        for js in context["script_files"]
        if "thebe" not in str(getattr(js, "filename", "") or "")
        and "THEBE_JS_URL" not in getattr(js, "attributes", {}).get("body", "")
    ]


def _copy_mathjax(app: Sphinx, exception: Exception | None) -> None:
    if exception is None and app.builder.format == "html":
        target = Path(app.outdir) / "_static" / "mathjax"
        shutil.copytree(MATHJAX_SOURCE, target, dirs_exist_ok=True)


SOURCE_ROLE = re.compile(r"^(?:(.*?)\s*<([^<>]+)>|(.+))$", re.S)


def source_url(path: str) -> str:
    """The address of ``path`` (a file of the repository) on the repository's site."""
    url, branch = repository()
    return f"{url}/blob/{branch}/{path}"


def _source_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """``{source}`path``` or ``{source}`label <path>```: a link to a file of the repository."""
    match = SOURCE_ROLE.match(text.strip())
    label, target = (match.group(1), match.group(2)) if match.group(2) else (None, match.group(3))
    path = target.split("::")[0].strip()
    if not (ROOT / path).is_file():
        message = inliner.reporter.warning(f"{{source}}: no file {path!r} in the repository")
        return [inliner.problematic(rawtext, rawtext, message)], [message]
    link = nodes.reference(rawtext, "", refuri=source_url(path))
    link += nodes.literal(label or target, label or target) if not label else nodes.Text(label)
    return [link], []


READER_COPIES = ROOT / "notebooks"
PRACTICE_COPIES = ROOT / "practice"
PRACTICE_TEXT = "Practice in Colab"
PRACTICE_TIP = "Practice in Colab: write the chapter's code yourself, checked cell by cell"
API_IN_ENGLISH = (
    "The reference itself is the package's docstrings, which are code: it is on the English "
    "page of the API reference."
)
PRACTICE_DOWNLOAD_TIP = "Download the practice notebook (stubs to fill in, with checks)"


def _edition(app: Sphinx) -> str:
    """The folder of the edition being built under ``notebooks/`` and ``practice/``:
    ``""`` for English, ``"pt-BR/"``..."""
    folder = EDITIONS.get(app.config.language, ("", ""))[0]
    return f"{folder}/" if folder else ""


def _colab_opens_reader_copy(app: Sphinx, pagename, templatename, context, doctree) -> None:
    """Point a chapter's Colab button at ``notebooks/<chapter>.ipynb``, add a "Practice in Colab"
    button beside it that opens ``practice/<chapter>.ipynb``, and a "practice .ipynb" download
    (runs after the theme has made its buttons). An edition's page opens the edition's copies,
    ``notebooks/pt-BR/<chapter>.ipynb``..."""
    base = pagename.rpartition("/")[2]
    name = f"{_edition(app)}{base}"
    language = app.config.language if app.config.language in EDITIONS else None
    if not pagename.startswith("chapters/") or not (READER_COPIES / f"{name}.ipynb").is_file():
        return
    practice = (PRACTICE_COPIES / f"{name}.ipynb").is_file()
    for group in context.get("header_buttons", []):
        if group.get("label") == "launch-buttons":
            buttons = group.get("buttons", [])
            for at, button in enumerate(list(buttons)):
                if button.get("text") != "Colab":
                    continue
                url = button["url"]
                button["url"] = url.replace(f"/{pagename}.ipynb", f"/notebooks/{name}.ipynb")
                text = translate(PRACTICE_TEXT, language)
                if practice and not any(b.get("text") == text for b in buttons):
                    buttons.insert(
                        at + 1,
                        {
                            **button,
                            "text": text,
                            "tooltip": translate(PRACTICE_TIP, language),
                            "url": url.replace(f"/{pagename}.ipynb", f"/practice/{name}.ipynb"),
                        },
                    )
        elif group.get("label") == "download-buttons" and practice:
            buttons = group.get("buttons", [])
            if any(b.get("label") == "download-practice-button" for b in buttons):
                continue
            buttons.insert(
                1,
                {
                    "type": "link",
                    "url": f"{context['pathto']('_sources', 1)}/practice/{base}.ipynb",
                    "text": "practice .ipynb",
                    "tooltip": translate(PRACTICE_DOWNLOAD_TIP, language),
                    "icon": "fas fa-pen",
                    "label": "download-practice-button",
                },
            )


def _copy_live_files(app: Sphinx, exception) -> None:
    """The live panels' weights, written by chapters 6 and 14 into ``chapters/live/``, served
    from ``_static/live/`` (``mhbook.viz.explorers.live``). Each ``NAME.json`` also as
    ``NAME.js``, a script that hands the same JSON to ``window.mhbookLiveFiles[NAME.json]``:
    a book opened from ``file://`` may not fetch a file, but it runs a ``<script src>``
    (live_core.js's loadWeights)."""
    source = ROOT / "chapters" / "live"
    if exception is None and app.builder.format == "html" and source.is_dir():
        target = Path(app.outdir) / "_static" / "live"
        shutil.copytree(source, target, dirs_exist_ok=True)
        for weights in source.glob("*.json"):
            (target / f"{weights.stem}.js").write_text(
                f"(window.mhbookLiveFiles ||= {{}})[{json.dumps(weights.name)}] = "
                + weights.read_text(encoding="ascii").strip()
                + ";\n",
                encoding="ascii",
            )


def _download_reader_copies(app: Sphinx, exception) -> None:
    """The ``.ipynb`` download of a chapter's page is its reader copy, not the MyST source;
    its practice copy is served beside it, in ``_sources/practice/``."""
    if exception is None and app.builder.format == "html":
        sources = Path(app.outdir) / "_sources" / "chapters"
        for copy in (READER_COPIES / _edition(app)).glob("*.ipynb"):
            if (sources / copy.name).is_file():
                shutil.copyfile(copy, sources / copy.name)
        practice = Path(app.outdir) / "_sources" / "practice"
        for copy in (PRACTICE_COPIES / _edition(app)).glob("*.ipynb"):
            if (sources / copy.name).is_file():
                practice.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(copy, practice / copy.name)


class AuthorYearLabels(BaseLabelStyle):
    """Bibliography labels that match the author-year citations: "Vaswani et al. 2017"."""

    def format_labels(self, sorted_entries):
        seen: dict[str, int] = {}
        for entry in sorted_entries:
            who = authors(entry)
            label = f"{who} {entry.fields.get('year', '')}".strip()
            seen[label] = seen.get(label, 0) + 1
            yield (
                label
                if seen[label] == 1
                else f"{label}{'abcdefghijklmnopqrstuvwxyz'[seen[label] - 1]}"
            )


class AuthorYearStyle(UnsrtStyle):
    """pybtex's ``plain`` formatting (sorted by author), with :class:`AuthorYearLabels`."""

    default_sorting_style = "author_year_title"
    default_label_style = AuthorYearLabels


register_plugin("pybtex.style.formatting", "mhbook_author_year", AuthorYearStyle)


def package_modules(package: str) -> list[tuple[str, bool]]:
    """``(name, is_package)`` of the public modules of ``package`` and of its subpackages,
    sorted."""
    path = importlib.import_module(package).__path__
    found = pkgutil.walk_packages(path, prefix=f"{package}.")
    public = (
        (m.name, m.ispkg) for m in found if not any(p.startswith("_") for p in m.name.split("."))
    )
    return sorted(public)


def _resolve_reexports(app: Sphinx, env, node, contnode):
    """Resolve ``mhbook.MultiHeadAttention`` (and a bare ``AddNorm``, ``Transformer.x``).

    The docstrings use the names the chapters use, re-exported by ``mhbook/__init__.py``;
    the reference documents each object once, in its module (``mhbook.attention.multihead...``).
    """
    if node.get("refdomain") != "py":
        return None
    package = importlib.import_module(PACKAGE)
    name = node["reftarget"].lstrip("~.").removeprefix(f"{PACKAGE}.")
    head, _, rest = name.partition(".")
    module = getattr(getattr(package, head, None), "__module__", None) or ""
    if not module.startswith(f"{PACKAGE}."):
        return None
    target = f"{module}.{name}"
    py = env.get_domain("py")
    return py.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], target, node, contnode
    )


def _skip_namedtuple_fields(app: Sphinx, what, name, obj, skip, options):
    """NamedTuple fields are described in the class's "Attributes:" section already."""
    doc = getattr(obj, "__doc__", None) or ""
    return True if doc.startswith("Alias for field number") else None


class PackageApi(SphinxDirective):
    """``{mhbook-api} package`` in a MyST page: a section with ``automodule`` per module."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        folder = EDITIONS.get(self.env.config.language, ("", ""))[0]
        if folder:  # an edition: the docstrings are code, in English, on the English page
            text = html.escape(translate(API_IN_ENGLISH, self.env.config.language))
            return [nodes.raw("", f'<p><a href="../api.html">{text}</a></p>', format="html")]
        lines = []  # MyST Markdown: the directive is used in api.md
        for module, is_package in package_modules(self.arguments[0]):
            # A folder's package only gathers its modules' names: its docstring says what the
            # folder holds, and each name is documented once, in its module.
            options = ["   :no-members:"] if is_package else []
            # autodoc writes reStructuredText, hence eval-rst
            lines += [f"## `{module}`", "", "```{eval-rst}", f".. automodule:: {module}"]
            lines += [*options, "```", ""]
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source="mhbook-api"), container)
        return container.children


def _live_train_panel() -> str:
    from mhbook.viz.explorers.live_train import live_train_html

    return live_train_html("page", open=True).data


#: The panels a page may show with ``{mhbook-panel} name``: the HTML of each, made at build time
#: by the function that makes it in the chapters (no kernel, nothing executed but that).
PANELS = {"live-train": _live_train_panel}


class Panel(SphinxDirective):
    """``{mhbook-panel} live-train`` in a MyST page: a chapter's self-contained panel, on a page
    of its own (the explorer pages of the appendix)."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        if name not in PANELS:
            raise self.error(
                f"mhbook-panel: unknown panel {name!r}; expected one of {sorted(PANELS)}"
            )
        return [nodes.raw("", PANELS[name](), format="html")]


def _citations_as_list_items(app: Sphinx, pagename, templatename, context, doctree) -> None:
    """docutils writes the bibliography as ``<div role="list">`` of entries with
    ``role="doc-biblioentry"``, a role ARIA does not allow inside a list (axe-core's critical
    ``aria-required-children``): make each entry a ``listitem``."""
    body = context.get("body")
    if body and 'role="doc-biblioentry"' in body:
        context["body"] = body.replace('role="doc-biblioentry"', 'role="listitem"')


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", _use_offline_mathjax)
    app.connect("build-finished", _copy_mathjax)
    app.connect("html-page-context", _drop_unused_thebe)
    app.connect("html-page-context", _citations_as_list_items)
    app.connect("html-page-context", _colab_opens_reader_copy, priority=600)
    app.connect("build-finished", _download_reader_copies)
    app.connect("build-finished", _copy_live_files)
    app.add_css_file("mhbook-mathjax2.css")
    app.add_css_file("mhbook-figures.css")
    app.add_css_file("mhbook-source.css")
    app.add_directive("mhbook-api", PackageApi)
    app.add_directive("mhbook-panel", Panel)
    app.add_role("source", _source_role)
    app.connect("missing-reference", _resolve_reexports)
    app.connect("autodoc-skip-member", _skip_namedtuple_fields)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
