"""The reader copies in ``notebooks/``: what Colab and Jupyter show instead of MyST's roles.

A reader who follows the Colab button, or opens a chapter in Jupyter, must see numbers where the
HTML book shows glued ones, not ``{glue:text}`key:.1f```. ``_ext/reader_notebooks.py`` writes
those copies from the chapters; these tests keep them in step and check what they say.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pytest
from myst_nb.core.variables import format_plain_text

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "reader_notebooks", ROOT / "_ext/reader_notebooks.py"
)
reader_notebooks = importlib.util.module_from_spec(_spec)
sys.modules["reader_notebooks"] = reader_notebooks
_spec.loader.exec_module(reader_notebooks)

CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
GLUE = re.compile(r"\{glue:text\}`([^`]+)`")


LANGUAGES = list(reader_notebooks.folders(ROOT / "notebooks"))
QUIZ_TITLE = reader_notebooks.QUIZ_CELL.splitlines()[0]


@pytest.mark.parametrize("language", LANGUAGES, ids=[str(lang or "en") for lang in LANGUAGES])
def test_every_chapter_has_a_current_reader_copy(language):
    """``notebooks/`` (and ``notebooks/pt-BR/``, ``notebooks/zh-CN/``: the editions' copies) is
    exactly what the script makes from the committed chapters (and the editions' messages); an
    edition's copy has the English copy's code cells, tags and ids, only its prose differs."""
    folder = reader_notebooks.folders(ROOT / "notebooks")[language]
    want = reader_notebooks.expected(language)
    have = {p.name: p.read_text() for p in folder.glob("*.ipynb")}
    assert sorted(want) == sorted(have) == [p.name for p in CHAPTERS]
    stale = [name for name in want if want[name] != have[name]]
    assert not stale, f"stale reader copies in {folder} (run `make notebooks`): {stale}"
    if language is not None:
        for name in want:
            english = nbformat.reads((ROOT / "notebooks" / name).read_text(), as_version=4)
            edition = nbformat.reads(have[name], as_version=4)
            assert [(c.cell_type, c.id) for c in edition.cells] == [
                (c.cell_type, c.id) for c in english.cells
            ], name
            for mine, theirs in zip(edition.cells, english.cells):
                quiz = theirs.source.startswith(QUIZ_TITLE)  # its questions are prose
                if theirs.cell_type == "code" and not quiz:
                    assert mine.source == theirs.source and mine.metadata == theirs.metadata


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem[:2] for p in CHAPTERS])
def test_reader_copy_shows_the_glued_numbers(chapter):
    """Each ``{glue:text}`` of the chapter reads, in its copy, as the value myst-nb would paste,
    and the copy holds no MyST role or directive, no outputs, and the same code cells."""
    book = nbformat.read(chapter, as_version=4)
    copy = nbformat.read(ROOT / "notebooks" / chapter.name, as_version=4)
    values = reader_notebooks.glued_values(book)
    text = "\n".join(c.source for c in copy.cells if c.cell_type == "markdown")
    for cell in book.cells:
        if cell.cell_type != "markdown":
            continue
        for role in GLUE.findall(cell.source):
            key, _, fmt = role.partition(":")
            shown = format_plain_text(values[key]["data"]["text/plain"], fmt)
            before = GLUE.split(cell.source)[0].split("\n")[-1][-25:]
            assert shown in text, f"{chapter.name}: {key} should read {shown!r} (after {before!r})"
    assert not re.search(r"\{(glue|cite|doc|admonition)[^}]*\}|^```\{", text, re.M)
    assert "Reading this outside the book" in copy.cells[1].source
    book_code = [c.source for c in book.cells if c.cell_type == "code"]
    quiz = "from mhbook.viz.explorers.quiz import show_quiz"  # tests/book/test_quiz.py
    copy_code = [c.source for c in copy.cells if c.cell_type == "code" and quiz not in c.source]
    assert copy_code == book_code
    assert not any(c.get("outputs") for c in copy.cells if c.cell_type == "code")


def test_glued_values_format_as_myst_nb_does():
    values = {"x": {"data": {"text/plain": "0.98765"}}, "n": {"data": {"text/plain": "12"}}}
    text = "{glue:text}`x:.1f` % and {glue:text}`n:d` and {glue:text}`x`"
    out = reader_notebooks.plain_markdown(text, values=values, cites={}, where="t")
    assert out == "1.0 % and 12 and 0.98765"


def test_an_unknown_glue_key_or_citation_is_named():
    with pytest.raises(reader_notebooks.ReaderCopyError, match="'missing'.*no cell glued"):
        reader_notebooks.plain_markdown("{glue:text}`missing:.1f`", values={}, cites={}, where="t")
    with pytest.raises(reader_notebooks.ReaderCopyError, match="'nobody2020'.*references.bib"):
        reader_notebooks.plain_markdown("{cite}`nobody2020`", values={}, cites={}, where="t")


def test_citations_links_and_dropdowns_become_plain_markdown():
    cites = {"a2017": ("Vaswani et al., 2017", None), "b2020": ("Su et al., 2021", "https://x")}
    text = (
        "See {cite}`a2017,b2020` and {doc}`the next chapter <02-scaled-dot-product-attention>`.\n"
        "{source}`tests/models/test_lm.py::test_x` and {source}`a test <tests/models/test_lm.py>`\n"
        "```{admonition} Hint\n:class: dropdown\nTry $x$.\n```\n"
    )
    out = reader_notebooks.plain_markdown(text, values={}, cites=cites, where="t")
    assert "(Vaswani et al., 2017; [Su et al., 2021](https://x))" in out
    assert "[the next chapter](02-scaled-dot-product-attention.ipynb)" in out
    blob = "https://github.com/mhbook/mhbook/blob/main/tests/models/test_lm.py"
    assert f"[`tests/models/test_lm.py::test_x`]({blob}) and [a test]({blob})" in out
    assert "<details>\n<summary><b>Hint</b></summary>\n\nTry $x$.\n\n</details>" in out
    with pytest.raises(reader_notebooks.ReaderCopyError, match="'tests/nothing.py'.*not a file"):
        reader_notebooks.plain_markdown(
            "{source}`tests/nothing.py`", values={}, cites={}, where="t"
        )
    with pytest.raises(reader_notebooks.ReaderCopyError, match="MyST syntax left"):
        reader_notebooks.plain_markdown("{numref}`fig-1`", values={}, cites={}, where="t")
