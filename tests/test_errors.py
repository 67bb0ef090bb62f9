"""Bad input raises ValueError or TypeError, and the message names both what was
expected and what was given."""

from __future__ import annotations

import re

import pytest
import torch

import mhbook

D_MODEL, NUM_HEADS = 8, 2


def shapes(*parts: str) -> str:
    """A regex that matches the message when it contains every part, in any order."""
    return "".join(f"(?=.*{re.escape(p)})" for p in parts)


@pytest.fixture
def mha():
    torch.manual_seed(0)
    return mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS)


@pytest.fixture
def model():
    torch.manual_seed(0)
    return mhbook.Transformer(mhbook.ModelConfig(D_MODEL, NUM_HEADS, 1, 16), 11, 13)


def x(*shape):
    return torch.randn(*shape)


def test_d_model_not_divisible_by_num_heads():
    with pytest.raises(ValueError, match=shapes("divisible", "d_model=10", "num_heads=3")):
        mhbook.MultiHeadAttention(10, 3)


# -- masks -------------------------------------------------------------------------------
def test_mask_of_wrong_shape(mha):
    mask = torch.ones(2, 5, dtype=torch.bool)  # should broadcast to (2, 2, 3, 4)
    with pytest.raises(ValueError, match=shapes("(2, 5)", "(2, 2, 3, 4)")):
        mha(x(2, 3, D_MODEL), x(2, 4, D_MODEL), x(2, 4, D_MODEL), mask)


def test_mask_of_wrong_shape_explicit_attention():
    mask = torch.ones(3, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=shapes("(3, 3)", "(2, 3, 4)")):
        mhbook.scaled_dot_product_attention(x(2, 3, 8), x(2, 4, 8), x(2, 4, 8), mask)


@pytest.mark.parametrize("bad_dtype", [torch.float32, torch.int64, torch.uint8])
def test_mask_of_wrong_dtype(mha, bad_dtype):
    mask = torch.ones(2, 1, 1, 4, dtype=bad_dtype)
    with pytest.raises(TypeError, match=shapes("torch.bool", str(bad_dtype))):
        mha(x(2, 3, D_MODEL), x(2, 4, D_MODEL), x(2, 4, D_MODEL), mask)
    with pytest.raises(TypeError, match=shapes("torch.bool", str(bad_dtype))):
        mhbook.scaled_dot_product_attention(x(2, 3, 8), x(2, 4, 8), x(2, 4, 8), mask)


def test_mask_not_a_tensor(mha):
    with pytest.raises(TypeError, match=shapes("torch.bool", "list")):
        mha(x(2, 3, D_MODEL), x(2, 3, D_MODEL), x(2, 3, D_MODEL), [[True] * 3] * 3)


def test_padding_mask_valid_lens_of_wrong_shape():
    with pytest.raises(ValueError, match=shapes("(batch,)", "(2, 3, 4)")):
        mhbook.padding_mask(torch.ones(2, 3, 4, dtype=torch.long), 4)
    with pytest.raises(TypeError, match="list"):
        mhbook.padding_mask([1, 2], 4)


def test_causal_mask_with_fewer_keys_than_queries():
    with pytest.raises(
        ValueError, match=shapes("num_keys >= num_queries", "num_queries=4", "num_keys=2")
    ):
        mhbook.causal_mask(4, 2)


# -- batch sizes ---------------------------------------------------------------------------
def test_query_and_key_batch_sizes_differ(mha):
    with pytest.raises(ValueError, match=shapes("batch", "(2, 3, 8)", "(3, ")):
        mha(x(2, 3, D_MODEL), x(3, 4, D_MODEL), x(3, 4, D_MODEL))


def test_query_and_key_batch_dims_differ_explicit_attention():
    with pytest.raises(ValueError, match=shapes("batch", "(2, 3, 8)", "(5, 4, 8)")):
        mhbook.scaled_dot_product_attention(x(2, 3, 8), x(5, 4, 8), x(5, 4, 8))


def test_src_and_tgt_in_batch_sizes_differ(model):
    src = torch.zeros(2, 5, dtype=torch.long)
    tgt_in = torch.zeros(3, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=shapes("batch", "(2, 5)", "(3, 4)")):
        model(src, tgt_in, torch.tensor([5, 5]))


def test_src_valid_lens_of_wrong_shape(model):
    src = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=shapes("(2,)", "(3,)")):
        model(src, torch.zeros(2, 4, dtype=torch.long), torch.tensor([5, 5, 5]))
    with pytest.raises(ValueError, match=shapes("(2,)", "(2, 1)")):
        model.greedy_decode(src, torch.tensor([[5], [5]]), 1, 2, 3)


def test_memory_and_tgt_batch_sizes_differ(model):
    with pytest.raises(ValueError, match=shapes("batch", "(2, 4)", "(3, 5, 8)")):
        model.decoder(torch.zeros(2, 4, dtype=torch.long), x(3, 5, D_MODEL))


# -- feature sizes and lengths --------------------------------------------------------
def test_wrong_feature_size(mha):
    with pytest.raises(ValueError, match=shapes("d_model=8", "(2, 3, 7)")):
        mha(x(2, 3, 7), x(2, 3, D_MODEL), x(2, 3, D_MODEL))
    with pytest.raises(ValueError, match=shapes("d_model=8", "(2, 4, 6)")):
        mha(x(2, 3, D_MODEL), x(2, 4, 6), x(2, 4, D_MODEL))


def test_wrong_number_of_dimensions(mha):
    with pytest.raises(ValueError, match=shapes("(batch, length, d_model=8)", "(3, 8)")):
        mha(x(3, D_MODEL), x(3, D_MODEL), x(3, D_MODEL))


def test_query_key_feature_sizes_differ_explicit_attention():
    with pytest.raises(ValueError, match=shapes("(2, 3, 8)", "(2, 4, 6)")):
        mhbook.scaled_dot_product_attention(x(2, 3, 8), x(2, 4, 6), x(2, 4, 6))


def test_key_and_value_lengths_differ(mha):
    with pytest.raises(ValueError, match=shapes("Lk", "(2, 5, 8)", "(2, 4, 8)")):
        mha(x(2, 3, D_MODEL), x(2, 5, D_MODEL), x(2, 4, D_MODEL))
    with pytest.raises(ValueError, match=shapes("Lk", "(2, 5, 8)", "(2, 4, 8)")):
        mhbook.scaled_dot_product_attention(x(2, 3, 8), x(2, 5, 8), x(2, 4, 8))


def test_positional_encoding_wrong_feature_size():
    with pytest.raises(ValueError, match=shapes("d_model=8", "(2, 3, 6)")):
        mhbook.PositionalEncoding(D_MODEL)(x(2, 3, 6))


# -- token ids -------------------------------------------------------------------------------
def test_token_ids_must_be_integers(model):
    with pytest.raises(TypeError, match=shapes("integer", "torch.float32")):
        model(x(2, 5), torch.zeros(2, 4, dtype=torch.long), torch.tensor([5, 5]))


def test_token_ids_must_be_2d(model):
    with pytest.raises(ValueError, match=shapes("(batch, length)", "(5,)")):
        model(
            torch.zeros(5, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long), torch.tensor([5])
        )


# -- conversion from PyTorch -------------------------------------------------------------
def test_from_torch_needs_batch_first():
    with pytest.raises(ValueError, match=shapes("batch_first=True", "batch_first=False")):
        mhbook.MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(D_MODEL, NUM_HEADS))
    with pytest.raises(TypeError, match=shapes("nn.MultiheadAttention", "Linear")):
        mhbook.MultiHeadAttention.from_torch(torch.nn.Linear(2, 2))
