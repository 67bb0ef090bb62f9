"""Chapter 15's runs that train for longer than a chapter should: induction heads, when and where.

    python -m benchmarks.induction_heads [--timing-seeds 0 1 2] [--chapter-steps 800]
                                         [--text-steps 2400] [--out FILE]

Every part trains chapter 15's toy model (chapter 16's copier, :data:`mhbook.COPIER_MODEL`:
2 layers of 4 heads, ``d_model`` 64, RMSNorm, RoPE, no feed-forward network, no biases) with
its loop (:func:`mhbook.fit`'s, written out to look at the model while it trains:
:func:`benchmarks.long_context.fine_tune_with_probes`), on one thread, and probes it on the
chapter's 64 test sequences (a block of 32 random characters written twice,
``RepeatedRandom(65).sample(64, seed 1, period=32)``).

* **Timing** (the chapter's three seeds): on repeated random blocks of 16 to 32 characters
  (:class:`mhbook.tasks.RepeatedRandom`), AdamW at a constant 3e-3, 600 steps from
  ``set_seed(seed)`` with the batches seeded alike, looking every 5 steps at the first 16
  test sequences: the loss on the second copy, the best induction score of layer 2 (the mean
  weight from each query of the second copy on the character after the earlier occurrence
  of its own) and the best previous-token score of layer 1.
* **The chapter's runs**, 800 steps of :data:`mhbook.training.shakespeare_lm.COPIER_TRAIN`
  from seed 0, looking every 25 steps at all 64 test sequences: ``copier``,
  :func:`mhbook.copier_model`'s seed 0 (the toy model whose weights ship with mhbook; every
  head's induction and previous-token scores, and how far the run's weights are from the
  shipped ones: 0 on the machine that made both); ``fixed_period``, the same on blocks of
  exactly 32 (exercise 2); ``one_layer``, one layer instead of two on the chapter's task.
  After each run: its in-context learning score (the loss at positions 48-62 minus the loss
  at 8-15 on 64 sequences of blocks of 16 to 32, seed 5) and, on 64 blocks of 24 (seed 3),
  its loss on the repeats and the best induction score of its last layer. Chapter 15 trains
  the first 200 steps of each live, checks them against this record and draws the record.
* **Text** (the chapter's exercise 3): on Tiny Shakespeare's characters instead, batches of
  16 windows of 64, AdamW at a constant 1e-3, 2,400 steps, looking every 300 steps at all 64
  test sequences: the loss on the characters 2-32 of the first copy and on the second copy,
  and the best induction score of layer 2.

The results file, ``mhbook/training/measured/induction_heads.json``, holds the command,
commit, machine and date that made it; chapter 15 loads it
(``mhbook.load_measured("induction_heads")``). About a minute and a half of one thread on the
2-core machine with nothing else running (the chapter's three runs add about 30 seconds).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mhbook import DecoderOnlyLM, TrainConfig, set_seed
from mhbook.tasks import RepeatedRandom
from mhbook.training.checkpoints import shipped_weights
from mhbook.training.shakespeare_lm import COPIER_MODEL, COPIER_TRAIN, shakespeare_data
from mhbook.viz.attention_records import passage_attention

from .llama_ablations import _commit, _machine
from .long_context import fine_tune_with_probes

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "mhbook/training/measured/induction_heads.json"
VOCAB, PERIOD = 65, 32

#: Chapter 15's attention-only toy model: chapter 16's copier.
TOY_CONFIG = COPIER_MODEL

#: Chapter 15's training of the toy model on repeated random blocks (``toy_train``, the
#: copier's), for the 600 steps of its timing runs.
TIMING_TRAIN = COPIER_TRAIN.replace(num_steps=600, seed=0)

#: Exercise 3's training on the text: the same, at 1e-3 for 2,400 steps.
TEXT_TRAIN = TIMING_TRAIN.replace(num_steps=2400, lr=1e-3)


def test_sequences() -> torch.Tensor:
    """``(64, 64)``: chapter 15's test set, 64 blocks of 32 random characters, twice."""
    return RepeatedRandom(VOCAB).sample(64, torch.Generator().manual_seed(1), period=PERIOD)


@torch.no_grad()
def probe_heads(model, sequences: torch.Tensor, period: int = PERIOD) -> dict:
    """Chapter 15's probe (its ``probe``) on blocks of ``period`` repeated: the loss on the
    first copy (its tokens 1..p-1) and on the repeats (p+1..), and every head's induction and
    previous-token score, as ``[layer][head]`` lists."""
    logits = model(sequences)
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), sequences[:, 1:], reduction="none")
    w = passage_attention(model, sequences)  # (N, layers, 4, 64, 64)
    i = np.arange(period, sequences.size(1))
    induction = w[..., i, i - period + 1].mean(axis=(0, -1))  # (layers, heads)
    previous = w.diagonal(offset=-1, axis1=-2, axis2=-1).mean(axis=(0, -1))  # (layers, heads)
    return {
        "first": losses[:, : period - 1].mean().item(),
        "second": losses[:, period:].mean().item(),
        "induction": induction.tolist(),
        "previous": previous.tolist(),
    }


def probe(model, sequences: torch.Tensor, period: int = PERIOD) -> dict:
    """:func:`probe_heads` with the best head's scores only: the last layer's induction
    score and layer 1's previous-token score."""
    looked = probe_heads(model, sequences, period)
    return {
        **looked,
        "induction": max(looked["induction"][-1]),
        "previous": max(looked["previous"][0]),
    }


def run(data, train: TrainConfig, seed: int, sequences: torch.Tensor, every: int) -> dict:
    set_seed(seed)
    model = DecoderOnlyLM(TOY_CONFIG, VOCAB)
    start = time.perf_counter()
    log = fine_tune_with_probes(
        model, data, train.replace(seed=seed), lambda m: probe(m, sequences), every
    )
    return {"seed": seed, "log": log, "seconds": time.perf_counter() - start}


@torch.no_grad()
def icl_score(model) -> float:
    """Chapter 15's in-context learning score: on 64 sequences of blocks of 16 to 32 (seed
    5), the mean loss at positions 48-62 (always in a repeat) minus that at 8-15 (always in
    the first block)."""
    mixed = RepeatedRandom(VOCAB).sample(64, torch.Generator().manual_seed(5))
    logits = model(mixed)
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), mixed[:, 1:], reduction="none")
    return (losses[:, 48:63].mean() - losses[:, 8:16].mean()).item()


#: The chapter's runs: (model config, the task's periods, the probe of every look).
CHAPTER_RUNS = {
    "copier": (COPIER_MODEL, (16, 32), probe_heads),
    "fixed_period": (COPIER_MODEL, (PERIOD, PERIOD), probe),
    "one_layer": (COPIER_MODEL.replace(num_layers=1), (16, 32), probe),
}


def chapter_run(name: str, sequences: torch.Tensor, steps: int, every: int) -> dict:
    """:data:`CHAPTER_RUNS`'s run ``name``: the looks, and the trained model's in-context
    learning score and scores on blocks of 24; for ``copier`` at its full length, how far its
    weights are from the shipped ``copier-seed0``."""
    config, periods, look = CHAPTER_RUNS[name]
    set_seed(0)
    model = DecoderOnlyLM(config, VOCAB)
    train = COPIER_TRAIN.replace(num_steps=steps, seed=0)
    start = time.perf_counter()
    log = fine_tune_with_probes(
        model, RepeatedRandom(VOCAB, periods=periods), train, lambda m: look(m, sequences), every
    )
    seconds = time.perf_counter() - start
    blocks_24 = RepeatedRandom(VOCAB).sample(64, torch.Generator().manual_seed(3), period=24)
    at_24 = probe(model, blocks_24, period=24)
    out = {
        "log": log,
        "seconds": seconds,
        "icl_score": icl_score(model),
        "blocks_24": {"second": at_24["second"], "induction": at_24["induction"]},
    }
    if name == "copier" and steps == COPIER_TRAIN.num_steps:
        shipped = torch.load(shipped_weights("copier-seed0"), map_location="cpu", weights_only=True)
        shipped = shipped["model"]
        out["max_weight_diff_from_shipped"] = max(
            (w - shipped[k]).abs().max().item() for k, w in model.state_dict().items()
        )
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timing-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--timing-steps", type=int, default=TIMING_TRAIN.num_steps)
    parser.add_argument("--timing-every", type=int, default=5)
    parser.add_argument("--chapter-steps", type=int, default=COPIER_TRAIN.num_steps)
    parser.add_argument("--chapter-every", type=int, default=25)
    parser.add_argument("--text-steps", type=int, default=TEXT_TRAIN.num_steps)
    parser.add_argument("--text-every", type=int, default=300)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    sequences = test_sequences()
    timing_train = TIMING_TRAIN.replace(num_steps=args.timing_steps)
    text_train = TEXT_TRAIN.replace(num_steps=args.text_steps)
    copying = RepeatedRandom(VOCAB)
    timing = [
        run(copying, timing_train, seed, sequences[:16], args.timing_every)
        for seed in args.timing_seeds
    ]
    chapter = {
        name: chapter_run(name, sequences, args.chapter_steps, args.chapter_every)
        for name in CHAPTER_RUNS
    }
    text = [run(shakespeare_data(), text_train, 0, sequences, args.text_every)]
    result = {
        "command": " ".join(["python -m benchmarks.induction_heads", *(argv or sys.argv[1:])]),
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "machine": _machine(),
        "torch": torch.__version__,
        "threads_per_run": 1,
        "model": dict(TOY_CONFIG.__dict__),
        "period": PERIOD,
        "timing": {"train": dict(timing_train.__dict__), "runs": timing},
        "chapter": {
            "train": dict(COPIER_TRAIN.replace(num_steps=args.chapter_steps, seed=0).__dict__),
            "every": args.chapter_every,
            "runs": chapter,
        },
        "text": {"train": dict(text_train.__dict__), "runs": text},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    for r in timing:
        first = {
            k: next((p["step"] for p in r["log"] if p["step"] and p[k] > 0.3), None)
            for k in ("previous", "induction")
        }
        print(f"timing, seed {r['seed']}: scores first above 0.3 at steps {first}")
    for name, r in chapter.items():
        half = next((p["step"] for p in r["log"] if p["second"] < np.log(VOCAB) / 2), None)
        print(
            f"{name}: second copy below half a uniform guess at step {half}, in-context "
            f"learning score {r['icl_score']:.2f}, on blocks of 24 {r['blocks_24']}"
        )
    print("copier: its weights are", chapter["copier"].get("max_weight_diff_from_shipped"),
          "from the shipped copier-seed0")  # fmt: skip
    print("text: step | induction (layer 2) | loss, copy 1, copy 2")
    for p in text[0]["log"]:
        print(f"  {p['step']:>5} | {p['induction']:.2f} | {p['first']:.2f} {p['second']:.2f}")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
