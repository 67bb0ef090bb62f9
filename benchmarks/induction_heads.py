"""Chapter 15's runs that train for longer than a chapter should: induction heads, when and where.

    python -m benchmarks.induction_heads [--timing-seeds 0 1 2] [--text-steps 2400] [--out FILE]

Both parts train chapter 15's toy model (2 layers of 4 heads, ``d_model`` 64, RMSNorm, RoPE,
no feed-forward network, no biases) with its loop (:func:`mhbook.fit`'s, written out to look
at the model while it trains: :func:`benchmarks.long_context.fine_tune_with_probes`), on one
thread, and probe it on the chapter's 64 test sequences (a block of 32 random characters
written twice, ``RepeatedRandom(65).sample(64, seed 1, period=32)``).

* **Timing** (the chapter's three seeds): on repeated random blocks of 16 to 32 characters
  (:class:`mhbook.tasks.RepeatedRandom`), AdamW at a constant 3e-3, 600 steps from
  ``set_seed(seed)`` with the batches seeded alike, looking every 5 steps at the first 16
  test sequences: the loss on the second copy, the best induction score of layer 2 (the mean
  weight from each query of the second copy on the character after the earlier occurrence
  of its own) and the best previous-token score of layer 1.
* **Text** (the chapter's exercise 3): on Tiny Shakespeare's characters instead, batches of
  16 windows of 64, AdamW at a constant 1e-3, 2,400 steps, looking every 300 steps at all 64
  test sequences: the loss on the characters 2-32 of the first copy and on the second copy,
  and the best induction score of layer 2.

The results file, ``mhbook/training/measured/induction_heads.json``, holds the command,
commit, machine and date that made it; chapter 15 loads it
(``mhbook.load_measured("induction_heads")``). About a minute and a half of one thread on the
2-core machine with nothing else running.
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

from mhbook import DecoderOnlyLM, ModelConfig, TrainConfig, set_seed
from mhbook.tasks import RepeatedRandom
from mhbook.training.shakespeare_lm import shakespeare_data
from mhbook.viz.attention_records import passage_attention

from .llama_ablations import _commit, _machine
from .long_context import fine_tune_with_probes

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "mhbook/training/measured/induction_heads.json"
VOCAB, PERIOD = 65, 32

#: Chapter 15's attention-only toy model.
TOY_CONFIG = ModelConfig(
    d_model=64, num_heads=4, num_layers=2, ffn="none", norm_first=True, norm="rms",
    bias=False, position="rope", scale_embeddings=False,
)  # fmt: skip

#: Chapter 15's training of the toy model on repeated random blocks (``toy_train``), for the
#: 600 steps of its timing runs.
TIMING_TRAIN = TrainConfig(
    num_steps=600, batch_size=16, lr=3e-3, warmup_steps=0, min_lr_ratio=1.0,
    weight_decay=0.0, clip_norm=1.0, eval_every=0, seed=0,
)  # fmt: skip

#: Exercise 3's training on the text: the same, at 1e-3 for 2,400 steps.
TEXT_TRAIN = TIMING_TRAIN.replace(num_steps=2400, lr=1e-3)


def test_sequences() -> torch.Tensor:
    """``(64, 64)``: chapter 15's test set, 64 blocks of 32 random characters, twice."""
    return RepeatedRandom(VOCAB).sample(64, torch.Generator().manual_seed(1), period=PERIOD)


@torch.no_grad()
def probe(model, sequences: torch.Tensor) -> dict:
    """Chapter 15's probe: the loss on each copy, layer 2's best induction score and layer
    1's best previous-token score."""
    logits = model(sequences)
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), sequences[:, 1:], reduction="none")
    w = passage_attention(model, sequences)  # (N, 2, 4, 64, 64)
    i = np.arange(PERIOD, sequences.size(1))
    induction = w[..., i, i - PERIOD + 1].mean(axis=(0, -1))  # (layers, heads)
    previous = w.diagonal(offset=-1, axis1=-2, axis2=-1).mean(axis=(0, -1))  # (layers, heads)
    return {
        "first": losses[:, : PERIOD - 1].mean().item(),
        "second": losses[:, PERIOD:].mean().item(),
        "induction": float(induction[-1].max()),
        "previous": float(previous[0].max()),
    }


def run(data, train: TrainConfig, seed: int, sequences: torch.Tensor, every: int) -> dict:
    set_seed(seed)
    model = DecoderOnlyLM(TOY_CONFIG, VOCAB)
    start = time.perf_counter()
    log = fine_tune_with_probes(
        model, data, train.replace(seed=seed), lambda m: probe(m, sequences), every
    )
    return {"seed": seed, "log": log, "seconds": time.perf_counter() - start}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timing-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--timing-steps", type=int, default=TIMING_TRAIN.num_steps)
    parser.add_argument("--timing-every", type=int, default=5)
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
    text = [run(shakespeare_data(), text_train, 0, sequences, args.text_every)]
    result = {
        "command": "python -m benchmarks.induction_heads " + " ".join(argv or sys.argv[1:]),
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "machine": _machine(),
        "torch": torch.__version__,
        "threads_per_run": 1,
        "model": dict(TOY_CONFIG.__dict__),
        "period": PERIOD,
        "timing": {"train": dict(timing_train.__dict__), "runs": timing},
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
    print("text: step | induction (layer 2) | loss, copy 1, copy 2")
    for p in text[0]["log"]:
        print(f"  {p['step']:>5} | {p['induction']:.2f} | {p['first']:.2f} {p['second']:.2f}")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
