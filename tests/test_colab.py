"""The Colab path: a chapter runs in a fresh environment where only its first cell installs mhbook.

Colab starts with torch, numpy and matplotlib but without ``mhbook``; the first code cell of every
chapter (``tests/colab_cell.py``) pip-installs it. This test rebuilds that situation offline:

* a fresh virtual environment (``python -m venv``) that sees this environment's packages through
  a folder of links to them, from which everything of ``mhbook`` (the package, its editable-install
  hook and its metadata) is left out, so ``import mhbook`` fails there: the test asserts it,
  in a subprocess and again inside the notebook's kernel before the first cell;
* a kernel running that environment's Python, in a temporary folder holding only a copy of
  the notebook (so the checkout's ``mhbook/`` folder is not on ``sys.path``);
* ``MHBOOK_SOURCE`` pointing at a copy of this checkout's package files, which makes the first cell
  install from there instead of GitHub. ``PIP_NO_INDEX`` keeps pip offline, and
  ``PIP_NO_BUILD_ISOLATION=0`` (pip's spelling of ``--no-build-isolation``) lets it build with
  the setuptools it can see instead of downloading one. Neither changes the cell.

The notebook run is the chapter's reader copy in ``notebooks/``, which the launch button opens.
Then the chapter must run to the end, and a last added cell reports where ``mhbook`` came from:
the new environment's site-packages. Chapter 1 runs, then the quickest other chapter (by the
timings recorded in the committed notebook) that starts no processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest
from helpers import recorded_seconds

pytestmark = pytest.mark.slow(seconds=45)  # installs mhbook into a fresh virtual environment

ROOT = Path(__file__).resolve().parents[1]
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


def _chapters() -> list[Path]:
    return sorted((ROOT / "chapters").glob("[0-9][0-9]-*.ipynb"))


def _chapters_to_run() -> list[Path]:
    """Chapter 1 and the quickest other chapter, as Colab opens them: their reader copies in
    ``notebooks/`` (``_ext/reader_notebooks.py``; the same code cells, outputs left out)."""
    chapters = _chapters()
    if not chapters:
        return []
    first, others = chapters[0], chapters[1:]
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
        checkout's package files (tests/test_release.py hands it the release's wheel)."""
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


@pytest.fixture(scope="module")
def colab(tmp_path_factory) -> ColabEnv:
    env = ColabEnv(tmp_path_factory.mktemp("colab"))
    seen = env.run_python("import torch, matplotlib, num2words, ipykernel", cwd=env.base)
    assert seen.returncode == 0, f"the fresh venv does not see our packages:\n{seen.stderr}"
    return env


def test_colab_cell_is_first(colab):
    """The chapters start with the cell this test relies on."""
    cell = (ROOT / "tests" / "colab_cell.py").read_text(encoding="utf8").strip()
    assert "MHBOOK_SOURCE" in cell and "pip" in cell
    for chapter in _chapters_to_run():
        nb = nbformat.read(chapter, as_version=4)
        first = next(c for c in nb.cells if c.cell_type == "code")
        assert first.source.strip() == cell, (
            f"{chapter.name}: the first code cell is not the Colab cell"
        )


@pytest.mark.parametrize("chapter", _chapters_to_run(), ids=lambda p: p.stem)
def test_chapter_runs_after_colab_install(chapter, colab):
    colab.assert_without_mhbook()
    done = colab.execute(chapter, colab.base / "run" / chapter.stem)
    last = done.cells[-1]
    text = "".join(o.get("text", "") for o in last.outputs if o.output_type == "stream")
    assert text, (
        f"{chapter.name}: the chapter did not run to its end (no report from the last cell)"
    )
    origin = json.loads(text.strip().splitlines()[-1])
    installed = Path(origin["file"]).resolve()
    assert installed.is_relative_to(colab.site_packages.resolve()), (
        f"{chapter.name} imported {PACKAGE} from {installed}, not from the fresh venv's "
        f"site-packages {colab.site_packages}"
    )
    assert Path(origin["prefix"]).resolve() == colab.venv.resolve(), origin
    assert not (colab.site_packages / f"__editable__.{PACKAGE}-{origin['version']}.pth").exists()
    import mhbook  # this checkout's, in the test's own environment

    assert origin["version"] == mhbook.__version__


def test_chapters_exist():
    assert _chapters(), "no chapters/NN-*.ipynb to run"
