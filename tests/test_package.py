"""The package itself: a cheap ``import mhbook``, lazy names, and the files it ships."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest
import torch

import mhbook

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ["matplotlib", "ipywidgets", "IPython", "tqdm.auto"]


def test_import_mhbook_imports_no_plotting_or_widgets():
    """``import mhbook`` leaves out matplotlib and ipywidgets; a plot name brings matplotlib."""
    code = (
        "import sys\n"
        "import mhbook\n"
        "print(' '.join(sys.modules))\n"
        "mhbook.plot_heatmap\n"
        "print(' '.join(sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    after_import, after_plot = (set(line.split()) for line in result.stdout.splitlines())
    assert not after_import & set(HEAVY), sorted(after_import & set(HEAVY))
    assert "matplotlib" in after_plot and "ipywidgets" not in after_plot


def test_lazy_names_resolve():
    from mhbook.viz import explorers, plot

    assert mhbook.viz.plot is plot and mhbook.viz.explorers is explorers
    assert mhbook.plot_heatmap is plot.plot_heatmap
    assert mhbook.attention_explorer_html is explorers.attention_explorer_html
    assert mhbook.attention_explorer is explorers.attention.attention_explorer
    for name in mhbook.__all__:
        assert getattr(mhbook, name) is not None, name
    assert set(mhbook.__all__) <= set(dir(mhbook))
    with pytest.raises(AttributeError, match="no attribute 'widgets'"):
        mhbook.widgets  # noqa: B018 (moved to mhbook.viz.explorers)


def test_every_public_name_is_what_its_module_exports():
    """``mhbook.X`` is the object the module that defines ``X`` offers under ``X``, never a
    module: a reader who calls ``mhbook.softmax(x)`` must not get "module is not callable"."""
    import importlib
    import types

    homes = {}
    for floor in mhbook.FLOORS:
        for folder in floor:
            if folder in ("check", "viz"):
                continue
            package = importlib.import_module(f"mhbook.{folder}")
            for name in package.__all__:
                homes.setdefault(name, []).append(folder)
    twice = {name: folders for name, folders in homes.items() if len(folders) > 1}
    assert not twice, f"names offered by two folders: {twice}"
    for name in mhbook.__all__:
        value = getattr(mhbook, name)
        assert not isinstance(value, types.ModuleType), f"mhbook.{name} is a module"
        defined_in = getattr(value, "__module__", None)
        if defined_in and defined_in.startswith("mhbook.") and callable(value):
            module = importlib.import_module(defined_in)
            assert getattr(module, name, None) is value, (name, defined_in)
    for explorer in ("softmax", "masks", "live", "attention", "positional", "svg", "viewer"):
        assert explorer not in mhbook.viz.NAMES, explorer
    assert mhbook.causal_mask is mhbook.core.masks.causal_mask
    assert not hasattr(mhbook, "masks") and not hasattr(mhbook, "softmax")
    assert mhbook.attention is importlib.import_module("mhbook.attention")


def test_gather_refuses_a_name_with_two_homes_and_a_module(tmp_path, monkeypatch):
    from mhbook.core.public import gather

    pkg = tmp_path / "pkg_gather"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("__all__ = ['f']\ndef f(): pass\n")
    (pkg / "b.py").write_text("__all__ = ['f']\ndef f(): pass\n")
    (pkg / "c.py").write_text("import os\n__all__ = ['os']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert gather({"__name__": "pkg_gather"}, ("a",)) == ["f"]
    with pytest.raises(ImportError, match="'f' is offered by both a and b"):
        gather({"__name__": "pkg_gather"}, ("a", "b"))
    with pytest.raises(ImportError, match="'os' is a module"):
        gather({"__name__": "pkg_gather"}, ("c",))


def test_every_package_and_static_file_ships():
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {
        ".".join(p.relative_to(ROOT).parent.parts) for p in (ROOT / "mhbook").rglob("__init__.py")
    }
    assert packages == set(setuptools["packages"])
    data = setuptools.get("package-data", {})
    for path in (ROOT / "mhbook").rglob("*"):
        if not path.is_file() or path.suffix in (".py", ".pyc"):
            continue
        folder = next(f for f in path.parents if (f / "__init__.py").exists())  # its package
        package = ".".join(folder.relative_to(ROOT).parts)
        relative = path.relative_to(folder).as_posix()
        assert any(fnmatch(relative, p) for p in data.get(package, [])), f"{package}: {relative}"


def test_glue_hands_plain_numbers_to_myst_nb(monkeypatch):
    """``{glue:text}`x:.1f``` formats the repr: ``np.float64(0.5)`` would not parse."""
    import myst_nb
    import numpy as np
    import torch

    glued = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display: glued.update({name: value}))
    mhbook.glue("a", np.float64(0.5))
    mhbook.glue("b", torch.tensor(3))
    mhbook.glue("c", "decoder layer 2")
    assert glued == {"a": 0.5, "b": 3, "c": "decoder layer 2"}
    assert type(glued["a"]) is float and type(glued["b"]) is int


def test_figures_are_retina_pngs_in_ipython():
    """``import mhbook`` in an IPython shell makes matplotlib figures retina PNGs (twice the
    pixels, display size in the metadata); outside IPython it changes nothing."""
    code = (
        "import base64, json, struct\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "import mhbook\n"
        "from matplotlib_inline.config import InlineBackend\n"
        "import matplotlib\n"
        "matplotlib.use('module://matplotlib_inline.backend_inline')\n"
        "import matplotlib.pyplot as plt\n"
        "from matplotlib_inline.backend_inline import configure_inline_support\n"
        "configure_inline_support(shell, 'inline')\n"
        "fig, ax = plt.subplots(figsize=(4, 3), dpi=100)\n"
        "png, shown = shell.display_formatter.formatters['image/png'](fig)\n"
        "png = base64.b64decode(png) if isinstance(png, str) else png\n"
        "print(json.dumps({'formats': sorted(InlineBackend.instance().figure_formats),\n"
        "    'pixels': struct.unpack('>II', png[16:24]), 'shown': shown}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert out["formats"] == ["retina"]
    width, height = out["pixels"]
    assert (width // 2, height // 2) == (out["shown"]["width"], out["shown"]["height"]), out
    assert width > 700, out  # twice the 4 inches x 100 dpi (less bbox_inches="tight")
    assert mhbook.use_sharp_figures() is False  # no IPython shell in this process


def test_cpu_or_gpu_picks_the_gpu_size_on_cuda_or_when_asked(monkeypatch):
    """Chapters train CPU-sized on a CPU and larger on a GPU; ``MHBOOK_GPU_SIZES=1`` lets a
    maintainer without a GPU run the GPU's sizes on the CPU."""
    monkeypatch.delenv("MHBOOK_GPU_SIZES", raising=False)
    assert mhbook.cpu_or_gpu(400, 1200, torch.device("cpu")) == 400
    assert mhbook.cpu_or_gpu(400, 1200, torch.device("meta")) == 400
    assert mhbook.cpu_or_gpu(400, 1200, torch.device("cuda")) == 1200  # no GPU needed to ask
    monkeypatch.setenv("MHBOOK_GPU_SIZES", "1")
    assert mhbook.cpu_or_gpu(400, 1200, torch.device("cpu")) == 1200
    monkeypatch.setenv("MHBOOK_GPU_SIZES", "0")
    assert mhbook.cpu_or_gpu(400, 1200, torch.device("cpu")) == 400


def _defined_and_exported(path: Path) -> tuple[set[str], list[str]]:
    """The top-level names a module defines (def, class, assignment) and its ``__all__``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defined, exported = set(), []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        defined.add(name.id)
            if any(getattr(t, "id", None) == "__all__" for t in targets):
                exported = [ast.literal_eval(e) for e in node.value.elts]
    return defined, exported


def test_every_public_name_has_one_home():
    """A module's ``__all__`` lists only what it defines (no re-export kept for an old path),
    so each public name of ``mhbook`` comes from exactly one module; the folders' packages
    gather them."""
    homes: dict[str, list[str]] = {}
    for path in sorted((ROOT / "mhbook").rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        defined, exported = _defined_and_exported(path)
        module = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
        borrowed = [name for name in exported if name not in defined]
        assert not borrowed, f"{module}.__all__ re-exports {borrowed}: export them from their home"
        if not module.startswith("mhbook.check."):  # check.attention grades attention
            for name in exported:
                homes.setdefault(name, []).append(module)
    public = set(mhbook.__all__)
    twice = {n: m for n, m in homes.items() if len(m) > 1 and n in public}
    assert not twice, f"public names with two homes: {twice}"
    assert len(mhbook.__all__) == len(public)
