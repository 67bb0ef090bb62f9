"""The chapters as practice notebooks: ``practice/``, made from ``chapters/``.

A practice copy is the chapter's reader copy (``_ext/reader_notebooks.py``: plain Jupyter
Markdown, no outputs) in which the code that builds a mechanism is left for the reader to write.
Which code is marked in the chapter itself, by a cell tag per checked function or class::

    practice:<function>=<check>      e.g. practice:attention_matmul=attention

on the cell that defines ``<function>`` at its top level, where ``<check>`` names a check of
:mod:`mhbook.check`. In the practice copy such a cell becomes three:

1. the cell up to the end of its last tagged definition, each tagged ``def`` reduced to a stub:
   its decorators and signature as written, its docstring (the chapter's, or else the check's
   one-line contract and a pointer to ``check.<check>``) and ``...``. A tagged class keeps its
   ``class`` line, docstring, ``__init__`` (which names the parameters the check loads) and
   anything that is not a method; its other methods are stubbed the same way. Everything else
   in the cell, comments included, is kept exactly as written (the script edits line ranges
   found by :mod:`ast`, it never unparses code);
2. a check cell: ``from mhbook import check`` and ``check.<check>(<function>)``, one per tag;
3. the rest of the cell, if any, as a cell of its own, so that it runs once the stub is filled in.

Every other cell is the reader copy's, and a note under the title says what the copy is and
how to use it. A tagged definition must be self-contained: it may use ``math``, ``torch``,
``np``, ``nn``, ``F``, ``mhbook``, the chapter's imports and the other definitions of its own
cell, and nothing else of the chapter (``tests/book/test_practice_notebooks.py`` runs each one
on its own through its check, and each stub, which must fail with "not written yet").

The book's "Practice in Colab" button opens these copies, and the page's downloads offer them
(``_ext/mhbook_sphinx.py``). ``tests/book/test_practice_notebooks.py`` checks that the committed
copies are what this script makes from the committed chapters: run ``make notebooks`` (or
``python _ext/practice_notebooks.py``) after changing a chapter.
"""

from __future__ import annotations

import argparse
import ast
import functools
import io
import re
import sys
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import editions  # noqa: E402
import reader_notebooks  # noqa: E402  (the sibling script, whether run or imported)

ROOT = HERE.parent
CHAPTERS = ROOT / "chapters"
PRACTICE = ROOT / "practice"

TAG_PREFIX = "practice:"
TAG = re.compile(r"^practice:([A-Za-z_]\w*)=([A-Za-z_]\w*)$")
CHECK_TAG = "practice-check"  # on the check cells this script adds
NOTE_ID = "practice-copy-note"

NOTE_HEAD = (
    "> **Practice copy.** This is the practice copy of the chapter, made from the book's source "
    "by `_ext/practice_notebooks.py`: the code cells that the chapter tags "
    "`practice:<function>=<check>` are replaced here by stubs."
)
NOTE_TODO = (
    "> Fill in each stub (its signature and docstring say what to write), then run the check "
    "cell below it: `check.<name>(your_function)` runs your code on small, hard cases and says "
    "what differs; when your code makes a common mistake, the check names the bug and how to "
    "fix it. Every other cell is the chapter's, so the rest of the chapter runs once your stubs "
    "are filled in. The worked solutions are in the book's page of this chapter (and in its "
    "[reader copy]({reader}))."
)
NOTE_LISTED = "> In this chapter: {listed}."
NOTE_NONE = (
    "> This chapter has no build-it cell checked yet: the cells below are the chapter's own. "
    "Try the exercises at the end of the chapter first, then open their hints and solutions "
    "(folded)."
)
NOTE_NUMBERS = (
    "> Numbers quoted in the text come from the book's recorded run of this notebook (on a CPU); "
    "when you run the cells, the outputs are yours. Hints and solutions are folded: click to "
    "open them."
)


class PracticeCopyError(ValueError):
    """A chapter's ``practice:`` tag that this script cannot follow."""


@dataclass
class Split:
    """What one tagged cell becomes: the stub cell, the check cell, the rest (``""``: none)."""

    stub: str
    check: str
    rest: str


def parse_tags(tags, where: str = "") -> list[tuple[str, str]]:
    """``[(function, check), ...]`` from a cell's tags, in their order."""
    out = []
    for tag in tags:
        if not tag.startswith(TAG_PREFIX):
            continue
        match = TAG.match(tag)
        if match is None:
            raise PracticeCopyError(
                f"{where}: tag {tag!r} is not of the form practice:<function>=<check>"
            )
        out.append((match.group(1), match.group(2)))
    names = [name for name, _ in out]
    if len(set(names)) != len(names):
        raise PracticeCopyError(f"{where}: a function is tagged twice: {names}")
    return out


def contract_line(check: str) -> str:
    """The first line of ``check.<check>``'s contract (its docstring)."""
    from mhbook.check import CHECKS

    if check not in CHECKS:
        raise PracticeCopyError(f"mhbook.check has no check {check!r} (known: {', '.join(CHECKS)})")
    return CHECKS[check].spec.contract.strip().splitlines()[0].strip()


def top_level_definitions(tree: ast.Module) -> dict[str, ast.AST]:
    """The functions and classes a cell defines at its top level, by name."""
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {node.name: node for node in tree.body if isinstance(node, kinds)}


def _header_end(lines: list[str], node: ast.AST) -> tuple[int, int | None]:
    """Where the signature of ``node`` (a def) ends: ``(line, col)``, 1-based line; ``col`` is
    ``None`` when the rest of that line is blank or a comment, else the column just after the
    colon (a body on the same line)."""
    text = "".join(lines[node.lineno - 1 : node.end_lineno])
    depth, seen_def, colon = 0, False, None
    tokens = tokenize.generate_tokens(io.StringIO(text.lstrip(" \t")).readline)
    shift = len(text) - len(text.lstrip(" \t"))  # the first line's indentation, stripped above
    for token in tokens:
        if colon is not None:
            if token.type in (tokenize.COMMENT, tokenize.NEWLINE, tokenize.NL):
                return colon[0], None
            return colon[0], colon[1]
        if token.type == tokenize.NAME and token.string == "def" and depth == 0:
            seen_def = True
        elif token.type == tokenize.OP and token.string in "([{":
            depth += 1
        elif token.type == tokenize.OP and token.string in ")]}":
            depth -= 1
        elif token.type == tokenize.OP and token.string == ":" and depth == 0 and seen_def:
            row, col = token.end
            colon = (node.lineno + row - 1, col + (shift if row == 1 else 0))
    raise PracticeCopyError(f"cannot find the end of the signature of {node.name}")


def _docstring_literal(text: str, indent: str) -> str:
    if '"""' in text:
        raise PracticeCopyError(f'a docstring cannot hold """: {text!r}')
    return f'{indent}"""{text.replace(chr(92), chr(92) * 2)}\n'


def stub_function(
    source: str, lines: list[str], node: ast.AST, check: str, contract: Callable[[str], str]
) -> tuple[int, int, list[str]]:
    """The edit that reduces the def ``node`` to its stub: ``(start, stop, new_lines)``, the
    0-based line range ``[start, stop)`` of ``lines`` to replace."""
    line, col = _header_end(lines, node)
    first = node.body[0]
    one_line = first.lineno == line
    indent = " " * (node.col_offset + 4) if one_line else " " * first.col_offset
    new = [lines[line - 1][:col].rstrip() + "\n"] if one_line else []
    if ast.get_docstring(node, clean=False) is not None:
        new.append(indent + ast.get_source_segment(source, first) + "\n")
    else:
        new.append(_docstring_literal(contract(check), indent))
        new.append(f"\n{indent}Contract: see `check.{check}` (`help(check.{check})` prints it).\n")
        new.append(f'{indent}"""\n')
    new.append(f"{indent}...\n")
    return (line - 1 if one_line else line), node.end_lineno, new


def split_cell(
    source: str,
    tags: list[tuple[str, str]],
    *,
    contract: Callable[[str], str] = contract_line,
    where: str = "",
) -> Split:
    """The stub, check and rest of a cell whose tags are ``tags`` (see the module's docstring)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise PracticeCopyError(f"{where}: the cell does not parse: {error}") from None
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    found = top_level_definitions(tree)
    edits = []
    for name, check in tags:
        node = found.get(name)
        if node is None:
            raise PracticeCopyError(
                f"{where}: tag practice:{name}={check} names no top-level def or class of the "
                f"cell (it defines: {', '.join(found) or 'nothing'})"
            )
        if isinstance(node, ast.ClassDef):
            methods = [
                item
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and item.name != "__init__"
            ]
            if not methods:
                raise PracticeCopyError(f"{where}: class {name} has no method to stub")
            edits += [stub_function(source, lines, m, check, contract) for m in methods]
        else:
            edits.append(stub_function(source, lines, node, check, contract))
    last = max(found[name].end_lineno for name, _ in tags)
    head = lines[:last]
    for start, stop, new in sorted(edits, reverse=True):
        head[start:stop] = new
    rest = lines[last:]
    while rest and not rest[0].strip():
        rest.pop(0)
    calls = [f"check.{check}({name})" for name, check in tags]
    if len(calls) > 1:  # a notebook shows only the last value: print the others
        calls[:-1] = [f"print({call})" for call in calls[:-1]]
    check = "from mhbook import check\n\n" + "\n".join(calls)
    return Split("".join(head).rstrip(), check, "".join(rest).rstrip())


def note(path: Path, stubs: list[tuple[str, str]], language: str | None = None) -> str:
    """The note under the title of ``path``'s practice copy (in ``language``'s edition)."""
    url, branch = reader_notebooks.repository()
    folder = reader_notebooks.folders(Path("notebooks"))[language].as_posix()
    t = functools.partial(editions.translate, language=language)
    parts = [t(NOTE_HEAD)]
    if stubs:
        listed = ", ".join(f"`{name}` (`check.{check}`)" for name, check in stubs)
        parts.append(t(NOTE_LISTED).format(listed=listed))
        parts.append(t(NOTE_TODO).format(reader=f"{url}/blob/{branch}/{folder}/{path.name}"))
    else:
        parts.append(t(NOTE_NONE))
    parts.append(t(NOTE_NUMBERS))
    return "\n>\n".join(parts)


def practice_copy(
    path: Path, *, contract: Callable[[str], str] = contract_line, language: str | None = None
):
    """The practice copy of the chapter at ``path`` (made from its reader copy), in
    ``language``'s edition (None: English)."""
    reader = reader_notebooks.reader_copy(path, language)
    out = nbformat.v4.new_notebook(metadata=dict(reader.metadata))
    stubs = []
    for index, cell in enumerate(reader.cells):
        where = f"{path.name}, cell {index} ({cell.get('id')})"
        tags = parse_tags(cell.metadata.get("tags", []), where) if cell.cell_type == "code" else []
        if cell.get("id") == "reader-copy-note":
            continue  # replaced by the practice note, after the title
        if not tags:
            out.cells.append(cell)
            continue
        for _, check in tags:
            contract(check)  # an unknown check is named here, whether or not it is used
        split = split_cell(cell.source, tags, contract=contract, where=where)
        stubs += tags
        other = [t for t in cell.metadata.get("tags", []) if not t.startswith(TAG_PREFIX)]
        stub = nbformat.v4.new_code_cell(split.stub)
        stub.metadata["tags"] = list(cell.metadata["tags"])
        stub.id = cell.id
        check = nbformat.v4.new_code_cell(split.check)
        check.metadata["tags"] = [CHECK_TAG]
        check.id = f"{cell.id}-check"
        out.cells += [stub, check]
        if split.rest:
            rest = nbformat.v4.new_code_cell(split.rest)
            if other:
                rest.metadata["tags"] = other
            rest.id = f"{cell.id}-rest"
            out.cells.append(rest)
    first = reader.cells[0] if reader.cells else None
    at = 1 if first is not None and first.cell_type == "markdown" else 0
    new = nbformat.v4.new_markdown_cell(note(path, stubs, language))
    new.id = NOTE_ID
    out.cells.insert(at, new)
    return out


def expected(language: str | None = None) -> dict[str, str]:
    """``file name -> text`` of every practice copy (in ``language``'s edition), from the
    committed chapters."""
    return {
        p.name: reader_notebooks.render(practice_copy(p, language=language))
        for p in sorted(CHAPTERS.glob("*.ipynb"))
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="only say whether practice/ is current"
    )
    args = parser.parse_args(argv)
    status = 0
    for language, folder in reader_notebooks.folders(PRACTICE).items():
        script = "_ext/practice_notebooks.py"
        status |= reader_notebooks.sync(folder, expected(language), check=args.check, script=script)
    return status


if __name__ == "__main__":
    sys.exit(main())
