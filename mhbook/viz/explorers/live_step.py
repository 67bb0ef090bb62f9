"""Every operation of one character's forward pass in the live language model, stepped through.

Chapter 14's live panel (:func:`mhbook.viz.explorers.live.live_lm_html`) runs the small Llama in
the page. Its step-through shows one character's way through the model, one operation at a
time: the embedding row; in every block RMSNorm, the projections, RoPE and its angles, the
cached keys and values, the key/value heads repeated for their groups, the scores, the causal
mask, the softmax, the weighted sum, ``W_o``, the residual add, RMSNorm, SwiGLU's three
products and the second residual add; then the final norm, the logits and the next character's
probabilities.

:data:`STEP_OPS` is the one description of those operations. The page shows them in its order,
with its names, formulas and links, and records each under its key as the JavaScript forward
(``static/live_lm.js``, the functions that generate) computes it; :func:`step_reference` takes
each from the PyTorch model of the same weights (:func:`~mhbook.viz.explorers.live.shipped_lm`)
with forward hooks on its modules, so the browser test compares every operation the page shows
(``tests/viz/test_browser_live_lm.py``) and an operation cannot be shown unchecked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ...attention.cache import LayerCache
from ...attention.multihead import MultiHeadAttention
from ...attention.rope import RotaryEmbedding, apply_rope
from ...attention.sdpa import attend
from ...core.masks import causal_mask
from ...models.generation import next_token_probs
from ...models.layers import AddNorm, RMSNorm, SwiGLU
from ...models.lm import DecoderOnlyLM

__all__ = ["StepOp", "STEP_OPS", "step_keys", "step_ops_data", "step_reference"]


@dataclass(frozen=True)
class StepOp:
    """One operation of the step-through.

    Attributes:
        key: its name in the page's record and in :func:`step_reference` (prefixed with
            ``blocks.{l}.`` for an operation of every block).
        name: what the page calls it.
        formula: how it is computed, in the book's notation.
        shape: its shape in the page, in the config's names (``S``: the keys the token
            attends to, itself included; ``T``: the prompt's characters).
        source: the ``mhbook`` function or method whose code computes it (a class's
            ``forward``, or the method that does it); the page links its entry in the API page
            and its lines in the book's copy of the source (``_modules``, Sphinx's viewcode).
        per_block: whether every block has it.
    """

    key: str
    name: str
    formula: str
    shape: str
    source: str
    per_block: bool = True


#: The operations of one character's forward pass, in the order the page shows them: the
#: embedding, then those of every block (``per_block``), then the final norm, the logits and
#: the probabilities.
STEP_OPS: tuple[StepOp, ...] = (
    StepOp("embedding", "Token embedding", "x = E[token]", "(d_model,)",
           "mhbook.DecoderOnlyLM.forward", per_block=False),
    StepOp("norm1", "RMSNorm", "h = w ⊙ x / √(mean(x²) + ε)", "(d_model,)",
           "mhbook.RMSNorm.forward"),
    StepOp("q", "Query projection", "q = h W_qᵀ", "(num_heads × d_head,)",
           "mhbook.MultiHeadAttention.forward"),
    StepOp("k", "Key projection", "k = h W_kᵀ", "(num_kv_heads × d_head,)",
           "mhbook.MultiHeadAttention.forward"),
    StepOp("v", "Value projection", "v = h W_vᵀ", "(num_kv_heads × d_head,)",
           "mhbook.MultiHeadAttention.forward"),
    StepOp("angles", "RoPE's angles", "φ_i = position · θ_i, θ_i = rope_theta^(−2i / d_head)",
           "(d_head / 2,)", "mhbook.RotaryEmbedding.tables"),
    StepOp("q_rope", "RoPE on the query",
           "(q_i, q_{i+d/2}) turned by φ_i: q cos φ + rotate_half(q) sin φ",
           "(num_heads × d_head,)", "mhbook.apply_rope"),
    StepOp("k_rope", "RoPE on the key", "k cos φ + rotate_half(k) sin φ",
           "(num_kv_heads × d_head,)", "mhbook.apply_rope"),
    StepOp("keys", "Keys in the cache", "the cached keys (after RoPE), then this token's",
           "(S, num_kv_heads × d_head)", "mhbook.LayerCache.update"),
    StepOp("values", "Values in the cache", "the cached values, then this token's",
           "(S, num_kv_heads × d_head)", "mhbook.LayerCache.update"),
    StepOp("keys_grouped", "Key heads repeated for their groups (GQA)",
           "query head i reads key/value head ⌊i / (num_heads / num_kv_heads)⌋",
           "(num_heads, S, d_head)", "mhbook.attend"),
    StepOp("scores", "Scores", "s_ij = q_i · k_j / √d_head", "(num_heads, S)", "mhbook.attend"),
    StepOp("mask", "Causal mask",
           "key j allowed (1) when position − window < j ≤ position, else 0", "(T,)",
           "mhbook.causal_mask"),
    StepOp("weights", "Softmax", "a_ij = exp(s_ij) / Σ_j exp(s_ij)", "(num_heads, S)",
           "mhbook.attend"),
    StepOp("heads", "Weighted sum of the values", "head_i = Σ_j a_ij v_j",
           "(num_heads × d_head,)", "mhbook.attend"),
    StepOp("attn_out", "Heads merged, then W_o", "concat(head_1, …) W_oᵀ", "(d_model,)",
           "mhbook.MultiHeadAttention.forward"),
    StepOp("residual1", "Residual add", "x + attention", "(d_model,)",
           "mhbook.AddNorm.forward"),
    StepOp("norm2", "RMSNorm", "h = w ⊙ x / √(mean(x²) + ε)", "(d_model,)",
           "mhbook.RMSNorm.forward"),
    StepOp("gate", "SwiGLU's gate", "g = h W_gateᵀ", "(d_ff,)", "mhbook.SwiGLU.forward"),
    StepOp("up", "SwiGLU's up", "u = h W_upᵀ", "(d_ff,)", "mhbook.SwiGLU.forward"),
    StepOp("hidden", "Gate times up", "silu(g) ⊙ u, silu(g) = g σ(g)", "(d_ff,)",
           "mhbook.SwiGLU.forward"),
    StepOp("ffn_out", "W_down", "(silu(g) ⊙ u) W_downᵀ", "(d_model,)",
           "mhbook.SwiGLU.forward"),
    StepOp("residual2", "Residual add", "x + feed-forward", "(d_model,)",
           "mhbook.AddNorm.forward"),
    StepOp("final_norm", "Final RMSNorm", "h = w ⊙ x / √(mean(x²) + ε)", "(d_model,)",
           "mhbook.RMSNorm.forward", per_block=False),
    StepOp("logits", "Logits", "z = h W_outᵀ", "(vocab_size,)",
           "mhbook.DecoderOnlyLM.forward", per_block=False),
    StepOp("probs", "Next character's probabilities",
           "softmax((z − max z) / temperature), then top-p", "(vocab_size,)",
           "mhbook.next_token_probs", per_block=False),
)  # fmt: skip


def step_keys(num_layers: int) -> list[str]:
    """Every key the page records for one token, in the order it shows them."""
    keys = [op.key for op in STEP_OPS if not op.per_block and op.key == "embedding"]
    for layer in range(num_layers):
        keys += [f"blocks.{layer}.{op.key}" for op in STEP_OPS if op.per_block]
    return keys + [op.key for op in STEP_OPS if not op.per_block and op.key != "embedding"]


#: The objects an operation's ``source`` names, imported from the modules that define them.
_SOURCES = {
    obj.__name__: obj
    for obj in (
        AddNorm,
        DecoderOnlyLM,
        LayerCache,
        MultiHeadAttention,
        RMSNorm,
        RotaryEmbedding,
        SwiGLU,
        apply_rope,
        attend,
        causal_mask,
        next_token_probs,
    )
}


def step_ops_data() -> list[dict]:
    """:data:`STEP_OPS` as the page reads them (JSON), with each source's anchor in the
    book's API page (``anchor``: the module that defines it, as autodoc writes it) and its
    page and anchor in the book's highlighted source (``code``: as Sphinx's viewcode writes
    them, ``mhbook/models/layers.html#RMSNorm.forward``)."""
    out = []
    for op in STEP_OPS:
        owner, _, member = op.source.removeprefix("mhbook.").partition(".")
        obj = getattr(_SOURCES[owner], member) if member else _SOURCES[owner]
        module = obj.__module__
        out.append(
            {
                **asdict(op),
                "anchor": f"{module}.{obj.__qualname__}",
                "code": f"{module.replace('.', '/')}.html#{obj.__qualname__}",
            }
        )
    return out


@torch.no_grad()
def step_reference(
    model: DecoderOnlyLM,
    ids: list[int],
    position: int,
    *,
    temperature: float = 1.0,
    top_p: float | None = None,
) -> dict[str, torch.Tensor]:
    """PyTorch's value of every operation of :data:`STEP_OPS` for the token at ``position``
    of ``ids``: the model runs once over the whole prompt (not token by token with a cache, as
    the page does) with forward hooks on its modules; what happens inside attention (RoPE, the
    scores) is computed from the hooked projections with the tables the model handed the
    layer, and checked against the model's own weights and heads.

    Args:
        model: a Llama-shaped :class:`mhbook.DecoderOnlyLM` (the live panel's kind), in eval
            mode.
        ids: the prompt's token ids.
        position: which token to step through, ``0 <= position < len(ids)``.
        temperature, top_p: for ``probs``, as :func:`mhbook.next_token_probs`.

    Returns:
        ``{key: float32 tensor}`` for every key of :func:`step_keys`, each of the shape its
        op's ``shape`` says (``S`` the keys within the window, itself included).
    """
    if not 0 <= position < len(ids):
        raise ValueError(f"position must be in [0, {len(ids) - 1}], got {position}")
    config, p = model.config, position
    h, h_kv = config.num_heads, config.kv_heads
    d_head = config.head_dim or config.d_model // h
    window = config.window or len(ids)
    first = max(0, p - window + 1)  # the oldest key the token sees (the rolling cache's)
    seen: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(module, args, output):
            seen[name] = output[0] if isinstance(output, tuple) else output

        return hook

    def keep_input(name):
        def hook(module, args):
            seen[name] = args[0]

        return hook

    def keep_tables(name):
        def hook(module, args, kwargs, output):
            seen[name] = kwargs["rope_tables"]

        return hook

    handles = [model.blocks[0].register_forward_pre_hook(keep_input("embedding"))]
    for i, block in enumerate(model.blocks):
        b, attn = f"blocks.{i}.", block.self_attn
        if not isinstance(block.addnorm1.norm, RMSNorm) or not isinstance(block.ffn, SwiGLU):
            raise ValueError("step_reference follows a Llama-shaped model: RMSNorm and SwiGLU")
        handles += [
            block.addnorm1.norm.register_forward_hook(keep(b + "norm1")),
            attn.W_q.register_forward_hook(keep(b + "q")),
            attn.W_k.register_forward_hook(keep(b + "k")),
            attn.W_v.register_forward_hook(keep(b + "v")),
            attn.register_forward_hook(keep_tables(b + "tables"), with_kwargs=True),
            attn.W_o.register_forward_pre_hook(keep_input(b + "heads")),
            attn.W_o.register_forward_hook(keep(b + "attn_out")),
            block.addnorm2.norm.register_forward_pre_hook(keep_input(b + "residual1")),
            block.addnorm2.norm.register_forward_hook(keep(b + "norm2")),
            block.ffn.W_gate.register_forward_hook(keep(b + "gate")),
            block.ffn.W_up.register_forward_hook(keep(b + "up")),
            block.ffn.W_down.register_forward_pre_hook(keep_input(b + "hidden")),
            block.ffn.W_down.register_forward_hook(keep(b + "ffn_out")),
            block.register_forward_hook(keep(b + "residual2")),
        ]
        attn.keep_weights = True
    handles += [
        model.norm.register_forward_hook(keep("final_norm")),
        model.output.register_forward_hook(keep("logits")),
    ]
    try:
        model(torch.tensor([ids], device=next(model.parameters()).device))
        weights = [block.self_attn.weights for block in model.blocks]
    finally:
        for handle in handles:
            handle.remove()
        for block in model.blocks:
            block.self_attn.keep_weights = False

    out = {"embedding": seen["embedding"][0, p]}
    theta, _ = model.rope.frequencies(torch.device("cpu"))
    angles = p * theta.float()  # float32, as the tables compute them
    for i in range(len(model.blocks)):
        b = f"blocks.{i}."
        cos, sin = seen[b + "tables"]
        q = seen[b + "q"][0].view(-1, h, d_head).transpose(0, 1)  # (h, T, d_head)
        k = seen[b + "k"][0].view(-1, h_kv, d_head).transpose(0, 1)
        v = seen[b + "v"][0].view(-1, h_kv, d_head).transpose(0, 1)
        q_rope, k_rope = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys = k_rope[:, first : p + 1]  # (h_kv, S, d_head)
        grouped = keys.repeat_interleave(h // h_kv, dim=0)  # (h, S, d_head)
        scores = (q_rope[:, p : p + 1] @ grouped.transpose(-2, -1))[:, 0] / d_head**0.5
        out.update({
            b + "norm1": seen[b + "norm1"][0, p],
            b + "q": seen[b + "q"][0, p],
            b + "k": seen[b + "k"][0, p],
            b + "v": seen[b + "v"][0, p],
            b + "angles": angles,
            b + "q_rope": q_rope[:, p].reshape(-1),
            b + "k_rope": k_rope[:, p].reshape(-1),
            b + "keys": keys.transpose(0, 1).reshape(p + 1 - first, -1),
            b + "values": v[:, first : p + 1].transpose(0, 1).reshape(p + 1 - first, -1),
            b + "keys_grouped": grouped,
            b + "scores": scores,
            b + "mask": causal_mask(len(ids), len(ids), window=config.window)[p].float(),
            b + "weights": weights[i][0, :, p, first : p + 1],
            b + "heads": seen[b + "heads"][0, p],
            b + "attn_out": seen[b + "attn_out"][0, p],
            b + "residual1": seen[b + "residual1"][0, p],
            b + "norm2": seen[b + "norm2"][0, p],
            b + "gate": seen[b + "gate"][0, p],
            b + "up": seen[b + "up"][0, p],
            b + "hidden": seen[b + "hidden"][0, p],
            b + "ffn_out": seen[b + "ffn_out"][0, p],
            b + "residual2": seen[b + "residual2"][0, p],
        })  # fmt: skip
        # The scores written out give the model's own weights (its fused kernel's).
        torch.testing.assert_close(
            torch.softmax(scores, -1), out[b + "weights"], rtol=1e-4, atol=1e-5
        )
    logits = seen["logits"][0, p]
    out.update({
        "final_norm": seen["final_norm"][0, p],
        "logits": logits,
        "probs": next_token_probs(logits[None], temperature, top_p=top_p)[0],
    })  # fmt: skip
    assert sorted(out) == sorted(step_keys(len(model.blocks))), "STEP_OPS and the hooks differ"
    return {key: value.detach().float().cpu() for key, value in out.items()}
