"""Sphinx extension of the mhbook book: the chapters' quizzes and the review page.

``{question}``
    A question in a chapter's Markdown (its syntax: :mod:`mhbook.viz.explorers.quiz`, which
    reads it). The question, each choice and each explanation are parsed into the page as the
    chapter's own Markdown, so that math, code and links render as elsewhere and Sphinx's
    gettext translates them with the chapter. A keyed answer (``:key: NAME``) is the value the
    chapter's executed code glued as NAME (myst-nb): the build fails when that value is missing
    or is not exactly one of the choices. ``static/quiz.js`` (of the package) makes the
    questions answerable in the page.

``{mhbook-review}``
    The review page: the questions the reader got wrong, or answered long enough ago, come back
    when the FSRS scheduler says they are due (``ts-fsrs``, from the npm registry, vendored in
    ``_ext/static/vendor/``; the reader's history stays in the browser's ``localStorage``).
    Every question's HTML, as a chapter shows it, is written to ``_static/mhbook-quiz-bank.js``
    after the build, for the review page to show.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from mhbook.viz.explorers.quiz import QuizError, parse_question, resolve_answer

PACKAGE_STATIC = Path(__file__).resolve().parents[1] / "mhbook" / "viz" / "explorers" / "static"
VENDOR = Path(__file__).resolve().parent / "static" / "vendor"
#: What ``_ext/static/vendor/`` holds: each file as the npm registry's tarball has it (the
#: package, its file, the file's sha256; tests/book/test_quiz.py checks it), with its licence.
VENDORED = {
    "ts-fsrs.umd.js": (
        "ts-fsrs@5.4.2",
        "dist/index.umd.js",
        "59b7444121d0aae5bb969097ed95df38eff4a4f878e459703c63720f6b6a176b",
    ),
}
BANK = "mhbook-quiz-bank.js"
_bank: dict[str, dict] = {}  # question id -> {page, title, html}, from this build's pages


class quiz_question(nodes.General, nodes.Element):
    pass


class quiz_prompt(nodes.General, nodes.Element):
    pass


class quiz_choices(nodes.General, nodes.Element):
    pass


class quiz_choice(nodes.General, nodes.Element):
    pass


class quiz_label(nodes.General, nodes.Element):
    pass


class quiz_feedback(nodes.General, nodes.Element):
    pass


def _glued(document, key: str) -> dict[str, str]:
    from myst_nb.ext.glue.utils import RetrievalError, retrieve_glue_data

    try:
        return {key: retrieve_glue_data(document, key).data["text/plain"]}
    except RetrievalError:
        return {}


class Question(SphinxDirective):
    required_arguments = 1
    has_content = True
    option_spec = {
        "kind": directives.unchanged,
        "answer": directives.unchanged,
        "key": directives.unchanged,
        "tolerance": directives.unchanged,
        "value": directives.unchanged,
    }

    def _parse(self, text: str, offset: int, into: nodes.Element) -> nodes.Element:
        """``text`` (Markdown, from line ``offset`` of the page's source) parsed into ``into``."""
        source, lines = self.get_source_info()[0], text.split("\n")
        items = [(source, offset + n) for n in range(len(lines))]
        self.state.nested_parse(StringList(lines, items=items), offset, into)
        return into

    def run(self) -> list[nodes.Node]:
        options = [f":{name}: {value}" for name, value in self.options.items()]
        body = "\n".join([*options, *self.content])
        where = f"{self.env.docname}"
        try:
            q = parse_question(self.arguments[0], body, where=where)
            answer = resolve_answer(q, _glued(self.state.document, q.key) if q.key else {})
        except QuizError as error:
            raise self.error(str(error)) from None
        start = self.content_offset - len(options)
        node = quiz_question(
            quiz_id=q.id,
            kind=q.kind,
            answer=answer,
            tolerance=q.tolerance,
            docname=self.env.docname,
        )
        self.set_source_info(node)
        node += self._parse(q.prompt, start + q.prompt_line, quiz_prompt())
        choices = quiz_choices()
        for c in q.choices:
            choice = quiz_choice(value=c.text)
            choice += self._parse(c.label, start + c.line, quiz_label())
            choice += self._parse(c.feedback, start + c.line + 1, quiz_feedback())
            choices += choice
        node += choices
        return [node]


def _visit_question(self, node):
    attrs = {
        "data-quiz-id": node["quiz_id"],
        "data-kind": node["kind"],
        "data-answer": str(node["answer"]),
    }
    if node["kind"] == "number":
        attrs["data-tolerance"] = str(node["tolerance"])
    node["mhbook_start"] = len(self.body)
    self.body.append(self.starttag(node, "div", CLASS="mhbook-quiz", **attrs))


def _depart_question(self, node):
    self.body.append("</div>\n")
    title = self.builder.env.titles.get(node["docname"])
    _bank[node["quiz_id"]] = {
        "page": self.builder.get_target_uri(node["docname"]),
        "title": title.astext() if title else node["docname"],
        "html": "".join(self.body[node["mhbook_start"] :]),
    }


def _wrapper(tag: str, cls: str, **extra):
    def visit(self, node):
        attrs = dict(extra)
        if "value" in node.attributes and node.get("value") is not None and tag == "li":
            attrs["data-value"] = node["value"]
        self.body.append(self.starttag(node, tag, CLASS=cls, **attrs))

    def depart(self, node):
        self.body.append(f"</{tag}>\n")

    return visit, depart


REVIEW = """<div id="mhbook-review" class="mhbook-review" data-bank="{root}_static/{bank}">
<noscript>The review needs JavaScript.</noscript>
</div>
<script src="{root}_static/{bank}"></script>
"""


class Review(SphinxDirective):
    """``{mhbook-review}``: the review page's panel (``static/quiz_review.js``)."""

    def run(self) -> list[nodes.Node]:
        root = "../" * self.env.docname.count("/")
        return [nodes.raw("", REVIEW.format(root=root, bank=BANK), format="html")]


def _write_bank(app: Sphinx, exception) -> None:
    """The questions' HTML for the review page, and the quiz's scripts, into ``_static``."""
    if exception is not None or app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    path = static / BANK
    bank = {}
    if path.is_file():  # an incremental build writes only the pages that changed
        bank = json.loads(path.read_text(encoding="utf-8").split("=", 1)[1].rstrip(";\n"))
    bank.update(_bank)
    static.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "window.mhbookQuizBank = " + json.dumps(bank, ensure_ascii=False, sort_keys=True) + ";\n",
        encoding="utf-8",
    )
    for name in ("quiz.js", "quiz.css", "quiz_review.js"):
        shutil.copyfile(PACKAGE_STATIC / name, static / name)
    (static / "vendor").mkdir(exist_ok=True)
    for file in VENDOR.iterdir():
        shutil.copyfile(file, static / "vendor" / file.name)


def setup(app: Sphinx) -> dict:
    app.add_node(quiz_question, html=(_visit_question, _depart_question))
    app.add_node(quiz_prompt, html=_wrapper("div", "mhbook-quiz-prompt"))
    app.add_node(quiz_choices, html=_wrapper("ol", "mhbook-quiz-choices"))
    app.add_node(quiz_choice, html=_wrapper("li", "mhbook-quiz-choice"))
    app.add_node(quiz_label, html=_wrapper("div", "mhbook-quiz-label"))
    app.add_node(quiz_feedback, html=_wrapper("div", "mhbook-quiz-feedback"))
    app.add_directive("question", Question)
    app.add_directive("mhbook-review", Review)
    # Every page: a chapter's answers are scheduled where they are given (deferred scripts
    # run in this order, after the page's HTML, the review page's question bank included).
    app.add_js_file("vendor/ts-fsrs.umd.js", defer="defer")
    app.add_js_file("quiz.js", defer="defer")
    app.add_js_file("quiz_review.js", defer="defer")
    app.add_css_file("quiz.css")
    app.connect("build-finished", _write_bank)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": False}
