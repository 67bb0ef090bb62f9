"""The grader's own tests for ``mhbook.check.encodings``: the sinusoidal encoding (the other
correct implementations, run by ``test_catalogue.py``, and what is special here)."""

from __future__ import annotations

import math

import torch
from grading import by_transformers, corrupt

from mhbook import check


def sinusoidal_annotated(num_positions, d_model):
    """Another correct table, in float32: the frequencies as exp(-2i log(10000) / d), as
    the Annotated Transformer writes them."""
    P = torch.zeros(num_positions, d_model)
    position = torch.arange(num_positions).unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    P[:, 0::2] = torch.sin(position * div)
    P[:, 1::2] = torch.cos(position * div)
    return P


def sinusoidal_loops(num_positions, d_model, offset=0):
    """Another correct table, in float64, with an offset: two Python loops."""
    P = torch.zeros(num_positions, d_model, dtype=torch.float64)
    for t in range(num_positions):
        for j in range(0, d_model, 2):
            angle = (offset + t) / 10000 ** (j / d_model)
            P[t, j], P[t, j + 1] = math.sin(angle), math.cos(angle)
    return P


def sinusoidal_stacked(num_positions, d_model):
    """Another correct table: sin and cos stacked on a last axis, then flattened."""
    angles = torch.outer(
        torch.arange(num_positions, dtype=torch.float64),
        torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model),
    )
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)


@by_transformers
def sinusoidal_marian(num_positions, d_model):
    """transformers' own Marian table (``MarianSinusoidalPositionalEmbedding``: sines in the
    first half of the features, cosines in the second), interleaved back."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    halves = MarianSinusoidalPositionalEmbedding(num_positions, d_model).create_weight()
    sines, cosines = halves[:, : d_model // 2], halves[:, d_model // 2 :]
    return torch.stack([sines, cosines], dim=-1).flatten(-2)


ALTERNATIVES = {
    "sinusoidal": (sinusoidal_annotated, sinusoidal_loops, sinusoidal_stacked, sinusoidal_marian)
}


def test_nan_shape_and_another_dtype_never_pass():
    reference = check.sinusoidal.spec.reference
    for how, word in (("nan", "NaN"), ("shape", "wrong shape")):
        result = check.sinusoidal(corrupt(reference, how))
        assert not result and word in result.report(), result.report()
    for dtype in (torch.float16, torch.bfloat16, torch.int64):
        result = check.sinusoidal(lambda n, d, dtype=dtype: reference(n, d).to(dtype))
        assert not result and "wrong dtype" in result.report(), result.report()


def test_a_float32_or_float64_table_passes_and_an_offset_is_used_when_taken():
    reference = check.sinusoidal.spec.reference
    assert check.sinusoidal(lambda n, d: reference(n, d).float())
    result = check.sinusoidal(sinusoidal_loops)
    assert result and "Skipped" not in result.report()
    ignores_offset = check.sinusoidal(lambda n, d, offset=0: reference(n, d))
    assert not ignores_offset and "offset = 3" in ignores_offset.report()
