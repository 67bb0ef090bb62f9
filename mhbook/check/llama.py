"""Checks of chapter 14's pieces of Llama's block, written by hand: RMSNorm, the SwiGLU
feed-forward network, RoPE from its ``cos`` and ``sin`` tables (rotate half), and
grouped-query attention with RoPE and the causal mask.

The expected values come from PyTorch's ``torch.nn.functional.rms_norm`` and from Hugging
Face ``transformers``' Llama code (``LlamaMLP``, ``LlamaRotaryEmbedding``,
``apply_rotary_pos_emb``, ``LlamaAttention``), built from a ``LlamaConfig`` with the case's
weights copied in, never from the hub. ``transformers`` is imported when a check first runs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .grader import Bug, Case, define, seeded

__all__ = ["rms_norm", "swiglu", "rotate_half", "rope_cos_sin", "llama_attention"]

CHAPTER = "14-a-small-llama"


def _llama_config(d_model, num_heads, num_kv_heads, d_head, d_ff=8, eps=1e-6):
    """A small ``LlamaConfig`` for one layer (eager attention: the weights are returned)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=d_model,
        intermediate_size=d_ff,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=d_head,
        hidden_act="silu",
        rms_norm_eps=eps,
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config._attn_implementation = "eager"
    return config


# --- RMSNorm ---------------------------------------------------------------------------


def _rms_norm_cases() -> list[Case]:
    def case(name, shape, seed, eps, dtype=torch.float32, scale=1.0, shift=0.0, dims=None):
        x = seeded(*shape, seed=seed, scale=scale) + shift
        g = 1 + seeded(shape[-1], seed=seed + 100, scale=0.5)
        return Case(name, (x.to(dtype), g.to(dtype), eps), dims={"output": dims or ("feature",)})

    return [
        case("one vector, d = 5", (5,), seed=40, eps=1e-6),
        case(
            "batch 1, T = 3, d = 7, small activations and eps = 0.1 (where eps matters)",
            (1, 3, 7),
            seed=41,
            eps=0.1,
            scale=0.3,
            dims=("batch", "position", "feature"),
        ),
        case(
            "(2, 3, 6) with a large mean (around 3; RMSNorm does not subtract it)",
            (2, 3, 6),
            seed=42,
            eps=1e-5,
            shift=3.0,
            dims=("batch", "position", "feature"),
        ),
        case(
            "(4, 16), eps = 1e-5",
            (4, 16),
            seed=43,
            eps=1e-5,
            dims=("position", "feature"),
        ),
        case(
            "float16, (3, 12)",
            (3, 12),
            seed=44,
            eps=1e-5,
            dtype=torch.float16,
            dims=("position", "feature"),
        ),
    ]


def _rms_norm_expected(case: Case) -> torch.Tensor:
    x, g, eps = case.args
    return F.rms_norm(x, (x.size(-1),), weight=g, eps=eps)


def _rms_norm_reference(x, g, eps):
    """Written for teaching: divide by the root mean square over the features, then scale."""
    return g * x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def _rms_eps_outside(x, g, eps):
    return g * x / (torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True)) + eps)


def _rms_layer_norm(x, g, eps):
    centred = x - x.mean(dim=-1, keepdim=True)
    return g * centred / torch.sqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps)


def _rms_first_axis(x, g, eps):
    return g * x / torch.sqrt(x.pow(2).mean(dim=0, keepdim=True) + eps)


def _rms_every_element(x, g, eps):
    return g * x / torch.sqrt(x.pow(2).mean() + eps)


def _rms_no_gain(x, g, eps):
    return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def _rms_sum(x, g, eps):
    return g * x / torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps)


def _rms_no_sqrt(x, g, eps):
    return g * x / (x.pow(2).mean(dim=-1, keepdim=True) + eps)


@define(
    title="RMSNorm, g * x / sqrt(mean(x^2) + eps)",
    cases=_rms_norm_cases,
    expected=_rms_norm_expected,
    reference=_rms_norm_reference,
    params=("x", "g", "eps"),
    why="Computing in float32 inside, as LlamaRMSNorm does, is fine.",
    bugs=[
        Bug(
            "eps added outside the square root",
            "add eps to the mean of the squares, then take the root: "
            "torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps).",
            _rms_eps_outside,
        ),
        Bug(
            "the mean subtracted and the result divided by the standard deviation (LayerNorm)",
            "RMSNorm does not centre: divide x itself by the root of the mean of x^2.",
            _rms_layer_norm,
        ),
        Bug(
            "the mean of the squares taken over the first axis instead of the features",
            "average over the last axis, mean(dim=-1, keepdim=True): each vector is "
            "normalised on its own.",
            _rms_first_axis,
        ),
        Bug(
            "the mean of the squares taken over every element of x",
            "average over the last axis only, mean(dim=-1, keepdim=True), not over the "
            "whole tensor.",
            _rms_every_element,
        ),
        Bug(
            "the gain g is not applied",
            "multiply the normalised vector by g, elementwise.",
            _rms_no_gain,
        ),
        Bug(
            "the sum of the squares instead of their mean (the vector's length)",
            "take the mean over the d features, not the sum: the result is sqrt(d) times larger.",
            _rms_sum,
        ),
        Bug(
            "divided by the mean square, without the square root",
            "divide by torch.sqrt(mean(x^2) + eps), the root mean square.",
            _rms_no_sqrt,
        ),
    ],
    chapter=CHAPTER,
)
def rms_norm(impl):
    """RMSNorm, ``g * x / sqrt(mean(x^2) + eps)`` over the last axis.

    Contract: ``impl(x, g, eps) -> y``, with ``x`` ``(..., d)``, the gain ``g`` ``(d,)`` in
    ``x``'s dtype and ``eps`` a float; ``y`` has ``x``'s shape and dtype. Each vector is
    divided by the root of the mean of its squares plus ``eps`` (no mean is subtracted),
    then multiplied by ``g`` elementwise. Compared with ``torch.nn.functional.rms_norm``
    (what ``transformers``' ``LlamaRMSNorm`` computes) in float32 and float16, the dtypes
    of models: computing inside in float32, as Llama does, is fine.
    """


# --- SwiGLU ----------------------------------------------------------------------------


def _swiglu_cases() -> list[Case]:
    def case(name, lead, d_model, d_ff, seed, dtype=torch.float64):
        x = seeded(*lead, d_model, seed=seed)
        w = [
            seeded(d_ff, d_model, seed=seed + 1, scale=0.5),
            seeded(d_ff, d_model, seed=seed + 2, scale=0.5),
            seeded(d_model, d_ff, seed=seed + 3, scale=0.5),
        ]
        dims = {
            "output": (*("batch", "position")[-len(lead) :], "feature") if lead else ("feature",)
        }
        return Case(name, (x.to(dtype), *(t.to(dtype) for t in w)), dims=dims)

    return [
        case("one vector, d_model = 3, d_ff = 5", (), 3, 5, seed=50),
        case("batch 1, T = 3, d_model = 4, d_ff = 10", (1, 3), 4, 10, seed=54),
        case(
            "float32, (2, 5) positions, d_model = 6, d_ff = 16",
            (2, 5),
            6,
            16,
            seed=58,
            dtype=torch.float32,
        ),
        case(
            "float16, 4 positions, d_model = 8, d_ff = 12",
            (4,),
            8,
            12,
            seed=62,
            dtype=torch.float16,
        ),
    ]


def _swiglu_expected(case: Case) -> torch.Tensor:
    """``transformers``' ``LlamaMLP`` with the case's weights."""
    from transformers.models.llama.modeling_llama import LlamaMLP

    x, W_gate, W_up, W_down = case.args
    d_ff, d_model = W_gate.shape
    mlp = LlamaMLP(_llama_config(d_model, 1, 1, d_model, d_ff=d_ff)).to(x.dtype)
    for layer, weight in ((mlp.gate_proj, W_gate), (mlp.up_proj, W_up), (mlp.down_proj, W_down)):
        layer.weight.data.copy_(weight)
    return mlp(x)


def _swiglu_reference(x, W_gate, W_up, W_down, act=F.silu):
    """Written for teaching: ``W_down (silu(W_gate x) * W_up x)``."""
    return (act(x @ W_gate.T) * (x @ W_up.T)) @ W_down.T


def _swiglu_swapped(x, W_gate, W_up, W_down):
    return _swiglu_reference(x, W_up, W_gate, W_down)


def _swiglu_gelu(x, W_gate, W_up, W_down):
    return _swiglu_reference(x, W_gate, W_up, W_down, act=F.gelu)


def _swiglu_relu(x, W_gate, W_up, W_down):
    return _swiglu_reference(x, W_gate, W_up, W_down, act=F.relu)


def _swiglu_sigmoid(x, W_gate, W_up, W_down):
    return _swiglu_reference(x, W_gate, W_up, W_down, act=torch.sigmoid)


def _swiglu_silu_both(x, W_gate, W_up, W_down):
    return (F.silu(x @ W_gate.T) * F.silu(x @ W_up.T)) @ W_down.T


@define(
    title="the SwiGLU feed-forward network, W_down (silu(W_gate x) * W_up x)",
    cases=_swiglu_cases,
    expected=_swiglu_expected,
    reference=_swiglu_reference,
    params=("x", "W_gate", "W_up", "W_down"),
    why="Float32 arithmetic inside is fine for float64 inputs.",
    bugs=[
        Bug(
            "the gate and up projections swapped (SiLU on W_up x)",
            "pass the gate projection through SiLU, silu(x @ W_gate.T), and multiply it by "
            "the plain x @ W_up.T.",
            _swiglu_swapped,
        ),
        Bug(
            "GELU instead of SiLU on the gate (GeGLU)",
            "use F.silu, z * sigmoid(z), the Swish of SwiGLU.",
            _swiglu_gelu,
        ),
        Bug(
            "ReLU instead of SiLU on the gate (ReGLU)",
            "use F.silu, z * sigmoid(z): smooth, and negative for negative z.",
            _swiglu_relu,
        ),
        Bug(
            "sigmoid instead of SiLU on the gate (the original GLU)",
            "SiLU is z * sigmoid(z), not sigmoid(z): use F.silu.",
            _swiglu_sigmoid,
        ),
        Bug(
            "SiLU on both projections",
            "only the gate goes through SiLU; the up projection x @ W_up.T stays linear.",
            _swiglu_silu_both,
        ),
    ],
    chapter=CHAPTER,
)
def swiglu(impl):
    """The SwiGLU feed-forward network of Llama, ``W_down (silu(W_gate x) * W_up x)``.

    Contract: ``impl(x, W_gate, W_up, W_down) -> y``, with ``x`` ``(..., d_model)``,
    ``W_gate`` and ``W_up`` ``(d_ff, d_model)`` and ``W_down`` ``(d_model, d_ff)`` (the
    ``nn.Linear`` layout: ``x @ W.T``, no biases); ``y`` ``(..., d_model)`` in ``x``'s
    dtype. Compared with ``transformers``' ``LlamaMLP`` holding the same weights.
    """


# --- RoPE from its tables (rotate half) -------------------------------------------------


def _tables(positions: torch.Tensor, d_head: int, base: float, dtype) -> tuple:
    """Llama's ``cos`` and ``sin`` tables ``(T, d_head)``, from ``LlamaRotaryEmbedding``."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = _llama_config(2 * d_head, 2, 2, d_head)
    config.rope_parameters = {"rope_type": "default", "rope_theta": base}
    rotary = LlamaRotaryEmbedding(config)
    cos, sin = rotary(torch.zeros(1, dtype=dtype), positions[None])
    return cos[0], sin[0]


def _rope_cases() -> list[Case]:
    def case(name, lead, T, d_head, seed, start, base=10000.0, dtype=torch.float64):
        x = seeded(*lead, T, d_head, seed=seed, dtype=dtype)
        cos, sin = _tables(torch.arange(start, start + T), d_head, base, dtype)
        dims = ("batch", "head", "position", "feature")[-(len(lead) + 2) :]
        return Case(name, (x, cos, sin), dims={"output": dims})

    return [
        case("one head, T = 3, d_head = 4, positions 0 to 2", (), 3, 4, seed=70, start=0),
        case(
            "batch 1, 3 heads, T = 5, d_head = 6 (3 pairs), positions 7 to 11",
            (1, 3),
            5,
            6,
            seed=71,
            start=7,
        ),
        case(
            "batch 2, 2 heads, T = 4, d_head = 8, base 100, positions 30 to 33",
            (2, 2),
            4,
            8,
            seed=72,
            start=30,
            base=100.0,
        ),
        case(
            "float16, 2 heads, T = 6, d_head = 16, positions 3 to 8",
            (2,),
            6,
            16,
            seed=73,
            start=3,
            dtype=torch.float16,
        ),
    ]


def _rope_expected(case: Case) -> torch.Tensor:
    """``transformers``' ``apply_rotary_pos_emb`` (queries and keys are rotated alike)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    x, cos, sin = case.args
    T, d_head = x.shape[-2:]
    flat = x.reshape(-1, 1, T, d_head)  # (batch, heads, T, d_head), as transformers has it
    rotated, _ = apply_rotary_pos_emb(flat, flat, cos[None], sin[None], unsqueeze_dim=1)
    return rotated.reshape(x.shape)


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def _rope_reference(x, cos, sin):
    """Written for teaching: ``x cos + rotate_half(x) sin``, rotate_half(a, b) = (-b, a)."""
    return x * cos + _rotate_half(x) * sin


def _rope_sign(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([b, -a], dim=-1) * sin


def _rope_neighbours(x, cos, sin):
    pairs = x.unflatten(-1, (-1, 2))
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return x * cos + rotated * sin


def _rope_swapped(x, cos, sin):
    return x * sin + _rotate_half(x) * cos


def _rope_not_rotated(x, cos, sin):
    return x * cos + x * sin


@define(
    title="RoPE from Llama's cos and sin tables, x cos + rotate_half(x) sin",
    cases=_rope_cases,
    expected=_rope_expected,
    reference=_rope_reference,
    params=("x", "cos", "sin"),
    why="Float32 arithmetic inside is fine for float64 inputs.",
    bugs=[
        Bug(
            "rotate_half returns (b, -a) instead of (-b, a): every pair turns the wrong way",
            "rotate_half(a, b) = (-b, a), i.e. torch.cat([-b, a], dim=-1), so that pair i "
            "gets x_i cos - x_{i+d/2} sin.",
            _rope_sign,
        ),
        Bug(
            "neighbouring features paired (the paper's interleaved layout) with Llama's tables",
            "Llama's tables pair feature j with j + d_head/2: rotate the two halves, "
            "torch.cat([-b, a], dim=-1) with a, b = x.chunk(2, dim=-1).",
            _rope_neighbours,
        ),
        Bug(
            "cos and sin swapped",
            "x goes with cos and rotate_half(x) with sin: x * cos + rotate_half(x) * sin.",
            _rope_swapped,
        ),
        Bug(
            "x itself multiplied by sin (rotate_half left out)",
            "the sin term multiplies the rotated vector: x * cos + rotate_half(x) * sin.",
            _rope_not_rotated,
        ),
    ],
    chapter=CHAPTER,
)
def rope_cos_sin(impl):
    """RoPE as Llama writes it, from tables: ``x cos + rotate_half(x) sin``.

    Contract: ``impl(x, cos, sin) -> rotated``, with ``x`` ``(..., T, d_head)`` (e.g.
    ``(batch, heads, T, d_head)``) and ``cos``, ``sin`` ``(T, d_head)``, the tables of
    ``LlamaRotaryEmbedding`` for T positions (the angles of the ``d_head / 2`` pairs,
    repeated over both halves); ``rotated`` has ``x``'s shape and dtype. Feature ``j`` is
    paired with feature ``j + d_head / 2`` ("rotate half": ``(a, b) -> (-b, a)`` on the two
    halves). The positions need not start at 0. Compared with ``transformers``'
    ``apply_rotary_pos_emb``.
    """


def _rotate_half_cases() -> list[Case]:
    return [
        Case(
            "one vector, d_head = 4",
            (torch.arange(1.0, 5.0, dtype=torch.float64),),
            dims={"output": ("feature",)},
        ),
        Case(
            "(2, 3, 6): 3 pairs per vector",
            (seeded(2, 3, 6, seed=75),),
            dims={"output": ("head", "position", "feature")},
        ),
        Case(
            "float16, (1, 2, 4, 8)",
            (seeded(1, 2, 4, 8, seed=76, dtype=torch.float16),),
            dims={"output": ("batch", "head", "position", "feature")},
        ),
    ]


def _rotate_half_expected(case: Case) -> torch.Tensor:
    """``transformers``' own ``rotate_half``."""
    from transformers.models.llama.modeling_llama import rotate_half as theirs

    return theirs(case.args[0])


def _rotate_half_sign(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([b, -a], dim=-1)


def _rotate_half_no_sign(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([b, a], dim=-1)


def _rotate_half_neighbours(x):
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)


@define(
    title="rotate_half, (a, b) -> (-b, a) on the two halves of the features",
    cases=_rotate_half_cases,
    expected=_rotate_half_expected,
    reference=_rotate_half,
    params=("x",),
    tolerances="exact",
    why="rotate_half only moves and negates values.",
    bugs=[
        Bug(
            "(b, -a) instead of (-b, a): the rotation goes the other way",
            "negate the second half and put it first: torch.cat([-b, a], dim=-1).",
            _rotate_half_sign,
        ),
        Bug(
            "the halves swapped without negating one: (b, a)",
            "a quarter turn negates one coordinate: torch.cat([-b, a], dim=-1).",
            _rotate_half_no_sign,
        ),
        Bug(
            "neighbouring features rotated (the paper's interleaved layout), not the halves",
            "Llama pairs feature j with j + d/2: a, b = x.chunk(2, dim=-1), then "
            "torch.cat([-b, a], dim=-1).",
            _rotate_half_neighbours,
        ),
    ],
    chapter=CHAPTER,
)
def rotate_half(impl):
    """Llama's ``rotate_half``: a quarter turn of every pair ``(x_j, x_{j + d/2})``.

    Contract: ``impl(x) -> y``, with ``x`` ``(..., d)`` (``d`` even) split into its halves
    ``a = x[..., :d/2]`` and ``b = x[..., d/2:]``; ``y = (-b, a)`` concatenated on the last
    axis, ``x``'s shape and dtype. Compared with ``transformers``' ``rotate_half``.
    """


# --- grouped-query attention with RoPE ---------------------------------------------------


def _attention_cases() -> list[Case]:
    def case(name, B, T, d_model, h, h_kv, d_head, seed, start=0, dtype=torch.float32):
        x = seeded(B, T, d_model, seed=seed, dtype=dtype)
        scale = 1 / math.sqrt(d_model)
        W = [
            seeded(h * d_head, d_model, seed=seed + 1, scale=2 * scale),
            seeded(h_kv * d_head, d_model, seed=seed + 2, scale=2 * scale),
            seeded(h_kv * d_head, d_model, seed=seed + 3, scale=scale),
            seeded(d_model, h * d_head, seed=seed + 4, scale=scale),
        ]
        cos, sin = _tables(torch.arange(start, start + T), d_head, 10000.0, dtype)
        return Case(
            name,
            (x, *(w.to(dtype) for w in W), h, h_kv, cos, sin),
            dims={
                "output": ("batch", "position", "feature"),
                "weights": ("batch", "head", "query", "key"),
            },
        )

    return [
        case(
            "batch 1, T = 3, 2 query heads sharing 1 key/value head, d_head = 4",
            B=1,
            T=3,
            d_model=6,
            h=2,
            h_kv=1,
            d_head=4,
            seed=80,
        ),
        case(
            "batch 2, T = 5, 4 query heads, 2 key/value heads, d_head = 4, positions 3 to 7",
            B=2,
            T=5,
            d_model=12,
            h=4,
            h_kv=2,
            d_head=4,
            seed=85,
            start=3,
        ),
        case(
            "batch 1, T = 4, 6 query heads, 3 key/value heads, d_head = 2",
            B=1,
            T=4,
            d_model=12,
            h=6,
            h_kv=3,
            d_head=2,
            seed=90,
        ),
        case(
            "batch 2, T = 6, 3 query heads, 3 key/value heads (plain multi-head), d_head = 6",
            B=2,
            T=6,
            d_model=9,
            h=3,
            h_kv=3,
            d_head=6,
            seed=95,
        ),
    ]


def _attention_expected(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """``transformers``' ``LlamaAttention`` (eager) with the case's weights and tables."""
    from transformers.models.llama.modeling_llama import LlamaAttention

    x, W_q, W_k, W_v, W_o, h, h_kv, cos, sin = case.args
    T, d_model = x.shape[-2:]
    layer = LlamaAttention(_llama_config(d_model, h, h_kv, W_q.size(0) // h), layer_idx=0)
    layer = layer.to(x.dtype).eval()
    for name, weight in zip("qkvo", (W_q, W_k, W_v, W_o)):
        getattr(layer, f"{name}_proj").weight.data.copy_(weight)
    mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    return layer(x, position_embeddings=(cos[None], sin[None]), attention_mask=mask)


def _attention_reference(
    x,
    W_q,
    W_k,
    W_v,
    W_o,
    num_heads,
    num_kv_heads,
    cos,
    sin,
    *,
    causal=True,
    rope_q=True,
    rope_k=True,
    rope_v=False,
    tile=False,
    scale=None,
    split="transpose",
    merge="transpose",
):
    """Written for teaching (and mutated for the bugs): project, split the heads, rotate q
    and k, repeat each key/value head for its group, causal softmax(q k^T / sqrt(d_head)) v,
    merge the heads, project back."""
    B, T, _ = x.shape
    d_head = W_q.size(0) // num_heads

    def heads(t, n):
        if split == "view":
            return t.reshape(B, n, T, d_head)
        return t.view(B, T, n, d_head).transpose(1, 2)

    q, k, v = (
        heads(x @ W_q.T, num_heads),
        heads(x @ W_k.T, num_kv_heads),
        heads(x @ W_v.T, num_kv_heads),
    )
    q = _rope_reference(q, cos, sin) if rope_q else q
    k = _rope_reference(k, cos, sin) if rope_k else k
    v = _rope_reference(v, cos, sin) if rope_v else v
    group = num_heads // num_kv_heads
    if tile:
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    else:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = math.sqrt(x.size(-1) if scale == "d_model" else d_head)
    scores = q @ k.transpose(-2, -1) / scale
    if causal:
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if merge == "reshape":
        merged = (weights @ v).reshape(B, T, num_heads * d_head)
    else:
        merged = (weights @ v).transpose(1, 2).reshape(B, T, num_heads * d_head)
    return merged @ W_o.T, weights


def _mutant(**change):
    def impl(x, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, cos, sin):
        return _attention_reference(
            x, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, cos, sin, **change
        )

    return impl


@define(
    title="grouped-query attention with RoPE and the causal mask, as Llama's",
    cases=_attention_cases,
    expected=_attention_expected,
    reference=_attention_reference,
    optional=("weights",),
    params=("x", "W_q", "W_k", "W_v", "W_o", "num_heads", "num_kv_heads", "cos", "sin"),
    why="The cases are float32, the dtype of models; the softmax in float32 or float64 both pass.",
    bugs=[
        Bug(
            "no causal mask: every position attends to the future too",
            "fill the scores above the diagonal with -inf before the softmax, "
            "scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float('-inf')).",
            _mutant(causal=False),
        ),
        Bug(
            "RoPE applied to the values too",
            "rotate only the queries and the keys: position must enter the scores, "
            "not what is averaged.",
            _mutant(rope_v=True),
        ),
        Bug(
            "RoPE applied to the queries only",
            "rotate the keys as well, by their own positions: rope(k, cos, sin).",
            _mutant(rope_k=False),
        ),
        Bug(
            "RoPE applied to the keys only",
            "rotate the queries as well: rope(q, cos, sin).",
            _mutant(rope_q=False),
        ),
        Bug(
            "key/value heads tiled with repeat (1, 2, 1, 2) instead of repeat_interleave "
            "(1, 1, 2, 2)",
            "query heads g * group ... (g + 1) * group - 1 share key/value head g: use "
            "k.repeat_interleave(group, dim=1), as transformers' repeat_kv does.",
            _mutant(tile=True),
        ),
        Bug(
            "scores scaled by sqrt(d_model) instead of sqrt(d_head)",
            "divide q k^T by math.sqrt(d_head), the size of one head's queries.",
            _mutant(scale="d_model"),
        ),
        Bug(
            "the heads split with view(B, num_heads, T, d_head) instead of view(B, T, "
            "num_heads, d_head).transpose(1, 2)",
            "the projections give (B, T, num_heads * d_head): view it as (B, T, num_heads, "
            "d_head), then transpose(1, 2).",
            _mutant(split="view"),
        ),
        Bug(
            "the heads merged with reshape(B, T, ...) without transposing back",
            "bring the heads back next to the features first: "
            "(weights @ v).transpose(1, 2).reshape(B, T, num_heads * d_head).",
            _mutant(merge="reshape"),
        ),
    ],
    chapter=CHAPTER,
)
def llama_attention(impl):
    """Llama's attention layer by hand: grouped-query heads, RoPE on queries and keys, the
    causal mask, no biases.

    Contract: ``impl(x, W_q, W_k, W_v, W_o, num_heads, num_kv_heads, cos, sin) -> (output,
    weights)`` (or the output alone), with ``x`` ``(batch, T, d_model)``, ``W_q``
    ``(num_heads * d_head, d_model)``, ``W_k`` and ``W_v`` ``(num_kv_heads * d_head,
    d_model)``, ``W_o`` ``(d_model, num_heads * d_head)`` (``x @ W.T``), and ``cos``,
    ``sin`` ``(T, d_head)``, the tables of ``LlamaRotaryEmbedding`` (positions need not
    start at 0). Query head ``i`` reads key/value head ``i // (num_heads //
    num_kv_heads)``. ``output`` is ``(batch, T, d_model)``, ``weights`` ``(batch,
    num_heads, T, T)``, in ``x``'s dtype. Compared with ``transformers``' ``LlamaAttention``
    (eager) holding the same weights, in float32 (its softmax runs in float32).
    """
