"""What each change of the Llama block buys: one change at a time, several seeds, one harness.

    python -m benchmarks.llama_ablations [--steps 1000] [--seeds 0 1 2] [--workers 2]
                                         [--out mhbook/training/measured/llama_ablations.json]

Trains Part V's model (:data:`mhbook.SHAKESPEARE_MODEL`: 4 layers, ``d_model`` 128, 4 query
heads and 2 key/value heads, pre-norm RMSNorm, SwiGLU with ``d_ff`` 344, RoPE, no biases) and
variants of it that each undo one of its choices, plus two plain GPTs that undo them all:

* ``LayerNorm``: ``norm="layer"`` (LayerNorm without biases, as the block has none);
* ``GELU``: ``ffn="gelu"`` with ``d_ff`` 512 (``4 d_model``, the same parameters as SwiGLU's 344);
* ``sinusoidal``: chapter 5's positions added to the embeddings instead of RoPE;
* ``learned``: a learned table of 64 positions added to the embeddings instead of RoPE
  (``position="learned"``, as GPT-2 and nanoGPT's GPT have);
* ``MHA``: 4 key/value heads instead of 2;
* ``post-norm``: the norm after the residual sum, as in 2017;
* ``GPT``: LayerNorm, GELU, sinusoidal positions and MHA at once, with biases, pre-norm as
  GPT-2 is (``benchmarks/shakespeare_char.py``'s ``GPT_MODEL``);
* ``nanoGPT``: nanoGPT's own model at its ``shakespeare_char`` quick-start: LayerNorm, GELU,
  MHA, a learned table of 64 positions, tied input and output embeddings, no biases (its
  ``train.py`` sets ``bias = False``), and its initialisation (``model.py``: every linear and
  embedding weight from N(0, 0.02), the residual projections from N(0, 0.02 / sqrt(2
  n_layers)), biases zero);
* ``nanoGPT, default init``: the same model with PyTorch's default initialisation, which
  every other variant has (the embeddings from N(0, 1)).

Every run uses the book's harness and optimiser (:data:`mhbook.SHAKESPEARE_TRAIN`: batches of
12 windows of 64 characters, AdamW at 1e-3 with warm-up and cosine decay, clipping at 1; the
same learning rate for every variant), for ``--steps`` steps, once per seed (the seed sets the
weights and the batches, so two variants trained with one seed see the same batches). It
records the validation loss over every window of the last 10 % of the text in nats and bits
per character, the parameters, and the training FLOPs per token (``6 N + 6 n_layers context
d_model``: Kaplan et al.'s count, a multiply-add being 2 FLOPs, with ``N`` the parameters
outside the token embedding, the position table and the output layer). The summary gives
each variant's mean and standard deviation over the seeds and its difference from the Llama
block paired by seed, with a 95 % t-interval. The results file,
``mhbook/training/measured/llama_ablations.json`` (package data, so that Colab has it too),
holds the command, commit, machine and date that made it; chapter 14 plots it
(``mhbook.load_measured("llama_ablations")``).

A benchmark, not a test: it trains 30 models (about a minute each on one thread of the
2-core machine at 1,000 steps, with nothing else running).
``tests/benchmarks/test_llama_ablations.py`` runs it for two steps.
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
from torch import nn

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

#: nanoGPT's GPT at its quick-start size: LayerNorm (no biases: nanoGPT's train.py has
#: ``bias = False``), GELU of ``4 d_model``, multi-head attention, pre-norm, a learned table
#: of ``block_size`` = 64 positions, the output layer tied to the token embedding.
NANOGPT = {
    "num_kv_heads": None,
    "d_ff": 4 * SHAKESPEARE_MODEL.d_model,
    "norm": "layer",
    "ffn": "gelu",
    "position": "learned",
    "max_position_embeddings": SHAKESPEARE_CONTEXT,
    "tie_embeddings": True,
}

#: Each variant: the Llama block with the changes it names.
VARIANTS = {
    "Llama block": {},
    "LayerNorm": {"norm": "layer"},
    "GELU": {"ffn": "gelu", "d_ff": 4 * SHAKESPEARE_MODEL.d_model},
    "sinusoidal": {"position": "sinusoidal"},
    "learned": {"position": "learned", "max_position_embeddings": SHAKESPEARE_CONTEXT},
    "MHA": {"num_kv_heads": None},
    "post-norm": {"norm_first": False},
    "GPT": {
        f: getattr(GPT_MODEL, f)
        for f in ("num_kv_heads", "d_ff", "norm", "ffn", "bias", "position")
    },
    "nanoGPT": NANOGPT,
    "nanoGPT, default init": NANOGPT,
}

#: The variants initialised as nanoGPT's model.py initialises its GPT (:func:`nanogpt_init`).
NANOGPT_INIT = ("nanoGPT",)

#: Two-sided 95 % quantiles of Student's t for 1 to 10 degrees of freedom (no scipy here).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "mhbook/training/measured/llama_ablations.json"
VOCAB = 65


def train_flops_per_token(model: DecoderOnlyLM, context: int) -> int:
    """``6 N + 6 n_layers context d_model``: the FLOPs of a forward and backward pass per
    token, a multiply-add counted as 2 (Kaplan et al., 2020, Table 1: ``2 N + 2 n_layers
    context d_model`` forward, times 3 for the backward), ``N`` the parameters outside the
    token embedding, the position table and the output layer."""
    config = model.config
    outside = {"embedding.weight", "output.weight", "pos_table.weight"}
    n = sum(p.numel() for name, p in model.named_parameters() if name not in outside)
    return 6 * n + 6 * config.num_layers * context * config.d_model


def nanogpt_init(model: DecoderOnlyLM) -> None:
    """nanoGPT's initialisation (its ``model.py``, ``GPT.__init__`` and ``_init_weights``),
    written here for the benchmark: every linear and embedding weight from N(0, 0.02), every
    bias zero, and the projections back into the residual stream (``c_proj`` there, ``W_o``
    and the feed-forward network's ``linear2`` here) from N(0, 0.02 / sqrt(2 n_layers)), "per
    GPT-2 paper". The norms keep their gains of 1."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    residual = 0.02 / math.sqrt(2 * model.config.num_layers)
    for name, weight in model.named_parameters():
        if name.endswith(("self_attn.W_o.weight", "ffn.linear2.weight")):
            nn.init.normal_(weight, mean=0.0, std=residual)


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
    if name in NANOGPT_INIT:
        nanogpt_init(model)
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


def paired(runs: list[dict], name: str, base: str = "Llama block") -> dict | None:
    """Variant ``name`` minus ``base``, seed by seed (the two saw the same batches): the
    mean difference, its sample standard deviation and the half-width of its 95 %
    t-interval; ``None`` with fewer than two seeds in common."""
    loss = {(r["variant"], r["seed"]): r["val_loss_nats"] for r in runs}
    seeds = sorted(s for v, s in loss if v == name and (base, s) in loss)
    if len(seeds) < 2:
        return None
    d = [loss[name, s] - loss[base, s] for s in seeds]
    sd = statistics.stdev(d)
    return {
        "mean_nats": statistics.mean(d),
        "sd_nats": sd,
        "ci95_nats": T_975[len(d) - 2] * sd / math.sqrt(len(d)),
        "seeds": seeds,
    }


def summary(runs: list[dict]) -> dict[str, dict]:
    """Per variant: the mean and the sample standard deviation of the loss over the seeds,
    and the difference from the Llama block paired by seed (:func:`paired`)."""
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
            "vs_llama_block": paired(runs, name) if name != "Llama block" else None,
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
        "nanogpt_init": [name for name in args.variants if name in NANOGPT_INIT],
        "runs": runs,
        "summary": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"{args.steps} steps, seeds {args.seeds}; validation loss, mean ± sd over the seeds, "
        "and minus the Llama block's, paired by seed, ± the 95 % interval:"
    )
    for name, row in table.items():
        pair = row["vs_llama_block"]
        delta = f"  {pair['mean_nats']:+.3f} ± {pair['ci95_nats']:.3f} (paired)" if pair else ""
        print(
            f"  {name:<21} {row['mean_nats']:.3f} ± {row['sd_nats'] or 0:.3f} nats/char "
            f"({row['mean_bits']:.3f} bits), {row['parameters']:,} parameters, "
            f"{row['train_flops_per_token'] / 1e6:.1f} MFLOPs/token{delta}"
        )
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
