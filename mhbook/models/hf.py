"""The book's language model as a Hugging Face model: configs and weights, both ways.

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

:meth:`mhbook.DecoderOnlyLM.to_hf` and :meth:`~mhbook.DecoderOnlyLM.from_hf` use these.
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

from ..attention.rope import hf_rope, ntk_base
from ..core.config import ModelConfig

__all__ = [
    "hf_config",
    "model_config",
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

#: What a Llama-shaped config holds: field -> (the value, what Llama has).
_LLAMA_SHAPE = {
    "norm": ("rms", "RMSNorm"),
    "ffn": ("swiglu", "a SwiGLU feed-forward network"),
    "bias": (False, "no biases"),
    "position": ("rope", "RoPE"),
    "norm_first": (True, "pre-norm"),
    "scale_embeddings": (False, "unscaled embeddings"),
    "dropout": (0.0, "no residual dropout"),
    "d_latent": (None, "no latent attention"),
    "sinks": (0, "no attention sinks"),
    "global_every": (None, "one kind of attention in every layer"),
}


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

    wrong = [
        f"{name}={getattr(config, name)!r} (Llama has {what}: {name}={value!r})"
        for name, (value, what) in _LLAMA_SHAPE.items()
        if getattr(config, name) != value
    ]
    if wrong:
        raise ValueError(
            "this ModelConfig has no Hugging Face Llama or Mistral equivalent: " + "; ".join(wrong)
        )
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
