"""RoPE context extension (position interpolation, NTK-aware scaling, YaRN), checked against
code we did not write: transformers' ``ROPE_INIT_FUNCTIONS`` for the frequencies, and its
LlamaForCausalLM / LlamaAttention for whole models and layers on sequences longer than the
context the scaling starts from."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from helpers import CLOSE, seeded

import mhbook
from mhbook import Config, DecoderOnlyLM, ModelConfig, RopeScaling, RotaryEmbedding
from mhbook.attention.rope import ntk_base, rope_angles, rope_frequencies

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaAttention,
    LlamaRotaryEmbedding,
)

VOCAB = 41
LLAMA = dict(
    d_model=32, num_heads=4, num_kv_heads=2, num_layers=2, d_ff=64, norm_first=True,
    norm="rms", ffn="swiglu", bias=False, position="rope", scale_embeddings=False,
)  # fmt: skip
#: (d_head, base, factor, original_context): small heads and contexts, and Llama 2's shape.
SHAPES = [(16, 10000.0, 4.0, 64), (32, 500.0, 2.0, 16), (128, 10000.0, 8.0, 4096)]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _llama_config(d_head, rope_parameters, max_position_embeddings=2048) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=4 * d_head, num_attention_heads=4, num_key_value_heads=2, head_dim=d_head,
        max_position_embeddings=max_position_embeddings, rope_parameters=rope_parameters,
    )  # fmt: skip


# -- the frequencies: the same bits as transformers' ROPE_INIT_FUNCTIONS ------------------
@pytest.mark.parametrize(("d_head", "base", "factor", "context"), SHAPES)
def test_linear_is_transformers_linear(d_head, base, factor, context):
    config = _llama_config(d_head, {"rope_type": "linear", "rope_theta": base, "factor": factor})
    theirs, their_factor = ROPE_INIT_FUNCTIONS["linear"](config)
    ours, our_factor = rope_frequencies(d_head, base, RopeScaling("linear", factor, context))
    assert torch.equal(ours, theirs) and our_factor == their_factor == 1.0
    torch.testing.assert_close(ours, rope_frequencies(d_head, base)[0] / factor, **CLOSE)


@pytest.mark.parametrize(("d_head", "base", "factor", "context"), SHAPES)
@pytest.mark.parametrize("betas", [(32.0, 1.0), (16.0, 2.0)], ids=["paper", "other betas"])
def test_yarn_is_transformers_yarn(d_head, base, factor, context, betas):
    beta_fast, beta_slow = betas
    rope = {
        "rope_type": "yarn", "rope_theta": base, "factor": factor, "beta_fast": beta_fast,
        "beta_slow": beta_slow, "original_max_position_embeddings": context,
    }  # fmt: skip
    config = _llama_config(d_head, rope, max_position_embeddings=round(factor * context))
    theirs, their_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
    scaling = RopeScaling("yarn", factor, context, beta_fast=beta_fast, beta_slow=beta_slow)
    ours, our_factor = rope_frequencies(d_head, base, scaling)
    assert torch.equal(ours, theirs)
    assert our_factor == their_factor == 0.1 * math.log(factor) + 1.0


def test_yarn_keeps_the_fast_pairs_and_interpolates_the_slow_ones():
    """Llama 2's heads (d = 128, base 10^4, L = 4096), s = 8: pair i turns
    r_i = L 10^(-8i/128) / (2 pi) times over L; r_20 = 36.6 > beta_fast = 32 > r_21 = 31.8
    and r_45 = 1.005 > beta_slow = 1 > r_46 = 0.87."""
    theta = rope_frequencies(128, 10000.0)[0]
    turns = 4096 * theta / (2 * math.pi)
    assert turns[20] > 32 > turns[21] and turns[45] > 1 > turns[46]
    ours, _ = rope_frequencies(128, 10000.0, RopeScaling("yarn", 8.0, 4096))
    assert torch.equal(ours[:21], theta[:21])  # kept
    torch.testing.assert_close(ours[46:], theta[46:] / 8, rtol=1e-6, atol=0)  # interpolated
    between = ours[21:46] / theta[21:46]  # 1 - gamma + gamma / s: from near 1 to near 1/8
    assert (between < 1).all() and (between > 1 / 8).all() and (between.diff() < 0).all()


@pytest.mark.parametrize(("d_head", "base", "factor", "context"), SHAPES)
def test_ntk_is_transformers_dynamic_where_their_factor_is_ours(d_head, base, factor, context):
    """transformers' "dynamic" NTK at length T uses the base ``base * (s T / L - (s - 1))^(d /
    (d - 2))``: at ``T = L (2 - 1/s)`` that is our static ``base * s^(d / (d - 2))``."""
    config = _llama_config(
        d_head, {"rope_type": "dynamic", "rope_theta": base, "factor": factor}, context
    )
    length = context * (2 - 1 / factor)
    assert length == int(length)
    theirs, their_factor = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=int(length))
    ours, our_factor = rope_frequencies(d_head, base, RopeScaling("ntk", factor, context))
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    assert our_factor == their_factor == 1.0
    # ...and it is the default RoPE of base' (what hf_config writes), bit for bit.
    default = _llama_config(
        d_head, {"rope_type": "default", "rope_theta": ntk_base(d_head, base, factor)}
    )
    assert torch.equal(ours, LlamaRotaryEmbedding(default).inv_freq)
    # Its two ends: the fastest pair is unchanged, the slowest divided by s.
    theta = rope_frequencies(d_head, base)[0]
    assert ours[0] == theta[0] == 1.0
    torch.testing.assert_close(ours[-1], theta[-1] / factor, rtol=1e-5, atol=0)


def test_no_scaling_changes_nothing():
    """``scaling=None`` is the RoPE of before, bit for bit: the same formula, and
    transformers' default RoPE; factor 1 of linear and NTK is no scaling either."""
    d, base = 16, 500.0
    exponents = torch.arange(0, d, 2, dtype=torch.int64).float()
    before = 1.0 / (base ** (exponents / d))
    assert torch.equal(rope_frequencies(d, base)[0], before)
    assert rope_frequencies(d, base)[1] == 1.0
    positions = torch.tensor([[0, 3, 9, 40, 100], [200, 1, 2, 7, 5]])
    assert torch.equal(rope_angles(positions, d, base), positions.float()[..., None] * before)
    hf = LlamaRotaryEmbedding(_llama_config(d, {"rope_type": "default", "rope_theta": base}))
    x = seeded(2, 4, 5, d)
    cos, sin = hf(x, positions)
    rotate_half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    expected = x * cos[:, None] + rotate_half * sin[:, None]
    assert torch.equal(RotaryEmbedding(d, base)(x, positions), expected)
    for kind in ("linear", "ntk"):
        same = RotaryEmbedding(d, base, scaling=RopeScaling(kind, 1.0, 8))
        assert torch.equal(same(x, positions), expected)


# -- whole models: the book's LM, exported, gives HF's logits past the original context ---
def _lm(scaling: RopeScaling) -> DecoderOnlyLM:
    torch.manual_seed(0)
    config = ModelConfig(**LLAMA, rope_scaling=scaling)
    return DecoderOnlyLM(config, VOCAB).double().eval()


SCALINGS = {
    "linear": RopeScaling("linear", 4.0, 8),
    "ntk": RopeScaling("ntk", 4.0, 8),
    "yarn": RopeScaling("yarn", 4.0, 8),
    "yarn, betas": RopeScaling("yarn", 2.5, 6, beta_fast=8.0, beta_slow=0.5),
}


@pytest.mark.parametrize("name", list(SCALINGS))
def test_to_hf_gives_the_same_logits_past_the_original_context(name):
    scaling = SCALINGS[name]
    lm = _lm(scaling)
    assert lm.rope.scaling == scaling  # the model's one rotary embedding
    hf = mhbook.lm_to_hf(lm)
    assert type(hf) is LlamaForCausalLM
    rope_type = hf.config.rope_parameters["rope_type"]
    assert rope_type == {"linear": "linear", "ntk": "default"}.get(scaling.kind, "yarn")
    length = 5 * scaling.original_context
    tokens = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(1))
    ours = lm(tokens)
    torch.testing.assert_close(hf(tokens).logits, ours, **CLOSE)
    # The scaling matters at these lengths: without it the logits are others.
    plain = _lm(None)
    plain.load_state_dict(lm.state_dict())
    assert (plain(tokens) - ours).abs().max() > 1e-3
    # Back from Hugging Face: linear and YaRN are the same config; NTK is the default
    # RoPE of the larger base, the same model.
    back = mhbook.lm_from_hf(hf)
    if scaling.kind == "ntk":
        d = lm.config.d_head
        assert back.config.rope_scaling is None
        assert back.config.rope_theta == ntk_base(d, lm.config.rope_theta, scaling.factor)
    else:
        assert back.config == lm.config
    torch.testing.assert_close(back(tokens), ours, **CLOSE)


def test_yarn_generates_hfs_tokens_past_the_original_context():
    """Greedy decoding with the KV cache, 20 tokens from a 4-token prompt, original context 6."""
    lm = _lm(SCALINGS["yarn, betas"])
    hf = mhbook.lm_to_hf(lm)
    prompt = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(2))
    theirs = hf.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
        pad_token_id=0,
    )  # fmt: skip
    assert torch.equal(lm.generate(prompt, 20), theirs[:, 4:])


@pytest.mark.parametrize("kind", ["linear", "yarn"])
def test_mha_from_hf_copies_the_scaling(kind):
    rope = {"rope_type": kind, "rope_theta": 1000.0, "factor": 3.0}
    if kind == "yarn":
        rope["original_max_position_embeddings"] = 8
    config = _llama_config(8, rope, max_position_embeddings=24)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    llama = LlamaAttention(config, layer_idx=0).double().eval()
    ours = mhbook.attention_from_hf(llama)
    assert ours.rope.scaling == RopeScaling(kind, 3.0, 8) and ours.rope.rope_theta == 1000.0
    x, position_ids = seeded(2, 20, 32, seed=3), torch.arange(20)[None]
    mask = torch.zeros(20, 20, dtype=torch.float64).masked_fill(
        ~mhbook.causal_mask(20), float("-inf")
    )
    cos_sin = LlamaRotaryEmbedding(config)(x, position_ids)
    theirs, _ = llama(x, position_embeddings=cos_sin, attention_mask=mask[None, None])
    mine, _ = ours(x, is_causal=True, positions=position_ids[0])
    torch.testing.assert_close(mine, theirs, **CLOSE)


# -- the config: stored, compared, refused by name ----------------------------------------
def test_a_config_with_scaling_round_trips_and_hashes():
    config = Config().replace(model={**LLAMA, "rope_scaling": SCALINGS["yarn"]})
    back = Config.from_dict(config.to_dict())
    assert back == config and hash(back.model) == hash(config.model)
    assert isinstance(back.model.rope_scaling, RopeScaling)
    assert ModelConfig(**dataclasses.asdict(config.model)) == config.model
    assert config.model != config.model.replace(rope_scaling=SCALINGS["linear"])


def test_bad_scalings_are_refused_by_name():
    with pytest.raises(ValueError, match=r"RopeScaling.factor must be a number >= 1.0, got 0.5"):
        RopeScaling(kind="yarn", factor=0.5, original_context=16)
    with pytest.raises(
        ValueError, match=r"RopeScaling.kind must be one of \('linear', 'ntk', 'yarn'\), got 'd"
    ):
        RopeScaling(kind="dynamic", factor=2.0, original_context=16)
    with pytest.raises(ValueError, match=r"RopeScaling.original_context must be an int >= 1"):
        RopeScaling("linear", 2.0, 0)
    with pytest.raises(ValueError, match=r"RopeScaling.beta_fast must be a number > 2"):
        RopeScaling("yarn", 2.0, 16, beta_fast=1.0, beta_slow=2.0)
    with pytest.raises(TypeError, match="scaling must be None or a RopeScaling, got dict"):
        RotaryEmbedding(8, scaling={"kind": "linear"})


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"position": "alibi"}, "it needs position='rope', got position='alibi'"),
        ({"position": "sinusoidal"}, "it needs position='rope'"),
        ({"d_latent": 16}, "with d_latent=16: latent attention's decoupled RoPE is not scaled"),
        ({"rope_scaling": "yarn"}, "must be None or a mhbook.RopeScaling, got 'yarn'"),
    ],
)
def test_the_config_refuses_scaling_it_does_not_build_by_name(changes, says):
    with pytest.raises(ValueError, match=f"ModelConfig.rope_scaling.*{says}"):
        ModelConfig(**{**LLAMA, "num_kv_heads": None, "rope_scaling": SCALINGS["yarn"], **changes})


@pytest.mark.parametrize(
    ("rope", "says"),
    [
        ({"rope_type": "dynamic", "factor": 2.0}, "rope_type'\\]='dynamic'"),
        ({"rope_type": "yarn", "factor": 2.0, "attention_factor": 1.5}, "attention_factor=1.5"),
        ({"rope_type": "yarn", "factor": 2.0, "truncate": False}, "truncate=False"),
    ],
)
def test_from_hf_names_the_rope_it_cannot_express(rope, says):
    config = _llama_config(8, {"rope_theta": 10000.0, **rope})
    with pytest.raises(ValueError, match=says):
        mhbook.models.hf.model_config(config)
