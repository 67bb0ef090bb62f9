"""The small layers: the sinusoidal positional encoding against its formula, and
AddNorm's dropout, which belongs on the sublayer's branch, never on the residual."""

from __future__ import annotations

import math

import pytest
import torch

import mhbook


def test_sinusoidal_encoding_follows_the_formula():
    """``P[t, 2i] = sin(t / 10000^(2i/d))``, ``P[t, 2i+1] = cos(t / 10000^(2i/d))``,
    written out with the math module."""
    num_positions, d_model, offset = 7, 10, 3
    P = mhbook.sinusoidal_encoding(num_positions, d_model, offset=offset, dtype=torch.float64)
    assert P.shape == (num_positions, d_model) and P.dtype == torch.float64
    for row in range(num_positions):
        t = offset + row
        for i in range(d_model // 2):
            angle = t / 10000 ** (2 * i / d_model)
            assert P[row, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert P[row, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_sinusoidal_encoding_row_0_and_offset():
    P = mhbook.sinusoidal_encoding(5, 8)
    assert torch.equal(P[0], torch.tensor([0.0, 1.0] * 4))  # sin 0 = 0, cos 0 = 1
    assert torch.equal(mhbook.sinusoidal_encoding(2, 8, offset=3), P[3:5])


class _Constant(torch.nn.Module):
    """A sublayer whose output does not depend on its input."""

    def __init__(self, value: float):
        super().__init__()
        self.value = value

    def forward(self, x):
        return torch.full_like(x, self.value)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_addnorm_dropout_never_touches_the_residual(norm_first):
    """With a sublayer that returns zeros the residual passes unchanged, whatever the
    dropout: post-norm gives exactly LayerNorm(x), pre-norm exactly x."""
    torch.manual_seed(0)
    addnorm = mhbook.AddNorm(16, dropout=0.5, norm_first=norm_first).train()
    x = torch.randn(4, 5, 16)
    out = addnorm(x, _Constant(0.0))
    expected = x if norm_first else addnorm.norm(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_addnorm_dropout_is_on_the_sublayer_branch():
    """Pre-norm: ``out - x`` is the sublayer's output c, dropped (0) or scaled (2c)."""
    torch.manual_seed(0)
    addnorm = mhbook.AddNorm(16, dropout=0.5, norm_first=True).train()
    x = torch.randn(8, 5, 16)
    branch = addnorm(x, _Constant(3.0)) - x
    dropped = branch.abs() < 1e-5
    kept = (branch - 6.0).abs() < 1e-5
    assert (dropped | kept).all()
    assert 0.4 < dropped.float().mean() < 0.6
    addnorm.eval()  # and no dropout in eval mode
    torch.testing.assert_close(addnorm(x, _Constant(3.0)) - x, torch.full_like(x, 3.0))
