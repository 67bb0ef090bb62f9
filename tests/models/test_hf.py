"""The book's language model is a Hugging Face model: mhbook.models.hf's lm_to_hf / lm_from_hf
against transformers' own LlamaForCausalLM and MistralForCausalLM (random weights, built from a
config; nothing is downloaded), and attention_from_hf against LlamaAttention."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

import mhbook
from mhbook import DecoderOnlyLM, ModelConfig

VOCAB = 41
LLAMA = dict(
    d_model=32,
    num_heads=4,
    num_layers=2,
    d_ff=48,
    norm="rms",
    ffn="swiglu",
    bias=False,
    position="rope",
    norm_first=True,
    scale_embeddings=False,
)
SHAPES = {
    "gqa": {"num_kv_heads": 2, "rope_theta": 500.0},
    "mha, tied": {"tie_embeddings": True},
    "mqa, wide heads": {"num_kv_heads": 1, "head_dim": 16, "norm_eps": 1e-6},
    "mistral window": {"num_kv_heads": 2, "window": 4},
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """Nothing may be downloaded: transformers is told so."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _lm(dtype=torch.float64, seed=0, **changes) -> DecoderOnlyLM:
    torch.manual_seed(seed)
    return DecoderOnlyLM(ModelConfig(**{**LLAMA, **changes}), VOCAB).to(dtype).eval()


def _tokens(batch=3, length=13, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_to_hf_gives_the_same_logits(shape, dtype, atol):
    lm = _lm(dtype, **SHAPES[shape])
    hf = mhbook.lm_to_hf(lm)
    expected = MistralForCausalLM if "window" in SHAPES[shape] else LlamaForCausalLM
    assert type(hf) is expected and not hf.training
    assert hf.dtype == dtype
    tokens = _tokens()
    torch.testing.assert_close(hf(tokens).logits, lm(tokens), rtol=0, atol=atol)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_generate_gives_the_same_tokens_as_hf_generate(shape):
    lm = _lm(torch.float64, **SHAPES[shape])
    hf = mhbook.lm_to_hf(lm)
    prompt = _tokens(2, 5)
    ours = lm.generate(prompt, 12)
    theirs = hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=12,
        do_sample=False,
        pad_token_id=0,
    )
    assert torch.equal(ours, theirs[:, prompt.size(1) :])


def test_save_pretrained_round_trips_through_auto_model(tmp_path):
    lm = _lm(torch.float64, num_kv_heads=2, tie_embeddings=True)
    mhbook.lm_to_hf(lm, eos_token_id=3).save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert type(loaded) is LlamaForCausalLM and loaded.config.eos_token_id == 3
    tokens = _tokens()
    torch.testing.assert_close(loaded(tokens).logits, lm(tokens), rtol=0, atol=1e-10)
    back = mhbook.lm_from_hf(loaded)
    assert back.config == lm.config
    assert back.output.weight is back.embedding.weight  # still tied
    torch.testing.assert_close(back(tokens), lm(tokens), rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_from_hf_of_a_random_model_decodes_with_the_cache_as_hf_runs_the_whole(kind):
    """A Llama (or Mistral) made by transformers with its own random initialisation: the
    book's copy, decoding token by token with its KV cache, gives HF's full-pass logits."""
    common = dict(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    )
    torch.manual_seed(3)
    if kind == "llama":
        hf = LlamaForCausalLM(LlamaConfig(**common)).double().eval()
    else:
        hf = MistralForCausalLM(MistralConfig(sliding_window=5, **common)).double().eval()
    ours = mhbook.lm_from_hf(hf)
    assert ours.config.kv_heads == 2 and ours.config.rope_theta == 1000.0
    assert ours.config.window == (5 if kind == "mistral" else None)
    tokens = _tokens(2, 11)
    full = hf(tokens).logits
    cache = ours.new_cache()
    steps = [ours(tokens[:, :3], cache=cache)]  # a prompt, then one token at a time
    steps += [ours(tokens[:, t : t + 1], cache=cache) for t in range(3, tokens.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-10)


REFUSED = {
    "norm": "layer",
    "ffn": "gelu",
    "bias": True,
    "position": "alibi",
    "norm_first": False,
    "scale_embeddings": True,
    "dropout": 0.1,
}


@pytest.mark.parametrize(("field", "value"), list(REFUSED.items()))
def test_to_hf_names_the_field_llama_cannot_express(field, value):
    lm = _lm(**{field: value})
    with pytest.raises(ValueError, match=rf"{field}={value!r} .* needs"):
        mhbook.lm_to_hf(lm)


def test_to_hf_refuses_the_books_default_model_naming_every_field():
    with pytest.raises(ValueError) as info:
        mhbook.lm_to_hf(DecoderOnlyLM(ModelConfig(), VOCAB))
    for field in ("norm=", "ffn=", "bias=", "position=", "norm_first=", "scale_embeddings="):
        assert field in str(info.value)


def test_to_hf_refuses_a_set_head_mask():
    lm = _lm()
    lm.blocks[0].self_attn.head_mask = torch.ones(4, dtype=torch.float64)
    with pytest.raises(ValueError, match="head_mask"):
        mhbook.lm_to_hf(lm)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type"),
    ],
)
def test_from_hf_names_what_the_book_cannot_express(change, named):
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, **change,
    )  # fmt: skip
    with pytest.raises(ValueError, match=named):
        mhbook.models.hf.model_config(config)


def test_mha_from_hf_with_per_row_positions_of_a_left_padded_batch():
    """HF's position_ids of a left-padded batch differ by row; the layer takes them as
    (batch, T) positions in one call and gives LlamaAttention's output."""
    config = LlamaConfig(
        hidden_size=48, num_attention_heads=6, num_key_value_heads=3, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 300.0},
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    llama = LlamaAttention(config, layer_idx=0).double().eval()
    ours = mhbook.attention_from_hf(llama)
    assert (ours.num_kv_heads, ours.rope.rope_theta, ours.W_q.bias is not None) == (3, 300.0, True)
    x = torch.randn(2, 7, 48, dtype=torch.float64)
    pad = torch.tensor([3, 0])  # row 0 has three pads on the left
    real = torch.arange(7)[None] >= pad[:, None]  # (2, 7)
    positions = (real.cumsum(-1) - 1).clamp(min=0)  # HF's position_ids for left padding
    mask = mhbook.causal_mask(7) & real[:, None, None, :]  # (2, 1, 7, 7)
    cos_sin = LlamaRotaryEmbedding(config)(x, positions)
    additive = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    theirs, _ = llama(x, position_embeddings=cos_sin, attention_mask=additive)
    mine, _ = ours(x, mask=mask, positions=positions)
    keep = real[..., None]  # rows of pads attend to nothing and are not compared
    torch.testing.assert_close(mine * keep, theirs * keep, rtol=0, atol=1e-10)
