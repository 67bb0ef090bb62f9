"""Checks of chapters 8 and 9: attention computed block by block with an online softmax,
a decoding step with a KV cache, and top-p (nucleus) filtering of the next token's logits.

The references are PyTorch's ``torch.nn.functional.scaled_dot_product_attention`` (the
whole sequence in one causal pass, for the cache) and Hugging Face ``transformers``'
``TopPLogitsWarper``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .grader import Bug, Case, define, seeded

__all__ = ["tiled_attention", "kv_cache", "top_p"]

HEADS = ("batch", "head", "query", "feature")


# --- tiled attention (online softmax) ---------------------------------------------------


def _tiled_cases() -> list[Case]:
    def qkv(shape_q, shape_k, d_v, seed, dtype=torch.float64, scale=1.0):
        *lead, _, d = shape_q
        return (
            seeded(*shape_q, seed=seed, dtype=dtype, scale=scale),
            seeded(*shape_k, seed=seed + 1, dtype=dtype, scale=scale),
            seeded(*shape_k[:-1], d_v, seed=seed + 2, dtype=dtype),
        )

    # Large scores whose block maxima fall from one block to the next: an online softmax that
    # does not keep the running maximum overflows (exp of several hundred).
    q_big = seeded(1, 3, 8, seed=40, dtype=torch.float32) * 6
    k_big = seeded(1, 10, 8, seed=41, dtype=torch.float32) * 6
    k_big = k_big * torch.linspace(3.0, 0.5, 10)[None, :, None]  # the first blocks score most
    v_big = seeded(1, 10, 4, seed=42, dtype=torch.float32)
    return [
        Case(
            "T_k = 10 keys in blocks of 4 (the last block holds 2)",
            qkv((2, 3, 4), (2, 10, 4), 3, seed=30),
            {"block_size": 4},
            dims={"output": ("batch", "query", "feature")},
        ),
        Case(
            "block_size 1: one key at a time",
            qkv((1, 2, 4, 4), (1, 2, 5, 4), 4, seed=33),
            {"block_size": 1},
            dims={"output": HEADS},
        ),
        Case(
            "one query (a decoding step), T_k = 7 in blocks of 3",
            qkv((2, 2, 1, 8), (2, 2, 7, 8), 5, seed=36),
            {"block_size": 3},
            dims={"output": HEADS},
        ),
        Case(
            "block_size larger than T_k: a single block",
            qkv((3, 4), (5, 4), 2, seed=39),
            {"block_size": 8},
            dims={"output": ("query", "feature")},
        ),
        Case(
            "float32 with large scores (hundreds) that fall from block to block",
            (q_big, k_big, v_big),
            {"block_size": 3},
            dims={"output": ("batch", "query", "feature")},
        ),
        Case(
            "float16, 3 blocks of 4",
            qkv((2, 5, 16), (2, 12, 16), 8, seed=43, dtype=torch.float16, scale=1.5),
            {"block_size": 4},
            dims={"output": ("batch", "query", "feature")},
        ),
        Case(
            "float32, every score about -400 (exp(-400) underflows float32), blocks of 2",
            _all_negative(),
            {"block_size": 2},
            dims={"output": ("query", "feature")},
        ),
    ]


def _all_negative() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (d = 4) whose scores are all between -420 and -380, built from numbers that
    float32 holds exactly (and products and sums of them), so that float32 code computes
    the scores without rounding: a running maximum that starts at 0 gives 0 / 0."""
    g = torch.Generator().manual_seed(44)
    q = 10.0 + torch.randint(-4, 5, (3, 4), generator=g) / 8
    k = -20.0 + torch.randint(-8, 9, (7, 4), generator=g) / 8
    v = seeded(7, 3, seed=45, dtype=torch.float32)
    return q.float(), k.float(), v


def _tiled_expected(case: Case) -> torch.Tensor:
    """PyTorch's fused attention in float64, in the inputs' dtype."""
    q, k, v = case.args
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double()).to(q.dtype)


def _tiled_reference(
    q,
    k,
    v,
    block_size=256,
    *,
    rescale_l=True,
    rescale_o=True,
    normalise_inside=False,
    keep_max=True,
    running_max=True,
    last_block=True,
    m_start=float("-inf"),
):
    """Written for teaching (and mutated for the bugs): the online softmax of chapter 8,
    with the running maximum ``m``, sum ``l`` and unnormalised output ``o`` of each query,
    in float32 for float16 inputs."""
    dtype = q.dtype
    compute = torch.promote_types(dtype, torch.float32)
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    scale = 1 / math.sqrt(q.size(-1))
    m = torch.full(q.shape[:-1] + (1,), m_start, dtype=compute)
    l = torch.zeros(q.shape[:-1] + (1,), dtype=compute)
    o = torch.zeros(q.shape[:-1] + (v.size(-1),), dtype=compute)
    T_k = k.size(-2)
    stop = T_k if last_block else T_k - T_k % block_size
    for start in range(0, stop, block_size):
        s = q @ k[..., start : start + block_size, :].transpose(-2, -1) * scale
        block_max = s.amax(dim=-1, keepdim=True)
        m_new = torch.maximum(m, block_max) if running_max else block_max
        p = torch.exp(s - m_new)
        rescale = torch.exp(m - m_new)
        l_new = (rescale * l if rescale_l else l) + p.sum(dim=-1, keepdim=True)
        o = (rescale * o if rescale_o else o) + p @ v[..., start : start + block_size, :]
        if normalise_inside:
            o = o / l_new
        l = l_new
        if keep_max:
            m = m_new
    return (o if normalise_inside else o / l).to(dtype)


def _tiled_l_not_rescaled(q, k, v, block_size=256):
    return _tiled_reference(q, k, v, block_size, rescale_l=False)


def _tiled_o_not_rescaled(q, k, v, block_size=256):
    return _tiled_reference(q, k, v, block_size, rescale_o=False)


def _tiled_divide_inside(q, k, v, block_size=256):
    return _tiled_reference(q, k, v, block_size, normalise_inside=True)


def _tiled_m_not_updated(q, k, v, block_size=256):
    return _tiled_reference(q, k, v, block_size, keep_max=False)


def _tiled_block_max(q, k, v, block_size=256):
    return _tiled_reference(q, k, v, block_size, running_max=False)


def _tiled_drop_last(q, k, v, block_size=256):
    return _tiled_reference(q, k, v, block_size, last_block=False)


def _tiled_max_from_zero(q, k, v, block_size=256):
    return _tiled_reference(q, k, v, block_size, m_start=0.0)


@define(
    title="attention over blocks of keys with an online softmax",
    cases=_tiled_cases,
    expected=_tiled_expected,
    reference=_tiled_reference,
    params=("q", "k", "v"),
    bugs=[
        Bug(
            "the running sum l is not rescaled by exp(m_old - m_new)",
            "when the maximum grows, shrink the old sum too: l = exp(m - m_new) * l + p.sum(-1).",
            _tiled_l_not_rescaled,
        ),
        Bug(
            "the running output o is not rescaled by exp(m_old - m_new)",
            "when the maximum grows, shrink the old output too: o = exp(m - m_new) * o + p @ v.",
            _tiled_o_not_rescaled,
        ),
        Bug(
            "the output is divided by l inside the loop",
            "keep o unnormalised while looping over the blocks and divide by l once, after "
            "the last block.",
            _tiled_divide_inside,
        ),
        Bug(
            "the running maximum m is never updated (m = m_new is missing)",
            "after each block set m = m_new; otherwise exp(m - m_new) = 0 throws away every "
            "block but the last.",
            _tiled_m_not_updated,
        ),
        Bug(
            "m_new is the block's own maximum, not max(m, block maximum)",
            "take m_new = torch.maximum(m, s.amax(-1, keepdim=True)): with the block's maximum "
            "alone exp(m - m_new) overflows when an earlier block scored higher.",
            _tiled_block_max,
        ),
        Bug(
            "the last, partial block of keys is skipped",
            "loop over range(0, T_k, block_size): the last block may hold fewer than "
            "block_size keys, and slicing k[..., start:start + block_size] handles it.",
            _tiled_drop_last,
        ),
        Bug(
            "the running maximum m starts at 0 instead of -inf",
            "start with m = torch.full(..., float('-inf')): when every score is far below 0, "
            "m = max(0, block maximum) stays 0, exp(s - 0) underflows to 0 and o / l is 0 / 0.",
            _tiled_max_from_zero,
        ),
    ],
    why="Computed in float32 inside for float64 inputs is fine; the expected values are "
    "PyTorch's fused attention in float64.",
    chapter="08-efficient-attention",
)
def tiled_attention(impl):
    """Softmax attention computed over blocks of keys with an online softmax (chapter 8).

    Contract: ``impl(q, k, v, block_size) -> output``, with ``q`` ``(..., T_q, d)``, ``k``
    ``(..., T_k, d)``, ``v`` ``(..., T_k, d_v)`` and ``output`` ``(..., T_q, d_v)`` in the
    inputs' dtype: ``softmax(q k^T / sqrt(d)) v``, computed ``block_size`` keys at a time
    (``T_k`` need not be a multiple of ``block_size``). Scores in the hundreds must not
    overflow. Compared with ``torch.nn.functional.scaled_dot_product_attention``.
    """


# --- a decoding step with a KV cache ----------------------------------------------------


def _kv_cases() -> list[Case]:
    def qkv(B, h, T, d, seed, dtype=torch.float64, scale=1.0):
        return tuple(
            seeded(B, h, T, d, seed=seed + i, dtype=dtype, scale=scale if i < 2 else 1.0)
            for i in range(3)
        )

    return [
        Case(
            "one token at a time from an empty cache (batch 1, 1 head)",
            qkv(1, 1, 4, 4, seed=50),
            {"chunks": (1, 1, 1, 1)},
            dims={"output": HEADS},
        ),
        Case(
            "a prompt of 3 tokens, then 3 steps of one token",
            qkv(2, 2, 6, 4, seed=53),
            {"chunks": (3, 1, 1, 1)},
            dims={"output": HEADS},
        ),
        Case(
            "chunks of 2, 3 and 2 tokens: T_q < T_k with a causal mask inside each chunk",
            qkv(2, 3, 7, 4, seed=56),
            {"chunks": (2, 3, 2)},
            dims={"output": HEADS},
        ),
        Case(
            "float32, d = 16, a step then a chunk of 4",
            qkv(1, 2, 7, 16, seed=59, dtype=torch.float32),
            {"chunks": (2, 1, 4)},
            dims={"output": HEADS},
        ),
        Case(
            "float16 with larger scores, a prompt of 4 then 2 steps",
            qkv(2, 2, 6, 8, seed=62, dtype=torch.float16, scale=2.0),
            {"chunks": (4, 1, 1)},
            dims={"output": HEADS},
        ),
    ]


def _kv_expected(case: Case) -> torch.Tensor:
    return F.scaled_dot_product_attention(*case.args, is_causal=True)


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _call_kv(impl, case: Case) -> torch.Tensor:
    """Feed the sequence to ``impl`` chunk by chunk with one cache; join its outputs, each
    copied when its step returns (a step may return a view of a buffer it later reuses)."""
    q, k, v = case.args
    cache, outputs, start = {}, [], 0
    for n in case.kwargs["chunks"]:
        part = slice(start, start + n)
        out = _first(impl(q[..., part, :], k[..., part, :], v[..., part, :], cache))
        outputs.append(out.clone() if isinstance(out, torch.Tensor) else out)
        start += n
    if any(not isinstance(o, torch.Tensor) for o in outputs):
        return outputs[0]
    return torch.cat(outputs, dim=-2)


def _attend(q, k, v, mask):
    compute = torch.promote_types(q.dtype, torch.float32)
    scores = q.to(compute) @ k.to(compute).transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v.to(compute)).to(v.dtype)


def _kv_reference(q, k, v, cache, *, align="bottom-right", store="all", attend_first=False):
    """Written for teaching (and mutated for the bugs): append the new keys and values to
    the cache, then attend to all of them with the bottom-right causal mask."""
    old_k, old_v = cache.get("k"), cache.get("v")
    all_k = k if old_k is None else torch.cat([old_k, k], dim=-2)
    all_v = v if old_v is None else torch.cat([old_v, v], dim=-2)
    cache["k"], cache["v"] = (all_k, all_v) if store == "all" else (k, v)
    if attend_first and old_k is not None:
        all_k, all_v = old_k, old_v  # the cache as it was before this step
    T_q, T_k = q.size(-2), all_k.size(-2)
    ones = torch.ones(T_q, T_k, dtype=torch.bool)
    if align == "bottom-right":
        mask = ones.tril(diagonal=T_k - T_q)
    elif align == "top-left":
        mask = ones.tril()
    else:
        mask = None
    if attend_first and old_k is not None:
        mask = None  # every old key is in the past
    return _attend(q, all_k, all_v, mask)


def _kv_top_left(q, k, v, cache):
    return _kv_reference(q, k, v, cache, align="top-left")


def _kv_no_mask(q, k, v, cache):
    return _kv_reference(q, k, v, cache, align=None)


def _kv_store_new_only(q, k, v, cache):
    return _kv_reference(q, k, v, cache, store="new")


def _kv_attend_before_append(q, k, v, cache):
    return _kv_reference(q, k, v, cache, attend_first=True)


def _kv_chunk_only(q, k, v, cache):
    return _kv_reference(q, k, v, {})  # a new, empty cache at every step


@define(
    title="attention with a KV cache, chunk by chunk, against one causal pass",
    cases=_kv_cases,
    expected=_kv_expected,
    reference=_kv_reference,
    call=_call_kv,
    params=("q", "k", "v"),
    bugs=[
        Bug(
            "the causal mask is aligned top-left (is_causal=True) while the cache holds keys",
            "with T_q new queries after a cache of T_k - T_q keys, query i may see key j when "
            "j <= i + (T_k - T_q): mhbook.causal_mask(T_q, T_k), or "
            "torch.ones(T_q, T_k, dtype=torch.bool).tril(T_k - T_q).",
            _kv_top_left,
        ),
        Bug(
            "no causal mask (right for one-token steps, wrong for a prompt or a chunk)",
            "mask the scores with the bottom-right causal mask mhbook.causal_mask(T_q, T_k): "
            "within a chunk, a token must not see the tokens after it.",
            _kv_no_mask,
        ),
        Bug(
            "the cache keeps only the newest keys and values (overwritten, not appended)",
            "store the concatenation: cache['k'] = torch.cat([cache['k'], k], dim=-2), and "
            "the same for the values.",
            _kv_store_new_only,
        ),
        Bug(
            "the new tokens attend to the cache before their own keys are appended",
            "append the new keys and values first, then attend to all of them: a token "
            "attends to itself.",
            _kv_attend_before_append,
        ),
        Bug(
            "the new tokens attend only to their own chunk: the cached keys and values are not "
            "used (or overwritten before attending)",
            "attend to the cached keys and values followed by the new ones: "
            "keys = torch.cat([cache['k'], k], dim=-2), store them, then attend with the "
            "bottom-right causal mask.",
            _kv_chunk_only,
        ),
    ],
    tolerances={torch.float16: (2e-2, 5e-3)},
    why="Float32 arithmetic inside is fine for float64 inputs (Hugging Face's eager "
    "attention takes the softmax in float32). For float16 inputs it multiplies q and k in "
    "float16: the float16 case's scores, up to about 11, are then off by up to 0.006, and so "
    "are the weights, relatively: hence float16's wider tolerance.",
    chapter="08-efficient-attention",
)
def kv_cache(impl):
    """Attention of new tokens with a KV cache (chapter 8).

    Contract: ``impl(q, k, v, cache) -> output``, with ``q``, ``k``, ``v``
    ``(batch, heads, T_new, d)`` the new tokens' queries, keys and values, and ``cache`` a
    dict, empty before the first call, that ``impl`` keeps what it needs in (e.g.
    ``cache["k"]``, ``cache["v"]``). ``impl`` appends the new keys and values to the cache
    and returns the new queries' attention output ``(batch, heads, T_new, d)`` over every
    cached key, its own included, with the causal mask aligned bottom-right (query ``i``
    of ``T_q`` sees key ``j`` of ``T_k`` when ``j <= i + T_k - T_q``). The check feeds a
    sequence in chunks (a prompt, then steps of one token) and compares the joined outputs
    with one causal pass, ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``.
    """


# --- top-p (nucleus) filtering -------------------------------------------------------------


def _top_p_cases() -> list[Case]:
    return [
        Case(
            "five logits (as in the chapter), p = 0.8",
            (torch.tensor([2.0, 1.0, 0.5, -1.0, -3.0]), 0.8),
            dims={"output": ("token",)},
        ),
        Case(
            "a batch of 3 rows of 10 logits, p = 0.5",
            (seeded(3, 10, seed=70, dtype=torch.float32, scale=2.0), 0.5),
            dims={"output": ("row", "token")},
        ),
        Case(
            "p = 0.05, below the most likely token's probability: that token alone is kept",
            (seeded(2, 8, seed=71, dtype=torch.float32), 0.05),
            dims={"output": ("row", "token")},
        ),
        Case(
            "p = 0.95, shuffled logits in float64",
            (seeded(2, 12, seed=72, scale=1.5), 0.95),
            dims={"output": ("row", "token")},
        ),
        Case(
            "batch and position dims (2, 2, 6), p = 0.7",
            (seeded(2, 2, 6, seed=73, dtype=torch.float32, scale=3.0), 0.7),
            dims={"output": ("batch", "position", "token")},
        ),
    ]


def _top_p_expected(case: Case) -> torch.Tensor:
    from transformers.generation.logits_process import TopPLogitsWarper

    logits, p = case.args
    flat = logits.reshape(-1, logits.size(-1))
    return TopPLogitsWarper(p)(None, flat).view_as(logits)


def _top_p_reference(logits, p, *, include_crossing=True, descending=True, ret="logits"):
    """Written for teaching (and mutated for the bugs): sort the probabilities, keep each
    token whose more likely tokens hold less than ``p``."""
    probs, order = torch.softmax(logits, dim=-1).sort(dim=-1, descending=descending)
    cumulative = probs.cumsum(dim=-1)
    keep_sorted = (cumulative - probs < p) if include_crossing else (cumulative < p)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    if ret == "probs":
        return torch.softmax(logits, dim=-1).masked_fill(~keep, 0.0)
    return logits.masked_fill(~keep, float("-inf"))


def _top_p_strict(logits, p):
    return _top_p_reference(logits, p, include_crossing=False)


def _top_p_ascending(logits, p):
    return _top_p_reference(logits, p, descending=False)


def _top_p_probs(logits, p):
    return _top_p_reference(logits, p, ret="probs")


@define(
    title="top-p (nucleus) filtering of logits",
    cases=_top_p_cases,
    expected=_top_p_expected,
    reference=_top_p_reference,
    params=("logits", "p"),
    why="The kept logits are the inputs, unchanged; in every case the probability mass before "
    "each token is at least 0.002 away from p, so that float32 probabilities keep the same "
    "tokens.",
    bugs=[
        Bug(
            "the token whose probability crosses p is dropped (cumsum < p)",
            "keep a token when the more likely tokens before it hold less than p: "
            "cumsum - probs < p, so the kept mass reaches p (and the top token is always kept).",
            _top_p_strict,
        ),
        Bug(
            "the probabilities are sorted in ascending order (the least likely kept)",
            "sort with descending=True: the nucleus is the most likely tokens.",
            _top_p_ascending,
        ),
        Bug(
            "the filtered probabilities are returned instead of the logits",
            "return the logits with the dropped tokens set to -inf "
            "(logits.masked_fill(~keep, float('-inf'))); the sampler takes the softmax.",
            _top_p_probs,
        ),
    ],
    chapter="09-decoder-only",
)
def top_p(impl):
    """Top-p (nucleus) filtering of the next token's logits (chapter 9).

    Contract: ``impl(logits, p) -> filtered``, with ``logits`` ``(..., vocab)`` and
    ``filtered`` the same shape and dtype: the logits of the smallest set of most likely
    tokens whose probabilities sum to ``p`` or more, the others set to ``-inf``. Compared
    with Hugging Face ``transformers``' ``TopPLogitsWarper``.
    """
