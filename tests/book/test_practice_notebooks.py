"""The practice copies in ``practice/``: each chapter with its checked code left as stubs.

``_ext/practice_notebooks.py`` writes them from the chapters: a cell tagged
``practice:<function>=<check>`` becomes a stub, a check cell, and the rest of the cell. These
tests keep the copies current, run every tagged solution of the chapters through its check on
its own (the solution must pass; the practice copy is not executed again: its other cells are
the chapter's, which nbval runs, and are compared as text here), run every stub through its
check (it must say "not written yet" and give the contract, no traceback), and test the stub
writer on a small notebook.
"""

from __future__ import annotations

import ast
import importlib.util
import linecache
import sys
from pathlib import Path

import nbformat
import pytest

from mhbook.check import CHECKS

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "_ext" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


reader_notebooks = sys.modules.get("reader_notebooks") or _load("reader_notebooks")
practice_notebooks = _load("practice_notebooks")

CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
#: What every tagged definition may use besides the chapter's imports and its own cell.
PRELUDE = (
    "import math\nimport numpy as np\nimport torch\nimport torch.nn as nn\n"
    "import torch.nn.functional as F\nimport mhbook\n"
)


def _tagged() -> list[tuple[Path, str, str, str]]:
    """``(chapter, cell id, function, check)`` for every ``practice:`` tag of the chapters."""
    out = []
    for path in CHAPTERS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            tags = cell.metadata.get("tags", [])
            for name, check in practice_notebooks.parse_tags(tags, f"{path.name} {cell.id}"):
                out.append((path, cell.id, name, check))
    return out


TAGGED = _tagged()
TAG_IDS = [f"{p.stem[:2]}-{name}" for p, _, name, _ in TAGGED]


def chapter_imports(notebook) -> str:
    """The chapter's top-level ``import`` statements, each once, in order (those of the
    cells that run: not of a widget twin's cell, tagged ``skip-execution``)."""
    found = []
    for cell in notebook.cells:
        if cell.cell_type != "code" or "skip-execution" in cell.metadata.get("tags", []):
            continue  # a widget twin's cell: not run by the book or nbval
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(ast.get_source_segment(cell.source, node))
    return "\n".join(dict.fromkeys(found))


def _definition_source(source: str, node: ast.AST) -> str:
    lines = source.splitlines(keepends=True)
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return "".join(lines[start - 1 : node.end_lineno])


def earlier_solutions(notebook, cell_id: str) -> list[tuple[str, str]]:
    """``(name, source)`` of the tagged definitions of the cells before ``cell_id``: what the
    reader has written by then in the practice copy (chapter 14's ``attention`` calls the
    ``rope`` of an earlier cell)."""
    out = []
    for cell in notebook.cells:
        if cell.get("id") == cell_id:
            break
        if cell.cell_type != "code":
            continue
        tagged = practice_notebooks.parse_tags(cell.metadata.get("tags", []), cell_id)
        if not tagged:
            continue
        found = practice_notebooks.top_level_definitions(ast.parse(cell.source))
        for name, _ in tagged:
            out.append((name, _definition_source(cell.source, found[name])))
    return out


def exec_alone(source: str, name: str, imports: str, where: str, earlier=()):
    """Define ``name`` from a cell's ``source`` on its own: in a namespace holding only
    :data:`PRELUDE`, the chapter's ``imports``, the ``earlier`` tagged definitions (see
    :func:`earlier_solutions`) and the cell's other top-level definitions."""
    namespace: dict = {"__name__": f"practice_{name}"}
    exec(compile(PRELUDE + imports, f"<{where}: imports>", "exec"), namespace)
    for other, text in earlier:
        exec(compile(text, f"<{where}: earlier {other}>", "exec"), namespace)
    found = practice_notebooks.top_level_definitions(ast.parse(source))
    assert name in found, f"{where}: no top-level def or class {name} (it has {list(found)})"
    for other in [n for n in found if n != name] + [name]:
        text = _definition_source(source, found[other])
        filename = f"<{where}: {other}>"
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        exec(compile(text, filename, "exec"), namespace)
    return namespace[name]


def _cell(notebook, cell_id: str):
    (cell,) = [c for c in notebook.cells if c.get("id") == cell_id]
    return cell


# --------------------------------------------------------------------------- the copies


LANGUAGES = [None, *practice_notebooks.editions.EDITIONS]


@pytest.mark.parametrize("language", LANGUAGES, ids=[str(lang or "en") for lang in LANGUAGES])
def test_every_chapter_has_a_current_practice_copy(language):
    """``practice/`` (and ``practice/pt-BR/``, ``practice/zh-CN/``) is exactly what the script
    makes from the committed chapters (and the editions' messages); an edition's copy has the
    English copy's code cells."""
    folder = practice_notebooks.reader_notebooks.folders(ROOT / "practice")[language]
    want = practice_notebooks.expected(language)
    have = {p.name: p.read_text() for p in folder.glob("*.ipynb")}
    assert sorted(want) == sorted(have) == [p.name for p in CHAPTERS], (
        f"{folder} does not hold one copy per chapter (run `make notebooks`)"
    )
    stale = [name for name in want if want[name] != have[name]]
    assert not stale, f"stale practice copies in {folder} (run `make notebooks`): {stale}"
    if language is not None:
        for name in want:
            english = nbformat.reads((ROOT / "practice" / name).read_text(), as_version=4)
            edition = nbformat.reads(have[name], as_version=4)
            quiz = practice_notebooks.reader_notebooks.QUIZ_CELL.splitlines()[0]

            def code(notebook, quiz=quiz):  # the quiz's cell holds prose: its questions
                return [
                    (c.id, c.source)
                    for c in notebook.cells
                    if c.cell_type == "code" and not c.source.startswith(quiz)
                ]

            assert code(edition) == code(english), name


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem[:2] for p in CHAPTERS])
def test_practice_copy_is_the_reader_copy_with_stubs(chapter):
    """Every cell of a practice copy is the reader copy's, except the note, the stubs and the
    check cells; a stub cell keeps the chapter's lines outside the stubbed definitions, and the
    rest of a split cell is the end of the chapter's cell, as text."""
    book = nbformat.read(chapter, as_version=4)
    reader = reader_notebooks.reader_copy(chapter)  # the chapter in plain Markdown
    practice = nbformat.read(ROOT / "practice" / chapter.name, as_version=4)
    nbformat.validate(practice)
    assert practice.cells[1].id == practice_notebooks.NOTE_ID
    assert "This is the practice copy" in practice.cells[1].source
    ids = [c.id for c in practice.cells]
    assert len(ids) == len(set(ids)), "cell ids repeat"
    assert not any(c.get("outputs") for c in practice.cells if c.cell_type == "code")
    by_id = {c.id: c for c in practice.cells}
    originals = [c for c in reader.cells if c.id != "reader-copy-note"]
    expected_ids = []
    for cell in originals:
        tags = practice_notebooks.parse_tags(cell.metadata.get("tags", []))
        expected_ids.append(cell.id)
        if not tags:
            assert by_id[cell.id].source == cell.source, f"{chapter.name} {cell.id} differs"
            assert by_id[cell.id].cell_type == cell.cell_type
            continue
        stub, check = by_id[cell.id], by_id[f"{cell.id}-check"]
        expected_ids.append(check.id)
        assert check.metadata["tags"] == [practice_notebooks.CHECK_TAG]
        assert check.source.startswith("from mhbook import check\n")
        for name, check_name in tags:
            assert f"check.{check_name}({name})" in check.source
        # the chapter's lines outside the tagged definitions, kept as written
        source = _cell(book, cell.id).source
        found = practice_notebooks.top_level_definitions(ast.parse(source))
        lines = source.splitlines()
        last = max(found[name].end_lineno for name, _ in tags)
        kept = set(range(last))
        for name, _ in tags:
            kept -= set(range(found[name].lineno - 1, found[name].end_lineno))
        stub_lines = stub.source.splitlines()
        for i in sorted(kept):
            assert lines[i] in stub_lines, f"{chapter.name} {cell.id}: line {lines[i]!r} lost"
        rest = "\n".join(lines[last:]).strip()
        if rest:
            expected_ids.append(f"{cell.id}-rest")
            assert by_id[f"{cell.id}-rest"].source.strip() == rest
            assert source.rstrip().endswith(by_id[f"{cell.id}-rest"].source)
    assert [i for i in ids if i != practice_notebooks.NOTE_ID] == expected_ids


# --------------------------------------------------------------------------- the checks


@pytest.mark.parametrize(("chapter", "cell_id", "name", "check"), TAGGED, ids=TAG_IDS)
def test_the_chapters_solution_passes_its_check_on_its_own(chapter, cell_id, name, check):
    """The chapter's own code for a tagged definition, defined alone (its cell's other
    definitions, the tagged definitions of earlier cells, the chapter's imports and the usual
    modules, nothing else), passes the check the tag names."""
    assert check in CHECKS, f"{chapter.name}: practice:{name}={check}: no check.{check}"
    notebook = nbformat.read(chapter, as_version=4)
    where = f"{chapter.name} {cell_id}"
    source, imports = _cell(notebook, cell_id).source, chapter_imports(notebook)
    impl = exec_alone(source, name, imports, where, earlier_solutions(notebook, cell_id))
    result = CHECKS[check](impl)
    assert result, f"{where}: the chapter's {name} fails check.{check}:\n{result.report()}"


@pytest.mark.parametrize(("chapter", "cell_id", "name", "check"), TAGGED, ids=TAG_IDS)
def test_an_empty_stub_says_what_to_write(chapter, cell_id, name, check):
    """The practice copy's stub, left as it is, fails its check with "not written yet" and the
    contract, not with a traceback."""
    notebook = nbformat.read(chapter, as_version=4)
    practice = nbformat.read(ROOT / "practice" / chapter.name, as_version=4)
    where = f"practice/{chapter.name} {cell_id}"
    stub = exec_alone(_cell(practice, cell_id).source, name, chapter_imports(notebook), where)
    result = CHECKS[check](stub)
    report = result.report()
    assert not result, f"{where}: the empty stub {name} passes check.{check}"
    assert "not written yet" in report, f"{where}: the stub's report:\n{report}"
    for line in CHECKS[check].spec.contract.strip().splitlines():
        assert line.strip() in report, f"{where}: the contract is not in the report:\n{report}"
    assert result.stub and not result.outcomes, f"{where}: the stub's report:\n{report}"
    assert "Traceback" not in report, report


# --------------------------------------------------------------------------- the stub writer

SYNTHETIC = '''import torch

SCALE = 2.0  # a constant the cell uses


@torch.no_grad()
def my_softmax(z,
               dim=-1):  # the signature spans two lines
    """Softmax over the last axis, as the chapter wrote it."""
    # the chapter's hint, a comment in the body
    e = torch.exp(z - z.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


class Scorer(torch.nn.Module):
    """Scores with a learned scale."""

    kind = "scorer"

    def __init__(self, d):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(d))  # kept: it names the parameters

    def forward(self, q, k, v, mask=None):
        return q @ k.transpose(-2, -1) * self.scale, None

    def extra_repr(self): return "a one-line method"


def helper(x):
    return x + 1


print(my_softmax(torch.zeros(3)) * SCALE)  # the rest of the cell
assert helper(1) == 2'''

STUB = '''import torch

SCALE = 2.0  # a constant the cell uses


@torch.no_grad()
def my_softmax(z,
               dim=-1):  # the signature spans two lines
    """Softmax over the last axis, as the chapter wrote it."""
    ...


class Scorer(torch.nn.Module):
    """Scores with a learned scale."""

    kind = "scorer"

    def __init__(self, d):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(d))  # kept: it names the parameters

    def forward(self, q, k, v, mask=None):
        """{attention}

        Contract: see `check.attention` (`help(check.attention)` prints it).
        """
        ...

    def extra_repr(self):
        """{attention}

        Contract: see `check.attention` (`help(check.attention)` prints it).
        """
        ...'''

REST = """def helper(x):
    return x + 1


print(my_softmax(torch.zeros(3)) * SCALE)  # the rest of the cell
assert helper(1) == 2"""


def _synthetic_chapter(tmp_path: Path, cells) -> Path:
    notebook = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}}
    )
    notebook.cells.append(nbformat.v4.new_markdown_cell("# A chapter\n\nSome text."))
    notebook.cells[0].id = "cell-000"
    for n, (source, tags) in enumerate(cells, start=1):
        cell = nbformat.v4.new_code_cell(source)
        cell.id = f"cell-{n:03d}"
        if tags:
            cell.metadata["tags"] = tags
        notebook.cells.append(cell)
    path = tmp_path / "99-synthetic.ipynb"
    nbformat.write(notebook, path)
    return path


def test_stub_writer_on_a_small_notebook(tmp_path):
    """Two tags in one cell (a def with its docstring, a class with ``__init__`` and
    ``forward`` whose methods have none), code before and after: the stub keeps everything but
    the bodies, a check cell follows, and the rest of the cell is a cell of its own."""
    tags = ["hide-input", "practice:my_softmax=softmax", "practice:Scorer=attention"]
    path = _synthetic_chapter(tmp_path, [("x = 1", None), (SYNTHETIC, tags), ("y = 2", None)])
    copy = practice_notebooks.practice_copy(path)
    nbformat.validate(copy)
    assert [c.id for c in copy.cells] == [
        "cell-000",
        practice_notebooks.NOTE_ID,
        "cell-001",
        "cell-002",
        "cell-002-check",
        "cell-002-rest",
        "cell-003",
    ]
    cells = {c.id: c for c in copy.cells}
    contract = CHECKS["attention"].spec.contract.strip().splitlines()[0]
    assert cells["cell-002"].source == STUB.format(attention=contract)
    assert cells["cell-002"].metadata["tags"] == tags
    assert cells["cell-002-check"].source == (
        "from mhbook import check\n\nprint(check.softmax(my_softmax))\ncheck.attention(Scorer)"
    )
    assert cells["cell-002-rest"].source == REST
    assert cells["cell-002-rest"].metadata["tags"] == ["hide-input"]
    assert cells["cell-001"].source == "x = 1" and cells["cell-003"].source == "y = 2"
    note = cells[practice_notebooks.NOTE_ID].source
    assert "`my_softmax` (`check.softmax`), `Scorer` (`check.attention`)" in note
    assert "practice_notebooks.py" in note and "run the check" in note

    # the stub runs: defined alone, the check says what to write
    stub = exec_alone(cells["cell-002"].source, "my_softmax", "", "synthetic")
    result = CHECKS["softmax"](stub)
    assert not result and "not written yet" in result.report()
    assert CHECKS["softmax"].spec.contract.strip().splitlines()[-1] in result.report()
    # and the chapter's own code passes
    assert CHECKS["softmax"](exec_alone(SYNTHETIC, "my_softmax", "", "synthetic"))


def test_a_function_alone_in_its_cell_gets_no_rest_cell(tmp_path):
    source = "def f(z):\n    return z.softmax(-1)  # a one-liner\n\n"
    path = _synthetic_chapter(tmp_path, [(source, ["practice:f=softmax"])])
    copy = practice_notebooks.practice_copy(path)
    assert [c.id for c in copy.cells][2:] == ["cell-001", "cell-001-check"]
    first = CHECKS["softmax"].spec.contract.strip().splitlines()[0]
    assert copy.cells[2].source == (
        f'def f(z):\n    """{first}\n\n    Contract: see `check.softmax` '
        '(`help(check.softmax)` prints it).\n    """\n    ...'
    )
    assert copy.cells[3].source == "from mhbook import check\n\ncheck.softmax(f)"


def test_a_chapter_without_tags_gets_a_copy_that_says_so(tmp_path):
    path = _synthetic_chapter(tmp_path, [("def f(z):\n    return z", None)])
    copy = practice_notebooks.practice_copy(path)
    assert [c.source for c in copy.cells if c.cell_type == "code"] == ["def f(z):\n    return z"]
    note = copy.cells[1].source
    assert "no build-it cell checked yet" in note and "exercises" in note


@pytest.mark.parametrize(
    ("source", "tag", "message"),
    [
        ("def f(z):\n    return z", "practice:g=softmax", "names no top-level def or class"),
        ("def f(z):\n    return z", "practice:f=no_such_check", "has no check 'no_such_check'"),
        ("def f(z):\n    return z", "practice:f", "not of the form"),
        ("class C:\n    def __init__(self):\n        pass", "practice:C=softmax", "no method"),
    ],
)
def test_a_wrong_tag_is_named(tmp_path, source, tag, message):
    path = _synthetic_chapter(tmp_path, [(source, [tag])])
    with pytest.raises(practice_notebooks.PracticeCopyError, match=message):
        practice_notebooks.practice_copy(path)
