"""Everything mhbook knows of Hugging Face ``transformers``: configs, weights and layers, both ways.

* :func:`lm_to_hf` / :func:`lm_from_hf`: a :class:`~mhbook.DecoderOnlyLM` and a
  ``LlamaForCausalLM`` (``MistralForCausalLM`` with a window);
* :func:`attention_from_hf`: a :class:`~mhbook.MultiHeadAttention` from a ``LlamaAttention``
  or ``MistralAttention``;
* :func:`mla_from_hf`: a :class:`~mhbook.MultiHeadLatentAttention` from a
  ``DeepseekV3Attention``;
* :func:`hf_config` / :func:`model_config`: a :class:`~mhbook.ModelConfig` and a
  ``LlamaConfig`` or ``MistralConfig``; :func:`hf_rope`: the RoPE of a Hugging Face config;
* :data:`LLAMA_NAMES`, :func:`to_hf_names` / :func:`from_hf_names`: the weights' names.

A :class:`~mhbook.ModelConfig` of the Llama shape (pre-norm RMSNorm, SwiGLU, RoPE, no
biases, unscaled embeddings, no residual dropout) is a ``transformers.LlamaConfig``; with a
sliding ``window`` it is a ``MistralConfig``. The weights only change names::

    mhbook                                 transformers (Llama, Mistral)
    embedding                              model.embed_tokens
    blocks.i.addnorm1.norm                 model.layers.i.input_layernorm
    blocks.i.self_attn.W_q / W_k / W_v     model.layers.i.self_attn.q_proj / k_proj / v_proj
    blocks.i.self_attn.W_o                 model.layers.i.self_attn.o_proj
    blocks.i.addnorm2.norm                 model.layers.i.post_attention_layernorm
    blocks.i.ffn.W_gate / W_up / W_down    model.layers.i.mlp.gate_proj / up_proj / down_proj
    norm                                   model.norm
    output                                 lm_head

:func:`lm_to_hf` and :func:`lm_from_hf` use these.
A :class:`~mhbook.RopeScaling` is written to ``rope_parameters``: ``"linear"`` and
``"yarn"`` as Hugging Face's rope types of those names. Hugging Face has no static
NTK-aware scaling (its ``"dynamic"`` grows the factor with the sequence length), but static
NTK-aware scaling is exactly the default RoPE with a larger base: ``"ntk"`` is written as
``rope_type="default"`` with ``rope_theta = base * factor^(d / (d - 2))`` (the same model;
read back, it is a config with that ``rope_theta`` and no ``rope_scaling``).

``transformers`` is imported only when a function here needs it.
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention.mla import MultiHeadLatentAttention
from ..attention.multihead import MultiHeadAttention
from ..attention.rope import RotaryEmbedding, ntk_base
from ..core.config import LLAMA_SHAPE, ModelConfig, RopeScaling
from .lm import DecoderOnlyLM

__all__ = [
    "lm_to_hf",
    "lm_from_hf",
    "attention_from_hf",
    "mla_from_hf",
    "hf_config",
    "model_config",
    "hf_rope",
    "to_hf_names",
    "from_hf_names",
    "LLAMA_NAMES",
]

#: mhbook's parameter names -> Hugging Face Llama's, per block ``{i}`` and outside blocks.
LLAMA_NAMES = {
    "embedding.weight": "model.embed_tokens.weight",
    "blocks.{i}.addnorm1.norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blocks.{i}.self_attn.W_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blocks.{i}.self_attn.W_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blocks.{i}.self_attn.W_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blocks.{i}.self_attn.W_o.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blocks.{i}.addnorm2.norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blocks.{i}.ffn.W_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blocks.{i}.ffn.W_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blocks.{i}.ffn.W_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


# -- the language model ------------------------------------------------------------------------
def lm_to_hf(model: DecoderOnlyLM, **special_tokens):
    """``model`` as a ``transformers.LlamaForCausalLM`` (a ``MistralForCausalLM`` when
    ``config.window`` is set): the same weights, on the same device and dtype, in the same
    mode, giving the same logits.

    The config must be Llama-shaped (see :func:`hf_config`); a field the Hugging Face class
    cannot express (LayerNorm, ReLU, biases, sinusoidal positions, scaled embeddings, ...)
    raises a ``ValueError`` naming it, and so does a set ``head_mask``. ``special_tokens``
    (``bos_token_id``, ``eos_token_id``, ``pad_token_id``) go into its config.
    ``save_pretrained(folder)`` then writes a checkpoint that
    ``transformers.AutoModelForCausalLM.from_pretrained(folder)`` loads.
    """
    from transformers import AutoModelForCausalLM

    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"expected a mhbook.DecoderOnlyLM, got {type(model).__name__}")
    config = hf_config(model.config, model.vocab_size, **special_tokens)
    weight = model.embedding.weight
    with torch.random.fork_rng(devices=[]):  # its random initialisation, overwritten below
        hf = AutoModelForCausalLM.from_config(config, dtype=weight.dtype)
    hf.to(weight.device)
    hf.load_state_dict(to_hf_names(model.state_dict(), len(model.blocks)))
    hf.train(model.training)
    return hf


def lm_from_hf(model) -> DecoderOnlyLM:
    """The book's :class:`~mhbook.DecoderOnlyLM` of a Hugging Face ``LlamaForCausalLM`` or
    ``MistralForCausalLM``: same weights, device, dtype and mode, same logits. A setting
    the book's model cannot express (a RoPE other than default, linear or YaRN, biases,
    another activation) raises a ``ValueError`` naming it (see :func:`model_config`)."""
    config, vocab_size = model_config(model)
    weight = model.get_input_embeddings().weight
    with torch.device("meta"):
        ours = DecoderOnlyLM(config, vocab_size)
    ours.to_empty(device=weight.device).to(weight.dtype)
    ours.load_state_dict(from_hf_names(model.state_dict(), config.num_layers))
    if config.tie_embeddings:
        ours.output.weight = ours.embedding.weight
    ours.train(model.training)
    return ours


# -- attention layers --------------------------------------------------------------------------
def attention_from_hf(m: nn.Module) -> MultiHeadAttention:
    """Copy a Hugging Face ``LlamaAttention`` or ``MistralAttention`` (``transformers``
    5): a :class:`~mhbook.MultiHeadAttention` with the same weights (``q_proj``,
    ``k_proj``, ``v_proj``, ``o_proj`` are ``W_q``, ``W_k``, ``W_v``, ``W_o``), device,
    dtype and mode, giving the same outputs, with a :class:`mhbook.RotaryEmbedding` of the
    model's ``rope_theta`` and RoPE scaling.

    Mistral's sliding window is not a property of the layer, in ``transformers`` as
    here: it is in the mask (``causal_mask(T, S, window=config.sliding_window)``).
    The default, ``"linear"`` and ``"yarn"`` RoPE are copied (see :func:`hf_rope`); another
    ``rope_type`` raises a ``ValueError``, and so do biases in some projections but not
    all. A module that is not such a layer raises a ``TypeError`` naming what it lacks.
    """
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "config", "head_dim"):
        if not hasattr(m, name):
            raise TypeError(
                f"expected a Hugging Face LlamaAttention or MistralAttention, got "
                f"{type(m).__name__} (it has no {name})"
            )
    config = m.config
    rope_theta, rope_scaling = hf_rope(config)
    bias = m.q_proj.bias is not None
    if (m.o_proj.bias is not None) != bias:
        raise ValueError(
            "mhbook's layer has biases in all four projections or in none; this one has "
            f"q_proj bias {bias}, o_proj bias {m.o_proj.bias is not None}"
        )
    weight = m.q_proj.weight
    ours = MultiHeadAttention(
        config.hidden_size,
        config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        dropout=float(getattr(config, "attention_dropout", 0.0) or 0.0),
        bias=bias,
        d_head=m.head_dim,
        rope=RotaryEmbedding(m.head_dim, rope_theta, scaling=rope_scaling),
    ).to(weight.device, weight.dtype)
    with torch.no_grad():
        for mine, theirs in (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj")):
            getattr(ours, mine).load_state_dict(getattr(m, theirs).state_dict())
        ours.W_o.load_state_dict(m.o_proj.state_dict())
    ours.train(m.training)
    return ours


def mla_from_hf(m: nn.Module) -> MultiHeadLatentAttention:
    """Copy a Hugging Face ``DeepseekV3Attention``: a
    :class:`~mhbook.MultiHeadLatentAttention` with the same weights, device and dtype,
    giving the same outputs.

    The layouts (see :mod:`mhbook.attention.mla`): ``q_proj`` (or, with ``q_lora_rank``,
    ``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``) holds ``W_q`` and ``W_qr`` side by side
    per head (``(h * (d_head + d_rope), ...)``); ``kv_a_proj_with_mqa`` is ``W_dkv``
    (``d_latent`` rows) and ``W_kr`` (``d_rope`` rows) stacked; ``kv_b_proj`` is ``W_uk``
    and ``W_uv`` side by side per head (``(h * (d_head + d_v), d_latent)``). Its latent RMS
    norms become PyTorch's ``nn.RMSNorm`` (same formula; Hugging Face's computes in
    float32 even for float64 inputs). ``rope_interleave`` is copied; RoPE scaling (YaRN)
    and fewer key/value heads than heads raise a ``ValueError``.
    """
    config = m.config
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"only the default RoPE is supported, got {rope!r}")
    if m.num_key_value_groups != 1:
        raise ValueError("DeepseekV3Attention with num_key_value_heads != num_heads")
    h = m.num_heads
    d_head, d_rope, d_v = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    d_latent, d_q_latent = m.kv_lora_rank, m.q_lora_rank
    weight = m.kv_b_proj.weight
    theta, interleaved = float(rope.get("rope_theta", 10000.0)), bool(config.rope_interleave)
    ours = MultiHeadLatentAttention(
        m.hidden_size,
        h,
        d_latent,
        dropout=float(m.attention_dropout or 0.0),
        bias=m.kv_a_proj_with_mqa.bias is not None,
        d_head=d_head,
        d_rope=d_rope,
        d_v=d_v,
        d_q_latent=d_q_latent,
        rope=RotaryEmbedding(d_rope, theta, interleaved=interleaved) if d_rope else None,
        norm_eps=m.kv_a_layernorm.variance_epsilon,
    ).to(weight.device, weight.dtype)
    with torch.no_grad():
        q_proj = m.q_proj if d_q_latent is None else m.q_b_proj
        if d_q_latent is not None:
            _copy_linear(ours.W_dq, m.q_a_proj.weight, m.q_a_proj.bias)
            ours.q_norm.weight.copy_(m.q_a_layernorm.weight)
        q = q_proj.weight.view(h, d_head + d_rope, -1)
        ours.W_q.weight.copy_(q[:, :d_head].reshape(h * d_head, -1))
        kv_a = m.kv_a_proj_with_mqa
        bias = kv_a.bias
        _copy_linear(ours.W_dkv, kv_a.weight[:d_latent], None if bias is None else bias[:d_latent])
        ours.kv_norm.weight.copy_(m.kv_a_layernorm.weight)
        if d_rope:
            ours.W_qr.weight.copy_(q[:, d_head:].reshape(h * d_rope, -1))
            _copy_linear(
                ours.W_kr, kv_a.weight[d_latent:], None if bias is None else bias[d_latent:]
            )
        kv_b = m.kv_b_proj.weight.view(h, d_head + d_v, d_latent)
        ours.W_uk.weight.copy_(kv_b[:, :d_head].reshape(h * d_head, d_latent))
        ours.W_uv.weight.copy_(kv_b[:, d_head:].reshape(h * d_v, d_latent))
        _copy_linear(ours.W_o, m.o_proj.weight, m.o_proj.bias)
    return ours


def _copy_linear(linear: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    linear.weight.copy_(weight)
    if bias is not None:
        linear.bias.copy_(bias)


# -- configs -----------------------------------------------------------------------------------
def hf_config(config: ModelConfig, vocab_size: int, **special_tokens):
    """The ``transformers.LlamaConfig`` (or ``MistralConfig`` when ``config.window`` is
    set) of a model built from ``config``.

    Args:
        config: a Llama-shaped :class:`~mhbook.ModelConfig`; any other field value
            raises a ``ValueError`` that names every field Llama cannot express.
        vocab_size: the number of tokens.
        special_tokens: ``bos_token_id``, ``eos_token_id``, ``pad_token_id`` to record
            (default ``None``: the book's models need none).
    """
    from transformers import LlamaConfig, MistralConfig

    config.require(LLAMA_SHAPE, "Hugging Face's Llama and Mistral")
    unknown = set(special_tokens) - {"bos_token_id", "eos_token_id", "pad_token_id"}
    if unknown:
        raise TypeError(f"unexpected arguments {sorted(unknown)}")
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.kv_heads,
        head_dim=config.d_head,
        hidden_act="silu",
        rms_norm_eps=config.norm_eps,
        tie_word_embeddings=config.tie_embeddings,
        attention_dropout=config.attention_dropout,
        **_rope_parameters(config),
        **{"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **special_tokens},
    )
    if config.window is not None:
        return MistralConfig(sliding_window=config.window, **fields)
    return LlamaConfig(attention_bias=False, mlp_bias=False, **fields)


def _rope_parameters(config: ModelConfig) -> dict:
    """``rope_parameters`` (and, when scaled, ``max_position_embeddings``, the extended
    context ``factor * original_context``) of ``config``'s RoPE."""
    theta, scaling = float(config.rope_theta), config.rope_scaling
    if scaling is None:
        return {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}
    rope = {"rope_type": scaling.kind, "rope_theta": theta, "factor": float(scaling.factor)}
    if scaling.kind == "ntk":  # static NTK-aware scaling = the default RoPE of a larger base
        rope = {
            "rope_type": "default",
            "rope_theta": ntk_base(config.d_head, theta, rope["factor"]),
        }
    elif scaling.kind == "yarn":
        rope["original_max_position_embeddings"] = scaling.original_context
        rope["beta_fast"], rope["beta_slow"] = float(scaling.beta_fast), float(scaling.beta_slow)
    extended = round(scaling.original_context * scaling.factor)
    return {"rope_parameters": rope, "max_position_embeddings": extended}


def model_config(hf) -> tuple[ModelConfig, int]:
    """``(ModelConfig, vocab_size)`` of a Hugging Face ``LlamaConfig`` or ``MistralConfig``
    (or of a model that has one as ``.config``). What the book's model cannot express
    (biases, another activation, a RoPE other than default, linear or YaRN, see
    :func:`hf_rope`) raises a ``ValueError`` naming it."""
    config = getattr(hf, "config", hf)
    model_type = getattr(config, "model_type", None)
    if model_type not in ("llama", "mistral"):
        raise ValueError(
            f"expected a Hugging Face Llama or Mistral model or config, got model_type="
            f"{model_type!r} ({type(config).__name__})"
        )
    refused = {
        "hidden_act": (config.hidden_act, "silu"),
        "attention_bias": (getattr(config, "attention_bias", False), False),
        "mlp_bias": (getattr(config, "mlp_bias", False), False),
    }
    wrong = [f"{k}={got!r} (needs {need!r})" for k, (got, need) in refused.items() if got != need]
    if wrong:
        raise ValueError("the book's model cannot express " + "; ".join(wrong))
    rope_theta, rope_scaling = hf_rope(config)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = config.num_key_value_heads or heads
    window = getattr(config, "sliding_window", None) if model_type == "mistral" else None
    ours = ModelConfig(
        d_model=config.hidden_size,
        num_heads=heads,
        num_layers=config.num_hidden_layers,
        d_ff=config.intermediate_size,
        num_kv_heads=None if kv_heads == heads else kv_heads,
        head_dim=None if head_dim * heads == config.hidden_size else head_dim,
        position="rope",
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        norm="rms",
        norm_eps=float(config.rms_norm_eps),
        norm_first=True,
        ffn="swiglu",
        bias=False,
        scale_embeddings=False,
        tie_embeddings=bool(config.tie_word_embeddings),
        attention_dropout=float(config.attention_dropout or 0.0),
        window=window,
    )
    return ours, config.vocab_size


def hf_rope(hf) -> tuple[float, RopeScaling | None]:
    """``(rope_theta, rope_scaling)`` of a Hugging Face config's ``rope_parameters`` (or
    of a model or layer that has one as ``.config``): ``"default"``, ``"linear"`` and
    ``"yarn"`` (with the paper's attention factor and ramp); any other rope type or YaRN
    option raises a ``ValueError`` naming it."""
    config = getattr(hf, "config", hf)
    rope = dict(getattr(config, "rope_parameters", None) or {})
    theta, kind = float(rope.get("rope_theta", 10000.0)), rope.get("rope_type", "default")
    if kind == "default":
        return theta, None
    if kind not in ("linear", "yarn"):
        raise ValueError(
            f"the book's model cannot express rope_parameters['rope_type']={kind!r} "
            "(needs 'default', 'linear' or 'yarn')"
        )
    wrong = [
        f"{k}={rope[k]!r}" for k in ("attention_factor", "mscale", "mscale_all_dim") if rope.get(k)
    ]
    wrong += ["truncate=False"] if rope.get("truncate", True) is False else []
    if wrong:
        raise ValueError(
            "the book's YaRN has the paper's attention factor and rounded ramp; it cannot "
            "express rope_parameters " + ", ".join(wrong)
        )
    longest = getattr(config, "max_position_embeddings", None)
    original = rope.get("original_max_position_embeddings")
    factor = rope.get("factor") or longest / original  # transformers' default for YaRN
    if original is None:  # linear scaling does not record it: the context before scaling
        original = max(1, round(longest / factor))
    scaling = RopeScaling(
        kind,
        float(factor),
        int(original),
        beta_fast=float(rope.get("beta_fast") or 32.0),
        beta_slow=float(rope.get("beta_slow") or 1.0),
    )
    return theta, scaling


# -- the weights' names ------------------------------------------------------------------------
def _renamer(num_layers: int, reverse: bool) -> dict[str, str]:
    pairs = {}
    for ours, theirs in LLAMA_NAMES.items():
        layers = range(num_layers) if "{i}" in ours else [None]
        for i in layers:
            a, b = ours.format(i=i), theirs.format(i=i)
            pairs[b if reverse else a] = a if reverse else b
    return pairs


def to_hf_names(state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """A Llama-shaped :class:`~mhbook.DecoderOnlyLM`'s state dict under Hugging Face's names."""
    names = _renamer(num_layers, reverse=False)
    extra = sorted(set(state) - set(names))
    if extra:
        raise ValueError(f"no Hugging Face Llama name for {extra} (a head_mask that is set?)")
    return {names[k]: v for k, v in state.items()}


def from_hf_names(state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """A Hugging Face Llama state dict under the book's names (the inverse of
    :func:`to_hf_names`); buffers such as the rotary embedding's are left out."""
    names = _renamer(num_layers, reverse=True)
    return {names[k]: v for k, v in state.items() if k in names}
