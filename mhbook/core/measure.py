"""Measuring tools of the chapters: the peak tensor memory of a call, on a CPU or a GPU.

Chapter 8 measures the memory of explicit, fused and tiled attention with
:func:`peak_memory_bytes`; the benchmark (``python -m benchmarks.bench``, outside the
package) measures its table (b) with it too.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

__all__ = ["peak_memory_bytes"]


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated by PyTorch while ``fn()`` runs, above what was allocated before.

    On CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak. On the CPU
    PyTorch keeps no such counter, so the call runs under ``torch.profiler`` with
    ``profile_memory=True``: every allocation and free of PyTorch's CPU allocator is
    an event with a byte count, and the peak of their running sum is the answer. Both
    count tensors only (the result of ``fn`` included), not the Python process's other memory.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    # PyTorch's profiler (its C++ side, Kineto) writes "USDT ... profiler_start/stop" lines
    # to stderr at every start and stop unless its log level is 6 (errors only). It reads
    # the level once, at its first use in the process: set it before that, unless the
    # caller chose a level.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # The raw events keep each allocation (+bytes) and free (-bytes) separately;
    # prof.events() would merge those made inside one operator.
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak
