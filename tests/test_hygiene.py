"""Project hygiene: safe checkpoint loading, docstrings on the public API, the
benchmark script's smoke run, and the layers of the package (``LAYERS``: no module imports
from a higher layer, and the imports make no cycle)."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mhbook

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"


def _python_sources():
    """``(label, source)`` for every .py file of the project and every notebook code cell."""
    for folder in ("mhbook", "benchmarks", "tests", "_ext"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "chapters").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] == "code":
                source = "".join(cell["source"])
                # IPython magics and shell escapes are not Python: blank them out.
                source = re.sub(r"(?m)^\s*[%!].*$", "", source)
                yield f"{path.relative_to(ROOT)} cell {i}", source


def _unsafe_torch_loads(source: str) -> list[int]:
    """Line numbers of ``torch.load(...)`` calls without ``weights_only=True``."""
    tree = ast.parse(source)
    load_names = {"torch.load", "torch.serialization.load"}
    for node in ast.walk(tree):  # `from torch import load [as name]`
        if isinstance(node, ast.ImportFrom) and node.module in ("torch", "torch.serialization"):
            load_names |= {a.asname or a.name for a in node.names if a.name == "load"}
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in load_names:
            safe = any(
                k.arg == "weights_only"
                and isinstance(k.value, ast.Constant)
                and k.value.value is True
                for k in node.keywords
            )
            if not safe:
                bad.append(node.lineno)
    return bad


def test_torch_load_always_uses_weights_only():
    """``torch.load`` without ``weights_only=True`` can run code hidden in a file."""
    checked, problems = 0, []
    for label, source in _python_sources():
        checked += 1
        problems += [f"{label}: line {line}" for line in _unsafe_torch_loads(source)]
    assert checked > 0
    assert not problems, "torch.load without weights_only=True:\n" + "\n".join(problems)


def test_the_unsafe_load_detector_works():
    assert _unsafe_torch_loads("import torch\ntorch.load('f')") == [2]
    assert _unsafe_torch_loads("torch.load('f', weights_only=False)") == [1]
    assert _unsafe_torch_loads("from torch import load as L\nL('f')") == [2]
    assert _unsafe_torch_loads("torch.load(\n 'f',\n weights_only=True,\n)") == []


def _public_objects():
    """Every public object of mhbook: its re-exports and each module's ``__all__``."""
    objects = {
        f"mhbook.{name}": obj
        for name, obj in vars(mhbook).items()
        if not name.startswith("_") and not inspect.ismodule(obj)
    }
    for info in pkgutil.iter_modules(mhbook.__path__):
        module = importlib.import_module(f"mhbook.{info.name}")
        objects[f"mhbook.{info.name}"] = module
        for name in getattr(module, "__all__", []):
            objects[f"mhbook.{info.name}.{name}"] = getattr(module, name)
    return objects


def test_public_names_have_docstrings():
    objects = _public_objects()
    assert "mhbook.MultiHeadAttention" in objects
    missing = [
        name
        for name, obj in objects.items()
        if not isinstance(obj, (str, int, float))
        and not (getattr(obj, "__doc__", None) or "").strip()
    ]
    assert not missing, f"public names without a docstring: {missing}"


def test_bench_quick_runs():
    """``python -m benchmarks.bench --quick`` prints its six tables."""
    try:
        result = subprocess.run(
            # One thread: tiny ops on a busy shared CPU are much slower with two.
            [sys.executable, "-m", "benchmarks.bench", "--quick", "--threads", "1"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:  # pragma: no cover
        pytest.fail("python -m benchmarks.bench --quick took more than 300 s")
    assert result.returncode == 0, result.stderr[-3000:]
    for table in ("(a)", "(b)", "(c)", "(d)", "(e)", "(f)"):
        assert f"\n{table} " in result.stdout
    assert result.stdout.rstrip().endswith("done")


def test_bench_measures_more_on_a_gpu():
    """On CUDA the benchmark goes to L=16k in (b) and adds bfloat16 and a larger shape to (a)."""
    import torch

    from benchmarks.bench import attention_lengths, multihead_sizes

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert max(attention_lengths(cpu)) == 4096
    assert max(attention_lengths(cuda)) == 16384
    assert multihead_sizes(cpu)[1] == [torch.float32]
    shapes, dtypes = multihead_sizes(cuda)
    assert torch.bfloat16 in dtypes and len(shapes) > len(multihead_sizes(cpu)[0])


def test_bibliography_parses():
    """references.bib is valid BibTeX (a missing brace otherwise fails only the book build)."""
    from pybtex.database import parse_file

    bib = parse_file(str(Path(__file__).resolve().parents[1] / "references.bib"))
    assert len(bib.entries) > 40


@pytest.mark.parametrize("path", sorted(CHAPTERS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebooks_store_no_widget_state(path):
    """ipywidgets state is hundreds of kilobytes the static book cannot use (CONTRIBUTING.md)."""
    assert "widgets" not in json.loads(path.read_text())["metadata"], (
        f"{path.name} stores ipywidgets state: drop metadata.widgets (see CONTRIBUTING.md)"
    )


def test_every_chapter_has_a_recorded_duration_for_the_schedule():
    """make test starts the longest files first; a chapter's length is its committed run's
    (chapters/conftest.py), so every chapter must keep nbclient's timestamps."""
    from helpers import recorded_seconds

    chapters = sorted(CHAPTERS.glob("*.ipynb"))
    missing = [p.name for p in chapters if not 0 < recorded_seconds(p) < float("inf")]
    assert not missing, f"chapters without execution timestamps: {missing}"


# -- the layers of the package ----------------------------------------------------------------
#: The folders of mhbook, which are its layers, floor by floor from the bottom up
#: (``mhbook.FLOORS``, the one list of them). A module may import modules of its own folder,
#: of the folders on its floor and of the floors below, never of a floor above; and the
#: imports make no cycle. ``mhbook/__init__.py``, which gathers every folder's public names,
#: is the top. Every module lives in one of these folders.
FLOORS = mhbook.FLOORS

PACKAGE = ROOT / "mhbook"
TOP = "mhbook"  # the package itself: ``import mhbook``, ``from mhbook import X``


def _modules() -> dict[str, Path]:
    """Every module of mhbook by its dotted name below ``mhbook`` (``"explorers.svg"``, a
    package by its own name, ``"explorers"``), without ``mhbook/__init__.py``."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            modules[".".join(parts)] = path
    return modules


def _mhbook_imports(source: str, module: str, is_package: bool, modules) -> dict[str, int]:
    """``{imported module: first line}`` for every import of mhbook code in ``source`` (the
    module ``module``): relative or absolute, at the top or lazily inside a function.
    ``from .pkg import name`` is ``pkg.name`` where that is a module, else ``pkg``; ``TOP``
    (``"mhbook"``) is the package itself."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: dict[str, int] = {}

    def add(parts: list[str], line: int) -> None:
        found.setdefault(".".join(parts) or TOP, line)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "mhbook":
                    add(parts[1:], node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != "mhbook":
                    continue
                base = parts[1:]
            else:
                if node.level - 1 > len(package):
                    raise ValueError(f"{module}: line {node.lineno} imports from above mhbook")
                base = package[: len(package) - (node.level - 1)]
                base += node.module.split(".") if node.module else []
            for alias in node.names:
                sub = base + [alias.name]
                add(sub if ".".join(sub) in modules else base, node.lineno)
    found.pop(module, None)
    return found


def _import_graph() -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}`` for every module of mhbook."""
    modules = _modules()
    return {
        name: _mhbook_imports(
            path.read_text(encoding="utf-8"), name, path.name == "__init__.py", modules
        )
        for name, path in modules.items()
    }


def _folder(module: str) -> str:
    """The folder (layer) of a module: ``"attention.multihead"`` -> ``"attention"``."""
    return module.split(".")[0]


def _floor_of() -> dict[str, int]:
    return {folder: i for i, floor in enumerate(FLOORS) for folder in floor}


def _label(module: str) -> str:
    path = _modules().get(module)
    return str(path.relative_to(ROOT)) if path else f"mhbook.{module}"


def test_every_module_is_in_a_layer_folder():
    """No module sits loose in mhbook/: each lives in one of the folders of ``FLOORS``, and
    every folder listed exists."""
    floor_of = _floor_of()
    loose = sorted(m for m in _modules() if _folder(m) not in floor_of)
    assert not loose, (
        f"modules outside the layer folders: {[_label(m) for m in loose]}: put each into the "
        "lowest folder of mhbook.FLOORS that holds everything it imports"
    )
    gone = sorted(f for f in floor_of if not (PACKAGE / f / "__init__.py").is_file())
    assert not gone, f"mhbook.FLOORS names folders that do not exist: {gone}"


def test_no_module_imports_from_a_higher_layer():
    """Lower floors know nothing of higher ones (lazy imports inside functions included)."""
    floor_of, modules = _floor_of(), _modules()
    problems = []
    for module, imports in _import_graph().items():
        if _folder(module) not in floor_of:
            continue  # test_every_module_is_in_a_layer_folder names it
        here = floor_of[_folder(module)]
        for target, line in sorted(imports.items()):
            if target == TOP:
                problems.append(
                    f"{_label(module)}: line {line} imports the package mhbook itself (its "
                    "__init__, the top): import the module that defines the name"
                )
            elif target not in modules:
                problems.append(f"{_label(module)}: line {line} imports mhbook.{target}, no module")
            elif floor_of.get(_folder(target), -1) > here:
                problems.append(
                    f"{_label(module)}: line {line} imports mhbook.{target}, on a higher floor "
                    f"({', '.join(FLOORS[floor_of[_folder(target)]])}) than its own "
                    f"({', '.join(FLOORS[here])})"
                )
    assert not problems, (
        "imports that run from a lower floor up to a higher one (FLOORS in "
        "tests/test_hygiene.py); move what both need down instead:\n" + "\n".join(problems)
    )


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" after
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_imports_make_no_cycle():
    graph = {module: set(imports) - {TOP} for module, imports in _import_graph().items()}
    cycle = _cycle(graph)
    assert cycle is None, "an import cycle: " + " -> ".join(f"mhbook.{m}" for m in cycle)


def test_the_import_reader_works():
    modules = {"data", "plot", "explorers", "explorers.svg", "explorers.viewer"}
    source = (
        "import numpy\n"
        "from . import svg\n"
        "from .svg import embed\n"
        "from ..data import tokenize\n"
        "def f():\n"
        "    from ..plot import plot_heatmap\n"
        "    import mhbook.explorers.svg\n"
        "    from mhbook import Transformer\n"
    )
    assert _mhbook_imports(source, "explorers.viewer", False, modules) == {
        "explorers.svg": 2,
        "data": 4,
        "plot": 6,
        TOP: 8,
    }
    package = "from . import svg, viewer\nfrom .viewer import attention_viewer\n"
    assert _mhbook_imports(package, "explorers", True, modules) == {
        "explorers.svg": 1,
        "explorers.viewer": 1,
    }
    assert _mhbook_imports("from .explorers import svg", "plot", False, modules) == {
        "explorers.svg": 1
    }
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def _private_names_imported(source: str) -> list[str]:
    """Private names (``_x``, not ``__x__``) a module of mhbook takes from another one of
    mhbook: ``from .m import _x`` and ``m._x`` for a module ``m`` it imported from mhbook
    (PyTorch's own private names are another matter)."""
    tree = ast.parse(source)
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            ours = node.level > 0 or (node.module or "").startswith("mhbook")
        else:
            ours = isinstance(node, ast.Import) and node.names[0].name.startswith("mhbook")
        if not ours:
            continue
        for alias in node.names:
            private = alias.name.startswith("_") and not alias.name.startswith("__")
            if isinstance(node, ast.ImportFrom) and private:
                found.append(f"line {node.lineno}: from {node.module or '.'} import {alias.name}")
            modules.add((alias.asname or alias.name).split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_private_name_crosses_a_module_boundary():
    """A name with a leading underscore is its module's own: no module of mhbook imports
    one from another module (what two modules share is a public name)."""
    crossing = {
        str(path.relative_to(ROOT)): _private_names_imported(path.read_text(encoding="utf-8"))
        for path in sorted((ROOT / "mhbook").rglob("*.py"))
    }
    assert {path: found for path, found in crossing.items() if found} == {}


def test_the_private_name_detector_works():
    source = "from .cache import _append, trim\nfrom . import viewer\nviewer._pack(1)\n"
    source += "self._own()\nx.__class__\nimport torch\ntorch._C\n"
    assert _private_names_imported(source) == [
        "line 1: from cache import _append",
        "line 3: viewer._pack",
    ]
