"""Chapter 10's exact match of MHA, GQA-2, MQA and MLA at one parameter budget, three seeds.

    python -m benchmarks.kv_sharing [--steps 200] [--seeds 0 1 2] [--workers 2]
                                    [--out mhbook/training/measured/kv_sharing.json]

Trains every variant of :data:`mhbook.training.kv_sharing.SHARING_VARIANTS` (each with the
``d_ff`` of :func:`~mhbook.training.kv_sharing.budget_configs`) once per seed with
:func:`~mhbook.training.kv_sharing.train_variant`, the call chapter 10 makes:
:data:`~mhbook.training.kv_sharing.SHARING_TRAIN` (200 steps of 64 sequences) on one
thread, from ``set_seed(seed)`` with the batches in the order of ``seed``. It records each
run's loss at every step and its exact match on the 250 test prompts, and per variant the
mean and the spread (largest minus smallest) over the seeds.

The results file, ``mhbook/training/measured/kv_sharing.json`` (package data, so that Colab
has it too), holds the command, commit, machine and date that made it; chapter 10 plots it
(``mhbook.load_measured("kv_sharing")``) and checks its live run of MHA, seed 0, against it.
About 40 seconds of one thread on the 2-core machine with nothing else running.
``tests/benchmarks/test_kv_sharing.py`` runs it for two steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from mhbook.training.kv_sharing import (
    SHARING_DATA,
    SHARING_SEEDS,
    SHARING_TRAIN,
    SHARING_VARIANTS,
    budget_configs,
    count_parameters,
    sharing_data,
    train_variant,
)
from mhbook.training.trainer import cpu_threads

from .llama_ablations import _commit, _machine

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "mhbook/training/measured/kv_sharing.json"


@functools.cache
def _data():
    return sharing_data()


def run(name: str, seed: int, steps: int) -> dict:
    """Train variant ``name`` with ``seed`` for ``steps`` steps on the CPU, one thread (the
    scoring too); its losses and exact match."""
    with cpu_threads(1):  # the caller's thread count is restored after
        start = time.perf_counter()
        train = SHARING_TRAIN.replace(num_steps=steps)
        _, history, exact = train_variant(name, seed, data=_data(), train=train, device="cpu")
        return {
            "variant": name,
            "seed": seed,
            "exact_match": exact,
            "loss": history["loss"],
            "seconds": round(time.perf_counter() - start, 1),
        }


def summary(runs: list[dict]) -> dict[str, dict]:
    """Per variant: the mean exact match over the seeds, the spread (largest minus smallest)
    and the sample standard deviation (``None`` for one seed)."""
    out = {}
    for name in SHARING_VARIANTS:
        values = [r["exact_match"] for r in runs if r["variant"] == name]
        if values:
            out[name] = {
                "mean": statistics.mean(values),
                "spread": max(values) - min(values),
                "sd": statistics.stdev(values) if len(values) > 1 else None,
                "seeds": len(values),
            }
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=SHARING_TRAIN.num_steps)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SHARING_SEEDS))
    parser.add_argument(
        "--variants", nargs="+", default=list(SHARING_VARIANTS), choices=list(SHARING_VARIANTS)
    )
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    jobs = [(name, seed, args.steps) for name in args.variants for seed in args.seeds]
    if args.workers == 1:
        runs = [run(*job) for job in jobs]
    else:
        with ProcessPoolExecutor(args.workers) as pool:
            runs = list(pool.map(run, *zip(*jobs)))
    vocab_size = len(_data().vocab)
    configs = budget_configs(vocab_size)
    result = {
        "command": " ".join(["python -m benchmarks.kv_sharing", *(argv or sys.argv[1:])]),
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "machine": _machine(),
        "torch": torch.__version__,
        "threads_per_run": 1,
        "data": SHARING_DATA,
        "train": dataclasses.asdict(SHARING_TRAIN.replace(num_steps=args.steps)),
        "variants": {
            name: {
                "changes": SHARING_VARIANTS[name],
                "d_ff": configs[name].d_ff,
                "parameters": count_parameters(configs[name], vocab_size),
            }
            for name in args.variants
        },
        "runs": runs,
        "summary": summary(runs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{args.steps} steps; exact match on the test prompts (%), by seed, mean and spread:")
    for name, row in result["summary"].items():
        seeds = " ".join(f"{100 * r['exact_match']:5.1f}" for r in runs if r["variant"] == name)
        print(
            f"  {name:6} {seeds}   mean {100 * row['mean']:5.1f}  spread {100 * row['spread']:4.1f}"
        )
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
