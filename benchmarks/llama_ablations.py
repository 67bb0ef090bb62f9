"""What each change of the Llama block buys: one change at a time, several seeds, one harness.

    python -m benchmarks.llama_ablations [--steps 1000] [--seeds 0 1 2] [--workers 2]
                                         [--out mhbook/training/measured/llama_ablations.json]

Trains Part V's model (:data:`mhbook.SHAKESPEARE_MODEL`: 4 layers, ``d_model`` 128, 4 query
heads and 2 key/value heads, pre-norm RMSNorm, SwiGLU with ``d_ff`` 344, RoPE, no biases) and
variants of it that each undo one of its choices, plus the plain GPT that undoes them all:

* ``LayerNorm``: ``norm="layer"`` (LayerNorm without biases, as the block has none);
* ``GELU``: ``ffn="gelu"`` with ``d_ff`` 512 (``4 d_model``, the same parameters as SwiGLU's 344);
* ``sinusoidal``: positions added to the embeddings instead of RoPE (the book has no learned
  position table; nanoGPT's GPT learns one);
* ``MHA``: 4 key/value heads instead of 2;
* ``post-norm``: the norm after the residual sum, as in 2017;
* ``GPT``: the first four at once, with biases, pre-norm as GPT-2 is
  (``benchmarks/shakespeare_char.py``'s ``GPT_MODEL``).

Every run uses the book's harness and optimiser (:data:`mhbook.SHAKESPEARE_TRAIN`: batches of
12 windows of 64 characters, AdamW at 1e-3 with warm-up and cosine decay, clipping at 1; the
same for every variant), for ``--steps`` steps, once per seed (the seed sets the weights and
the batches). It records the validation loss over every window of the last 10 % of the text in
nats and bits per character, the parameters, and the training FLOPs per token
(``6 N + 6 n_layers context d_model``, Kaplan et al.'s count with ``N`` the parameters outside
the embeddings). The results file, ``mhbook/training/measured/llama_ablations.json`` (package
data, so that Colab has it too), holds the command, commit, machine and date that made it;
chapter 14 plots it (``mhbook.load_measured("llama_ablations")``).

A benchmark, not a test: it trains 21 models (about 45 s each on one thread of the 2-core
machine at 1,000 steps). ``tests/benchmarks/test_llama_ablations.py`` runs it for two steps.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from mhbook import DecoderOnlyLM, set_seed
from mhbook.tasks.shakespeare import lm_loss
from mhbook.training.shakespeare_lm import (
    SHAKESPEARE_CONTEXT,
    SHAKESPEARE_MODEL,
    SHAKESPEARE_TRAIN,
    shakespeare_data,
)
from mhbook.training.trainer import cpu_threads, fit, valid_loss

from .shakespeare_char import GPT_MODEL

#: Each variant: the Llama block with the changes it names.
VARIANTS = {
    "Llama block": {},
    "LayerNorm": {"norm": "layer"},
    "GELU": {"ffn": "gelu", "d_ff": 4 * SHAKESPEARE_MODEL.d_model},
    "sinusoidal": {"position": "sinusoidal"},
    "MHA": {"num_kv_heads": None},
    "post-norm": {"norm_first": False},
    "GPT": {
        f: getattr(GPT_MODEL, f)
        for f in ("num_kv_heads", "d_ff", "norm", "ffn", "bias", "position")
    },
}

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "mhbook/training/measured/llama_ablations.json"
VOCAB = 65


def train_flops_per_token(model: DecoderOnlyLM, context: int) -> int:
    """``6 N + 6 n_layers context d_model``: the multiply-adds of a forward and backward pass
    per token (Kaplan et al., 2020, Table 1, times 3 for the backward), ``N`` the parameters
    outside the token embedding and the output layer."""
    config = model.config
    outside = {"embedding.weight", "output.weight"}
    n = sum(p.numel() for name, p in model.named_parameters() if name not in outside)
    return 6 * n + 6 * config.num_layers * context * config.d_model


@functools.cache
def _data():
    return shakespeare_data()


def run(name: str, seed: int, steps: int) -> dict:
    """Train variant ``name`` with ``seed`` for ``steps`` steps, on one thread; its validation
    loss."""
    with cpu_threads(1):  # the caller's thread count is restored after
        return _run(name, seed, steps)


def _run(name: str, seed: int, steps: int) -> dict:
    data = _data()
    config = SHAKESPEARE_MODEL.replace(**VARIANTS[name])
    settings = SHAKESPEARE_TRAIN.replace(num_steps=steps, eval_every=0, seed=seed)
    set_seed(seed)
    model = DecoderOnlyLM(config, vocab_size=VOCAB)
    start = time.perf_counter()
    fit(model, data, settings, loss_fn=lm_loss, progress=False)
    seconds = time.perf_counter() - start
    loss = valid_loss(model, data, "valid", loss_fn=lm_loss)
    return {
        "variant": name,
        "seed": seed,
        "val_loss_nats": loss,
        "val_bits_per_char": loss / math.log(2),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_flops_per_token": train_flops_per_token(model, SHAKESPEARE_CONTEXT),
        "train_seconds": seconds,
    }


def summary(runs: list[dict]) -> dict[str, dict]:
    """Per variant: the mean and the sample standard deviation of the loss over the seeds."""
    out = {}
    for name in VARIANTS:
        losses = [r["val_loss_nats"] for r in runs if r["variant"] == name]
        if not losses:
            continue
        first = next(r for r in runs if r["variant"] == name)
        sd = statistics.stdev(losses) if len(losses) > 1 else None
        out[name] = {
            "mean_nats": statistics.mean(losses),
            "sd_nats": sd,
            "min_nats": min(losses),
            "max_nats": max(losses),
            "mean_bits": statistics.mean(losses) / math.log(2),
            "seeds": len(losses),
            "parameters": first["parameters"],
            "train_flops_per_token": first["train_flops_per_token"],
        }
    return out


def _machine() -> str:
    """The CPU's model name (Linux) or the platform's, and the number of cores."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores, {platform.system()}"


def _commit() -> str:
    try:
        root = Path(__file__).resolve().parents[1]
        return subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=SHAKESPEARE_TRAIN.num_steps)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    jobs = [(name, seed, args.steps) for name in args.variants for seed in args.seeds]
    if args.workers == 1:  # in this process: no start-up cost, the corpus encoded once
        runs = [run(*job) for job in jobs]
    else:
        with ProcessPoolExecutor(args.workers) as pool:
            runs = list(pool.map(run, *zip(*jobs)))
    table = summary(runs)
    result = {
        "command": "python -m benchmarks.llama_ablations " + " ".join(argv or sys.argv[1:]),
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "machine": _machine(),
        "torch": torch.__version__,
        "steps": args.steps,
        "batch_size": SHAKESPEARE_TRAIN.batch_size,
        "context": SHAKESPEARE_CONTEXT,
        "workers": args.workers,
        "threads_per_run": 1,
        "variants": {name: VARIANTS[name] for name in args.variants},
        "runs": runs,
        "summary": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    base = table.get("Llama block", {}).get("mean_nats")
    print(f"{args.steps} steps, seeds {args.seeds}; validation loss, mean ± sd over the seeds:")
    for name, row in table.items():
        delta = f"  {row['mean_nats'] - base:+.3f} vs Llama block" if base is not None else ""
        print(
            f"  {name:<12} {row['mean_nats']:.3f} ± {row['sd_nats'] or 0:.3f} nats/char "
            f"({row['mean_bits']:.3f} bits), {row['parameters']:,} parameters, "
            f"{row['train_flops_per_token'] / 1e6:.1f} MFLOPs/token{delta}"
        )
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
