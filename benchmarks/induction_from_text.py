"""Chapter 15's exercise 3: does the 2-layer attention-only model form induction heads on text?

    python -m benchmarks.induction_from_text [--steps 2400] [--every 300] [--seeds 0] [--out FILE]

Trains chapter 15's toy model (2 layers of 4 heads, ``d_model`` 64, RMSNorm, RoPE, no
feed-forward network, no biases) on Tiny Shakespeare's characters instead of repeated random
blocks: batches of 16 windows of 64 characters, AdamW at a constant 1e-3, no warm-up, no
weight decay, clipping at 1, from ``set_seed(seed)``. Every ``--every`` steps (and before the
first) it probes the model as the chapter does, on its 64 test sequences (a block of 32
random characters written twice, ``RepeatedRandom(65).sample(64, seed 1, period=32)``): the
loss on the characters 2-32 of the first copy and on the second copy, and the best
induction score of layer 2 (the mean weight from each query of the second copy on the
character after the earlier occurrence of its own). The loop is :func:`mhbook.fit`'s
(:func:`benchmarks.long_context.fine_tune_with_probes`).

The results file, ``mhbook/training/measured/induction_from_text.json``, holds the command,
commit, machine and date that made it; chapter 15 loads it
(``mhbook.load_measured("induction_from_text")``). About half a minute of one thread per
seed on the 2-core machine with nothing else running.
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

DEFAULT_OUT = (
    Path(__file__).resolve().parents[1] / "mhbook/training/measured/induction_from_text.json"
)
VOCAB, PERIOD = 65, 32

#: Chapter 15's attention-only toy model.
TOY_CONFIG = ModelConfig(
    d_model=64, num_heads=4, num_layers=2, ffn="none", norm_first=True, norm="rms",
    bias=False, position="rope", scale_embeddings=False,
)  # fmt: skip

#: Chapter 15's training of the toy model, at exercise 3's learning rate.
TEXT_TRAIN = TrainConfig(
    num_steps=2400, batch_size=16, lr=1e-3, warmup_steps=0, min_lr_ratio=1.0,
    weight_decay=0.0, clip_norm=1.0, eval_every=0, seed=0,
)  # fmt: skip


def test_sequences() -> torch.Tensor:
    """``(64, 64)``: chapter 15's test set, 64 blocks of 32 random characters, twice."""
    return RepeatedRandom(VOCAB).sample(64, torch.Generator().manual_seed(1), period=PERIOD)


@torch.no_grad()
def probe(model, sequences: torch.Tensor) -> dict:
    """Chapter 15's probe: the loss on each copy and layer 2's best induction score."""
    logits = model(sequences)
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), sequences[:, 1:], reduction="none")
    w = passage_attention(model, sequences)  # (64, 2, 4, 64, 64)
    i = np.arange(PERIOD, sequences.size(1))
    induction = w[..., i, i - PERIOD + 1].mean(axis=(0, -1))  # (layers, heads)
    return {
        "first": losses[:, : PERIOD - 1].mean().item(),
        "second": losses[:, PERIOD:].mean().item(),
        "induction": float(induction[1].max()),
    }


def run(seed: int, steps: int, every: int) -> dict:
    sequences = test_sequences()
    set_seed(seed)
    model = DecoderOnlyLM(TOY_CONFIG, VOCAB)
    start = time.perf_counter()
    log = fine_tune_with_probes(
        model,
        shakespeare_data(),
        TEXT_TRAIN.replace(num_steps=steps, seed=seed),
        lambda m: probe(m, sequences),
        every,
    )
    return {"seed": seed, "log": log, "seconds": time.perf_counter() - start}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=TEXT_TRAIN.num_steps)
    parser.add_argument("--every", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    runs = [run(seed, args.steps, args.every) for seed in args.seeds]
    result = {
        "command": "python -m benchmarks.induction_from_text " + " ".join(argv or sys.argv[1:]),
        "commit": _commit(),
        "date": datetime.date.today().isoformat(),
        "machine": _machine(),
        "torch": torch.__version__,
        "threads_per_run": 1,
        "model": {k: v for k, v in TOY_CONFIG.__dict__.items()},
        "train": {k: v for k, v in TEXT_TRAIN.replace(num_steps=args.steps).__dict__.items()},
        "period": PERIOD,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    for r in runs:
        print(f"seed {r['seed']}: step | induction (layer 2) | loss, copy 1, copy 2")
        for p in r["log"]:
            print(f"  {p['step']:>5} | {p['induction']:.2f} | {p['first']:.2f} {p['second']:.2f}")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
