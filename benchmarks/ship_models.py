"""Train the models that ship with mhbook, too long to train in a chapter, and record how.

    python -m benchmarks.ship_models [--only shakespeare-llama copier-seed0 ...]

Writes ``mhbook/training/trained/{name}.pt`` (package data, so that Colab has them too) with
the very calls the chapters make, from their fixed seeds on one CPU thread, and
``trained/provenance.json``: the command, commit, machine, date and PyTorch that made them,
and each file's SHA-256 and last training loss.

* ``shakespeare-llama``: :func:`mhbook.shakespeare_model` (chapters 14 to 16), 1,000 steps,
  about two minutes;
* ``copier-seed0``, ``-seed1``, ``-seed2``: :func:`mhbook.copier_model` (chapter 16), 11 to
  14 seconds each;
* ``position-sinusoidal``, ``-rope``, ``-alibi``: :func:`mhbook.position_model` (chapter 11),
  and ``window-full``, ``-16``, ``-8``: :func:`mhbook.window_model` (chapter 12), about 20
  seconds each;
* ``head-counts-h4-seed0`` to ``-seed2`` and ``head-counts-member-seed100`` to ``-seed111``:
  chapter 7's 4-head models and ensemble members
  (:data:`mhbook.training.head_counts.SHIPPED_MODELS`, ``head_count_model``), a second or two
  each.

Run it after a change to what these calls train (their configs, ``fit``'s arithmetic):
``tests/training/test_trained.py`` fails until the files are made again, and names them.
A CPU's floating-point kernels change the last bits of the weights, so the chapters'
committed outputs are those of the machine that made the files; rerun the chapters that load
them (7, 11, 12 and Part V's) after shipping new ones.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys

import torch

from mhbook.training.checkpoints import TRAINED_DIR, shipped_weights
from mhbook.training.head_counts import SHIPPED_MODELS, head_count_model
from mhbook.training.number_lms import (
    NUMBER_LM_POSITIONS,
    NUMBER_LM_WINDOWS,
    position_model,
    window_model,
)
from mhbook.training.shakespeare_lm import copier_model, shakespeare_model

from .llama_ablations import _commit, _machine

#: name -> the call that trains it into ``checkpoint`` (retrain: never load the old file).
MODELS = {
    "shakespeare-llama": lambda path: shakespeare_model(
        path, retrain=True, progress=False, device="cpu"
    ),
    **{
        f"copier-seed{seed}": (
            lambda path, seed=seed: copier_model(seed, path, retrain=True, device="cpu")
        )
        for seed in (0, 1, 2)
    },
    **{
        f"position-{position}": (
            lambda path, position=position: position_model(
                position, path, retrain=True, device="cpu"
            )
        )
        for position in NUMBER_LM_POSITIONS
    },
    **{
        f"window-{window or 'full'}": (
            lambda path, window=window: window_model(window, path, retrain=True, device="cpu")
        )
        for window in NUMBER_LM_WINDOWS
    },
    **{
        name: (
            lambda path, h=h, seed=seed, changes=changes: head_count_model(
                h, seed, checkpoint=path, retrain=True, device="cpu", **changes
            )
        )
        for name, (h, seed, changes) in SHIPPED_MODELS.items()
    },
}


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    args = parser.parse_args(argv)
    record_path = TRAINED_DIR / "provenance.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"models": {}}
    for name in args.only:
        path = shipped_weights(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        _, _, history = MODELS[name](str(path))
        path.with_name(path.name + ".lock").unlink(missing_ok=True)
        record["models"][name] = {
            "command": " ".join(["python -m benchmarks.ship_models", *(argv or sys.argv[1:])]),
            "commit": _commit(),
            "date": datetime.date.today().isoformat(),
            "machine": _machine(),
            "torch": torch.__version__,
            "sha256": sha256(path),
            "steps": history["step"][-1],
            "last_loss": history["loss"][-1],
            "seconds": round(history["time_s"][-1], 1),
        }
        print(f"{name}: {path} ({path.stat().st_size:,} bytes)", record["models"][name])
    record_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


if __name__ == "__main__":
    main()
