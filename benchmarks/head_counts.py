"""Chapter 7's grid: the number of heads at a fixed budget, a fixed head size, and ensembles
of one-head models, each setting from three seeds, on every CPU kernel set.

    python -m benchmarks.head_counts [--kernels native default avx2] [--seeds 0 1 2]
                                     [--steps 160] [--workers 2]
                                     [--out mhbook/training/measured/head_counts.json]

Trains the small models of :mod:`mhbook.training.head_counts` (the very calls the chapter
shows) with its training (160 steps of 32 numbers on one thread, the seed setting the
weights and the batches):

* ``sweep``: ``h`` heads of size ``64 / h`` for ``h`` in :data:`HEAD_COUNTS`, the same
  parameters whatever ``h``;
* ``fixed``: ``h`` heads of size :data:`FIXED_HEAD_DIM` for ``h`` in
  :data:`FIXED_HEAD_COUNTS` (more parameters);
* ``member``: the ensemble members, one head at half the width (:data:`ENSEMBLE_MEMBER`),
  :data:`ENSEMBLE_SIZE` per seed, seeded with :func:`member_seed`.

Each run records its test loss (teacher-forced, nats per token), its exact match on the
300 test numbers, its parameters, the CPU seconds it took to train and measure, and its
training loss in the warm-up (the first 25 steps, which the chapter retraces live) and at the
last step.

The whole grid runs once per CPU kernel set of ``--kernels`` (``ATEN_CPU_CAPABILITY``, set
in fresh worker processes; ``native`` leaves it unset; a set that PyTorch maps to one already
run, such as ``avx2`` on an AVX2 machine, is skipped), so that the results file shows how far
the kernels' rounding moves each number, and the chapter checks its claims on the grid of
every kernel set. The file, ``mhbook/training/measured/head_counts.json`` (package data),
holds the command, commit, machine, date and PyTorch version; chapter 7 plots it
(``mhbook.load_measured("head_counts")``) and trains two of its runs live. The first kernel
set is the native one, which also trains the models that ship for the chapter
(``python -m benchmarks.ship_models``): run both on the same machine.

A benchmark, not a test: 36 models per kernel set, about two minutes of CPU time each (the
scalar kernels a little more). ``tests/benchmarks/test_head_counts.py`` runs it for two steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from mhbook.training.head_counts import (
    ENSEMBLE_MEMBER,
    ENSEMBLE_SIZE,
    FIXED_HEAD_COUNTS,
    FIXED_HEAD_DIM,
    HEAD_COUNT_DATA,
    HEAD_COUNT_MODEL,
    HEAD_COUNT_TRAIN,
    HEAD_COUNTS,
    SEEDS,
    head_count_run,
    member_seed,
    small_model,
)

from .llama_ablations import _commit, _machine

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "mhbook/training/measured/head_counts.json"
KERNELS = ("native", "default", "avx2")


def jobs(seeds, steps: int) -> list[dict]:
    """Every run of the grid, in the order of the results file."""
    out = [{"variant": "sweep", "num_heads": h, "seed": s} for h in HEAD_COUNTS for s in seeds]
    out += [
        {"variant": "fixed", "num_heads": h, "head_dim": FIXED_HEAD_DIM, "seed": s}
        for h in FIXED_HEAD_COUNTS
        for s in seeds
    ]
    out += [
        {"variant": "member", "num_heads": 1, "seed": member_seed(s, j), "ensemble_seed": s}
        for s in seeds
        for j in range(ENSEMBLE_SIZE)
    ]
    return [{**job, "steps": steps} for job in out]


def run(job: dict) -> dict:
    """Train and measure one model of the grid (:func:`head_count_run`, one thread, the
    CPU); what the results file records of it."""
    changes = ENSEMBLE_MEMBER if job["variant"] == "member" else {}
    train = HEAD_COUNT_TRAIN.replace(num_steps=job["steps"])
    head_dim = job.get("head_dim")
    model = small_model(job["num_heads"], job["seed"], head_dim, device="cpu", **changes)
    start = time.process_time()  # this process's CPU time: one thread, whatever else runs
    result = head_count_run(
        job["num_heads"], job["seed"], head_dim, train=train, device="cpu", **changes
    )
    return {
        "kernel": torch.backends.cpu.get_cpu_capability(),
        **{k: v for k, v in job.items() if k != "steps"},
        "d_model": model.config.d_model,
        "d_head": model.encoder.blocks[0].self_attn.d_head,
        "parameters": sum(p.numel() for p in model.parameters()),
        "test_loss": result["test_loss"],
        "exact_match": result["exact_match"],
        "last_train_loss": result["train_loss"][-1],
        "warmup_loss": result["train_loss"][: train.warmup_steps],
        "cpu_seconds": round(time.process_time() - start, 2),
    }


def capability(kernel: str) -> str:
    """The kernel set PyTorch picks with ``ATEN_CPU_CAPABILITY`` = ``kernel`` (``native``:
    unset), asked of a fresh Python: e.g. ``AVX2`` for ``avx2``, or for ``native`` on an
    AVX2 machine."""
    if kernel == "native" and "ATEN_CPU_CAPABILITY" not in os.environ:
        return torch.backends.cpu.get_cpu_capability()  # this process's own
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if kernel != "native":
        env["ATEN_CPU_CAPABILITY"] = kernel
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def _grid(kernel: str, job_list: list[dict], workers: int) -> list[dict]:
    """Run ``job_list`` with the CPU kernel set ``kernel``: in this process with one worker
    and ``native`` (the test), else in fresh processes started with ``ATEN_CPU_CAPABILITY``
    (PyTorch reads it once, when it is imported)."""
    if workers == 1 and kernel == "native" and "ATEN_CPU_CAPABILITY" not in os.environ:
        return [run(job) for job in job_list]
    saved = os.environ.get("ATEN_CPU_CAPABILITY")
    if kernel == "native":
        os.environ.pop("ATEN_CPU_CAPABILITY", None)
    else:
        os.environ["ATEN_CPU_CAPABILITY"] = kernel
    try:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            return list(pool.map(run, job_list))
    finally:
        if saved is None:
            os.environ.pop("ATEN_CPU_CAPABILITY", None)
        else:
            os.environ["ATEN_CPU_CAPABILITY"] = saved


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--steps", type=int, default=HEAD_COUNT_TRAIN.num_steps)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    job_list = jobs(args.seeds, args.steps)
    runs, ran = [], {}
    for kernel in args.kernels:
        picked = capability(kernel)
        if picked in ran.values():  # e.g. avx2 on an AVX2 machine: the native grid again
            print(f"{kernel}: the {picked} kernels, already run")
            continue
        start = time.perf_counter()
        grid = _grid(kernel, job_list, args.workers)
        ran[kernel] = grid[0]["kernel"]
        runs += grid
        print(f"{kernel}: {len(grid)} runs on the {ran[kernel]} kernels in "
              f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    result = {
        "command": "python -m benchmarks.head_counts " + " ".join(argv or sys.argv[1:]),
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "machine": _machine(),
        "torch": torch.__version__,
        "steps": args.steps,
        "data": HEAD_COUNT_DATA,
        "model": dataclasses.asdict(HEAD_COUNT_MODEL),
        "train": dataclasses.asdict(HEAD_COUNT_TRAIN.replace(num_steps=args.steps)),
        "fixed_head_dim": FIXED_HEAD_DIM,
        "ensemble_member": ENSEMBLE_MEMBER,
        "kernels": list(ran.values()),
        "seeds": args.seeds,
        "threads_per_run": 1,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for kernel in ran.values():
        print(f"{kernel} kernels: test loss, mean over seeds (exact match %)")
        for variant in ("sweep", "fixed", "member"):
            settings = sorted(
                {(r["num_heads"], r["d_head"]) for r in runs if r["variant"] == variant},
                key=lambda k: (k[0], -k[1]),
            )
            for h, d_head in settings:
                mine = [
                    r
                    for r in runs
                    if (r["kernel"], r["variant"], r["num_heads"], r["d_head"])
                    == (kernel, variant, h, d_head)
                ]
                loss = sum(r["test_loss"] for r in mine) / len(mine)
                exact = 100 * sum(r["exact_match"] for r in mine) / len(mine)
                print(f"  {variant:<6} h {h:>2}, d_head {d_head:>2}: {loss:.3f} ({exact:.1f} %)")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
