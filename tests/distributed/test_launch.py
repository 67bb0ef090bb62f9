"""The process launcher, mhbook.distributed.launch: its argument checks, the errors it raises for a
rank
that fails, and that no rank outlives :func:`mhbook.distributed.launch.run`, whichever way it ends.

The ranks run small functions defined here, at the top level, so that ``spawn`` can import
them; each launch is bounded by a timeout and costs a second or two of start-up.
"""

from __future__ import annotations

import errno
import math
import multiprocessing.context
import os
import signal
import time

import pytest
import torch.distributed as dist
import torch.multiprocessing

from mhbook.distributed import launch, verify

pytestmark = pytest.mark.slow(seconds=40)  # starts processes

TIMEOUT = 120  # seconds for a launch that should end by itself (a busy 2-core CI)


def act(rank, world_size, device, *actions):
    """Do ``actions[rank]``: ``"raise"`` a ValueError, ``"exit"`` with code 3 and no
    exception, be ``"kill"``-ed, ``"sleep"`` for a minute, wait in a ``"barrier"``, or
    ``"return"``; then return this process's PID."""
    action = actions[rank]
    if action == "raise":
        raise ValueError(f"rank {rank} fails on purpose")
    if action == "exit":
        os._exit(3)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "sleep":
        time.sleep(60)
    if action == "barrier":
        dist.barrier()
    return os.getpid()


@pytest.fixture
def started(monkeypatch) -> list[int]:
    """The PIDs of the processes that ``run`` starts, noted as each starts (whether or not
    it gets as far as calling ``fn``)."""
    pids = []
    start = multiprocessing.context.SpawnProcess.start

    def start_and_note(process):
        start(process)
        pids.append(process.pid)

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", start_and_note)
    return pids


def _still_running(pids: list[int]) -> list[int]:
    """Those of ``pids`` whose process still exists; they are killed now, so that a failing
    test leaves nothing behind."""
    assert pids, "no process was started"
    running = []
    for pid in pids:
        try:
            os.kill(pid, 0)  # no signal: only asks whether the process exists
        except ProcessLookupError:
            continue
        running.append(pid)
        os.kill(pid, signal.SIGKILL)
    return running


@pytest.mark.parametrize(
    "actions, error, match, timeout",
    [
        (("return", "return"), None, None, TIMEOUT),
        (("sleep", "raise"), launch.WorkerError, r"rank 1 of 2 \(gloo\) raised", TIMEOUT),
        (("sleep", "exit"), launch.WorkerError, r"rank 1 of 2 \(gloo\) exited", TIMEOUT),
        (("barrier", "sleep"), TimeoutError, r"ranks \[0, 1\] of 2 \(gloo\) did not finish", 10),
    ],
    ids=["return", "rank raises", "rank exits", "timeout"],
)
def test_no_rank_outlives_run(started, actions, error, match, timeout):
    """Whether the ranks return, one raises, one dies or one hangs, when ``run`` is back
    every rank's process is gone (stopped and reaped), and soon."""
    start = time.monotonic()
    if error is None:
        assert launch.run(act, *actions, world_size=2, backend="gloo", timeout=timeout) == started
    else:
        with pytest.raises(error, match=match):
            launch.run(act, *actions, world_size=2, backend="gloo", timeout=timeout)
    assert _still_running(started) == []
    assert time.monotonic() - start < timeout + 15  # stopped, not waited for


def test_no_rank_outlives_a_failed_start(started, monkeypatch):
    """Rank 1 cannot start (the system refuses a process, say): rank 0, already started and
    on its way to the rendezvous, is stopped before the error reaches the caller."""
    start = multiprocessing.context.SpawnProcess.start  # the one that notes the PIDs

    def start_only_one(process):
        if started:
            raise OSError(errno.EAGAIN, "no more processes (made up by the test)")
        start(process)

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", start_only_one)
    with pytest.raises(OSError, match="made up by the test"):
        launch.run(act, "return", "return", world_size=2, backend="gloo", timeout=5)
    assert len(started) == 1
    assert _still_running(started) == []


@pytest.mark.parametrize(
    "death, how", [("exit", "with code 3"), ("kill", "with code -9 (Killed)")], ids=["exit", "kill"]
)
def test_a_rank_that_dies_is_named_with_its_exit_code(started, death, how):
    """Rank 1 exits with code 3 (or is killed); rank 0, waiting for it in a barrier, then
    fails in gloo. The error names rank 1 and its exit code, not rank 0's consequence."""
    with pytest.raises(launch.WorkerError) as caught:
        launch.run(act, "barrier", death, world_size=2, backend="gloo", timeout=TIMEOUT)
    message = str(caught.value)
    assert message.startswith(f"rank 1 of 2 (gloo) exited {how} without an exception"), message
    assert _still_running(started) == []


def test_run_raises_a_workers_exception_with_its_traceback():
    with pytest.raises(launch.WorkerError, match=r"(?s)rank \d of 2 \(gloo\) raised.*api must be"):
        launch.run(
            verify.check_tensor_parallel,
            "nonsense",
            world_size=2,
            backend="gloo",
            timeout=TIMEOUT,
        )


BAD_ARGUMENTS = [
    ("timeout", 0, ValueError, r"timeout must be a number in \(0.0, inf\), got 0$"),
    ("timeout", -5, ValueError, r"timeout must be .*, got -5$"),
    ("timeout", math.nan, ValueError, r"timeout must be .*, got nan$"),
    ("timeout", math.inf, ValueError, r"timeout must be .*, got inf$"),
    ("timeout", "10", ValueError, r"timeout must be .*, got '10'$"),
    ("timeout", True, ValueError, r"timeout must be .*, got True$"),
    ("world_size", 0, ValueError, r"world_size must be an int >= 1, got 0 \(int\)$"),
    ("world_size", 2.0, ValueError, r"world_size must be an int >= 1, got 2.0 \(float\)$"),
    ("world_size", True, ValueError, r"world_size must be an int >= 1, got True \(bool\)$"),
    ("threads", 0, ValueError, r"threads must be an int >= 1, got 0 \(int\)$"),
    ("backend", "mpi", ValueError, r"backend must be 'gloo', 'nccl' or None, got 'mpi'$"),
    ("fn", 3, TypeError, r"fn must be a function, got int 3$"),
]


@pytest.mark.parametrize(
    "name, value, error, match", BAD_ARGUMENTS, ids=[f"{n}={v!r}" for n, v, *_ in BAD_ARGUMENTS]
)
def test_bad_arguments_are_refused_before_anything_starts(monkeypatch, name, value, error, match):
    """A clear error naming the argument, what it must be and what it is, and no store or
    process started (both would fail the test here)."""

    def must_not_start(*args, **kwargs):
        raise AssertionError("run started something before checking its arguments")

    monkeypatch.setattr(dist, "TCPStore", must_not_start)
    monkeypatch.setattr(torch.multiprocessing, "get_context", must_not_start)
    arguments = {"fn": verify.check_tensor_parallel, "backend": "gloo", name: value}
    with pytest.raises(error, match=match):
        launch.run(arguments.pop("fn"), **arguments)


def test_run_rejects_functions_that_spawn_cannot_import():
    def local(rank, world_size, device):
        return rank

    with pytest.raises(ValueError, match="importable module"):
        launch.run(local, world_size=2)
