"""Rotary position embedding: its properties, its two layouts, and Hugging Face's Llama code."""

from __future__ import annotations

import pytest
import torch
from helpers import CLOSE, EXACT, seeded

import mhbook
from mhbook.attention.rope import interleaved_to_half, rope_angles

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

LAYOUTS = pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])


@LAYOUTS
def test_scores_depend_only_on_the_offset(interleaved):
    """q at m and k at n score q R(m)^T ... = a function of m - n: shift both, same score."""
    rope = mhbook.RotaryEmbedding(16, interleaved=interleaved)
    q, k = seeded(1, 1, 1, 16, seed=1), seeded(1, 1, 1, 16, seed=2)

    def score(m, n):
        return (rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum()

    for m, n in [(0, 0), (5, 2), (2, 5), (9, 0)]:
        for shift in (1, 7, 100):
            torch.testing.assert_close(score(m + shift, n + shift), score(m, n), rtol=0, atol=1e-5)
    # ...but it does depend on the offset: a different offset gives a different score.
    assert not torch.isclose(score(5, 2), score(5, 3))


@LAYOUTS
def test_position_zero_is_the_identity_and_norms_are_kept(interleaved):
    rope = mhbook.RotaryEmbedding(8, interleaved=interleaved)
    x = seeded(2, 3, 6, 8)
    positions = torch.arange(6)
    y = rope(x, positions)
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0], rtol=0, atol=0)
    # cos and sin are computed in float32 (as Llama's code does), so cos^2 + sin^2 = 1
    # holds to float32's precision, even for float64 inputs.
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-6, atol=0)
    assert not torch.allclose(y[:, :, 1:], x[:, :, 1:])


def test_the_two_layouts_are_equal_up_to_a_permutation():
    """The paper's pairs (2i, 2i+1) and Llama's halves (i, i + d/2): the same rotation once
    the features are permuted by [0, 2, 4, ..., 1, 3, 5, ...]."""
    d = 12
    perm = interleaved_to_half(d)
    assert perm.tolist() == [0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11]
    paper = mhbook.RotaryEmbedding(d, interleaved=True)
    llama = mhbook.RotaryEmbedding(d, interleaved=False)
    x, positions = seeded(2, 3, 7, d), torch.arange(3, 10)
    torch.testing.assert_close(paper(x, positions)[..., perm], llama(x[..., perm], positions))
    # Not the same function without the permutation.
    assert not torch.allclose(paper(x, positions), llama(x, positions))
    # Scores are the same when q and k are permuted alike.
    q, k = seeded(1, 2, 7, d, seed=3), seeded(1, 2, 7, d, seed=4)
    scores_paper = paper(q, positions) @ paper(k, positions).transpose(-2, -1)
    scores_llama = llama(q[..., perm], positions) @ llama(k[..., perm], positions).transpose(-2, -1)
    torch.testing.assert_close(scores_paper, scores_llama)


@LAYOUTS
def test_matches_the_complex_number_form(interleaved):
    """The paper's form: each pair is a complex number multiplied by e^{i m theta}."""
    d = 10
    x, positions = seeded(2, 1, 5, d), torch.tensor([0, 3, 4, 10, 2])
    rope = mhbook.RotaryEmbedding(d, rope_theta=500.0, interleaved=interleaved)
    perm = torch.arange(d) if interleaved else interleaved_to_half(d)
    pairs = x[..., torch.argsort(perm)] if not interleaved else x  # back to adjacent pairs
    z = torch.view_as_complex(pairs.unflatten(-1, (d // 2, 2)).contiguous())
    angles = rope_angles(positions, d, 500.0).double()
    rotated = torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)
    expected = rotated if interleaved else rotated[..., perm]
    torch.testing.assert_close(rope(x, positions), expected)


def test_positions_per_sequence():
    """(batch, T) positions: each sequence rotated by its own, as with (T,) one at a time."""
    rope = mhbook.RotaryEmbedding(8)
    x = seeded(2, 3, 4, 8)
    positions = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])
    y = rope(x, positions)
    for b in range(2):
        torch.testing.assert_close(y[b], rope(x[b], positions[b]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_equals_hugging_face_llama(dtype):
    """transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb give the same q and k,
    bit for bit: the angles are computed in float32 as there, and the rotation written alike."""
    config = LlamaConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )  # fmt: skip
    theirs = LlamaRotaryEmbedding(config)
    q, k = seeded(2, 4, 9, 16, seed=5, dtype=dtype), seeded(2, 2, 9, 16, seed=6, dtype=dtype)
    position_ids = torch.tensor([list(range(9)), list(range(100, 109))])
    cos, sin = theirs(q, position_ids)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    ours = mhbook.RotaryEmbedding(16, rope_theta=500.0)
    torch.testing.assert_close(ours(q, position_ids), q_hf, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours(k, position_ids), k_hf, rtol=0, atol=1e-12)
    # (T,) positions: the same for every sequence of the batch.
    cos, sin = theirs(q, position_ids[:1])
    q_hf, _ = apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(ours(q, position_ids[0]), q_hf, rtol=0, atol=1e-12)


def test_on_the_meta_device():
    rope = mhbook.RotaryEmbedding(8, interleaved=True)
    x = torch.empty(2, 3, 5, 8, device="meta")
    y = rope(x, torch.arange(5, device="meta"))
    assert y.device.type == "meta" and y.shape == x.shape
    assert mhbook.RotaryEmbedding(8)(x, torch.arange(5, device="meta")).shape == x.shape


@pytest.mark.parametrize("d_head", [7, 1, 0, 2.0, True])
def test_bad_d_head(d_head):
    with pytest.raises(ValueError, match=rf"d_head must be .*got {d_head!r}"):
        mhbook.RotaryEmbedding(d_head)


def test_odd_d_head_says_why():
    with pytest.raises(ValueError, match="even: RoPE rotates features in pairs, got 7"):
        mhbook.RotaryEmbedding(7)


def test_bad_base():
    with pytest.raises(ValueError, match=r"rope_theta must be a number > 1\.0, got 1$"):
        mhbook.RotaryEmbedding(8, rope_theta=1)


def test_bad_inputs():
    rope = mhbook.RotaryEmbedding(8)
    x = torch.zeros(2, 3, 5, 8)
    with pytest.raises(ValueError, match=r"d_head=8\), got \(2, 3, 5, 6\)"):
        rope(torch.zeros(2, 3, 5, 6), torch.arange(5))
    with pytest.raises(ValueError, match=r"\(T,\) = \(5,\) .* got \(4,\)"):
        rope(x, torch.arange(4))
    with pytest.raises(ValueError, match=r"\(batch, T\) = \(2, 5\) .* got \(3, 5\)"):
        rope(x, torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="positions must hold integers, got dtype torch.float32"):
        rope(x, torch.arange(5.0))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        rope(torch.zeros(2, 3, 5, 8, dtype=torch.long), torch.arange(5))
    with pytest.raises(
        ValueError, match="positions must be on x's device meta, got positions on cpu"
    ):
        rope(x.to("meta"), torch.arange(5))


# -- grouped-query attention with RoPE against Hugging Face's LlamaAttention -----------------
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_gqa_with_rope_equals_llama_attention(num_kv_heads, hf_llama_attention):
    from transformers.masking_utils import create_causal_mask

    config, llama, llama_rope = hf_llama_attention(num_kv_heads)
    ours = mhbook.attention_from_hf(llama)
    assert isinstance(ours.rope, mhbook.RotaryEmbedding) and ours.num_kv_heads == num_kv_heads
    x = seeded(2, 7, 32, seed=7)
    for start in (0, 40):  # positions 0..6, then 40..46
        position_ids = torch.arange(start, start + 7)[None]
        mask = create_causal_mask(
            config, x, None, None, position_ids=position_ids, allow_is_causal_skip=False
        )
        theirs, _ = llama(x, position_embeddings=llama_rope(x, position_ids), attention_mask=mask)
        mine, _ = ours(x, mask=mhbook.causal_mask(7), positions=position_ids[0])
        torch.testing.assert_close(mine, theirs, **CLOSE)
        # (batch, T) positions, one row per sequence, as transformers' position_ids
        mine, _ = ours(x, is_causal=True, positions=position_ids.expand(2, -1))
        torch.testing.assert_close(mine, theirs, **CLOSE)


def test_gqa_with_rope_decoding_equals_llama_with_its_cache(hf_llama_attention):
    """Token by token: mhbook's LayerCache (rotated keys) and transformers' DynamicCache."""
    from transformers import DynamicCache

    config, llama, llama_rope = hf_llama_attention(2)
    ours = mhbook.attention_from_hf(llama)
    x = seeded(1, 6, 32, seed=8)
    theirs_cache, our_cache = DynamicCache(config=config), mhbook.LayerCache()
    for t in range(6):
        step = x[:, t : t + 1]
        position_ids = torch.tensor([[t]])
        theirs, _ = llama(
            step, position_embeddings=llama_rope(step, position_ids), attention_mask=None,
            past_key_values=theirs_cache,
        )  # fmt: skip
        mine, _ = ours(step, mask=mhbook.causal_mask(1, t + 1), cache=our_cache)
        torch.testing.assert_close(mine, theirs, **CLOSE)
    torch.testing.assert_close(our_cache.keys, theirs_cache.layers[0].keys, **EXACT)


def test_the_default_base_is_llamas_10000():
    """The base defaults to 10000 (the paper, Llama 1 and 2, transformers' default
    rope_theta); the angles are those of transformers' LlamaRotaryEmbedding at its default."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = mhbook.RotaryEmbedding(16)
    assert rope.rope_theta == 10000.0 and mhbook.ModelConfig().rope_theta == 10000.0
    config = LlamaConfig(hidden_size=64, num_attention_heads=4)  # head_dim 16, default theta
    x = torch.zeros(1, 7, 64)
    cos, sin = LlamaRotaryEmbedding(config)(x, torch.arange(7)[None])
    angles = mhbook.attention.rope.rope_angles(torch.arange(7), 16)
    torch.testing.assert_close(cos[0], torch.cat([angles.cos()] * 2, dim=-1), rtol=0, atol=0)
    torch.testing.assert_close(sin[0], torch.cat([angles.sin()] * 2, dim=-1), rtol=0, atol=0)
    config = mhbook.ModelConfig(d_model=64, position="rope")
    assert mhbook.make_rope(config).rope_theta == 10000.0


# -- RoPE has one owner (issue 38) ------------------------------------------------------------
def test_apply_rope_reads_the_layout_from_the_tables():
    """apply_rope is the rotation of RotaryEmbedding in both layouts: tables of d_head
    columns (each angle twice) rotate halves, of d_head / 2 interleaved pairs."""
    x, positions = seeded(2, 3, 5, 8, seed=1), torch.arange(3, 8)
    for interleaved in (False, True):
        rope = mhbook.RotaryEmbedding(8, interleaved=interleaved)
        cos, sin = rope.tables(positions, x.dtype)
        assert cos.shape == (5, 4 if interleaved else 8)
        torch.testing.assert_close(mhbook.apply_rope(x, cos, sin), rope(x, positions), **EXACT)
    with pytest.raises(
        ValueError,
        match=r"tables of width 4 rotate heads of d_head=4 .* or d_head=8 .*got x of d_head=6",
    ):
        mhbook.apply_rope(seeded(1, 1, 5, 6), cos, sin)


def _counted_tables(monkeypatch):
    """Count the calls of RotaryEmbedding.tables (every table computation goes through it)."""
    calls = []
    tables = mhbook.RotaryEmbedding.tables

    def counted(self, positions, dtype=torch.float32):
        calls.append(self)
        return tables(self, positions, dtype)

    monkeypatch.setattr(mhbook.RotaryEmbedding, "tables", counted)
    return calls


ONE_OWNER = {
    # config changes -> (rotary embeddings in the model, tables computed per forward)
    "Llama": ({}, 1),
    "Gemma 3: local and global bases": (
        {"window": 3, "global_every": 2, "global_rope_theta": 1e6},
        2,
    ),
    "sinks": ({"window": 3, "sinks": 2}, 1),
    "sinks and global layers": ({"window": 3, "sinks": 2, "global_every": 2}, 2),
    "latent attention": ({"d_latent": 12}, 1),
}


@pytest.mark.parametrize("name", list(ONE_OWNER))
def test_the_model_owns_one_rotary_embedding_per_kind_of_layer(name, monkeypatch):
    """The layers hold none; the model computes the tables once per kind of layer and
    forward pass, whatever the number of layers (it held 5 modules for 4 layers, and the
    sinks and latent paths computed tables twice per layer)."""
    changes, kinds = ONE_OWNER[name]
    config = mhbook.ModelConfig(
        d_model=32, num_heads=4, num_layers=4, d_ff=32, norm_first=True, position="rope",
        **changes,
    )  # fmt: skip
    lm = mhbook.DecoderOnlyLM(config, 20).eval()
    ropes = [m for m in lm.modules() if isinstance(m, mhbook.RotaryEmbedding)]
    assert len(ropes) == (2 if "global_rope_theta" in changes else 1)
    assert all(block.self_attn.rope is None and block.self_attn.rotary for block in lm.blocks)
    calls = _counted_tables(monkeypatch)
    tokens = torch.randint(0, 20, (2, 9), generator=torch.Generator().manual_seed(0))
    cache = lm.new_cache()
    lm(tokens[:, :8], cache=cache)
    assert len(calls) == kinds and set(map(id, calls)) <= set(map(id, ropes))
    lm(tokens[:, 8:], cache=cache)  # a decoding step too
    assert len(calls) == 2 * kinds


def test_a_layer_rotates_by_its_own_rope_or_by_its_models_tables():
    """One owner per layer: a layer that stands alone owns its rope and refuses tables; a
    layer built for a model (rotary) refuses to run without them; a layer without RoPE
    refuses them."""
    x, positions = seeded(2, 5, 16, seed=2), torch.arange(5)
    rope = mhbook.RotaryEmbedding(4)
    torch.manual_seed(0)
    alone = mhbook.MultiHeadAttention(16, 4, rope=rope).double()
    torch.manual_seed(0)
    in_a_model = mhbook.MultiHeadAttention(16, 4, rotary=True).double()
    tables = rope.tables(positions, x.dtype)
    torch.testing.assert_close(in_a_model(x, rope_tables=tables)[0], alone(x)[0], **EXACT)
    with pytest.raises(ValueError, match="rope_tables: this layer owns its rope; pass none"):
        alone(x, rope_tables=tables)
    with pytest.raises(ValueError, match="rope_tables: this layer is rotated by the RoPE tables"):
        in_a_model(x)
    with pytest.raises(ValueError, match="rope_tables: this layer has no RoPE; pass none"):
        mhbook.MultiHeadAttention(16, 4).double()(x, rope_tables=tables)
    lm = mhbook.DecoderOnlyLM(mhbook.ModelConfig(d_model=16, num_heads=4, position="rope"), 20)
    with pytest.raises(ValueError, match="call it through its model"):
        lm.blocks[0].self_attn(lm.embed(torch.zeros(1, 3, dtype=torch.long), "tokens"))
