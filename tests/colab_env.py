"""A fresh virtual environment as Colab gives one: this environment's packages but mhbook,
and a Jupyter kernel for it, in which a chapter's first cell must install mhbook itself.
Used by ``tests/book/test_colab.py`` (the chapters as Colab opens them) and
``tests/book/test_release.py`` (the release's wheel)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
from helpers import recorded_seconds

ROOT = Path(__file__).resolve().parents[1]  # tests/ is one level down
PACKAGE = "mhbook"
KERNEL = "mhbook-colab-test"
CELL_TIMEOUT = 300  # seconds

CHECK_NOT_INSTALLED = f"""\
# Added by tests/test_colab.py: before the first cell, {PACKAGE} must not be importable.
import importlib.util
import sys

assert importlib.util.find_spec("{PACKAGE}") is None, importlib.util.find_spec("{PACKAGE}")
"""

REPORT_ORIGIN = f"""\
# Added by tests/test_colab.py: where did {PACKAGE} come from?
import json
import sys

import {PACKAGE}

print(json.dumps({{"file": {PACKAGE}.__file__, "version": {PACKAGE}.__version__,
                  "executable": sys.executable, "prefix": sys.prefix}}))
"""


def chapters() -> list[Path]:
    return sorted((ROOT / "chapters").glob("[0-9][0-9]-*.ipynb"))


def chapters_to_run() -> list[Path]:
    """Chapter 1 (run from the wheel, ``tests/book/test_release.py``) and the quickest other
    chapter (run through the Colab cell, ``tests/book/test_colab.py``), as Colab opens them:
    their reader copies in ``notebooks/`` (``_ext/reader_notebooks.py``; the same code cells,
    outputs left out)."""
    found = chapters()
    if not found:
        return []
    first, others = found[0], found[1:]
    # Chapters that start processes (launch.run) take longer in a fresh environment than their
    # recorded time says: every process imports torch there again.
    others = [p for p in others if "launch.run(" not in p.read_text(encoding="utf8")] or others
    picked = [first] + ([min(others, key=recorded_seconds)] if others else [])
    return [ROOT / "notebooks" / p.name for p in picked]


# --------------------------------------------------------------------------- the environment


def _source_copy(target: Path) -> Path:
    """What ``pip install`` of the repository needs: pyproject.toml, the README and the package."""
    target.mkdir(parents=True)
    for pattern in (
        "pyproject.toml",
        "setup.cfg",
        "setup.py",
        "MANIFEST.in",
        "README*",
        "LICEN[CS]E*",
    ):
        for path in ROOT.glob(pattern):
            shutil.copy2(path, target / path.name)
    shutil.copytree(
        ROOT / PACKAGE, target / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    return target


def _is_mhbook(name: str) -> bool:
    """Files of this environment's site-packages that belong to the mhbook install."""
    lowered = name.lower()
    return lowered.startswith((PACKAGE, f"__editable__.{PACKAGE}", f"__editable___{PACKAGE}"))


class ColabEnv:
    """A fresh venv that sees this environment's packages except mhbook, and a kernel for it."""

    def __init__(self, base: Path, source: Path | None = None):
        """``source``: what the first cell installs (``MHBOOK_SOURCE``); by default a copy of this
        checkout's package files (tests/book/test_release.py hands it the release's wheel)."""
        self.base = base
        self.venv = base / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(self.venv)], check=True)
        self.python = self.venv / "bin" / "python"
        self.site_packages = Path(
            subprocess.run(
                [str(self.python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
        # Links to everything in our site-packages but mhbook. .pth files are left out too: the
        # editable install works through one, and a folder named in a .pth line does not run
        # the .pth files inside it anyway.
        outer = Path(sysconfig.get_path("purelib"))
        self.view = base / "outer-site-packages"
        self.view.mkdir()
        for entry in outer.iterdir():
            if not _is_mhbook(entry.name) and entry.suffix != ".pth":
                (self.view / entry.name).symlink_to(entry)
        (self.site_packages / "zz-outer-packages.pth").write_text(f"{self.view}\n")

        self.kernels = base / "kernels"
        spec_dir = self.kernels / KERNEL
        spec_dir.mkdir(parents=True)
        spec = {
            "argv": [str(self.python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "fresh venv without mhbook",
            "language": "python",
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec))

        self.source = source or _source_copy(base / "source")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
        self.env.update(
            {
                "VIRTUAL_ENV": str(self.venv),
                "PATH": f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                "MHBOOK_SOURCE": str(self.source),
                "PIP_NO_INDEX": "1",
                "PIP_NO_BUILD_ISOLATION": "0",  # i.e. --no-build-isolation (pip's double negative)
                "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                "PYTHONNOUSERSITE": "1",
                "MPLBACKEND": "module://matplotlib_inline.backend_inline",
            }
        )

    def run_python(self, code: str, cwd: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.python), "-c", code], cwd=cwd, env=self.env, capture_output=True, text=True
        )

    def assert_without_mhbook(self) -> None:
        """Uninstall what an earlier chapter installed, then check that mhbook is gone."""
        if any(_is_mhbook(p.name) for p in self.site_packages.iterdir()):
            subprocess.run(
                [str(self.python), "-m", "pip", "uninstall", "--yes", "--quiet", PACKAGE],
                cwd=self.base,
                env=self.env,
                check=True,
            )
        probe = self.run_python(f"import {PACKAGE}; print({PACKAGE}.__file__)", cwd=self.base)
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, (
            f"{PACKAGE} is importable in the fresh venv before the install:\n"
            f"{probe.stdout}{probe.stderr}"
        )

    def execute(self, notebook: Path, workdir: Path) -> nbformat.NotebookNode:
        """Run a copy of ``notebook`` in ``workdir`` with this environment's kernel."""
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import AsyncKernelManager
        from nbclient import NotebookClient

        nb = nbformat.read(notebook, as_version=4)
        nb.cells.insert(0, nbformat.v4.new_code_cell(CHECK_NOT_INSTALLED))
        nb.cells.append(nbformat.v4.new_code_cell(REPORT_ORIGIN))
        workdir.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, workdir / notebook.name)
        km = AsyncKernelManager(
            kernel_name=KERNEL,
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(self.kernels)]),
        )
        client = NotebookClient(
            nb,
            km=km,
            timeout=CELL_TIMEOUT,
            allow_errors=False,
            resources={"metadata": {"path": str(workdir)}},
        )
        # cleanup_kc: shut the kernel down afterwards (nbclient keeps kernels it was handed)
        return client.execute(env=self.env, cleanup_kc=True)
