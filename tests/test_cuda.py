"""The GPU path: run with ``pytest -m cuda`` on a machine with a CUDA device.

Every test here is marked ``cuda`` and skipped without a CUDA device (the CI machines have
none). They check what only a GPU can: PyTorch's CUDA attention kernels against mhbook's
explicit path, the guard that keeps a fully masked query row at zero on every fused
backend, float16 and bfloat16, and the KV cache on the device.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mhbook

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = torch.device("cuda")


def _randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator(device=CUDA).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=CUDA, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_equals_explicit_with_a_fully_masked_row(dtype):
    """Whatever backend PyTorch picks on the GPU, a query with no key gives 0, never NaN,
    and the other rows agree with the explicit path."""
    q, k, v = (_randn(2, 4, 6, 32, dtype=dtype, seed=s).requires_grad_() for s in (1, 2, 3))
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool, device=CUDA).tril()
    mask[:, :, 2] = False  # query 2 may attend to nothing
    fused, _ = mhbook.attend(q, k, v, mask)
    explicit, _ = mhbook.attend(q, k, v, mask, need_weights=True)
    assert torch.isfinite(fused).all() and (fused[:, :, 2] == 0).all()
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(fused, explicit, atol=tolerance, rtol=tolerance)
    fused.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding"])
@pytest.mark.parametrize("num_queries", [6, 1], ids=["queries", "decoding-step"])
def test_grouped_query_attention_on_cuda_equals_the_explicit_path(dtype, masked, num_queries):
    """Shared key/value heads on the GPU: with several queries mhbook passes enable_gqa only
    where FlashAttention takes it and copies the heads elsewhere (no warning from PyTorch);
    a decoding step keeps them shared. Equal to the explicit path."""
    import warnings

    q = _randn(2, 8, num_queries, 32, dtype=dtype, seed=1)
    k, v = (_randn(2, 2, 6, 32, dtype=dtype, seed=s) for s in (2, 3))
    mask = mhbook.padding_mask(torch.tensor([6, 3], device=CUDA), 6) if masked else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fused, _ = mhbook.attend(q, k, v, mask)
        torch.cuda.synchronize()
    if num_queries > 1:
        assert not caught, [str(w.message) for w in caught]
    explicit, _ = mhbook.attend(q, k, v, mask, need_weights=True)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(fused, explicit, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention_equals_pytorch_on_cuda(need_weights):
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(64, 8, batch_first=True, device=CUDA)
    ours = mhbook.attention_from_torch(theirs)
    x, memory = _randn(3, 5, 64, seed=1), _randn(3, 7, 64, seed=2)
    valid_lens = torch.tensor([7, 4, 2], device=CUDA)
    mask = mhbook.padding_mask(valid_lens, 7)
    out, _ = ours(x, memory, memory, mask, need_weights=need_weights)
    expected, _ = theirs(x, memory, memory, key_padding_mask=~mask[:, 0, 0], need_weights=False)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def test_float16_model_records_attention_without_nan():
    torch.manual_seed(0)
    config = mhbook.ModelConfig(d_model=32, num_heads=4, num_layers=2, d_ff=64)
    model = mhbook.Transformer(config, 20, 20).to(CUDA, torch.float16).eval()
    src = torch.randint(4, 20, (3, 6), device=CUDA)
    tgt = torch.randint(4, 20, (3, 5), device=CUDA)
    with torch.no_grad(), mhbook.record_attention(model) as recorded:
        logits = model(src, tgt, torch.tensor([6, 4, 2], device=CUDA))
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(w).all() for w in recorded().values())


def test_greedy_generate_with_and_without_cache_on_cuda():
    torch.manual_seed(0)
    config = mhbook.ModelConfig(d_model=32, num_heads=4, num_layers=2, d_ff=64)
    model = mhbook.Transformer(config, 20, 20).to(CUDA).eval()
    src = torch.randint(4, 20, (4, 7), device=CUDA)
    valid_lens = torch.tensor([7, 5, 3, 1], device=CUDA)
    cached = model.generate(src, valid_lens, 12, bos_id=1, eos_id=2, use_cache=True)
    uncached = model.generate(src, valid_lens, 12, bos_id=1, eos_id=2, use_cache=False)
    assert cached.device.type == "cuda"
    assert torch.equal(cached, uncached)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.parametrize("api", ["by hand", "dtensor"])
def test_tensor_parallel_attention_on_two_gpus_with_nccl(api):
    """Heads split over 2 GPUs (mhbook.distributed.tensor_parallel) on NCCL: equal to one GPU,
    forward and
    gradients, in float64."""
    from mhbook.distributed import launch, verify

    for cross in (False, True):
        ranks = launch.run(
            verify.check_tensor_parallel, api, world_size=2, timeout=300, cross=cross
        )
        for rank, result in enumerate(ranks):
            assert result["backend"] == "nccl" and result["rank"] == rank
            for what, diff in result["max_diff"].items():
                assert diff < 1e-10, (api, cross, rank, what, diff)
