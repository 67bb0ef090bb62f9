"""Tensor-parallel attention (mhbook.distributed.tensor_parallel); the launcher itself is tested in
test_launch.py.

Single-process tests cut a ``MultiHeadAttention`` into the ranks' shares and add up their
partial outputs, as the all-reduce would. The two-process test starts 2 gloo ranks on the
CPU and compares the hand-written layer and PyTorch's DTensor version with the
single-process layer: output and gradients, float64. Every launch is bounded by a timeout.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import mhbook
from mhbook.distributed import launch, verify
from mhbook.distributed import tensor_parallel as parallel
from mhbook.distributed.tensor_parallel import TensorParallelMultiHeadAttention as TPAttention

pytestmark = pytest.mark.slow(seconds=30)  # starts gloo processes

TIGHT = {"rtol": 1e-12, "atol": 1e-12}  # float64
TIMEOUT = 240  # seconds for a whole two-process run, start-up included (a busy 2-core CI)


def _layer(d_model=16, num_heads=4, **kwargs):
    torch.manual_seed(0)
    return mhbook.MultiHeadAttention(d_model, num_heads, **kwargs).double()


def _simulated(mha, world_size, query, key, value, mask=None):
    """What the ranks compute together: the sum of their partial outputs, plus the bias."""
    shards = [TPAttention.from_module(mha, r, world_size) for r in range(world_size)]
    total = sum(s.partial_forward(query, key, value, mask) for s in shards)
    return total + mha.W_o.bias, shards


# -- slicing, in one process ---------------------------------------------------------------
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_partial_outputs_add_up_to_the_single_process_layer(world_size):
    mha = _layer()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    mask = mhbook.causal_mask(5)
    out, shards = _simulated(mha, world_size, x, x, x, mask)
    torch.testing.assert_close(out, mha(x, x, x, mask)[0], **TIGHT)
    torch.testing.assert_close(out, mha(x, mask=mask)[0], **TIGHT)  # the self-attention call
    for rank, shard in enumerate(shards):
        local = 4 // world_size
        assert shard.heads == slice(rank * local, (rank + 1) * local)
        assert shard.W_q.weight.shape == (local * 4, 16)
        assert shard.W_o.weight.shape == (16, local * 4)
        torch.testing.assert_close(
            shard.W_q.weight, mha.W_q.weight[rank * local * 4 :][: local * 4]
        )
        torch.testing.assert_close(
            shard.W_o.weight, mha.W_o.weight[:, rank * local * 4 :][:, : local * 4]
        )


def test_slicing_with_cross_attention_head_size_per_head_masks():
    """kdim/vdim, a d_head other than d_model / h, a mask per head and a head_mask."""
    mha = _layer(d_model=12, num_heads=6, d_head=5, kdim=7, vdim=9)
    mha.head_mask = torch.tensor([1.0, 0.0, 1.0, 0.5, 1.0, 0.0], dtype=torch.float64)
    query = torch.randn(3, 4, 12, dtype=torch.float64)
    key, value = (
        torch.randn(3, 6, 7, dtype=torch.float64),
        torch.randn(3, 6, 9, dtype=torch.float64),
    )
    mask = torch.rand(3, 6, 4, 6) > 0.3  # (batch, num_heads, Lq, Lk): each head its own
    out, shards = _simulated(mha, 3, query, key, value, mask)
    torch.testing.assert_close(out, mha(query, key, value, mask)[0], **TIGHT)
    assert [tuple(s.head_mask.tolist()) for s in shards] == [(1.0, 0.0), (1.0, 0.5), (1.0, 0.0)]


def test_unshard_restores_the_parameters():
    mha = _layer(d_model=12, num_heads=6, kdim=5)
    shards = [TPAttention.from_module(mha, r, 3).state_dict() for r in range(3)]
    whole = parallel.unshard(shards)
    assert whole.keys() == dict(mha.named_parameters()).keys()
    for name, tensor in mha.named_parameters():
        assert torch.equal(whole[name], tensor), name


def test_world_size_one_is_the_single_process_layer_without_a_process_group():
    assert not dist.is_initialized()
    mha = _layer()
    tp = TPAttention.from_module(mha, 0, 1)
    x1 = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    tp(x1, x1, x1)[0].sum().backward()
    mha(x2, x2, x2)[0].sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, **TIGHT)
    for (name, p), (_, q) in zip(tp.named_parameters(), mha.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TIGHT, msg=name)
    assert parallel.gather_full(tp, grads=True).keys() == dict(mha.named_parameters()).keys()


def test_shares_are_copies_on_the_layers_device_and_dtype():
    mha = _layer()
    tp = TPAttention.from_module(mha, 1, 2)
    assert tp.W_q.weight.dtype == torch.float64
    with torch.no_grad():
        tp.W_q.weight.zero_()
    assert mha.W_q.weight.abs().sum() > 0  # the single-process layer is untouched
    assert "heads 2..3 of 4, rank=1, world_size=2" in repr(tp)


def test_meta_device():
    with torch.device("meta"):
        mha = mhbook.MultiHeadAttention(16, 4)
        x = torch.empty(2, 5, 16)
    shard = TPAttention.from_module(mha, 1, 2)
    assert shard.W_q.weight.device.type == "meta"
    out = shard.partial_forward(x, x, x, mhbook.causal_mask(5, device=x.device))
    assert out.device.type == "meta" and out.shape == (2, 5, 16)
    alone = TPAttention.from_module(mha, 0, 1)
    assert alone(x, x, x)[0].device.type == "meta"


def test_clear_errors():
    mha = _layer(d_model=12, num_heads=6)
    with pytest.raises(
        ValueError, match=r"num_heads must be divisible by world_size.*num_heads=6, world_size=4"
    ):
        TPAttention.from_module(mha, 0, 4)
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 3\), got 3"):
        TPAttention.from_module(mha, 3, 3)
    with pytest.raises(TypeError, match="expected mhbook.MultiHeadAttention, got Linear"):
        TPAttention.from_module(torch.nn.Linear(2, 2), 0, 2)
    with pytest.raises(ValueError, match="world_size must be an int >= 1, got 0"):
        parallel.head_slice(4, 0, 0)
    with pytest.raises(ValueError, match="num_heads must be divisible by world_size"):
        parallel.layer_cost(1, 8, 12, 6, 4)
    tp = TPAttention.from_module(mha, 0, 2)
    with pytest.raises(ValueError, match=r"query must have shape \(batch, length, d_model=12\)"):
        tp(torch.randn(2, 3, 10, dtype=torch.float64), *[torch.randn(2, 3, 12)] * 2)


def test_layer_cost_is_counted_from_the_shapes():
    cost = parallel.layer_cost(2, 6, 16, 4, 2, bytes_per_element=8)
    projections = 4 * 2 * 2 * 6 * 16 * 16
    products = 2 * 2 * 2 * 4 * 6 * 6 * 4
    assert cost["flops_forward"] == projections + products == 29_184
    assert cost["flops_backward_per_rank"] == 29_184
    assert cost["allreduce_bytes"] == 2 * 6 * 16 * 8 == 1536
    assert cost["ring_bytes_sent_per_rank"] == 1536  # 2 (p - 1) / p = 1 for p = 2
    assert parallel.layer_cost(1, 4, 8, 8, 8)["ring_bytes_sent_per_rank"] == 2 * 7 * 128 // 8
    assert parallel.layer_cost(1, 4, 8, 2, 1)["allreduces_forward"] == 0
    table = parallel.cost_table(
        {"tiny": dict(batch=2, length=6, d_model=16, num_heads=4, world_size=2)}
    )
    assert "tiny" in table and "14,592" in table


# -- two processes ---------------------------------------------------------------------------
def check_all(rank, world_size, device):
    """Every case in one start-up: hand-written and DTensor, self- and cross-attention."""
    return {
        (api, cross): verify.check_tensor_parallel(rank, world_size, device, api, cross=cross)
        for api in ("by hand", "dtensor")
        for cross in (False, True)
    }


def test_two_gloo_processes_equal_the_single_process_layer():
    ranks = launch.run(check_all, world_size=2, backend="gloo", timeout=TIMEOUT)
    for rank, results in enumerate(ranks):
        for (api, cross), result in results.items():
            assert result["rank"] == rank and result["backend"] == "gloo", result
            assert result["heads"] == (2 * rank, 2 * rank + 1)
            inputs = 2 if cross else 1
            assert len(result["max_diff"]) == 1 + inputs + 8  # output, inputs, 8 parameters
            for what, diff in result["max_diff"].items():
                assert diff < 1e-12, (api, cross, rank, what, diff)
            collectives = result["collectives"]
            if api == "by hand":
                # One all-reduce of the output forward; backward one per distinct input.
                (forward,) = collectives["forward"]
                assert forward == parallel.Collective(
                    "all_reduce", "forward", (2, 6, 16), "float64", 1536
                )
                shapes = sorted(c.shape for c in collectives["backward"])
                assert shapes == ([(2, 6, 16), (2, 8, 12)] if cross else [(2, 6, 16)])
            else:
                assert collectives["forward"] == 1 and collectives["backward"] >= 1
