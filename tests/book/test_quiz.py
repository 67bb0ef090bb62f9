"""The chapters' quizzes (issue 40): the reading of a question (mhbook.viz.explorers.quiz), the
book's directive (_ext/mhbook_quiz.py, on a small Sphinx project of its own), the keys against
the chapters' committed runs, the reader copies' quiz cells, and the vendored scheduler.

The built book's quizzes are answered in Chromium by tests/book/test_browser_panels.py.
"""

from __future__ import annotations

import hashlib
import re
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from mhbook.viz.explorers.quiz import (
    QuizError,
    parse_question,
    parse_quiz,
    quiz_html,
    resolve_answer,
    show_quiz,
)

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
sys.path.insert(0, str(ROOT / "_ext"))
import mhbook_quiz  # noqa: E402  (_ext/, on the path now)
import reader_notebooks  # noqa: E402

SHAPE = """\
:kind: shape
:key: quiz_shape

`x` has shape `(2, 5, 512)` and 8 heads. What is the shape of `q` after the split?

`(2, 8, 5, 64)`
: Batch, heads, tokens, $d_\\text{head} = 64$ ([the split](#splitting-into-heads)).

`(2, 5, 8, 64)`
: That is the shape before the transpose.
  The heads must come in front.
"""

NUMBER = """\
:kind: number
:key: quiz_n

What is $d_\\text{head}$?

=
: 512 / 8.

512
: That is $d_\\text{model}$.

?
: Divide $d_\\text{model}$ by the number of heads.
"""

MASK = """\
:kind: mask
:answer: 1

Which mask is causal (rows are queries)?

`100/110/111`
: Each query sees itself and the keys before it.

`111/011/001`
: Each query sees itself and the keys after it: the future.
"""


def test_a_question_reads_as_written():
    q = parse_question("04-split-shape", SHAPE)
    assert (q.kind, q.key, q.answer) == ("shape", "quiz_shape", None)
    assert q.prompt.startswith("`x` has shape")
    assert [c.text for c in q.choices] == ["(2, 8, 5, 64)", "(2, 5, 8, 64)"]
    assert (
        q.choices[1].feedback
        == "That is the shape before the transpose.\nThe heads must come in front."
    )
    assert resolve_answer(q, {"quiz_shape": "'(2, 8, 5, 64)'"}) == 1
    n = parse_question("04-d-head", NUMBER)
    assert [c.label for c in n.choices] == ["=", "512", "?"]
    assert resolve_answer(n, {"quiz_n": "64"}) == 64.0
    assert resolve_answer(parse_question("03-causal", MASK), {}) == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (SHAPE.replace(":key: quiz_shape", ":answer: 1\n:key: quiz_shape"), "exactly one of"),
        (SHAPE.replace(":key: quiz_shape\n", ""), "exactly one of"),
        (SHAPE.replace(":kind: shape", ":kind: shapes"), "kind must be one of"),
        (SHAPE.replace(":kind: shape", ":level: 2"), "unknown option 'level'"),
        (MASK.replace(":answer: 1", ":answer: 3"), "between 1 and 2"),
        (MASK.replace("`111/011/001`", "`abc`"), "rows of 0/1"),
        (NUMBER.replace("?\n: Divide", "7\n: Divide"), "needs the term '?'"),
        (NUMBER.replace(":key: quiz_n", ":answer: 2"), "keyed"),
        (
            MASK.replace(": Each query sees itself and the keys after it: the future.", ": "),
            "no explanation",
        ),
        (MASK + "\nA stray line.\n", "text after the choices"),
    ],
    ids=[
        "both",
        "neither",
        "kind",
        "option",
        "answer",
        "mask",
        "number-other",
        "number-typed",
        "no-explanation",
        "stray",
    ],  # fmt: skip
)
def test_a_question_the_book_cannot_check_is_refused(body, message):
    with pytest.raises(QuizError, match=re.escape(message)):
        parse_question("03-causal", body)


def test_a_key_must_name_one_choice():
    q = parse_question("04-split-shape", SHAPE)
    with pytest.raises(QuizError, match="glued no value named 'quiz_shape'"):
        resolve_answer(q, {})
    with pytest.raises(QuizError, match=r"gives quiz_shape = '\(2, 8, 64\)', which is none"):
        resolve_answer(q, {"quiz_shape": "'(2, 8, 64)'"})


def test_the_reader_copy_quiz_renders_kernel_free():
    """show_quiz: the same markup and classes as the book's, math as MathML, the JavaScript
    and CSS inline (nothing to fetch)."""
    source = f":::{{question}} 03-causal\n{MASK}:::\n"
    html = show_quiz(source).data
    assert html.count('<div class="mhbook-quiz" data-') == 1 and 'data-answer="1"' in html
    assert "window.mhbookQuiz" in html and ".mhbook-quiz-mask" in html
    assert "<script src" not in html and "http" not in html.replace("http://www.w3.org", "")
    number = quiz_html(parse_quiz(f":::{{question}} 04-d-head\n{NUMBER}:::"), {"quiz_n": "64"})
    assert 'data-answer="64.0"' in number and "<math" in number and "$" not in number


@pytest.fixture(scope="module")
def small_book(tmp_path_factory):
    """A Sphinx project of one notebook (committed outputs: two glued values) with three
    questions, built with the book's extension."""
    folder = tmp_path_factory.mktemp("quiz-book")
    (folder / "conf.py").write_text(
        textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(ROOT / "_ext")!r})
        extensions = ["myst_nb", "mhbook_quiz"]
        myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
        myst_heading_anchors = 3
        nb_execution_mode = "off"
        """)
    )

    def write(glued_shape):
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
        nb.metadata["language_info"] = {"name": "python"}
        cells = []
        for name, text in [("quiz_shape", repr(glued_shape)), ("quiz_n", "64")]:
            cell = nbformat.v4.new_code_cell(f"glue({name!r}, ...)")
            meta = {"scrapbook": {"name": name, "mime_prefix": ""}}
            cell.outputs = [
                nbformat.v4.new_output("display_data", data={"text/plain": text}, metadata=meta)
            ]
            cells.append(cell)
        questions = "\n".join(
            f":::{{question}} {qid}\n{body}:::\n"
            for qid, body in [("04-split-shape", SHAPE), ("04-d-head", NUMBER), ("03-causal", MASK)]
        )
        text = "# A chapter\n\n## Splitting into heads\n\nText.\n\n## Check your understanding\n\n"
        cells.append(nbformat.v4.new_markdown_cell(text + questions))
        nb.cells = cells
        nbformat.write(nb, folder / "index.ipynb")

    def build(glued_shape="(2, 8, 5, 64)"):
        from sphinx.cmd.build import build_main

        write(glued_shape)
        out = folder / "_build" / glued_shape.replace(" ", "")
        status = build_main(["-b", "html", "-W", "-n", "-q", str(folder), str(out)])
        return status, out

    return build


def test_the_book_shows_each_question_with_its_keyed_answer(small_book):
    status, out = small_book()
    assert status == 0
    page = (out / "index.html").read_text(encoding="utf-8")
    found = re.findall(r'<div class="mhbook-quiz" ([^>]*)>', page)
    assert found == [
        'data-answer="1" data-kind="shape" data-quiz-id="04-split-shape"',
        'data-answer="64.0" data-kind="number" data-quiz-id="04-d-head" data-tolerance="0.0"',
        'data-answer="1" data-kind="mask" data-quiz-id="03-causal"',
    ]
    assert 'href="#splitting-into-heads"' in page  # the explanation's link, resolved
    bank = (out / "_static" / "mhbook-quiz-bank.js").read_text(encoding="utf-8")
    assert bank.startswith("window.mhbookQuizBank = {") and '"03-causal"' in bank
    for name in ("quiz.js", "quiz_review.js", "vendor/ts-fsrs.umd.js"):
        assert (out / "_static" / name).is_file(), name
        assert f"_static/{name}" in page


def test_the_build_fails_when_the_code_no_longer_gives_the_keyed_answer(small_book, capsys):
    status, _ = small_book("(2, 8, 5, 32)")
    assert status != 0
    assert (
        "gives quiz_shape = '(2, 8, 5, 32)', which is none of the choices"
        in capsys.readouterr().err
    )


def _questions(path):
    book = nbformat.read(path, as_version=4)
    found = []
    for n, cell in enumerate(book.cells):
        if cell.cell_type == "markdown":
            found += parse_quiz(cell.source, where=f"{path.name}, cell {n}")
    return book, found


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem[:2] for p in CHAPTERS])
def test_every_chapter_has_a_quiz_keyed_by_its_code(chapter):
    """5 to 8 questions before the exercises, ids of the chapter, each key one of its choices
    in the committed run (the book's build checks the run it makes)."""
    book, questions = _questions(chapter)
    assert 5 <= len(questions) <= 8, f"{chapter.name}: {len(questions)} questions"
    assert all(q.id.startswith(chapter.stem[:2] + "-") for q in questions)
    glued = {
        name: value["data"]["text/plain"]
        for name, value in reader_notebooks.glued_values(book).items()
    }
    for q in questions:
        resolve_answer(q, glued)
    text = "\n".join(c.source for c in book.cells if c.cell_type == "markdown")
    assert text.index("{question}") < text.index("## Exercises"), "the quiz comes before them"


def test_question_ids_are_unique_in_the_book():
    ids = [q.id for chapter in CHAPTERS for q in _questions(chapter)[1]]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def test_the_reader_copies_show_the_quiz_in_a_cell():
    """Each chapter's copy has one quiz cell per run of questions, with no key left (the
    answers written in), that the quiz of the copy reads as the chapter's."""
    for chapter in CHAPTERS:
        questions = _questions(chapter)[1]
        copy = nbformat.read(ROOT / "notebooks" / chapter.name, as_version=4)
        cells = [c.source for c in copy.cells if "show_quiz(" in c.source]
        shown = [q for source in cells for q in parse_quiz(re.split(r"r\"\"\"|r'''", source)[1])]
        assert [q.id for q in shown] == [q.id for q in questions], chapter.name
        assert not any(q.key for q in shown)


def test_the_vendored_scheduler_is_the_npm_packages_file():
    """Each file of _ext/static/vendor/ has the sha256 recorded in mhbook_quiz.VENDORED (that of
    the file in the npm registry's tarball) and its licence beside it."""
    folder = ROOT / "_ext" / "static" / "vendor"
    for name, (package, _, sha256) in mhbook_quiz.VENDORED.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == sha256, name
        assert (folder / f"{package.split('@')[0]}.LICENSE").is_file()
