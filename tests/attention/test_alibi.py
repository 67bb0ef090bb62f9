"""ALiBi: the slopes of the paper, the bias, and Hugging Face's BLOOM code."""

from __future__ import annotations

import pytest
import torch

import mhbook

transformers = pytest.importorskip("transformers")
from transformers.models.bloom.modeling_bloom import (  # noqa: E402
    _get_alibi_slopes,
    build_alibi_tensor,
)


def test_slopes_of_the_paper():
    """Eight heads: 1/2, 1/4, ..., 1/256 (Press et al., 2022, section 3)."""
    assert mhbook.alibi_slopes(8).tolist() == [2.0**-i for i in range(1, 9)]
    assert mhbook.alibi_slopes(1).tolist() == [2.0**-8]


@pytest.mark.parametrize("num_heads", [1, 2, 3, 4, 5, 6, 8, 12, 16, 20])
def test_slopes_equal_bloom(num_heads):
    torch.testing.assert_close(
        mhbook.alibi_slopes(num_heads), _get_alibi_slopes(num_heads, torch.device("cpu"))
    )


def test_bias_is_minus_slope_times_distance():
    bias = mhbook.ALiBi(2)(torch.arange(3), torch.arange(4))
    assert bias.shape == (2, 3, 4) and bias.dtype == torch.float32
    assert bias[0].tolist() == [[0, -1 / 16, -2 / 16, -3 / 16],
                                [-1 / 16, 0, -1 / 16, -2 / 16],
                                [-2 / 16, -1 / 16, 0, -1 / 16]]  # fmt: skip
    torch.testing.assert_close(bias[1], bias[0] / 16)
    # Only the offset matters: shift every position, same bias.
    torch.testing.assert_close(mhbook.ALiBi(2)(torch.arange(3) + 50, torch.arange(4) + 50), bias)


def test_same_attention_as_bloom():
    """BLOOM adds slope * (key position), the same for every query: with a causal mask the
    softmax is the same as with -slope * (query - key), which differs by a constant per row."""
    num_heads, L = 6, 7
    scores = torch.randn(1, num_heads, L, L, generator=torch.Generator().manual_seed(0))
    causal = mhbook.causal_mask(L)
    theirs = build_alibi_tensor(torch.ones(1, L, dtype=torch.long), num_heads, torch.float32)
    ours = mhbook.ALiBi(num_heads)(torch.arange(L), torch.arange(L))

    def weights(bias):
        return torch.softmax((scores + bias).masked_fill(~causal, float("-inf")), dim=-1)

    torch.testing.assert_close(weights(ours), weights(theirs.view(1, num_heads, 1, L)))


def test_positions_per_sequence():
    """(batch, T) and (batch, S) positions: one (num_heads, T, S) bias per sequence, as with
    that sequence's (T,) and (S,) positions."""
    alibi = mhbook.ALiBi(4)
    q_positions = torch.tensor([[0, 1, 2], [5, 6, 7]])
    k_positions = torch.tensor([[0, 1, 2, 3], [3, 5, 6, 7]])
    bias = alibi(q_positions, k_positions)
    assert bias.shape == (2, 4, 3, 4)
    for b in range(2):
        assert torch.equal(bias[b], alibi(q_positions[b], k_positions[b]))
    # One row of positions for the whole batch on one side (the new queries of a cache
    # whose kept keys have positions per sequence): the same as that row expanded.
    row = q_positions[1]
    assert torch.equal(alibi(row, k_positions), alibi(row.expand(2, -1), k_positions))
    assert torch.equal(alibi(k_positions, row), alibi(k_positions, row.expand(2, -1)))


def test_on_the_meta_device():
    positions = torch.arange(5, device="meta")
    bias = mhbook.ALiBi(4)(positions, positions[:3], dtype=torch.float64)
    assert bias.device.type == "meta" and bias.shape == (4, 5, 3) and bias.dtype == torch.float64
    assert mhbook.alibi_slopes(4, device="meta").device.type == "meta"


def test_bad_inputs():
    with pytest.raises(ValueError, match="num_heads must be an int >= 1, got 0"):
        mhbook.ALiBi(0)
    alibi = mhbook.ALiBi(2)
    with pytest.raises(
        ValueError,
        match=r"k_positions must be a tensor of positions \(T,\) or \(batch, T\), got \(1, 1, 3\)",
    ):
        alibi(torch.arange(3), torch.arange(3)[None, None])
    with pytest.raises(
        ValueError, match=r"q_positions \(2, 3\) and k_positions \(1, 3\) must have the same batch"
    ):
        alibi(torch.arange(3).expand(2, -1), torch.arange(3)[None])
    with pytest.raises(TypeError, match="q_positions must hold integers"):
        alibi(torch.arange(3.0), torch.arange(3))
    with pytest.raises(ValueError, match="same device, got cpu and meta"):
        alibi(torch.arange(3), torch.arange(3, device="meta"))
