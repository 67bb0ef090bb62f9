"""Start a few processes that talk through ``torch.distributed``, from a script, a test or a
notebook, and bring their results back.

:func:`run` is a small stand-in for ``torchrun`` that works inside Jupyter, under nbval and
in Colab. It starts ``world_size`` fresh Python processes with the ``spawn`` method of
``torch.multiprocessing`` and joins them in one process group: the rendezvous is a
``TCPStore`` that the caller serves on 127.0.0.1, on a free port the operating system picks.
Each rank calls ``fn(rank, world_size, device, *args)``; :func:`run` returns what every rank
returned, in rank order. Everything is bounded by ``timeout``: a rank that hangs (waiting
in a collective for a rank that died) is stopped and :class:`TimeoutError` raised; an
exception in a rank is raised in the caller as :class:`WorkerError` with the rank's traceback.

``spawn`` starts new interpreters that import ``fn`` by its module and name, so ``fn`` must
be defined in an importable module (like :mod:`mhbook.parallel`), not in a notebook cell.
"""

from __future__ import annotations

import datetime
import pickle
import queue as queue_module
import time
import traceback
from typing import Callable

import torch

__all__ = ["WorkerError", "default_backend", "run"]


class WorkerError(RuntimeError):
    """A rank started by :func:`run` raised an exception or died; the message holds its
    traceback or exit code."""


def default_backend(world_size: int) -> str:
    """``"nccl"`` when there is one CUDA GPU per rank and NCCL is built in, else ``"gloo"``
    (CPU tensors)."""
    import torch.distributed as dist

    if torch.cuda.device_count() >= world_size and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def run(
    fn: Callable,
    *args,
    world_size: int = 2,
    backend: str | None = None,
    timeout: float = 120.0,
    threads: int = 1,
    **kwargs,
) -> list:
    """Run ``fn(rank, world_size, device, *args, **kwargs)`` in ``world_size`` processes.

    Args:
        fn: a function defined at the top level of an importable module. Each rank calls it
            after ``torch.distributed.init_process_group``; ``device`` is ``cuda:rank`` with
            NCCL and the CPU with gloo. Its return value must pickle (tensors are copied).
        args, kwargs: more arguments for ``fn``; they must pickle too.
        world_size: the number of processes (ranks).
        backend: ``"gloo"`` or ``"nccl"``; ``None`` picks :func:`default_backend`.
        timeout: seconds for everything: starting, the rendezvous and ``fn``.
        threads: ``torch.set_num_threads`` in each rank (one keeps ranks from competing).

    Returns:
        The ``world_size`` return values of ``fn``, in rank order.

    Raises:
        WorkerError: a rank raised (its traceback is in the message) or died.
        TimeoutError: the ranks did not all finish within ``timeout`` seconds; they are stopped.
    """
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not callable(fn):
        raise TypeError(f"fn must be a function, got {type(fn).__name__}")
    if getattr(fn, "__module__", None) == "__main__" or "<locals>" in getattr(
        fn, "__qualname__", ""
    ):
        raise ValueError(
            f"fn={getattr(fn, '__qualname__', fn)!r} is defined in __main__ (a notebook or a "
            "script) or inside a function; the spawned processes import fn by module and name, "
            "so define it at the top level of an importable module, e.g. a .py file beside the "
            "notebook or mhbook.parallel"
        )
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    backend = default_backend(world_size) if backend is None else backend
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None, got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"backend='nccl' needs one GPU per rank: world_size={world_size}, "
            f"{torch.cuda.device_count()} GPUs"
        )

    context = mp.get_context("spawn")
    results_queue = context.Queue()
    # The rendezvous: a key-value store served from this process on a port the OS picks
    # (port 0), so no other program can take the port between choosing and binding it.
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        world_size,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
    )
    port = store.port
    processes = [
        context.Process(
            target=_worker,
            args=(
                rank,
                fn,
                args,
                kwargs,
                world_size,
                backend,
                port,
                timeout,
                threads,
                results_queue,
            ),
            daemon=True,  # they go when the caller goes
        )
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    results: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - set(results))
                raise TimeoutError(
                    f"ranks {missing} of {world_size} ({backend}) did not finish within "
                    f"{timeout} s; they were stopped"
                )
            try:
                rank, ok, payload = results_queue.get(timeout=min(0.2, remaining))
            except queue_module.Empty:
                dead = [
                    (r, p.exitcode)
                    for r, p in enumerate(processes)
                    if r not in results and p.exitcode not in (None, 0)
                ]
                if dead:
                    try:  # its traceback may still be on the way
                        rank, ok, payload = results_queue.get(timeout=1.0)
                    except queue_module.Empty:
                        r, code = dead[0]
                        raise WorkerError(
                            f"rank {r} of {world_size} died with exit code {code} without "
                            "returning a result"
                        ) from None
                else:
                    continue
            if not ok:
                raise WorkerError(f"rank {rank} of {world_size} ({backend}) raised:\n{payload}")
            results[rank] = pickle.loads(payload)
    finally:
        # Finished ranks get a moment to exit; after a failure the others are stopped now.
        _stop(processes, grace=5.0 if len(results) == world_size else 0.0)
        results_queue.close()
        del store
    return [results[rank] for rank in range(world_size)]


def _worker(rank, fn, args, kwargs, world_size, backend, port, timeout, threads, results_queue):
    """One rank: join the group, call ``fn``, send back ``(rank, ok, result or traceback)``."""
    import torch.distributed as dist

    try:
        torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
        wait = datetime.timedelta(seconds=timeout)
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=wait)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=wait
        )
        # Pickled here with the plain pickle: a tensor travels as bytes, not as shared
        # memory that would vanish with this process.
        message = (rank, True, pickle.dumps(fn(rank, world_size, device, *args, **kwargs)))
    except BaseException:  # noqa: BLE001 (every failure goes back to the caller)
        message = (rank, False, traceback.format_exc())
    results_queue.put(message)
    if message[1] and dist.is_initialized():
        dist.destroy_process_group()
    results_queue.close()
    results_queue.join_thread()  # the message is sent before the process ends


def _stop(processes, grace: float = 5.0) -> None:
    """Wait a little for finished ranks to exit, then terminate, then kill the rest."""
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(timeout=2.0)
        if process.is_alive():
            process.kill()
            process.join()
