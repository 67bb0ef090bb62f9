"""The small layers: the sinusoidal positional encoding against its formula, and
AddNorm's dropout, which belongs on the sublayer's branch, never on the residual."""

from __future__ import annotations

import math

import pytest
import torch

import mhbook
from mhbook.models.layers import Dropout


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


# -- dropout: F.dropout's distribution, and no op where it would do nothing -------------------
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_zeroes_a_fraction_p_and_scales_the_rest(p):
    """Each value is kept with probability 1 - p and then scaled by exactly 1 / (1 - p);
    the gradient is the same noise (0 or 1 / (1 - p)). Like F.dropout."""
    torch.manual_seed(0)
    dropout = Dropout(p).train()
    x = (torch.rand(200, 500) + 1).requires_grad_()  # in [1, 2): never 0 by chance
    out = dropout(x)
    kept = out != 0
    scale = torch.ones(()).div_(1 - p)  # 1 / (1 - p) in float32, as F.dropout has it
    torch.testing.assert_close(out[kept], x[kept] * scale, rtol=0, atol=0)
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005  # 100 000 draws: 5 sigma
    out.sum().backward()
    torch.testing.assert_close(x.grad, kept * scale, rtol=0, atol=0)
    mean = dropout(torch.ones(100_000)).mean().item()
    assert abs(mean - 1) < 0.02  # the expected value is kept


def test_dropout_does_nothing_in_eval_mode_or_with_p_0():
    """``x`` itself comes back, and no random number is drawn."""
    x = torch.randn(3, 4)
    state = torch.get_rng_state()
    assert Dropout(0.5).eval()(x) is x
    assert Dropout(0.0).train()(x) is x
    assert torch.equal(torch.get_rng_state(), state)
    all_dropped = Dropout(1.0).train()(x)
    assert torch.equal(all_dropped, torch.zeros_like(x))


def test_dropout_is_seeded_by_the_global_generator():
    dropout = Dropout(0.3).train()
    x = torch.randn(5, 6)
    torch.manual_seed(1)
    a = dropout(x)
    torch.manual_seed(1)
    assert torch.equal(a, dropout(x))
    assert isinstance(dropout, torch.nn.Dropout) and repr(dropout) == repr(torch.nn.Dropout(0.3))


# -- the positional encoding's table, kept between calls ------------------------------------
def test_positional_encoding_keeps_its_table_and_adds_the_right_rows():
    pe = mhbook.PositionalEncoding(8).eval()
    x = torch.zeros(2, 3, 8)
    torch.testing.assert_close(pe(x), mhbook.sinusoidal_encoding(3, 8).expand(2, 3, 8))
    table = pe._table
    assert table.shape == (3, 8)
    torch.testing.assert_close(
        pe(x[:, :2], offset=1), mhbook.sinusoidal_encoding(3, 8)[1:].expand(2, 2, 8)
    )
    assert pe._table is table  # no new table for positions it holds
    torch.testing.assert_close(pe(x[:1, :1], offset=6), mhbook.sinusoidal_encoding(1, 8, 6)[None])
    assert pe._table.shape == (7, 8)  # grew: at least the 7 positions needed
    P64 = mhbook.sinusoidal_encoding(2, 8, dtype=torch.float64)  # not float32's, widened
    assert torch.equal(pe(torch.zeros(1, 2, 8, dtype=torch.float64)), P64[None])
    on_meta = torch.zeros(1, 2, 8, dtype=torch.float64, device="meta")  # same dtype, new device
    assert pe(on_meta).device.type == "meta"
    assert "_table" not in pe.state_dict() and not list(pe.buffers())


def test_positional_encoding_rows_do_not_depend_on_the_table_length():
    """A longer table gives bit-for-bit the same rows, so caching changes no result."""
    short = mhbook.sinusoidal_encoding(5, 16)
    assert torch.equal(mhbook.sinusoidal_encoding(300, 16)[:5], short)
    assert torch.equal(
        mhbook.sinusoidal_encoding(64, 16)[3:5], mhbook.sinusoidal_encoding(2, 16, 3)
    )


@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_rms_norm_equals_hugging_face_and_pytorch(eps):
    """mhbook.RMSNorm equals transformers' LlamaRMSNorm bit for bit (both compute in float32),
    and PyTorch's nn.RMSNorm on float32 input; a large eps shows that eps is used."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    ours, theirs = mhbook.RMSNorm(16, eps=eps), LlamaRMSNorm(16, eps=eps)
    torch_norm = torch.nn.RMSNorm(16, eps=eps)
    with torch.no_grad():
        for norm in (ours, theirs, torch_norm):
            norm.weight.copy_(torch.linspace(0.5, 2.0, 16))
    x = torch.randn(3, 5, 16) * 0.3
    assert torch.equal(ours(x), theirs(x))
    torch.testing.assert_close(ours(x), torch_norm(x), rtol=1e-6, atol=1e-6)
    x64 = x.double()
    assert ours(x64).dtype == torch.float64 and torch.equal(
        ours.double()(x64), theirs.double()(x64)
    )
