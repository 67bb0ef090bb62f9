"""Greedy decoding: ``mhbook.generate`` against Hugging Face's ``generate`` on the same network.

    python -m benchmarks.decode_vs_hf [--rounds 7] [--new 128] [--threads 1]

Builds Part V's Llama-block :class:`mhbook.DecoderOnlyLM` (:data:`mhbook.SHAKESPEARE_MODEL`:
4 layers, 4 query heads and 2 key/value heads, ``d_model`` 128, RMSNorm, SwiGLU, RoPE) with
random weights and 65 tokens, exports it with :func:`mhbook.lm_to_hf` (the same weights in a
``transformers.LlamaForCausalLM``), checks that both write the same tokens, then times greedy
decoding of ``--new`` tokens after a 16-token prompt at batch 1 and 8, the two alternating
round after round so that the machine's noise hits both. It prints the median seconds of each
and HF / mhbook (above 1: mhbook is faster), wall-clock and in CPU time of the thread (with
one thread, each side's own work, less disturbed by other processes on a shared machine).

Both run with a KV cache, in eval mode, under ``torch.inference_mode``, on one thread by
default. HF's ``generate`` is called with ``do_sample=False``, ``min_new_tokens`` =
``max_new_tokens`` (no early stop) and its default dynamic cache.

A benchmark, not a test: timings depend on the machine. Its goal (issue 31): at least 1.1 at
both batch sizes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mhbook import DecoderOnlyLM, generate, lm_to_hf, set_seed
from mhbook.training.shakespeare_lm import SHAKESPEARE_MODEL

VOCAB = 65
PROMPT = 16


def build():
    """The book's model and its Hugging Face export, both in eval mode."""
    set_seed(0)
    model = DecoderOnlyLM(SHAKESPEARE_MODEL, vocab_size=VOCAB).eval()
    return model, lm_to_hf(model).eval()


def decoders(model, hf, new_tokens: int) -> dict:
    """``name -> fn(prompt) -> new tokens (batch, new_tokens)``."""

    def ours(prompt):
        return generate(model, prompt, new_tokens)

    def theirs(prompt):
        out = hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        return out[:, prompt.size(1) :]

    return {"mhbook": ours, "HF": theirs}


def seconds(fn, prompt) -> tuple[float, float]:
    """Wall-clock and CPU seconds of this thread (``time.thread_time``) of ``fn(prompt)``."""
    wall, cpu = time.perf_counter(), time.thread_time()
    fn(prompt)
    return time.perf_counter() - wall, time.thread_time() - cpu


def main(argv=None) -> dict[int, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--new", type=int, default=128, help="new tokens per call")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    model, hf = build()
    runs = decoders(model, hf, args.new)
    ratios = {}
    with torch.inference_mode():
        for batch in (1, 8):
            prompt = torch.randint(
                0, VOCAB, (batch, PROMPT), generator=torch.Generator().manual_seed(batch)
            )
            same = torch.equal(runs["mhbook"](prompt), runs["HF"](prompt))  # also a warm-up
            times = {name: [] for name in runs}
            for _ in range(args.rounds):
                for name, fn in runs.items():
                    times[name].append(seconds(fn, prompt))
            median = {name: statistics.median(w for w, _ in t) for name, t in times.items()}
            cpu = {name: statistics.median(c for _, c in t) for name, t in times.items()}
            ratios[batch] = median["HF"] / median["mhbook"]
            print(
                f"batch {batch}, {PROMPT}-token prompt, {args.new} new tokens, greedy, "
                f"{args.threads} thread(s), median of {args.rounds}:\n"
                f"  mhbook.generate {median['mhbook']:.3f} s, HF generate {median['HF']:.3f} s, "
                f"HF / mhbook = {ratios[batch]:.2f} (same tokens: {same}); CPU time of the "
                f"thread: {cpu['mhbook']:.3f} s and {cpu['HF']:.3f} s, "
                f"HF / mhbook = {cpu['HF'] / cpu['mhbook']:.2f}"
            )
            assert same, "mhbook and its Hugging Face export wrote different tokens"
    return ratios


if __name__ == "__main__":
    main()
