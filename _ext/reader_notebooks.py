"""The chapters as a reader opens them in Colab or Jupyter: ``notebooks/``, made from ``chapters/``.

The chapters in ``chapters/`` are written for the HTML book, in MyST: the prose quotes computed
numbers with myst-nb's ``{glue:text}`` role, cites papers with ``{cite}``, links pages with
``{doc}``, and hides hints and solutions in ``{admonition}`` dropdowns. Jupyter and Colab render
none of these, so a reader there would see ``{glue:text}`test_exact:.1f``` where the book shows
a number. This script writes a copy of each chapter in plain Jupyter Markdown:

* every ``{glue:text}`key:fmt``` becomes the value the committed run glued, formatted as
  myst-nb formats it (its own ``format_plain_text``), and a note under the title says that the
  numbers in the text are those of the book's recorded run, while the outputs are the reader's;
* ``{cite}`key``` becomes "(Vaswani et al., 2017)", linked to the paper where
  ``references.bib`` gives an address;
* ``{source}`` links to a file of the repository become ordinary links;
* ``{doc}`` links become links to the other notebooks (or to the page on the repository);
* ``{admonition}`` dropdowns become HTML ``<details>``, which Jupyter and Colab fold;
* the quiz's ``{question}`` directives become a code cell (its code folded) that shows them
  with :func:`mhbook.viz.explorers.quiz.show_quiz`, each keyed answer written in as the
  committed run glued it (``:answer: N``, or a number's ``:value: X``);
* outputs are left out: the reader runs the chapter.

The book's launch button opens these copies in Colab, and the page's ``.ipynb`` download gives
them (``_ext/mhbook_sphinx.py``). ``tests/book/test_reader_notebooks.py`` checks that the committed
copies are what this script makes from the committed chapters, so after executing a chapter run
``make notebooks`` (or ``python _ext/reader_notebooks.py``).
"""

from __future__ import annotations

import argparse
import copy
import functools
import re
import sys
from pathlib import Path

import nbformat
import yaml
from myst_nb.core.variables import format_plain_text
from myst_nb.ext.glue import extract_glue_data_cell
from pybtex.backends.plaintext import Backend as PlainText
from pybtex.database import parse_file
from pybtex.richtext import Text

from mhbook.viz.explorers.quiz import parse_quiz, resolve_answer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import editions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
NOTEBOOKS = ROOT / "notebooks"

GLUE = re.compile(r"\{glue:text\}`([^`]+)`")
CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
SOURCE = re.compile(r"\{source\}`(?:([^`<]*?)\s*<([^`>]+)>|([^`]+))`")
DOC = re.compile(r"\{doc\}`(?:([^`<]*?)\s*<([^`>]+)>|([^`]+))`")
ADMONITION = re.compile(
    r"^```\{admonition\}[ \t]*([^\n]*)\n((?::[a-z_]+:[^\n]*\n)*)(.*?)^```[ \t]*$", re.M | re.S
)
QUESTIONS = re.compile(
    r"^(:{3,})\{question\}.*?^\1[ \t]*$(?:\s*^(:{3,})\{question\}.*?^\2[ \t]*$)*", re.M | re.S
)
KEY = re.compile(r"^:key:[ \t]*(\S+)[ \t]*$", re.M)
QUIZ_CELL = """#@title The chapter's quiz: run the cell, pick an answer, press Check
# (the book's Review page brings back the questions you get wrong)
from mhbook.viz.explorers.quiz import show_quiz

show_quiz(r{q}
{source}
{q})"""
LEFTOVER = re.compile(r"\{[a-z][a-z:\-]*\}`|^```\{|^:::", re.M)

NOTE = (
    "> **Reading this outside the book.** This is the Colab/Jupyter copy of the chapter, made from "
    "the book's source by `_ext/reader_notebooks.py`. Numbers quoted in the text come from the "
    "book's recorded run of this notebook (on a CPU); when you run the cells, the outputs are "
    "yours, and measured times or trained results may differ in their last digits. On a GPU, "
    "chapters that train train longer (more steps, larger batches), so their trained results "
    "differ by more. "
    "Hints and solutions are folded: click to open them."
)


class ReaderCopyError(ValueError):
    """A chapter uses something this script cannot write in plain Jupyter Markdown."""


def repository() -> tuple[str, str]:
    """The repository's address and branch, from ``_config.yml`` (the one place they are set)."""
    return _repository((ROOT / "_config.yml").read_text())


@functools.cache  # asked for by every Markdown cell: parsing the YAML each time took 40 CPU-s
def _repository(config_yml: str) -> tuple[str, str]:
    config = yaml.safe_load(config_yml)
    return config["repository"]["url"].rstrip("/"), config["repository"].get("branch", "main")


PLAIN_TEXT = PlainText()  # render(...) with it skips render_as's plugin lookup, slow per call


def authors(entry) -> str:
    """The book's one rule for naming a reference's authors: "Vaswani et al." (three or
    more), "Bahdanau and Cho" (two), the name (one), else the entry's key."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [Text.from_latex(" ".join(p.last_names)).render(PLAIN_TEXT) for p in people]
    return f"{names[0]} et al." if len(names) > 2 else " and ".join(names) or entry.key


@functools.cache
def citations() -> dict[str, tuple[str, str | None]]:
    """``key -> ("Vaswani et al., 2017", url or None)`` for every entry of ``references.bib``."""
    return {
        key: (f"{authors(entry)}, {entry.fields.get('year', 'n.d.')}", entry.fields.get("url"))
        for key, entry in parse_file(ROOT / "references.bib").entries.items()
    }


def glued_values(notebook) -> dict[str, dict]:
    """The data every ``glue`` call of the notebook recorded, by name (as myst-nb reads it)."""
    values = {}
    for cell in copy.deepcopy(notebook).cells:
        if cell.cell_type == "code":
            values.update(dict(extract_glue_data_cell(cell)))
    return values


def _title(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem


def plain_markdown(text: str, *, values, cites, where: str) -> str:
    """One markdown cell of a chapter in plain Jupyter Markdown (see the module's docstring)."""
    text = ADMONITION.sub(_admonition, _roles(text, values=values, cites=cites, where=where))
    left = LEFTOVER.search(text)
    if left:
        line = text[: left.start()].count("\n") + 1
        raise ReaderCopyError(f"{where}, line {line}: MyST syntax left: {left.group(0)!r}")
    return text


def _admonition(match):
    title, body = match.group(1).strip() or "Note", match.group(3).strip("\n")
    return f"<details>\n<summary><b>{title}</b></summary>\n\n{body}\n\n</details>"


def _roles(text: str, *, values, cites, where: str) -> str:
    """MyST's roles written out: glued numbers, citations, links to pages and to files."""
    url, branch = repository()

    def glue(match):
        key, _, fmt = match.group(1).partition(":")
        if key not in values:
            raise ReaderCopyError(f"{where}: {{glue:text}} names {key!r}, which no cell glued")
        return format_plain_text(values[key]["data"]["text/plain"], fmt)

    def cite(match):
        parts = []
        for key in (k.strip() for k in match.group(1).split(",")):
            if key not in cites:
                raise ReaderCopyError(f"{where}: {{cite}} names {key!r}, not in references.bib")
            label, link = cites[key]
            parts.append(f"[{label}]({link})" if link else label)
        return "(" + "; ".join(parts) + ")"

    def doc(match):
        text, target = (
            (match.group(1), match.group(2)) if match.group(2) else (None, match.group(3))
        )
        target = target.strip()
        if (CHAPTERS / f"{target}.ipynb").is_file():
            return f"[{text or target}]({target}.ipynb)"
        page = (CHAPTERS / f"{target}.md").resolve()
        if page.is_file():
            rel = page.relative_to(ROOT).as_posix()
            return f"[{text or _title(page)}]({url}/blob/{branch}/{rel})"
        raise ReaderCopyError(f"{where}: {{doc}} names {target!r}, which is not a page")

    def source(match):
        label, target = (
            (match.group(1), match.group(2)) if match.group(2) else (None, match.group(3))
        )
        path = target.split("::")[0].strip()
        if not (ROOT / path).is_file():
            raise ReaderCopyError(
                f"{where}: {{source}} names {path!r}, not a file of the repository"
            )
        return f"[{label or f'`{target}`'}]({url}/blob/{branch}/{path})"

    text = GLUE.sub(glue, text)
    text = CITE.sub(cite, text)
    text = DOC.sub(doc, text)
    return SOURCE.sub(source, text)


def quiz_source(text: str, *, values, cites, where: str) -> str:
    """Questions as a reader copy's quiz cell shows them: roles written out, and each keyed
    answer written in from the committed run's glue."""
    glued = {name: value["data"]["text/plain"] for name, value in values.items()}
    answers = {}
    for question in parse_quiz(text, where=where):
        if question.key:
            value = resolve_answer(question, glued)
            kind = "value" if question.kind == "number" else "answer"
            answers[question.key] = (
                f":{kind}: {value:g}" if kind == "value" else f":answer: {value}"
            )

    text = KEY.sub(lambda m: answers[m.group(1)], text)
    text = _roles(text, values=values, cites=cites, where=where)
    if '"""' in text and "'''" in text:
        raise ReaderCopyError(f"{where}: a question holds both kinds of triple quotes")
    return text


def _cells(source: str, *, values, cites, where: str) -> list:
    """A markdown cell of a chapter as reader-copy cells: its Markdown, and a code cell for
    each run of questions in it."""
    cells, start = [], 0
    for match in QUESTIONS.finditer(source):
        if source[start : match.start()].strip():
            text = source[start : match.start()].strip("\n")
            cells.append(
                new_markdown(plain_markdown(text, values=values, cites=cites, where=where))
            )
        quiz = quiz_source(match.group(0), values=values, cites=cites, where=where)
        q = "'''" if '"""' in quiz else '"""'  # a snippet in a question may hold a docstring
        cell = nbformat.v4.new_code_cell(QUIZ_CELL.format(source=quiz, q=q))
        cell.metadata.update({"cellView": "form", "jupyter": {"source_hidden": True}})
        cells.append(cell)
        start = match.end()
    if source[start:].strip() or not cells:
        text = source[start:].strip("\n") if cells else source
        cells.append(new_markdown(plain_markdown(text, values=values, cites=cites, where=where)))
    return cells


def new_markdown(text: str):
    return nbformat.v4.new_markdown_cell(text)


def reader_copy(path: Path, language: str | None = None):
    """The reader's copy of the chapter at ``path``: a new notebook, outputs left out; with
    ``language`` (``pt_BR``, ``zh_CN``), its prose in that edition (``_ext/editions.py``)."""
    if language is None:
        notebook = nbformat.read(path, as_version=4)
    else:
        notebook = editions.translated_notebook(path, language)
    values, cites = glued_values(notebook), citations()
    out = nbformat.v4.new_notebook(metadata={"kernelspec": notebook.metadata["kernelspec"]})
    for index, cell in enumerate(notebook.cells):
        where = f"{path.name}, cell {index}"
        if cell.cell_type == "markdown":
            cells = _cells(cell.source, values=values, cites=cites, where=where)
            for n, extra in enumerate(cells[1:], 1):
                extra.id = f"{cell.get('id', 'cell')}-{n}"
            new, *more = cells
        elif cell.cell_type == "code":
            more = []
            new = nbformat.v4.new_code_cell(cell.source)
            if "tags" in cell.metadata:
                new.metadata["tags"] = list(cell.metadata["tags"])
        else:
            more = []
            new = nbformat.v4.new_raw_cell(cell.source)
        new.id = cell.get("id", new.id)
        out.cells += [new, *more]
        if index == 0 and cell.cell_type == "markdown":
            note = nbformat.v4.new_markdown_cell(editions.translate(NOTE, language))
            note.id = "reader-copy-note"
            out.cells.append(note)
    return out


def render(notebook) -> str:
    return nbformat.writes(notebook) + "\n"


def expected(language: str | None = None) -> dict[str, str]:
    """``file name -> text`` of every reader copy (in ``language``'s edition), from the
    committed chapters."""
    return {p.name: render(reader_copy(p, language)) for p in sorted(CHAPTERS.glob("*.ipynb"))}


def folders(root: Path) -> dict[str | None, Path]:
    """{language (None: English): the folder of its copies}: ``root``, ``root/pt-BR``..."""
    return {None: root} | {
        language: root / folder for language, (folder, _) in editions.EDITIONS.items()
    }


def sync(folder: Path, want: dict[str, str], *, check: bool, script: str) -> int:
    """Make ``folder`` hold exactly the notebooks ``want`` (file name -> text), or with ``check``
    only list those that differ; the exit status (1: stale, with ``check``)."""
    have = {p.name: p.read_text() for p in folder.glob("*.ipynb")}
    stale = sorted(n for n in want.keys() | have.keys() if want.get(n) != have.get(n))
    where = folder.relative_to(ROOT).as_posix() if folder.is_relative_to(ROOT) else str(folder)
    if check:
        for name in stale:
            print(f"{where}/{name} is not what {script} makes", file=sys.stderr)
        return 1 if stale else 0
    folder.mkdir(exist_ok=True)
    for name in stale:
        if name in want:
            (folder / name).write_text(want[name])
        else:
            (folder / name).unlink()
        print(f"wrote {where}/{name}" if name in want else f"removed {where}/{name}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="only say whether notebooks/ is current"
    )
    args = parser.parse_args(argv)
    status = 0
    for language, folder in folders(NOTEBOOKS).items():
        script = "_ext/reader_notebooks.py"
        status |= sync(folder, expected(language), check=args.check, script=script)
    return status


if __name__ == "__main__":
    sys.exit(main())
