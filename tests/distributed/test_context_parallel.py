"""Context parallelism (``mhbook.distributed.context_parallel``): the sequence split across
processes.

Ulysses and ring attention, each on 4 gloo processes (so that the ring makes three passes
and Ulysses' all-to-alls split four ways), must equal the single-process
``MultiHeadAttention`` in float64, and each rank must send exactly the bytes that
``context_parallel_bytes`` gives. Chapter 13 runs both on 2 processes.
"""

from __future__ import annotations

import pytest
import torch

from mhbook.distributed import launch
from mhbook.distributed.context_parallel import context_parallel_bytes, ulysses_attention
from mhbook.distributed.verify import check_context_parallel

pytestmark = pytest.mark.slow(seconds=25)  # starts 4 processes twice


@pytest.mark.parametrize("method", ["ulysses", "ring"])
def test_four_ranks_equal_one_process(method):
    ranks = launch.run(check_context_parallel, method, world_size=4, timeout=180, length=8)
    assert [r["tokens"] for r in ranks] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert max(r["max_diff"] for r in ranks) < 1e-12, [r["max_diff"] for r in ranks]
    want = context_parallel_bytes(2, 8, 16, 4, bytes_per_element=8)[method]
    assert [sum(nbytes for _, nbytes in r["sent"]) for r in ranks] == [want] * 4
    if method == "ring":  # three passes of a rank's keys and values
        assert [what for what, _ in ranks[0]["sent"]] == ["k, v"] * 3
    else:  # q, k, v into head shards and the output back
        assert [what for what, _ in ranks[0]["sent"]] == ["q", "k", "v", "output"]


def test_bytes_from_the_shapes():
    cost = context_parallel_bytes(1, 8192, 4096, 8, bytes_per_element=2)
    n = 8192 * 4096 * 2
    assert cost == {"megatron": 2 * 7 * n // 8, "ulysses": 4 * 7 * n // 64, "ring": 7 * 2 * n // 8}
    assert context_parallel_bytes(2, 6, 16, 2, 8) == {
        "megatron": 1536,
        "ulysses": 1536,
        "ring": 1536,
    }


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="method must be one of"):
        check_context_parallel(0, 2, torch.device("cpu"), "zigzag")
    with pytest.raises(ValueError, match=r"length \(7\) must be a multiple of world_size \(2\)"):
        check_context_parallel(0, 2, torch.device("cpu"), "ring", length=7)
    with pytest.raises(ValueError, match=r"length \(6\) must be a multiple of world_size \(4\)"):
        context_parallel_bytes(1, 6, 16, 4)
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        context_parallel_bytes(1, 8, 16, 0)


def test_ulysses_needs_heads_divisible(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    q = torch.zeros(1, 6, 2, 4)
    with pytest.raises(
        ValueError, match=r"num_heads \(6\) must be a multiple of the world size \(4\)"
    ):
        ulysses_attention(q, q, q)
