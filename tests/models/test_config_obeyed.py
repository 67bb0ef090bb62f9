"""Every model obeys every field of its ModelConfig, or refuses it with a ValueError that
names the field: nothing is ignored. Plus the bad input that once got an obscure error."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import mhbook
from mhbook import (
    ALiBi,
    DecoderOnlyLM,
    LayerCache,
    ModelConfig,
    MultiHeadAttention,
    MultiHeadLatentAttention,
    RotaryEmbedding,
    Transformer,
)

BASE = ModelConfig(d_model=16, num_heads=4, num_layers=2, d_ff=32)

#: Each field with a value other than the default, on a base where it matters.
CHANGES = {
    "d_model": ({"d_model": 24}, {}),
    "num_heads": ({"num_heads": 2}, {}),
    "num_layers": ({"num_layers": 1}, {}),
    "d_ff": ({"d_ff": 48}, {}),
    "dropout": ({"dropout": 0.3}, {}),
    "attention_dropout": ({"attention_dropout": 0.3}, {}),
    "norm_first": ({"norm_first": True}, {}),
    "norm_eps": ({"norm_eps": 0.5}, {}),
    "num_kv_heads": ({"num_kv_heads": 1}, {}),
    "position": ({"position": "rope"}, {}),
    "window": ({"window": 2}, {}),
    "d_latent": ({"d_latent": 8}, {}),
    "head_dim": ({"head_dim": 8}, {}),
    "norm": ({"norm": "rms"}, {}),
    "ffn": ({"ffn": "swiglu"}, {}),
    "bias": ({"bias": False}, {}),
    "rope_theta": ({"rope_theta": 50.0}, {"position": "rope"}),
    "rope_scaling": ({"rope_scaling": mhbook.RopeScaling("yarn", 4.0, 4)}, {"position": "rope"}),
    "tie_embeddings": ({"tie_embeddings": True}, {}),
    "scale_embeddings": ({"scale_embeddings": False}, {}),
    "sinks": ({"sinks": 2}, {"window": 2, "position": "rope"}),
    "global_every": ({"global_every": 2}, {"window": 2}),
    "global_rope_theta": (
        {"global_rope_theta": 50.0},
        {"window": 2, "global_every": 2, "position": "rope"},
    ),
    "max_position_embeddings": (
        {"max_position_embeddings": 16},
        {"position": "learned", "max_position_embeddings": 8},
    ),
}


def test_every_field_is_in_the_table():
    assert set(CHANGES) == {f.name for f in dataclasses.fields(ModelConfig)}


def _transformer(config):
    torch.manual_seed(0)
    return Transformer(config, 20, 20)


def _lm(config):
    torch.manual_seed(0)
    return DecoderOnlyLM(config, 20)


def _run(model):
    """Logits of a fixed batch in training mode with a fixed seed (so dropout counts)."""
    torch.manual_seed(1)
    tokens = torch.randint(3, 20, (2, 7), generator=torch.Generator().manual_seed(2))
    if isinstance(model, Transformer):
        return model(tokens, tokens[:, :5], torch.tensor([7, 5]))
    return model(tokens)


def _signature(model) -> dict:
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


@pytest.mark.parametrize("build", [_transformer, _lm], ids=["Transformer", "DecoderOnlyLM"])
@pytest.mark.parametrize("field", list(CHANGES))
def test_a_field_changes_the_model_or_is_refused_by_name(build, field):
    change, base_changes = CHANGES[field]
    base = BASE.replace(**base_changes)
    try:
        changed = build(base.replace(**change))
    except ValueError as error:
        if f"ModelConfig.{field}" not in str(error):
            # Refused for what the base sets (the Transformer refuses the window that
            # sinks and global_every need): then the base alone is refused alike.
            with pytest.raises(ValueError) as base_error:
                build(base)
            assert str(base_error.value) == str(error)
        return
    reference = build(base)
    if _signature(changed) != _signature(reference):
        return  # other parameters: obeyed
    if field == "tie_embeddings":
        output = changed.decoder.output if isinstance(changed, Transformer) else changed.output
        embedding = changed.decoder if isinstance(changed, Transformer) else changed
        assert output.weight is embedding.embedding.weight
        return
    assert not torch.equal(_run(changed), _run(reference)), f"{field} changed nothing"


def test_the_transformer_refuses_a_window_by_name():
    with pytest.raises(ValueError, match="ModelConfig.window=4: the encoder-decoder"):
        Transformer(BASE.replace(window=4), 20, 20)


def test_the_reviews_example_is_a_rope_mqa_transformer():
    """`Transformer(ModelConfig(num_kv_heads=1, position="rope"), 20, 20)` once built a
    sinusoidal multi-head model with as many parameters as MHA."""
    model = Transformer(ModelConfig(num_kv_heads=1, position="rope"), 20, 20)
    full = Transformer(ModelConfig(), 20, 20)
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in full.parameters())
    for stack in (model.encoder, model.decoder):
        assert stack.pos_encoding is None and isinstance(stack.rope, RotaryEmbedding)
        attention = stack.blocks[0].self_attn
        assert attention.num_kv_heads == 1 and attention.rotary  # by its stack's tables
    cross = model.decoder.blocks[0].cross_attn
    assert cross.num_kv_heads == 1 and not cross.rotary


@pytest.mark.parametrize("position", ["sinusoidal", "rope", "alibi", "none"])
@pytest.mark.parametrize("kv", [None, 2])
def test_transformer_cached_decoding_equals_the_full_pass(position, kv):
    config = BASE.replace(position=position, num_kv_heads=kv)
    model = _transformer(config).double().eval()
    src = torch.randint(3, 20, (2, 6), generator=torch.Generator().manual_seed(0))
    lens = torch.tensor([6, 4])
    with torch.no_grad():
        assert torch.equal(
            model.generate(src, lens, 8, bos_id=1, eos_id=2),
            model.generate(src, lens, 8, bos_id=1, eos_id=2, use_cache=False),
        )
        memory = model.encoder(src, lens)
        mask = mhbook.padding_mask(lens, 6)
        tgt = torch.randint(3, 20, (2, 5), generator=torch.Generator().manual_seed(1))
        full = model.decoder(tgt, memory, mask)
        cache = model.decoder.new_cache()
        steps = [model.decoder(tgt[:, t : t + 1], memory, mask, cache) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-10)


def test_latent_attention_in_the_transformers_self_attention():
    model = _transformer(BASE.replace(d_latent=8, position="rope")).double().eval()
    for stack in (model.encoder, model.decoder):
        assert isinstance(stack.blocks[0].self_attn, MultiHeadLatentAttention)
    assert isinstance(model.decoder.blocks[0].cross_attn, MultiHeadAttention)
    src = torch.randint(3, 20, (2, 6), generator=torch.Generator().manual_seed(0))
    lens = torch.tensor([6, 4])
    assert torch.equal(
        model.generate(src, lens, 6, bos_id=1, eos_id=2),
        model.generate(src, lens, 6, bos_id=1, eos_id=2, use_cache=False),
    )


def test_dropout_has_one_meaning():
    """`dropout` drops the embeddings and each sublayer's output, nothing else; the
    attention weights have `attention_dropout`."""
    for model in (_lm(BASE.replace(dropout=0.2)), _transformer(BASE.replace(dropout=0.2))):
        attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
        assert attention and all(m.dropout == 0.0 for m in attention)
        ffns = [m for m in model.modules() if isinstance(m, mhbook.PositionWiseFFN)]
        assert ffns and not any(isinstance(c, nn.Dropout) for f in ffns for c in f.children())
    lm = _lm(BASE.replace(attention_dropout=0.2))
    assert all(b.self_attn.dropout == 0.2 for b in lm.blocks)
    assert all(m.p == 0.0 for m in lm.modules() if isinstance(m, nn.Dropout))


def test_the_default_config_is_the_books_models():
    """The defaults are the book's encoder-decoder model (chapter 6): LayerNorm, ReLU,
    scaled embeddings, biases everywhere (``bias`` is a plain bool, True); the
    decoder-only model with the defaults has them too, in its attention projections as
    well; bias=False removes them all."""
    lm, model = _lm(BASE), _transformer(BASE)
    assert BASE.bias is True and ModelConfig().bias is True
    assert lm.blocks[0].self_attn.W_q.bias is not None and lm.output.bias is not None
    without = _lm(BASE.replace(bias=False))
    assert without.blocks[0].self_attn.W_q.bias is None and without.output.bias is None
    with pytest.raises(ValueError, match="ModelConfig.bias must be True or False, got None"):
        ModelConfig(bias=None)
    assert lm.blocks[0].ffn.linear1.bias is not None
    assert model.encoder.blocks[0].self_attn.W_q.bias is not None
    assert isinstance(lm.blocks[0].addnorm1.norm, nn.LayerNorm)
    assert lm.config.scale_embeddings and lm.pos_encoding is not None


# -- bad input that once got an obscure error, or none ------------------------------------
def test_zero_length_input_gives_empty_outputs():
    mha = MultiHeadAttention(16, 4, num_kv_heads=2, rope=RotaryEmbedding(4))
    out, _ = mha(torch.zeros(2, 0, 16), is_causal=True)
    assert out.shape == (2, 0, 16)
    mla = MultiHeadLatentAttention(16, 4, 8)
    assert mla(torch.zeros(2, 0, 16))[0].shape == (2, 0, 16)
    lm = _lm(BASE.replace(position="rope", num_kv_heads=2))
    assert lm(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0, 20)


def test_alibi_of_another_head_count_is_refused():
    with pytest.raises(ValueError, match="ALiBi of num_heads=1 for a layer of num_heads=4"):
        MultiHeadAttention(16, 4, alibi=ALiBi(1))


def test_token_ids_on_another_device_are_named():
    with pytest.raises(ValueError, match="tokens are on meta but the model is on cpu"):
        _lm(BASE)(torch.zeros(2, 3, dtype=torch.long, device="meta"))
    with pytest.raises(ValueError, match="src are on meta but the model is on cpu"):
        model = _transformer(BASE)
        src = torch.zeros(2, 3, dtype=torch.long, device="meta")
        model(src, src, torch.tensor([3, 3], device="meta"))


def test_a_cache_refuses_to_mix_keys_and_a_latent():
    x = torch.randn(1, 3, 16)
    mha, mla = MultiHeadAttention(16, 4), MultiHeadLatentAttention(16, 4, 8)
    cache = LayerCache()
    mla(x, cache=cache)
    with pytest.raises(ValueError, match="holds a latent of 3 tokens; it cannot take keys"):
        mha(x, cache=cache)
    cache = LayerCache()
    mha(x, cache=cache)
    with pytest.raises(ValueError, match="holds keys and values of 3 tokens; it cannot take a"):
        mla(x, cache=cache)


# -- ffn="none": attention-only blocks (Elhage et al., 2021) ------------------------------
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_ffn_none_leaves_the_attention_alone(norm_first):
    """A block with ffn="none" is x + attention(x) in its AddNorm, nothing more; in every
    kind of block, and the model has no feed-forward parameters at all."""
    config = BASE.replace(ffn="none", norm_first=norm_first)
    lm, model = _lm(config), _transformer(config)
    for m in (lm, model):
        names = [name for name, _ in m.named_parameters()]
        assert not any(".ffn." in name for name in names)
    block = lm.blocks[0]
    assert block.ffn is None and block.addnorm2 is None
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
    mask = mhbook.causal_mask(5)
    expected = block.addnorm1(x, lambda x: block.self_attn(x, mask=mask)[0])
    torch.testing.assert_close(block(x, mask), expected, rtol=0, atol=0)
    # Against a block with an FFN whose output is zero: the same output.
    with_ffn = mhbook.DecoderOnlyBlock(config.replace(ffn="relu"))
    with_ffn.load_state_dict(block.state_dict(), strict=False)
    nn.init.zeros_(with_ffn.ffn.linear2.weight), nn.init.zeros_(with_ffn.ffn.linear2.bias)
    if norm_first:  # post-norm normalises once more after the (zero) FFN
        torch.testing.assert_close(with_ffn(x, mask), block(x, mask), rtol=0, atol=0)
    encoder, decoder = model.encoder.blocks[0], model.decoder.blocks[0]
    assert encoder.ffn is decoder.ffn is None and encoder.addnorm2 is decoder.addnorm3 is None
    src = torch.randint(3, 20, (2, 6), generator=torch.Generator().manual_seed(1))
    assert model(src, src[:, :4], torch.tensor([6, 4])).shape == (2, 4, 20)


def test_ffn_none_is_refused_by_hugging_face():
    config = BASE.replace(
        ffn="none", norm="rms", bias=False, position="rope", norm_first=True,
        scale_embeddings=False,
    )  # fmt: skip
    with pytest.raises(ValueError, match="ffn='none' .* needs a SwiGLU"):
        mhbook.models.hf.hf_config(config, 20)
