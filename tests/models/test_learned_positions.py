"""position="learned": a trained table of max_position_embeddings rows added to the token
embeddings, as GPT-2's ``wpe`` and nanoGPT's GPT. Checked against Hugging Face's GPT2Model and
GPT2LMHeadModel (random weights, built from a config; nothing is downloaded), and refused by
name where it cannot go: past the table, with positions=, with the Llama conversion."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import mhbook
from mhbook import DecoderOnlyLM, ModelConfig, Transformer

VOCAB, TABLE = 37, 12
#: nanoGPT's GPT (= GPT-2's block) in a ModelConfig: pre-norm LayerNorm with biases, GELU,
#: multi-head attention, learned positions, tied embeddings, unscaled embeddings.
GPT = ModelConfig(
    d_model=32,
    num_heads=4,
    num_layers=2,
    d_ff=128,
    norm_first=True,
    norm="layer",
    ffn="gelu",
    bias=True,
    position="learned",
    max_position_embeddings=TABLE,
    tie_embeddings=True,
    scale_embeddings=False,
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _tokens(batch=2, length=9, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _gpt2_like(config: ModelConfig = GPT) -> tuple[DecoderOnlyLM, GPT2LMHeadModel]:
    """Hugging Face's GPT-2 with random weights, and the book's model holding the same."""
    torch.manual_seed(0)
    theirs = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB,
            n_positions=config.max_position_embeddings,
            n_embd=config.d_model,
            n_layer=config.num_layers,
            n_head=config.num_heads,
            n_inner=config.d_ff,
            activation_function="gelu",  # the exact GELU, as ffn="gelu"
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=config.norm_eps,
        )
    ).double()
    theirs.eval()
    ours = DecoderOnlyLM(config, VOCAB).double().eval()
    d = config.d_model
    h = theirs.transformer
    with torch.no_grad():
        ours.embedding.weight.copy_(h.wte.weight)
        ours.pos_table.weight.copy_(h.wpe.weight)
        for block, layer in zip(ours.blocks, h.h):
            attn = block.self_attn
            c_attn_w, c_attn_b = layer.attn.c_attn.weight, layer.attn.c_attn.bias  # (d, 3d): x @ W
            for i, W in enumerate((attn.W_q, attn.W_k, attn.W_v)):
                W.weight.copy_(c_attn_w[:, i * d : (i + 1) * d].T)
                W.bias.copy_(c_attn_b[i * d : (i + 1) * d])
            attn.W_o.weight.copy_(layer.attn.c_proj.weight.T)
            attn.W_o.bias.copy_(layer.attn.c_proj.bias)
            block.ffn.linear1.weight.copy_(layer.mlp.c_fc.weight.T)
            block.ffn.linear1.bias.copy_(layer.mlp.c_fc.bias)
            block.ffn.linear2.weight.copy_(layer.mlp.c_proj.weight.T)
            block.ffn.linear2.bias.copy_(layer.mlp.c_proj.bias)
            block.addnorm1.norm.load_state_dict(layer.ln_1.state_dict())
            block.addnorm2.norm.load_state_dict(layer.ln_2.state_dict())
        ours.norm.load_state_dict(h.ln_f.state_dict())
        ours.output.bias.zero_()  # GPT-2's head has no bias; ours (bias=True) has one
    return ours, theirs


def test_the_embedding_is_gpt2s_token_plus_position_rows():
    """Stack.embed with learned positions is GPT-2's wte(tokens) + wpe(position_ids), from
    any offset (Hugging Face's position_ids after past_length tokens)."""
    ours, theirs = _gpt2_like()
    tokens = _tokens()
    with torch.no_grad():
        for offset in (0, 3):
            positions = torch.arange(offset, offset + tokens.size(1))
            hidden = theirs.transformer(
                tokens, position_ids=positions[None].expand_as(tokens), output_hidden_states=True
            ).hidden_states[0]  # the embedding's output, before the first block
            torch.testing.assert_close(ours.embed(tokens, "tokens", offset), hidden, rtol=0, atol=0)


def test_a_nanogpt_shaped_config_is_gpt2():
    """The config nanoGPT's GPT has (tied embeddings, a learned table) gives GPT-2's logits,
    and its tied output layer is the token embedding."""
    ours, theirs = _gpt2_like()
    assert ours.output.weight is ours.embedding.weight
    tokens = _tokens(length=TABLE)
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens).logits, rtol=0, atol=1e-10)


def test_cached_decoding_equals_the_full_pass():
    """The cache's length is the offset into the table, as GPT-2's past_length."""
    ours, theirs = _gpt2_like()
    tokens = _tokens(length=TABLE)
    with torch.no_grad():
        full = ours(tokens)
        cache = ours.new_cache()
        steps = [ours(tokens[:, :5], cache=cache)]
        steps += [ours(tokens[:, t : t + 1], cache=cache) for t in range(5, TABLE)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-10)
    assert torch.equal(
        ours.generate(tokens[:, :3], TABLE - 3),
        ours.generate(tokens[:, :3], TABLE - 3, use_cache=False),
    )


def test_positions_past_the_table_are_refused_by_name():
    ours, _ = _gpt2_like()
    message = "past the learned position table of ModelConfig.max_position_embeddings=12 rows"
    with pytest.raises(ValueError, match=f"tokens reach position 12 \\(from 0\\), {message}"):
        ours(_tokens(length=TABLE + 1))
    cache = ours.new_cache()
    ours(_tokens(length=TABLE), cache=cache)
    with pytest.raises(ValueError, match=f"tokens reach position 12 \\(from 12\\), {message}"):
        ours(_tokens(length=1), cache=cache)
    with pytest.raises(ValueError, match="ModelConfig.max_position_embeddings=12"):
        ours.generate(_tokens(length=3), TABLE)  # the 13th token needs position 12
    model = Transformer(GPT.replace(tie_embeddings=False), VOCAB, VOCAB)
    with pytest.raises(ValueError, match=f"src reach position 12 \\(from 0\\), {message}"):
        src = _tokens(length=TABLE + 1)
        model(src, src[:, :3], torch.tensor([TABLE + 1, TABLE + 1]))


def test_the_config_refuses_a_table_without_learned_positions_and_the_reverse():
    with pytest.raises(ValueError, match="position='learned' needs max_position_embeddings"):
        ModelConfig(position="learned")
    with pytest.raises(
        ValueError,
        match="max_position_embeddings=64 is the length of a learned position table: it "
        "needs position='learned', got position='rope'",
    ):
        ModelConfig(position="rope", max_position_embeddings=64)
    with pytest.raises(ValueError, match="ModelConfig.max_position_embeddings must be an int >= 1"):
        ModelConfig(position="learned", max_position_embeddings=0)


def test_the_repr_shows_the_table_only_when_there_is_one():
    assert "max_position_embeddings" not in repr(ModelConfig())
    assert repr(GPT).endswith("global_rope_theta=None, max_position_embeddings=12)")
    assert eval(repr(GPT), {"ModelConfig": ModelConfig}) == GPT


def test_positions_are_refused_with_learned_positions():
    ours, _ = _gpt2_like()
    with pytest.raises(ValueError, match="learned positions are added to the embeddings"):
        ours(_tokens(), positions=torch.arange(9))


def test_the_llama_conversion_refuses_learned_positions_by_name():
    llama = dict(norm="rms", ffn="swiglu", bias=False, norm_first=True, scale_embeddings=False)
    config = GPT.replace(**llama, tie_embeddings=False)
    with pytest.raises(ValueError, match="position='learned' \\(Hugging Face's Llama"):
        mhbook.models.hf.hf_config(config, VOCAB)
    with pytest.raises(ValueError, match="position='learned'"):
        mhbook.lm_to_hf(DecoderOnlyLM(config, VOCAB))


def test_the_table_learns():
    """The table is a parameter: trained, in the state_dict, with its own gradient."""
    lm = DecoderOnlyLM(GPT, VOCAB)
    assert "pos_table.weight" in lm.state_dict()
    assert lm.pos_table.weight.shape == (TABLE, GPT.d_model)
    tokens = _tokens()
    lm(tokens).sum().backward()
    grad = lm.pos_table.weight.grad
    assert grad[: tokens.size(1)].abs().sum() > 0 and torch.equal(
        grad[tokens.size(1) :], torch.zeros_like(grad[tokens.size(1) :])
    )
