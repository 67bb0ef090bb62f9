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
the new environment's site-packages. The chapter is the quickest after chapter 1 (by the
timings recorded in the committed notebook) that starts no processes; chapter 1 itself runs in a
fresh environment from the wheel (``tests/book/test_release.py``), the same install by another
route, so each route runs one chapter.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from colab_env import PACKAGE, ROOT, ColabEnv, chapters, chapters_to_run

pytestmark = pytest.mark.slow(seconds=45)  # installs mhbook into a fresh virtual environment


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
    for chapter in chapters_to_run():  # chapter 1 (the wheel's) and the one run here
        nb = nbformat.read(chapter, as_version=4)
        first = next(c for c in nb.cells if c.cell_type == "code")
        assert first.source.strip() == cell, (
            f"{chapter.name}: the first code cell is not the Colab cell"
        )


@pytest.mark.parametrize("chapter", chapters_to_run()[1:], ids=lambda p: p.stem)
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
    assert chapters(), "no chapters/NN-*.ipynb to run"
