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


@pytest.mark.parametrize(
    "shape,ok",
    [
        ((2, 2, 3, 4), True),
        ((4,), True),
        ((1, 1, 1, 1, 4), False),  # more dimensions than the scores: never
        ((2, 1, 1, 1, 4), False),  # one dimension too many
        ((3, 4), True),
        ((2, 1, 3, 1), True),
        ((1, 3, 3, 4), False),  # 3 heads for 2
        ((2, 2, 2, 4), False),
        ((0, 1, 1, 4), False),
    ],
)
def test_mask_broadcast_check(shape, ok):
    """check_mask accepts exactly the shapes torch.broadcast_shapes takes to the scores'."""
    mask = torch.ones(shape, dtype=torch.bool)
    expected = (2, 2, 3, 4)
    try:
        broadcasts = torch.broadcast_shapes(shape, expected) == expected
    except RuntimeError:
        broadcasts = False
    assert broadcasts == ok
    if ok:
        mhbook.check_mask(mask, expected)
    else:
        with pytest.raises(ValueError, match="does not broadcast"):
            mhbook.check_mask(mask, expected)


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
        model.generate(src, torch.tensor([[5], [5]]), 3, bos_id=1, eos_id=2)


def test_memory_and_tgt_batch_sizes_differ(model):
    with pytest.raises(ValueError, match=shapes("batch", "(2, 4)", "(3, 5, 8)")):
        model.decoder(torch.zeros(2, 4, dtype=torch.long), x(3, 5, D_MODEL))


# -- feature sizes and lengths --------------------------------------------------------
def test_wrong_feature_size(mha):
    with pytest.raises(ValueError, match=shapes("d_model=8", "(2, 3, 7)")):
        mha(x(2, 3, 7), x(2, 3, D_MODEL), x(2, 3, D_MODEL))
    with pytest.raises(ValueError, match=shapes("kdim=8", "(2, 4, 6)")):
        mha(x(2, 3, D_MODEL), x(2, 4, 6), x(2, 4, D_MODEL))


def test_wrong_number_of_dimensions(mha):
    with pytest.raises(ValueError, match=shapes("(batch, length, d_model=8)", "(3, 8)")):
        mha(x(3, D_MODEL), x(3, D_MODEL), x(3, D_MODEL))


def test_query_key_feature_sizes_differ_explicit_attention():
    with pytest.raises(ValueError, match=shapes("(2, 3, 8)", "(2, 4, 6)")):
        mhbook.scaled_dot_product_attention(x(2, 3, 8), x(2, 4, 6), x(2, 4, 6))


def test_key_and_value_lengths_differ(mha):
    with pytest.raises(ValueError, match=shapes("same length S", "(2, 5, 8)", "(2, 4, 8)")):
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
        mhbook.attention_from_torch(torch.nn.MultiheadAttention(D_MODEL, NUM_HEADS))
    with pytest.raises(TypeError, match=shapes("nn.MultiheadAttention", "Linear")):
        mhbook.attention_from_torch(torch.nn.Linear(2, 2))


# -- constructor arguments ---------------------------------------------------------------
@pytest.mark.parametrize("num_heads", [0, -2, 2.0, True])
def test_num_heads_must_be_a_positive_int(num_heads):
    with pytest.raises(ValueError, match=shapes("num_heads", "an int >= 1", f"got {num_heads!r}")):
        mhbook.MultiHeadAttention(D_MODEL, num_heads)


def test_d_model_must_be_positive():
    with pytest.raises(ValueError, match=shapes("d_model", "an int >= 1", "got 0")):
        mhbook.MultiHeadAttention(0, 1)


# -- dtypes and devices -------------------------------------------------------------------
def test_input_dtype_differs_from_the_module(mha):
    with pytest.raises(TypeError, match=shapes("query", "torch.float64", "torch.float32")):
        mha(x(2, 3, D_MODEL).double(), x(2, 3, D_MODEL), x(2, 3, D_MODEL))
    with pytest.raises(TypeError, match=shapes("value", "torch.float16", "torch.float32")):
        mha(x(2, 3, D_MODEL), x(2, 3, D_MODEL), x(2, 3, D_MODEL).half())


def test_input_on_another_device_than_the_module():
    with torch.device("meta"):
        mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS)
    with pytest.raises(ValueError, match=shapes("query", "cpu", "meta")):
        mha(x(2, 3, D_MODEL), x(2, 3, D_MODEL), x(2, 3, D_MODEL))


def test_qkv_dtypes_or_devices_differ_explicit_attention():
    with pytest.raises(TypeError, match=shapes("query", "key", "torch.float32", "torch.float64")):
        mhbook.scaled_dot_product_attention(x(2, 3, 8), x(2, 4, 8).double(), x(2, 4, 8))
    meta = torch.empty(2, 4, 8, device="meta")
    with pytest.raises(ValueError, match=shapes("query", "key", "cpu", "meta")):
        mhbook.scaled_dot_product_attention(x(2, 3, 8), meta, meta)
    with pytest.raises(ValueError, match=shapes("mask", "cpu", "meta")):
        mask = torch.ones(3, 4, dtype=torch.bool, device="meta")
        mhbook.scaled_dot_product_attention(x(2, 3, 8), x(2, 4, 8), x(2, 4, 8), mask)


def test_qkv_dtypes_or_devices_differ_attend():
    q, k = x(2, 4, 3, 8), x(2, 2, 5, 8)
    with pytest.raises(TypeError, match=shapes("q", "v", "torch.float32", "torch.float16")):
        mhbook.attend(q, k, k.half())
    with pytest.raises(ValueError, match=shapes("q", "k", "cpu", "meta")):
        mhbook.attend(q, k.to("meta"), k.to("meta"))


def test_head_mask_of_wrong_shape(mha):
    mha.head_mask = torch.ones(NUM_HEADS + 1)
    with pytest.raises(ValueError, match=shapes("head_mask", f"({NUM_HEADS},)", "(3,)")):
        mha(x(2, 3, D_MODEL), x(2, 3, D_MODEL), x(2, 3, D_MODEL))


# -- attend --------------------------------------------------------------------------------
def test_attend_rejects_keys_without_a_head_dimension():
    """3-D keys and values would broadcast over the heads silently."""
    with pytest.raises(
        ValueError, match=shapes("k", "4 dimensions", "(batch, h_kv, S, d)", "(2, 5, 8)")
    ):
        mhbook.attend(x(2, 4, 3, 8), x(2, 5, 8), x(2, 5, 8))


def test_attend_keys_and_values_of_different_lengths():
    """PyTorch's fused kernel accepts 4 keys with 5 values and returns garbage."""
    with pytest.raises(ValueError, match=shapes("k and v", "(2, 4, 4, 8)", "(2, 4, 5, 8)")):
        mhbook.attend(x(2, 4, 3, 8), x(2, 4, 4, 8), x(2, 4, 5, 8))


def test_attend_shape_errors():
    with pytest.raises(ValueError, match=shapes("batch", "(2, 4, 3, 8)", "(3, 4, 5, 8)")):
        mhbook.attend(x(2, 4, 3, 8), x(3, 4, 5, 8), x(3, 4, 5, 8))
    with pytest.raises(ValueError, match=shapes("feature size d", "(2, 4, 3, 8)", "(2, 4, 5, 6)")):
        mhbook.attend(x(2, 4, 3, 8), x(2, 4, 5, 6), x(2, 4, 5, 6))
    with pytest.raises(
        ValueError,
        match=shapes(
            "num_heads must be divisible by num_kv_heads", "num_heads=4", "num_kv_heads=3"
        ),
    ):
        mhbook.attend(x(2, 4, 3, 8), x(2, 3, 5, 8), x(2, 3, 5, 8))
    with pytest.raises(ValueError, match=shapes("(2, 5)", "(2, 4, 3, 5)")):
        mhbook.attend(x(2, 4, 3, 8), x(2, 2, 5, 8), x(2, 2, 5, 8), torch.ones(2, 5, dtype=bool))
    with pytest.raises(TypeError, match=shapes("torch.bool", "torch.float32")):
        mhbook.attend(x(2, 4, 3, 8), x(2, 2, 5, 8), x(2, 2, 5, 8), torch.ones(3, 5))
    with pytest.raises(ValueError, match=shapes("dropout_p", "[0, 1]", "1.5")):
        mhbook.attend(x(2, 4, 3, 8), x(2, 2, 5, 8), x(2, 2, 5, 8), dropout_p=1.5)


# -- values: valid_lens, causal_mask, token ids --------------------------------------------
def test_padding_mask_valid_lens_must_be_integers():
    with pytest.raises(TypeError, match=shapes("valid_lens", "integer", "torch.float32")):
        mhbook.padding_mask(torch.tensor([2.5, 1.0]), 4)


@pytest.mark.parametrize("lens", [[-1, 2], [2, 5]], ids=["negative", "longer-than-keys"])
def test_padding_mask_valid_lens_out_of_range(lens):
    low, high = min(lens), max(lens)
    with pytest.raises(ValueError, match=shapes("num_keys=4", f"from {low} to {high}")):
        mhbook.padding_mask(torch.tensor(lens), 4)


def test_padding_mask_skips_value_checks_off_the_cpu():
    """Reading values would synchronise with an accelerator: only CPU tensors are checked."""
    mask = mhbook.padding_mask(torch.tensor([-1, 9], device="meta"), 4)
    assert mask.shape == (2, 1, 1, 4) and mask.device.type == "meta"


@pytest.mark.parametrize(
    "args,name,bad",
    [((-1,), "num_queries", -1), ((2, -1), "num_keys", -1), ((2.0,), "num_queries", 2.0)]
    + [((3, 3.5), "num_keys", 3.5), ((3, 4, None), "window", 0)],
)
def test_causal_mask_negative_or_not_an_int(args, name, bad):
    minimum = 1 if name == "window" else 0
    with pytest.raises(ValueError, match=shapes(name, f"int >= {minimum}", f"got {bad!r}")):
        if name == "window":
            mhbook.causal_mask(*args, window=bad)
        else:
            mhbook.causal_mask(*args)


@pytest.mark.parametrize("src_id,tgt_id", [(11, 13), (50, 60), (-1, -3)])
def test_token_id_outside_the_vocabulary(model, src_id, tgt_id):
    """The vocabularies have 11 (source) and 13 (target) tokens."""
    src = torch.zeros(2, 5, dtype=torch.long)
    src[1, 2] = src_id
    with pytest.raises(ValueError, match=shapes("src", str(src_id), "11 tokens")):
        model(src, torch.zeros(2, 4, dtype=torch.long), torch.tensor([5, 5]))
    tgt_in = torch.zeros(2, 4, dtype=torch.long)
    tgt_in[0, 1] = tgt_id
    with pytest.raises(ValueError, match=shapes("tgt", str(tgt_id), "13 tokens")):
        model(torch.zeros(2, 5, dtype=torch.long), tgt_in, torch.tensor([5, 5]))


# -- the KV cache ---------------------------------------------------------------------------
def test_eos_id_outside_the_target_vocabulary(model):
    """An <eos> the model can never emit would never stop generation."""
    src = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=shapes("eos_id", "[0, 12]", "13 tokens", "got 13")):
        model.generate(src, torch.tensor([5, 5]), 3, bos_id=1, eos_id=13)


def test_decoder_cache_of_the_wrong_kind(model):
    memory = x(2, 5, D_MODEL)
    with pytest.raises(TypeError, match=shapes("mhbook.KVCache", "list")):
        model.decoder(torch.zeros(2, 1, dtype=torch.long), memory, None, [{}])
    with pytest.raises(ValueError, match=shapes("1 layers", "the cache has 3")):
        model.decoder(torch.zeros(2, 1, dtype=torch.long), memory, None, mhbook.KVCache(3))


def test_layer_cache_update_that_does_not_fit():
    cache = mhbook.LayerCache()
    cache.update(x(2, 4, 3, 8), x(2, 4, 3, 8))
    with pytest.raises(ValueError, match=shapes("(2, 2, 1, 8)", "(2, 4, 3, 8)", "dim 2")):
        cache.update(x(2, 2, 1, 8), x(2, 2, 1, 8))
    with pytest.raises(ValueError, match=shapes("torch.float64", "torch.float32")):
        cache.update(x(2, 4, 1, 8).double(), x(2, 4, 1, 8).double())
    with pytest.raises(ValueError, match=shapes("4 dimensions", "(2, 1, 8)")):
        cache.update(x(2, 1, 8), x(2, 1, 8))


def test_input_dtype_differs_from_a_module_on_meta():
    """The dtype check also works where autocast does not exist (the meta device)."""
    with torch.device("meta"):
        mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS)
        query = torch.randn(2, 3, D_MODEL, dtype=torch.float64)
    with pytest.raises(TypeError, match=shapes("query", "torch.float64", "torch.float32")):
        mha(query, query, query)


# -- d_head, kdim and vdim -----------------------------------------------------------
@pytest.mark.parametrize("name", ["d_head", "kdim", "vdim"])
@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_d_head_kdim_vdim_must_be_positive_ints(name, bad):
    with pytest.raises(ValueError, match=shapes(name, "an int >= 1 or None", f"got {bad!r}")):
        mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, **{name: bad})


def test_d_head_lifts_the_divisibility_rule():
    assert mhbook.MultiHeadAttention(10, 3, d_head=4).W_q.out_features == 12


def test_key_or_value_of_the_wrong_width():
    mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, kdim=6, vdim=5)
    with pytest.raises(ValueError, match=shapes("key", "(batch, S, kdim=6)", "(2, 4, 8)")):
        mha(x(2, 3, D_MODEL), x(2, 4, D_MODEL), x(2, 4, 5))
    with pytest.raises(ValueError, match=shapes("value", "(batch, S, vdim=5)", "(2, 4, 6)")):
        mha(x(2, 3, D_MODEL), x(2, 4, 6), x(2, 4, 6))
    # Projecting the memory into a cache checks it too, and keeps nothing.
    cache = mhbook.LayerCache()
    with pytest.raises(ValueError, match=shapes("key", "kdim=6", "(2, 4, 8)")):
        mha(x(2, 3, D_MODEL), x(2, 4, D_MODEL), x(2, 4, 5), cache=cache)
    assert cache.memory_keys is None and cache.memory_values is None
    # Self-attention (key=None) takes keys and values of width d_model from the query.
    with pytest.raises(ValueError, match=shapes("key=None", "d_model=8", "kdim=6", "vdim=5")):
        mha(x(2, 3, D_MODEL))


def test_to_torch_needs_heads_that_fill_d_model():
    mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, d_head=6)
    with pytest.raises(
        ValueError,
        match=shapes(
            "d_head", "num_heads * d_head == d_model", "num_heads=2", "d_head=6", "d_model=8"
        ),
    ):
        mhbook.attention_to_torch(mha)


@pytest.mark.parametrize(
    "kwargs,named",
    [
        ({"num_kv_heads": 1}, "num_kv_heads"),
        ({"rope": mhbook.RotaryEmbedding(4)}, "rope"),
        ({"alibi": mhbook.ALiBi(NUM_HEADS)}, "alibi"),
    ],
)
def test_to_torch_names_what_pytorch_cannot_express(kwargs, named):
    mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS, **kwargs)
    with pytest.raises(ValueError, match=shapes("cannot express", f"layer's {named}")):
        mhbook.attention_to_torch(mha)
    plain = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS)
    plain.head_mask = torch.ones(NUM_HEADS)
    with pytest.raises(ValueError, match=shapes("cannot express", "layer's head_mask")):
        mhbook.attention_to_torch(plain)


def test_the_conversions_name_the_module_they_need():
    """The conversion functions take the module as an argument: another one is named."""
    linear = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match=shapes("mhbook.MultiHeadAttention", "Linear")):
        mhbook.attention_to_torch(linear)
    with pytest.raises(TypeError, match=shapes("mhbook.DecoderOnlyLM", "Linear")):
        mhbook.lm_to_hf(linear)
    with pytest.raises(TypeError, match=shapes("TransformerEncoderLayer", "Linear")):
        mhbook.encoder_block_from_torch(linear)


def test_from_hf_needs_a_hugging_face_attention_layer():
    with pytest.raises(TypeError, match=shapes("LlamaAttention", "Linear", "q_proj")):
        mhbook.attention_from_hf(torch.nn.Linear(2, 2))


def test_from_torch_refuses_add_bias_kv():
    theirs = torch.nn.MultiheadAttention(D_MODEL, NUM_HEADS, add_bias_kv=True, batch_first=True)
    with pytest.raises(ValueError, match="add_bias_kv=True"):
        mhbook.attention_from_torch(theirs)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_model_config_head_dim_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match=shapes("ModelConfig.head_dim", ">= 1 or None", repr(bad))):
        mhbook.ModelConfig(d_model=D_MODEL, num_heads=NUM_HEADS, head_dim=bad)


def test_model_config_divisibility_only_without_head_dim():
    with pytest.raises(ValueError, match=shapes("divisible", "d_model=10", "num_heads=3")):
        mhbook.ModelConfig(d_model=10, num_heads=3)
    assert mhbook.ModelConfig(d_model=10, num_heads=3, head_dim=4).d_head == 4


# -- issue 38, section 4: two bad inputs, as a new user meets them --------------------------
def test_a_rope_of_another_head_size_is_refused_when_the_layer_is_built():
    """8 features in 2 heads are heads of 4: a rotary embedding of 6 would fail only in the
    forward pass, with PyTorch's "size of tensor a (4) must match ... (6)"."""
    with pytest.raises(ValueError, match=shapes("d_head=6", "d_head=4", "RotaryEmbedding(4)")):
        mhbook.MultiHeadAttention(8, 2, rope=mhbook.RotaryEmbedding(6))
    mhbook.MultiHeadAttention(8, 2, rope=mhbook.RotaryEmbedding(4))  # the right size
    # Latent attention's decoupled RoPE part: d_rope features.
    with pytest.raises(ValueError, match=shapes("d_head=6", "d_rope=8", "RotaryEmbedding(8)")):
        mhbook.MultiHeadLatentAttention(32, 4, 16, d_rope=8, rope=mhbook.RotaryEmbedding(6))
    with pytest.raises(ValueError, match=shapes("d_head=8", "d_rope=0")):
        mhbook.MultiHeadLatentAttention(32, 4, 16, rope=mhbook.RotaryEmbedding(8))
    with pytest.raises(TypeError, match="rope must be None or a mhbook.RotaryEmbedding, got"):
        mhbook.MultiHeadAttention(8, 2, rope=torch.nn.Identity())


def _windowed_lms(**configs):
    """Language models of the same weights, one per config change."""
    base = mhbook.ModelConfig(
        d_model=16, num_heads=4, num_layers=2, d_ff=32, norm_first=True, position="rope"
    )
    models = {}
    for name, changes in configs.items():
        torch.manual_seed(0)
        models[name] = mhbook.DecoderOnlyLM(base.replace(**changes), 20).eval()
    return models


def test_a_cache_that_dropped_tokens_is_refused_by_a_layer_that_needs_them():
    """A model with window=4 fills a cache with 10 tokens (it keeps 4); a full-attention
    model with the same weights would attend to those 4 and give a finite, wrong answer."""
    lms = _windowed_lms(
        local={"window": 4}, full={}, wider={"window": 6}, sinks={"window": 4, "sinks": 2}
    )
    tokens = torch.randint(0, 20, (2, 11), generator=torch.Generator().manual_seed(0))
    cache = lms["local"].new_cache()
    lms["local"](tokens[:, :10], cache=cache)
    assert cache.length == 10 and all(layer.num_kept == 4 for layer in cache.layers)
    for name, layer in (("full", "full attention (window=None)"), ("wider", "window=6")):
        with pytest.raises(ValueError, match=shapes("last 4 of the 10 tokens", "window=4", layer)):
            lms[name](tokens[:, 10:], cache=cache.copy())
    with pytest.raises(ValueError, match=shapes("window=4, sinks=2", "needs tokens it dropped")):
        lms["sinks"](tokens[:, 10:], cache=cache.copy())
    # The model that filled it reads it on, and a cache that dropped nothing suits any model.
    lms["local"](tokens[:, 10:], cache=cache.copy())
    fresh = lms["full"].new_cache()
    lms["local"](tokens[:, :3], cache=fresh)
    lms["full"](tokens[:, 3:4], cache=fresh)


def test_a_cache_of_keys_before_rope_is_refused_by_a_layer_that_rotates_them():
    """A layer with sinks and RoPE (StreamingLLM) caches its keys before RoPE and positions
    them within the cache; a layer without sinks caches them rotated at their text positions.
    Nothing was dropped (3 tokens), so only how the keys are positioned tells the two apart:
    read by the other kind, the keys would be at the wrong positions, a finite, wrong answer."""
    lms = _windowed_lms(streaming={"window": 4, "sinks": 2}, full={}, local={"window": 4})
    tokens = torch.randint(0, 20, (2, 4), generator=torch.Generator().manual_seed(0))
    streamed = lms["streaming"].new_cache()
    lms["streaming"](tokens[:, :3], cache=streamed)
    rotated = lms["full"].new_cache()
    lms["full"](tokens[:, :3], cache=rotated)
    for name, cache, held, wanted in (
        ("full", streamed, "within the cache (before RoPE)", "at their text positions"),
        ("local", streamed, "within the cache (before RoPE)", "at their text positions"),
        ("streaming", rotated, "at their text positions", "within the cache (before RoPE)"),
    ):
        with pytest.raises(ValueError, match=shapes(f"positioned {held}", f"them {wanted}")):
            lms[name](tokens[:, 3:], cache=cache.copy())
    lms["streaming"](tokens[:, 3:], cache=streamed.copy())  # each reads its own
    lms["local"](tokens[:, 3:], cache=rotated.copy())


def test_a_narrower_window_reads_a_wider_windows_cache():
    """What a layer needs is the last window - 1 tokens: a window of 3 finds them in a cache
    of window 4, and (one layer: the same keys) gives what it gives on the whole text."""
    lms = _windowed_lms(wide={"window": 4, "num_layers": 1}, narrow={"window": 3, "num_layers": 1})
    tokens = torch.randint(0, 20, (2, 11), generator=torch.Generator().manual_seed(1))
    cache = lms["wide"].new_cache()
    lms["wide"](tokens[:, :10], cache=cache)
    step = lms["narrow"](tokens[:, 10:], cache=cache)
    torch.testing.assert_close(step[:, -1], lms["narrow"](tokens)[:, -1])
    assert cache.layers[0].num_kept == 3  # now it keeps what the narrower layer keeps
