"""nbval runs each chapter on other CPU kernels and thread counts than the author's.

The committed outputs come from one machine (its first cell says which). A reader's
CPU picks other floating-point kernels (``torch.backends.cpu.get_cpu_capability()``:
``AVX512``, ``AVX2``, ``DEFAULT``, an arm64 set) and has another number of cores, and
both change the last digits of float results. The chapters print exact things exactly and
assert their claims about float results, so they must pass whatever the kernels; this
file makes every ``pytest --nbval`` run prove it on settings other than the native one.

Unless the caller sets them, each chapter's kernel is started with

* ``ATEN_CPU_CAPABILITY`` from :data:`KERNELS` (``native`` leaves it unset), and
* ``OMP_NUM_THREADS`` (PyTorch's threads) 1, 2 or 4,

as :data:`SETTINGS` lists them, so one run covers all three kernel sets and all three
thread counts. A caller's own
``ATEN_CPU_CAPABILITY`` or ``OMP_NUM_THREADS`` applies to every chapter instead, e.g.
``ATEN_CPU_CAPABILITY=default pytest --nbval chapters``. ``MHBOOK_NBVAL_NATIVE=1`` runs
every chapter natively. The settings used are listed at the end of the run.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import pytest

from tests.helpers import recorded_seconds  # the repository root is on sys.path (pyproject)

KERNELS = ("native", "default", "avx2")
THREADS = (1, 2, 4)

#: ``(kernel, threads)`` of each chapter, in file-name order. ``make test`` runs two chapters
#: at once on a 2-core machine, and a chapter with more threads than it has cores makes its
#: threads wait for each other (and for the other chapter) at every operation. So the
#: chapters that train (6-12, 14-16) run on one thread, and the short ones carry the 2- and
#: 4-thread settings; the slow scalar ``default`` kernels go to chapters with little training.
#: Chapters after the table take the settings in turn.
SETTINGS = (
    ("native", 2),  # 01
    ("default", 4),  # 02
    ("default", 4),  # 03
    ("native", 4),  # 04
    ("default", 2),  # 05
    ("avx2", 1),  # 06
    ("native", 1),  # 07
    ("avx2", 1),  # 08 (times attention kernels: the scalar ones would double it)
    ("avx2", 1),  # 09
    ("native", 1),  # 10
    ("avx2", 1),  # 11
    ("native", 1),  # 12
    ("avx2", 2),  # 13
    ("native", 1),  # 14 (trains for two minutes: the scalar kernels would make it three)
    ("avx2", 1),  # 15
    ("avx2", 1),  # 16
)

_used: dict[str, str] = {}


def setting_for(index: int) -> dict[str, str | None]:
    """The environment of the ``index``-th chapter (0-based, in file-name order)."""
    if index < len(SETTINGS):
        kernel, threads = SETTINGS[index]
    else:
        kernel = KERNELS[index % len(KERNELS)]
        threads = THREADS[(index // len(KERNELS)) % len(THREADS)]
    return {
        "ATEN_CPU_CAPABILITY": None if kernel == "native" else kernel,
        "OMP_NUM_THREADS": str(threads),
    }


#: Chapters that load a model another chapter trains (``train_once`` under a lock): a loader
#: started beside the trainer waits for the model with its worker idle, or trains it itself
#: (and chapter 6, which always retrains, then trains it again), and its committed run (which
#: loaded the checkpoint) hides that. So the trainers go first, and each loader is ordered as
#: if it were shorter by the training's seconds, so that other chapters run meanwhile.
#: {trainer: (loaders, seconds of training in the committed run)}
SHARED_MODELS = {
    "06-transformer.ipynb": (("07-why-several-heads.ipynb", "08-efficient-attention.ipynb"), 19),
}


def ordering_seconds(path: Path) -> float:
    """The seconds that order ``path`` among the slow files (tests/conftest.py)."""
    for trainer, (loaders, training) in SHARED_MODELS.items():
        if path.name == trainer:
            return 1e6 + recorded_seconds(path)  # before every other file
        if path.name in loaders:
            return max(recorded_seconds(path) - training, 1.0)
    return recorded_seconds(path)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items) -> None:
    """Mark every chapter's cells ``slow`` with the seconds that order the files
    (tests/conftest.py): the chapter's recorded run, as :func:`ordering_seconds` adjusts it."""
    seconds = functools.cache(ordering_seconds)
    for item in items:
        path = Path(str(item.fspath))
        if path.suffix == ".ipynb":
            item.add_marker(pytest.mark.slow(seconds=seconds(path)))


def pytest_configure(config):
    """Chapter 6 writes the live translator's weights (mhbook.viz.explorers.live.export_translator);
    under nbval they go to a folder of their own, never over the committed file."""
    os.environ.setdefault("MHBOOK_LIVE_DIR", tempfile.mkdtemp(prefix="mhbook-live-"))


def _chapter_index(path: Path) -> int:
    chapters = sorted(p.name for p in Path(__file__).parent.glob("*.ipynb"))
    return chapters.index(path.name) if path.name in chapters else 0


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    """Set the environment just before nbval starts a chapter's kernel, then restore it."""
    notebook = Path(str(item.fspath))
    starting = notebook.suffix == ".ipynb" and getattr(item.parent, "kernel", None) is None
    if not starting or os.environ.get("MHBOOK_NBVAL_NATIVE") == "1":
        yield
        return
    wanted = setting_for(_chapter_index(notebook))
    saved = {name: os.environ.get(name) for name in wanted}
    for name, value in wanted.items():
        if saved[name] is not None:
            continue  # the caller's own setting wins
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    setting = ", ".join(f"{name}={os.environ.get(name, 'unset (native)')}" for name in wanted)
    item.user_properties.append(("chapter_setting", setting))  # reaches xdist's controller
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def pytest_runtest_logreport(report):
    for key, value in report.user_properties:
        if key == "chapter_setting":
            _used[report.nodeid.split("::")[0]] = value


def pytest_terminal_summary(terminalreporter):
    if _used:
        terminalreporter.section("chapters ran with")
        for name, setting in sorted(_used.items()):
            terminalreporter.write_line(f"{name}: {setting}")
