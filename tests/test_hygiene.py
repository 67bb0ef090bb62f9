"""Project hygiene: safe checkpoint loading, docstrings on the public API, and the
benchmark script's smoke run."""

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


def test_longest_first_names_files_that_exist():
    """make test's schedule (tests/conftest.py) must not name a file that was renamed."""
    from conftest import LONGEST_FIRST

    missing = [name for name in LONGEST_FIRST if not (ROOT / name).is_file()]
    assert not missing, f"LONGEST_FIRST in tests/conftest.py names missing files: {missing}"
