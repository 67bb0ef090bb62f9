"""Start a few processes that talk through ``torch.distributed``, from a script, a test or a
notebook, and bring their results back.

:func:`run` is a small stand-in for ``torchrun`` that works inside Jupyter, under nbval and
in Colab. It starts ``world_size`` fresh Python processes with the ``spawn`` method of
``torch.multiprocessing`` and joins them in one process group: the rendezvous is a
``TCPStore`` that the caller serves on 127.0.0.1, on a free port the operating system picks.
Each rank calls ``fn(rank, world_size, device, *args)``; :func:`run` returns what every rank
returned, in rank order. Everything is bounded by ``timeout``: a rank that hangs (waiting
in a collective for a rank that died) is stopped and :class:`TimeoutError` raised; an
exception in a rank is raised in the caller as :class:`WorkerError` with the rank's traceback,
and a rank that dies without one (``os._exit``, a signal, a crash in C++) as
:class:`WorkerError` with its exit code. Whichever way :func:`run` ends, no rank outlives it.

``spawn`` starts new interpreters that import ``fn`` by its module and name, so ``fn`` must
be defined in an importable module (like :mod:`mhbook.distributed.tensor_parallel`), not in a
notebook cell.
"""

from __future__ import annotations

import datetime
import math
import multiprocessing.connection
import pickle
import signal
import time
import traceback
from typing import Callable

import torch

from ..core.validate import check_int, check_number

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
        TypeError, ValueError: a bad argument, before any process starts.
        WorkerError: a rank raised (its traceback is in the message) or died without an
            exception (its exit code is); the other ranks are stopped.
        TimeoutError: the ranks did not all finish within ``timeout`` seconds; they are stopped.
    """
    import torch.distributed as dist
    import torch.multiprocessing as mp

    _check_arguments(fn, world_size, timeout, threads)
    backend = default_backend(world_size) if backend is None else backend
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None, got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"backend='nccl' needs one GPU per rank: world_size={world_size}, "
            f"{torch.cuda.device_count()} GPUs"
        )

    context = mp.get_context("spawn")
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
    # One pipe per rank for its one message, so that we know who sent what and can wait on
    # the messages and on the processes' ends together.
    pipes = [context.Pipe(duplex=False) for _ in range(world_size)]  # (receive, send)
    processes = [
        context.Process(
            target=_worker,
            args=(rank, fn, args, kwargs, world_size, backend, port, timeout, threads, send),
            daemon=True,  # they go when the caller goes
        )
        for rank, (_, send) in enumerate(pipes)
    ]
    results = []
    try:  # started in here, so that if one rank cannot start the others are stopped
        for process, (_, send) in zip(processes, pipes):
            process.start()
            send.close()  # the rank has its own copy
        results = _collect(processes, [receive for receive, _ in pipes], backend, timeout)
    finally:
        # Finished ranks get a moment to exit; after a failure the others are stopped now.
        _stop(processes, grace=5.0 if results else 0.0)
        for receive, send in pipes:
            receive.close()
            send.close()
        del store
    return results


def _check_arguments(fn, world_size, timeout, threads) -> None:
    """Raise a clear error for an argument that :func:`run` cannot use."""
    if not callable(fn):
        raise TypeError(f"fn must be a function, got {type(fn).__name__} {fn!r}")
    if getattr(fn, "__module__", None) == "__main__" or "<locals>" in getattr(
        fn, "__qualname__", ""
    ):
        raise ValueError(
            f"fn={getattr(fn, '__qualname__', fn)!r} is defined in __main__ (a notebook or a "
            "script) or inside a function; the spawned processes import fn by module and name, "
            "so define it at the top level of an importable module, e.g. a .py file beside the "
            "notebook or mhbook.distributed.tensor_parallel"
        )
    check_int("world_size", world_size)
    check_int("threads", threads)
    check_number("timeout", timeout, 0.0, math.inf, low_inclusive=False)  # in seconds


def _collect(processes, receivers, backend: str, timeout: float) -> list:
    """Wait for every rank's message and return their results, or raise for the first
    failure: a rank that died without a message, else a rank's exception, else the timeout.

    A rank that dies takes its peers down with it (their collectives fail when its sockets
    close), so when a death and exceptions show up together the death is reported: it came
    first.
    """
    world_size = len(processes)
    results: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    while len(results) < world_size:
        pending = [rank for rank in range(world_size) if rank not in results]
        owners = {receivers[rank]: rank for rank in pending}
        owners.update({processes[rank].sentinel: rank for rank in pending})
        remaining = max(0.0, deadline - time.monotonic())
        ready = multiprocessing.connection.wait(list(owners), timeout=remaining)
        if not ready:
            raise TimeoutError(
                f"ranks {pending} of {world_size} ({backend}) did not finish within "
                f"{timeout} s; they were stopped"
            )
        raised, died = [], []
        for rank in sorted({owners[thing] for thing in ready}):
            message = _receive(receivers[rank])
            if message is None:  # the rank ended (or is ending) without a word
                processes[rank].join(timeout=5.0)
                died.append(rank)
            elif message[0]:
                results[rank] = pickle.loads(message[1])
            else:
                raised.append((rank, message[1]))
        if died:
            rank, code = died[0], processes[died[0]].exitcode
            killed = f" ({signal.strsignal(-code)})" if code is not None and code < 0 else ""
            raise WorkerError(
                f"rank {rank} of {world_size} ({backend}) exited with code {code}{killed} "
                "without an exception (os._exit, a signal or a crash); the other ranks were "
                "stopped"
            )
        if raised:
            rank, text = raised[0]
            raise WorkerError(f"rank {rank} of {world_size} ({backend}) raised:\n{text}")
    return [results[rank] for rank in range(world_size)]


def _receive(connection):
    """The message waiting in ``connection``, or ``None`` if its sender closed it without
    one (it died)."""
    try:
        return connection.recv() if connection.poll() else None
    except (EOFError, OSError):
        return None


def _worker(rank, fn, args, kwargs, world_size, backend, port, timeout, threads, connection):
    """One rank: join the group, call ``fn``, send back ``(ok, pickled result or traceback)``."""
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
        # Every rank past its set-up before any goes on: a rank whose fn returns at once
        # would otherwise leave (and close its connections) while another is still
        # connecting to it, which fails there with gloo's "Connection closed by peer".
        dist.barrier(device_ids=[rank] if backend == "nccl" else None)
        # Pickled here with the plain pickle: a tensor travels as bytes, not as shared
        # memory that would vanish with this process.
        message = (True, pickle.dumps(fn(rank, world_size, device, *args, **kwargs)))
    except BaseException:  # noqa: BLE001 (every failure goes back to the caller)
        message = (False, traceback.format_exc())
    try:
        connection.send(message)
    except OSError:  # the caller is gone
        pass
    connection.close()
    if message[0] and dist.is_initialized():
        dist.destroy_process_group()


def _stop(processes, grace: float = 5.0) -> None:
    """Wait up to ``grace`` seconds for the ranks to exit, then terminate, then kill the rest,
    and reap them all (even when interrupted while waiting)."""
    started = [process for process in processes if process.pid is not None]
    deadline = time.monotonic() + grace
    try:
        for process in started:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for process in started:
            if process.is_alive():
                process.terminate()
                process.join(timeout=2.0)
            if process.is_alive():
                process.kill()
                process.join()
