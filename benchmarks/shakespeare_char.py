"""nanoGPT's ``shakespeare_char`` CPU quick-start with the book's modern block.

    python -m benchmarks.shakespeare_char [--threads N] [--steps 2000] [--gpt] [--profile]
                                          [--rounds 40] [--round-steps 3]

Trains :data:`mhbook.SHAKESPEARE_MODEL` (4 layers, 4 query heads and 2 key/value heads,
``d_model`` 128, RMSNorm, SwiGLU, RoPE, no biases) on Tiny Shakespeare's characters at
nanoGPT's quick-start settings: context 64, batch 12, 2,000 steps, no dropout, AdamW at
1e-3 with 100 warm-up steps and cosine decay to 1e-4, gradients clipped at 1.0. nanoGPT's
README reports a validation loss of about 1.88 nats per character after about 3 minutes on
a laptop CPU. Prints the validation loss (every character of the last 10 %, once) and the
training tokens per second.

Before training, it times steps of the modern block against a plain GPT of the same size
(LayerNorm, GELU feed-forward of ``4 d_model``, biases, four key/value heads, sinusoidal
positions added to the embeddings: ``mhbook.ModelConfig``'s 2017 choices in pre-norm form),
alternating the two round after round so that the machine's noise hits both, and prints
the median and quartiles of the rounds' ratios of their step times, wall-clock and in CPU
time of the thread (less disturbed by other processes on a shared machine; with one torch
thread it is the step's own work). ``--gpt`` also trains
the GPT for the same steps, to compare the losses the two blocks reach; ``--profile``
prints where each one's step spends its time (the PyTorch ops with the most time of their
own); ``--steps 0`` trains neither.

A benchmark, not a test: timings depend on the machine. Its goal (issue 23): a validation
loss at or below 1.88, at a step at least as fast as the plain GPT's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mhbook import DecoderOnlyLM, set_seed
from mhbook.tasks.shakespeare import lm_loss, ngram_losses
from mhbook.training.shakespeare_lm import SHAKESPEARE_MODEL, SHAKESPEARE_TRAIN, shakespeare_data
from mhbook.training.trainer import fit, make_optimizer, make_scheduler, train_step, valid_loss

#: A plain GPT of the same size: what the modern block replaces.
GPT_MODEL = SHAKESPEARE_MODEL.replace(
    num_kv_heads=None,
    d_ff=4 * SHAKESPEARE_MODEL.d_model,
    norm="layer",
    ffn="gelu",
    bias=True,
    position="sinusoidal",
)


def parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def training_parts(config, data):
    """``(model, optimizer, scheduler, batches)`` for timing steps of ``config``, seeded."""
    set_seed(0)
    model = DecoderOnlyLM(config, vocab_size=65).train()
    optimizer = make_optimizer(model, SHAKESPEARE_TRAIN)
    scheduler = make_scheduler(optimizer, SHAKESPEARE_TRAIN)
    return model, optimizer, scheduler, data.batches("train", SHAKESPEARE_TRAIN.batch_size)


def step_times(configs: dict, data, rounds: int, steps: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per training step of each config in every round, the configs alternating
    round by round (``steps`` steps each per round, in forward order on even rounds and
    reverse order on odd ones, after one warm-up round): the steps of one round ran under
    the same load, so their ratio is paired.

    Returns ``{"wall": {name: [...]}, "cpu": {name: [...]}}``: wall-clock seconds, and the
    CPU seconds of this thread (``time.thread_time``: with one torch thread, the step's own
    work, without the time other processes took the core).
    """
    runs = {}
    for name, config in configs.items():
        runs[name] = training_parts(config, data)
    times: dict[str, dict[str, list[float]]] = {"wall": {}, "cpu": {}}
    for r in range(rounds + 1):
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            model, optimizer, scheduler, batches = runs[name]
            wall, cpu = time.perf_counter(), time.thread_time()
            for _ in range(steps):
                batch = next(batches)
                train_step(model, batch, lm_loss, optimizer, scheduler, 1.0)
            if r > 0:  # round 0 warms up
                times["wall"].setdefault(name, []).append((time.perf_counter() - wall) / steps)
                times["cpu"].setdefault(name, []).append((time.thread_time() - cpu) / steps)
    return times


def profile_steps(configs: dict, data, steps: int = 10, rows: int = 8) -> None:
    """Where a training step's time goes: the ``rows`` PyTorch ops with the most CPU time of
    their own over ``steps`` steps of each config (after one warm-up step), with their share."""
    from torch.profiler import profile

    for name, config in configs.items():
        model, optimizer, scheduler, batches = training_parts(config, data)
        train_step(model, next(batches), lm_loss, optimizer, scheduler, 1.0)
        with profile() as prof:
            for _ in range(steps):
                train_step(model, next(batches), lm_loss, optimizer, scheduler, 1.0)
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events)
        print(f"profile, {name}: {total / steps / 1000:.1f} ms of ops per step; the largest:")
        for e in events[:rows]:
            share = e.self_cpu_time_total / total
            print(f"  {e.key:<48} {share:6.1%}  {e.count // steps:>4} calls per step")


def train(config, data, num_steps: int, label: str) -> None:
    set_seed(SHAKESPEARE_TRAIN.seed)
    model = DecoderOnlyLM(config, vocab_size=65)
    settings = SHAKESPEARE_TRAIN.replace(num_steps=num_steps, eval_every=0)
    start = time.perf_counter()
    history = fit(model, data, settings, loss_fn=lm_loss, progress=False)
    seconds = time.perf_counter() - start
    tokens = num_steps * settings.batch_size * data.context
    loss = valid_loss(model, data, "valid", loss_fn=lm_loss)
    print(
        f"{label}: {parameters(model):,} parameters, {num_steps} steps in {seconds:.0f} s, "
        f"{tokens / sum(history['time_s'][-1:]):,.0f} tokens/s"
    )
    print(f"{label}: val loss {loss:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--steps", type=int, default=2000, help="training steps (default 2000)")
    parser.add_argument("--rounds", type=int, default=40, help="rounds of the step timing")
    parser.add_argument("--round-steps", type=int, default=3, help="steps per model and round")
    parser.add_argument("--gpt", action="store_true", help="also train the plain GPT")
    parser.add_argument("--profile", action="store_true", help="where a step's time goes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = shakespeare_data()
    chars = data.tokenizer
    base = ngram_losses(data.ids["train"], data.ids["valid"], chars.vocab_size)
    print(
        f"Tiny Shakespeare, characters: {data}; {torch.get_num_threads()} thread(s), "
        f"torch {torch.__version__}"
    )
    print(f"baselines: unigram {base['unigram']:.3f}, bigram {base['bigram']:.3f} nats/char")
    configs = {"modern": SHAKESPEARE_MODEL, "gpt": GPT_MODEL}
    times = step_times(configs, data, rounds=args.rounds, steps=args.round_steps)
    for clock, label in (("wall", "wall-clock"), ("cpu", "CPU time of the thread")):
        modern, gpt = times[clock]["modern"], times[clock]["gpt"]
        q1, median, q3 = statistics.quantiles(
            [g / m for g, m in zip(gpt, modern)], n=4, method="inclusive"
        )
        print(
            f"step time, {label}: modern {statistics.median(modern) * 1000:.1f} ms, gpt "
            f"{statistics.median(gpt) * 1000:.1f} ms; ratio gpt/modern {median:.2f} "
            f"[{q1:.2f}, {q3:.2f}]"
        )
    print(
        f"(medians [quartiles] of {args.rounds} rounds of {args.round_steps} steps each; "
        "ratio >= 1: modern faster)"
    )
    if args.profile:
        profile_steps(configs, data)
    if args.steps == 0:
        return
    train(SHAKESPEARE_MODEL, data, args.steps, "modern")
    if args.gpt:
        train(GPT_MODEL, data, args.steps, "gpt")


if __name__ == "__main__":
    main()
