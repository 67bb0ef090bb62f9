"""How long the book's model takes to translate 99 % of the validation sentences exactly.

Trains the model of ``mhbook.book_model`` (``BOOK_CONFIG``: same data, seeds, optimizer
and schedule, through ``mhbook.fit``) and, every ``--every`` steps, translates the
``"valid"`` split greedily (``mhbook.evaluate``). Prints the first step at which the exact
match reaches ``--target`` and the training time up to it: wall-clock and CPU seconds of
the training steps only (from the first step on; the evaluations are not counted). The
probe does not change the training: it runs in eval mode without gradients and draws no
random numbers.

    python benchmarks/time_to_99.py --threads 2              # the installed mhbook
    python benchmarks/time_to_99.py --source /path/to/other  # the mhbook of another checkout

Timings depend on the machine and on what else runs on it: compare two versions on one
machine, one after the other, on a quiet machine.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--every", type=int, default=25, help="evaluate every this many steps")
    parser.add_argument("--first", type=int, default=0, help="no evaluation before this step")
    parser.add_argument("--target", type=float, default=0.99, help="exact match to reach")
    parser.add_argument("--source", default=None, help="a checkout whose mhbook/ to import instead")
    args = parser.parse_args(argv)
    if args.source is not None:
        sys.path.insert(0, args.source)

    import torch

    import mhbook
    from mhbook import BOOK_CONFIG

    config = BOOK_CONFIG
    # The first step of PyTorch's fused AdamW imports torch.distributed.tensor (seconds):
    # take that one-off cost here, before the clock starts.
    warm = torch.nn.Linear(1, 1)
    warm(torch.ones(1)).sum().backward()
    mhbook.make_optimizer(warm, config.train).step()
    data = mhbook.make_data(config)
    pad_id = data.tgt_vocab.pad_id
    mhbook.set_seed(config.train.seed)  # as book_model does
    model = mhbook.make_model(data, config, device="cpu")

    steps, hit = 0, None
    evaluation = {"wall": 0.0, "cpu": 0.0}
    start = {}  # the clocks when the first training step starts (fit's set-up not counted)

    def probe(model, batch):
        """fit's loss, after an exact-match check every ``args.every`` training steps."""
        nonlocal steps, hit
        if model.training:  # (fit's own validation is off: eval_every=0)
            if not start:
                start.update(wall=time.perf_counter(), cpu=time.process_time())
            if hit is None and steps >= max(1, args.first) and steps % args.every == 0:
                wall, cpu = time.perf_counter(), time.process_time()
                trained = {  # since the start, less the earlier evaluations
                    "wall": wall - start["wall"] - evaluation["wall"],
                    "cpu": cpu - start["cpu"] - evaluation["cpu"],
                }
                exact = mhbook.evaluate(model, data, "valid")["exact_match"]
                model.train()
                evaluation["wall"] += time.perf_counter() - wall
                evaluation["cpu"] += time.process_time() - cpu
                print(
                    f"step {steps:4d}: exact match {100 * exact:5.1f} %, trained "
                    f"{trained['wall']:6.1f} s wall, {trained['cpu']:6.1f} s CPU",
                    flush=True,
                )
                if exact >= args.target:
                    hit = (steps, trained)
            steps += 1
        return mhbook.translation_loss(model, batch, pad_id=pad_id)

    mhbook.fit(
        model, data, config.train, loss_fn=probe, progress=False,
        eval_every=0, num_threads=args.threads,
    )  # fmt: skip
    print(f"mhbook from {mhbook.__file__}, torch {torch.__version__}, {args.threads} threads")
    if hit is None:
        print(f"did not reach {100 * args.target:.0f} % in {config.train.num_steps} steps")
    else:
        step, trained = hit
        print(
            f"time to {100 * args.target:.0f} % exact match: {step} steps, "
            f"{trained['wall']:.1f} s wall, {trained['cpu']:.1f} s CPU"
        )


if __name__ == "__main__":
    main()
