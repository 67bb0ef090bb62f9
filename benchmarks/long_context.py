"""Chapter 16's experiments that train: a start token from scratch, and fine-tuning at 256.

    python -m benchmarks.long_context [--sink-steps 1000] [--sink-seeds 1337 0]
                                      [--tune-steps 200] [--tune-every 25] [--workers 2]
                                      [--out mhbook/training/measured/long_context.json]

**A dedicated start token, from scratch** (StreamingLLM's remedy, Xiao et al., 2024, §3.3):
Part V's model (:data:`mhbook.SHAKESPEARE_MODEL`, :data:`mhbook.SHAKESPEARE_TRAIN`) is trained
from scratch for ``--sink-steps`` steps twice per seed: on the text's windows as they are,
and with one more token, id 65 (one more row of the embedding and of the output layer), put
before every window, ``[S, c_0, ..., c_62]`` predicting ``c_0, ..., c_63``. On 64 windows of
64 characters of the validation text (those chapter 16 uses; with ``S`` before them for the
second model), it measures for every head:

* the mean weight on position 0 of the queries 16 to 63, and that over an even share
  (``1 / (t + 1)`` for the query at ``t``): chapter 16's ratio;
* Gu et al.'s (2025) importance of the first token, the mean weight on position 0 over every
  query, and their sink rate, the share of (window, layer, head) whose importance passes
  ``epsilon = 0.3`` (their ``eval_sink_open_source.py``), in percent;
* the validation loss (every window of the last 10 %, the start token before each for the
  second model).

**Fine-tuning at 256** (chapter 16's exercise 4): the trained model of chapter 14 with
position interpolation (``s = 4``), with YaRN (``s = 4``) and, as a control, with plain RoPE,
each fine-tuned for ``--tune-steps`` steps on windows of 256 characters
(:data:`mhbook.SHAKESPEARE_TRAIN` with 20 warm-up steps, batches of 12, from
``set_seed(0)``). Every ``--tune-every`` steps (and before the first) it measures the loss at
every position 0 to 511 on chapter 16's 64 validation sequences of 513 characters, as the
mean of each block of 64 positions; after the last step, each head's weight on keys 64 or
more and 256 or more characters back, at the queries 448 to 511 (on 16 of the sequences),
for each fine-tuned model and the model before fine-tuning. The loop is :func:`mhbook.fit`'s,
written out to look at the model while it trains (``tests/benchmarks/test_long_context.py``
checks that it gives fit's weights).

Each run trains on one thread; ``--workers`` run side by side. The results file,
``mhbook/training/measured/long_context.json`` (package data, so that Colab has it too),
holds the command, commit, machine and date that made it; chapter 16 loads it
(``mhbook.load_measured("long_context")``). A benchmark, not a test: about 7 CPU-minutes with
the defaults on the 2-core machine with nothing else running.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mhbook import DecoderOnlyLM, RopeScaling, set_seed
from mhbook.tasks.shakespeare import lm_loss
from mhbook.training.shakespeare_lm import (
    SHAKESPEARE_CONTEXT,
    SHAKESPEARE_MODEL,
    SHAKESPEARE_TRAIN,
    shakespeare_data,
    shakespeare_model,
)
from mhbook.training.trainer import (
    cpu_threads,
    fit,
    make_optimizer,
    make_scheduler,
    train_step,
    valid_loss,
)
from mhbook.viz.attention_records import passage_attention

from .llama_ablations import _commit, _machine

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "mhbook/training/measured/long_context.json"
T = SHAKESPEARE_CONTEXT  # 64
LENGTH = 8 * T  # chapter 16's sequences: 512 positions
VOCAB = 65
START = VOCAB  # the start token's id: one past the characters
EPSILON = 0.3  # Gu et al.'s threshold on the first token's importance
FINE_TUNE_CONTEXT, FACTOR = 4 * T, 4.0
METHODS = {
    "position interpolation, s = 4": RopeScaling("linear", FACTOR, T),
    "YaRN, s = 4": RopeScaling("yarn", FACTOR, T),
    "plain RoPE": None,
}


# -- what chapter 16 measures on ------------------------------------------------------------
@functools.cache
def _data(context: int = T):
    return shakespeare_data(context)


def validation_windows() -> torch.Tensor:
    """``(64, 64)``: chapter 16's windows of the validation text, 1,700 characters apart."""
    ids = _data().ids["valid"]
    return torch.stack([ids[i * 1700 : i * 1700 + T] for i in range(64)])


def validation_sequences(num_sequences: int = 64) -> torch.Tensor:
    """``(64, 513)``: chapter 16's sequences, spread evenly over the validation text."""
    ids = _data().ids["valid"]
    stride = (len(ids) - LENGTH - 1) // num_sequences
    return torch.stack([ids[i * stride : i * stride + LENGTH + 1] for i in range(num_sequences)])


class WithStartToken:
    """The text's windows, each read after the start token ``START``: x is ``START`` and
    the window's first 63 characters, y the window (:func:`mhbook.fit`'s batch protocol)."""

    def __init__(self, data):
        self.data = data

    def batches(self, split="train", batch_size=12, shuffle=True, device=None, generator=None):
        for x, _ in self.data.batches(split, batch_size, shuffle, device, generator):
            yield torch.cat([torch.full_like(x[:, :1], START), x[:, :-1]], dim=1), x


def first_token_weights(model, windows: torch.Tensor) -> dict:
    """Per layer and head: the weight on position 0 of the queries 16-63 (mean) and over an
    even share; Gu et al.'s importance of the first token (the mean weight on it over every
    query) and their sink rate (the share of windows, layers and heads above EPSILON)."""
    w = torch.as_tensor(passage_attention(model, windows))  # (windows, L, H, T, T)
    queries = torch.arange(16, w.size(-1))
    on_first = w[..., 16:, 0].mean(dim=(0, 3))  # (L, H)
    importance = w[..., :, 0].mean(dim=-1)  # (windows, L, H): their alpha_1
    return {
        "first_weight": on_first.tolist(),
        "ratio_to_even_share": (on_first / (1.0 / (queries + 1)).mean()).tolist(),
        "importance": importance.mean(0).tolist(),
        "sink_rate_percent": 100 * (importance > EPSILON).float().mean().item(),
        "heads_above_threshold": int((importance.mean(0) > EPSILON).sum()),
    }


@torch.no_grad()
def loss_by_block(model, sequences: torch.Tensor, batch_size: int = 16) -> list[float]:
    """The next-character loss at positions 0-511, as the mean of each block of 64."""
    rows = []
    for batch in sequences.split(batch_size):
        logits = model(batch[:, :-1])
        rows.append(F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none"))
    return torch.cat(rows).mean(0).view(-1, T).mean(-1).tolist()


@torch.no_grad()
def far_weight(model, sequences: torch.Tensor, distance: int) -> list[list[float]]:
    """Per layer and head: the weight the queries 448-511 give keys ``distance`` or more
    positions back (mean over the sequences and queries)."""
    w = torch.as_tensor(passage_attention(model, sequences[:, :LENGTH]))  # (N, L, H, 512, 512)
    back = torch.arange(LENGTH)[:, None] - torch.arange(LENGTH)[None, :]
    return (w * (back >= distance)).sum(-1)[..., LENGTH - T :].mean(dim=(0, 3)).tolist()


# -- the runs ---------------------------------------------------------------------------------
def sink_run(variant: str, seed: int, steps: int) -> dict:
    """Part V's model from scratch, with (``"start token"``) or without (``"vanilla"``) a
    start token before every window; what its heads give the first position."""
    with cpu_threads(1):
        data = _data() if variant == "vanilla" else WithStartToken(_data())
        set_seed(seed)
        model = DecoderOnlyLM(SHAKESPEARE_MODEL, VOCAB + (variant == "start token"))
        settings = SHAKESPEARE_TRAIN.replace(num_steps=steps, eval_every=0, seed=seed)
        start = time.perf_counter()
        fit(model, data, settings, loss_fn=lm_loss, progress=False)
        seconds = time.perf_counter() - start
        windows = validation_windows()
        if variant == "start token":
            windows = torch.cat([torch.full((len(windows), 1), START), windows[:, :-1]], dim=1)
        return {
            "variant": variant,
            "seed": seed,
            "steps": steps,
            "valid_loss_nats": valid_loss(model, data, "valid", loss_fn=lm_loss),
            **first_token_weights(model, windows),
            "train_seconds": seconds,
        }


def fine_tune_with_probes(model, data, config, probe, every: int) -> list[dict]:
    """:func:`mhbook.fit`'s loop written out (the same optimiser, schedule, clipping and
    batches in the same order), with ``probe(model)`` before the first step and every
    ``every`` steps: ``[{"step": step, **probe(model)}, ...]``."""
    optimizer = make_optimizer(model, config)
    scheduler = make_scheduler(optimizer, config)
    generator = torch.Generator().manual_seed(config.seed)

    def endless():  # epoch after epoch, as fit's
        while True:
            yield from data.batches("train", config.batch_size, shuffle=True, generator=generator)

    batches = endless()
    model.eval()
    log = [{"step": 0, **probe(model)}]
    with cpu_threads(config.num_threads):
        for step in range(1, config.num_steps + 1):
            model.train()
            train_step(model, next(batches), lm_loss, optimizer, scheduler, config.clip_norm)
            if step % every == 0 or step == config.num_steps:
                model.eval()
                log.append({"step": step, **probe(model)})
    model.eval()
    return log


def tune_run(method: str, steps: int, every: int, checkpoint: str) -> dict:
    """Chapter 14's model with ``METHODS[method]``, fine-tuned at 256 with probes."""
    with cpu_threads(1):
        base, _, _ = shakespeare_model(checkpoint, progress=False, device="cpu")
        model = DecoderOnlyLM(base.config.replace(rope_scaling=METHODS[method]), VOCAB)
        model.load_state_dict(base.state_dict())
        sequences = validation_sequences()
        settings = SHAKESPEARE_TRAIN.replace(num_steps=steps, warmup_steps=20, eval_every=0)
        set_seed(0)
        start = time.perf_counter()
        log = fine_tune_with_probes(
            model,
            _data(FINE_TUNE_CONTEXT),
            settings,
            lambda m: {"loss_by_block": loss_by_block(m, sequences)},
            every,
        )
        seconds = time.perf_counter() - start
        few = sequences[:16]
        out = {
            "method": method,
            "steps": [r["step"] for r in log],
            "loss_by_block": [r["loss_by_block"] for r in log],
            "far_weight_64": far_weight(model, few, T),
            "far_weight_256": far_weight(model, few, FINE_TUNE_CONTEXT),
            "seconds": seconds,
        }
        if method == "plain RoPE":  # the model before fine-tuning, for comparison
            out["before_far_weight_64"] = far_weight(base, few, T)
            out["before_far_weight_256"] = far_weight(base, few, FINE_TUNE_CONTEXT)
        return out


def _run(job: tuple) -> dict:
    kind, *args = job
    return sink_run(*args) if kind == "sink" else tune_run(*args)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sink-steps", type=int, default=SHAKESPEARE_TRAIN.num_steps)
    parser.add_argument("--sink-seeds", type=int, nargs="+", default=[SHAKESPEARE_TRAIN.seed, 0])
    parser.add_argument("--tune-steps", type=int, default=200)
    parser.add_argument("--tune-every", type=int, default=25)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="chapter 14's model (default: the weights that ship with mhbook)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as folder:
        checkpoint = str(args.checkpoint or Path(folder) / "shakespeare-llama.pt")
        shakespeare_model(checkpoint, progress=False, device="cpu")  # once, before the workers
        jobs = [("tune", m, args.tune_steps, args.tune_every, checkpoint) for m in METHODS]
        jobs += [
            ("sink", variant, seed, args.sink_steps)
            for seed in args.sink_seeds
            for variant in ("vanilla", "start token")
        ]
        if args.workers == 1:
            runs = [_run(job) for job in jobs]
        else:
            with ProcessPoolExecutor(args.workers) as pool:
                runs = list(pool.map(_run, jobs))
    result = {
        "command": "python -m benchmarks.long_context " + " ".join(argv or sys.argv[1:]),
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "machine": _machine(),
        "torch": torch.__version__,
        "threads_per_run": 1,
        "sinks": {
            "steps": args.sink_steps,
            "seeds": args.sink_seeds,
            "start_id": START,
            "epsilon": EPSILON,
            "runs": [r for r in runs if "variant" in r],
        },
        "fine_tuning": {
            "steps": args.tune_steps,
            "every": args.tune_every,
            "context": FINE_TUNE_CONTEXT,
            "factor": FACTOR,
            "block": T,
            "runs": [r for r in runs if "method" in r],
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("first token, queries 16-63: largest ratio to an even share, largest mean weight;")
    print(f"Gu et al.'s sink rate (importance > {EPSILON}) and heads above it:")
    for r in result["sinks"]["runs"]:
        print(
            f"  seed {r['seed']:>4} {r['variant']:<11}: "
            f"ratio {np.max(r['ratio_to_even_share']):.2f}, "
            f"weight {np.max(r['first_weight']):.3f}, sink rate {r['sink_rate_percent']:.1f} %, "
            f"{r['heads_above_threshold']} heads; valid loss {r['valid_loss_nats']:.3f}"
        )
    print("fine-tuned at 256, loss at 0-63, 192-255, 448-511 before and after:")
    for r in result["fine_tuning"]["runs"]:
        before, after = r["loss_by_block"][0], r["loss_by_block"][-1]
        print(
            f"  {r['method']:<30} " + " ".join(f"{before[b]:.2f}" for b in (0, 3, 7)) + " -> "
            + " ".join(f"{after[b]:.2f}" for b in (0, 3, 7))
            + f"; weight on keys 256+ back at 448-511: {np.max(r['far_weight_256']):.3f} (max)"
        )  # fmt: skip
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
