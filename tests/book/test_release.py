"""The release: ``python -m build`` makes an sdist and a wheel that hold the whole package, and
the wheel, installed in a fresh virtual environment by a chapter's first cell, runs chapter 1.

CONTRIBUTING.md ("Releasing") gives the maintainer's steps; this is the part of them that runs
offline, in CI:

* the checkout's files (those git tracks, and new ones it does not ignore: what a clone holds
  once they are committed) are copied to a temporary folder, and ``python -m build
  --no-isolation`` builds there, the sdist first and the wheel from the sdist, as a release
  does. ``--no-isolation`` builds with this environment's setuptools (``requirements.txt``)
  instead of downloading one; the maintainer's ``python -m build`` fetches its own;
* the wheel must hold every file of ``mhbook/`` (modules and package data: the corpus in
  ``mhbook/tasks/corpus/``, the explorers' ``static/`` files), so a data file that
  ``pyproject.toml``'s ``package-data`` misses fails here, by name;
* a fresh virtual environment (tests/book/test_colab.py's :class:`ColabEnv`: it sees this
  environment's packages but not mhbook, so torch is not downloaded, and pip runs with no
  index) gets the wheel from chapter 1's first cell (``MHBOOK_SOURCE`` = the wheel), runs
  chapter 1's reader copy to its end, reads every packaged file through
  ``importlib.resources`` and loads the corpus (its sha256 checked), all from the fresh
  environment's site-packages.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from colab_env import PACKAGE, ColabEnv, chapters_to_run

# 10 s on 2 cores (the build 1 s, the fresh environment and chapter 1 8 s); 53 s on a loaded machine
pytestmark = pytest.mark.slow(seconds=15)

ROOT = Path(__file__).resolve().parents[2]
IGNORED = ("__pycache__", ".pyc", ".pyo")


def _checkout_files() -> list[str]:
    """The checkout's files as a clone would hold them (tracked, or new and not ignored)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: the package alone
        listed = ["pyproject.toml", "README.md"] + [
            str(p.relative_to(ROOT)) for p in (ROOT / PACKAGE).rglob("*") if p.is_file()
        ]
    return sorted(f for f in listed if f and (ROOT / f).is_file())


def _package_files() -> set[str]:
    """Every file of the package (``mhbook/...``) that a release must ship."""
    return {
        f
        for f in _checkout_files()
        if f.startswith(f"{PACKAGE}/") and not any(part in f for part in IGNORED)
    }


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """``python -m build`` of a copy of the checkout: ``{"sdist": ..., "wheel": ...}``."""
    try:
        import build  # noqa: F401
    except ImportError:  # not a skip: the release would go untested
        pytest.fail("the build package is missing (pip install -r requirements.txt)")
    base = tmp_path_factory.mktemp("release")
    source = base / "source"
    for name in _checkout_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    out = base / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        cwd=base,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, (
        f"python -m build failed:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
    )
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in out.iterdir())
    return {"sdist": sdists[0], "wheel": wheels[0]}


def _version() -> str:
    import mhbook  # this checkout's (tests/book/test_chapters.py keeps it equal to pyproject's)

    return mhbook.__version__


def test_build_makes_the_release_files(dist):
    """An sdist and a pure-Python wheel named for the package's version."""
    version = _version()
    assert dist["sdist"].name == f"{PACKAGE}-{version}.tar.gz"
    assert dist["wheel"].name == f"{PACKAGE}-{version}-py3-none-any.whl"


def test_the_wheel_and_sdist_hold_the_whole_package(dist):
    """Every file of ``mhbook/`` is in the wheel and in the sdist: the modules, the corpus and
    the explorers' static files (``package-data`` in ``pyproject.toml``)."""
    want = _package_files()
    assert f"{PACKAGE}/tasks/corpus/tinyshakespeare/input.txt" in want
    assert any(f.startswith(f"{PACKAGE}/viz/explorers/static/") for f in want)
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        in_wheel = {n for n in wheel.namelist() if n.startswith(f"{PACKAGE}/")}
    missing = sorted(want - in_wheel)
    assert not missing, (
        f"{len(missing)} files of the package are not in {dist['wheel'].name} (add them to "
        f"[tool.setuptools.package-data] in pyproject.toml): {missing}"
    )
    with tarfile.open(dist["sdist"]) as sdist:
        prefix = f"{PACKAGE}-{_version()}/"
        in_sdist = {n.removeprefix(prefix) for n in sdist.getnames()}
    missing = sorted(want - in_sdist)
    assert not missing, f"not in {dist['sdist'].name}: {missing}"


# Run in the fresh environment, outside the checkout: every packaged file can be read, and the
# corpus loads (load_shakespeare checks its sha256).
READ_PACKAGE_DATA = f"""
import json, sys
from importlib.resources import files

import {PACKAGE}
from {PACKAGE}.tasks.shakespeare import load_shakespeare

names = json.loads(sys.argv[1])
unreadable = [n for n in names if not files("{PACKAGE}").joinpath(n).is_file()]
print(json.dumps({{"file": {PACKAGE}.__file__, "unreadable": unreadable,
                  "corpus": len(load_shakespeare())}}))
"""


def test_the_wheel_runs_chapter_1_in_a_fresh_environment(dist, tmp_path_factory):
    """Chapter 1's first cell installs the wheel into a fresh virtual environment (as Colab's
    does from the release), and the chapter runs to its end on that install."""
    env = ColabEnv(tmp_path_factory.mktemp("wheel-env"), source=dist["wheel"])
    env.assert_without_mhbook()
    chapter = chapters_to_run()[0]
    done = env.execute(chapter, env.base / "run" / chapter.stem)
    text = "".join(o.get("text", "") for o in done.cells[-1].outputs if o.output_type == "stream")
    assert text, f"{chapter.name} did not run to its end on the wheel"
    origin = json.loads(text.strip().splitlines()[-1])
    assert Path(origin["file"]).resolve().is_relative_to(env.site_packages.resolve()), origin
    assert origin["version"] == _version(), origin

    data = sorted(f.removeprefix(f"{PACKAGE}/") for f in _package_files() if not f.endswith(".py"))
    probe = subprocess.run(
        [str(env.python), "-c", READ_PACKAGE_DATA, json.dumps(data)],
        cwd=env.base,
        env=env.env,
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert Path(found["file"]).resolve().is_relative_to(env.site_packages.resolve()), found
    assert not found["unreadable"], f"package data missing from the install: {found['unreadable']}"
    assert found["corpus"] > 1_000_000, found
