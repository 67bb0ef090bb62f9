"""Checks of Part I's mechanisms (chapters 1-6): the softmax, scaled dot-product attention, the
masked softmax and the masks, splitting and merging heads, multi-head attention, one attention
head, and layer norm.

Each check's docstring is its contract; the references are PyTorch's ``torch.softmax``,
``torch.nn.functional.scaled_dot_product_attention``, ``torch.nn.MultiheadAttention`` and
``torch.nn.functional.layer_norm`` (the masks: ``mhbook.padding_mask`` and
``mhbook.causal_mask``), with the book's one convention on top: a query that may attend to no
key gets zero weights and a zero output, never NaN.
"""

from __future__ import annotations

import copy
import inspect
import math

import torch
import torch.nn.functional as F

from .grader import Bug, Case, define, seeded

__all__ = [
    "softmax",
    "attention",
    "masked_softmax",
    "padding_mask",
    "causal_mask",
    "split_heads",
    "merge_heads",
    "multihead",
    "attention_head",
    "layer_norm",
]


# --- softmax ---------------------------------------------------------------------------


def _softmax_cases() -> list[Case]:
    row = ("row",)
    rows = ("row", "position")
    return [
        Case(
            "three scores",
            (torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64),),
            dims={"output": ("position",)},
        ),
        Case(
            "a batch of rows (2, 3, 5)",
            (seeded(2, 3, 5, seed=1),),
            dims={"output": ("batch", *rows)},
        ),
        Case(
            "large scores (around 1000): exp overflows unless the largest is subtracted",
            (seeded(2, 4, seed=2, dtype=torch.float32) + 1000.0,),
            dims={"output": rows},
        ),
        Case(
            "very negative scores (around -1000): exp underflows to 0/0",
            (seeded(2, 4, seed=3, dtype=torch.float32) - 1000.0,),
            dims={"output": rows},
        ),
        Case(
            "-inf among the scores (a masked key gets weight 0)",
            (torch.tensor([[0.5, float("-inf"), 2.0], [float("-inf"), 1.0, 1.0]]),),
            dims={"output": rows},
        ),
        Case(
            "float16 scores around 10 (exp(11) overflows float16)",
            (seeded(3, 6, seed=4, scale=4.0, dtype=torch.float16) + 10,),
            dims={"output": rows},
        ),
        Case("one score per row", (seeded(4, 1, seed=5),), dims={"output": (*row, "position")}),
        Case(
            "float32, two rows in one tensor, around +1000 and around -1000 (each row needs "
            "its own largest score)",
            (torch.stack([seeded(5, seed=6) + 1000.0, seeded(5, seed=7) - 1000.0]).float(),),
            dims={"output": rows},
        ),
        Case(
            "float32 rows with one outlier each: a score of -150 among small ones, and +100 "
            "beside -100",
            (torch.tensor([[3.0, 1.0, -150.0, 2.0], [0.5, 100.0, -100.0, 0.0]]),),
            dims={"output": rows},
        ),
    ]


def _softmax_reference(z: torch.Tensor) -> torch.Tensor:
    """Written for teaching: subtract each row's largest score, exponentiate, normalise."""
    e = torch.exp(z - z.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def _softmax_naive(z):
    e = torch.exp(z)
    return e / e.sum(dim=-1, keepdim=True)


def _softmax_first_axis(z):
    e = torch.exp(z - z.max(dim=0, keepdim=True).values)
    return e / e.sum(dim=0, keepdim=True)


def _softmax_no_normalise(z):
    return torch.exp(z - z.max(dim=-1, keepdim=True).values)


def _softmax_min(z):
    e = torch.exp(z - z.min(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def _softmax_mean(z):
    e = torch.exp(z - z.mean(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def _softmax_global_max(z):
    e = torch.exp(z - z.max())
    return e / e.sum(dim=-1, keepdim=True)


@define(
    title="a numerically stable softmax over the last axis",
    cases=_softmax_cases,
    expected=lambda case: torch.softmax(case.args[0], dim=-1),
    reference=_softmax_reference,
    params=("z",),
    bugs=[
        Bug(
            "exp of the raw scores (large scores overflow to inf/inf = NaN)",
            "subtract each row's largest score before exp: softmax(z) = softmax(z - max z).",
            _softmax_naive,
        ),
        Bug(
            "softmax over the first axis instead of the last",
            "normalise over dim=-1 (each row sums to one), not dim=0.",
            _softmax_first_axis,
        ),
        Bug(
            "the exponentials are not divided by their sum",
            "divide by e.sum(dim=-1, keepdim=True) so that each row sums to one.",
            _softmax_no_normalise,
        ),
        Bug(
            "the smallest score subtracted instead of the largest",
            "subtract z.max(dim=-1, keepdim=True).values: then every exponent is <= 0 and "
            "nothing overflows.",
            _softmax_min,
        ),
        Bug(
            "each row's mean subtracted instead of its largest score",
            "subtract the largest score, z.max(dim=-1, keepdim=True).values: a score far "
            "above the row's mean still overflows exp.",
            _softmax_mean,
        ),
        Bug(
            "one largest score of the whole tensor subtracted (z.max()), not each row's",
            "subtract each row's own largest score, z.max(dim=-1, keepdim=True).values: a row "
            "far below the tensor's largest score underflows to 0 / 0.",
            _softmax_global_max,
        ),
    ],
    why="Float32 arithmetic inside is fine for float64 scores: what the mechanism needs is "
    "each row's largest score subtracted, not float64.",
    chapter="02-scaled-dot-product-attention",
)
def softmax(impl):
    """A numerically stable softmax.

    Contract: ``impl(z) -> weights``, with ``z`` a tensor ``(..., n)`` of any dtype and
    ``weights`` the same shape and dtype: ``exp(z_i) / sum_j exp(z_j)`` along the last axis.
    Scores around +-1000 must not overflow or underflow to NaN, and a ``-inf`` score gets
    weight 0. Compared with ``torch.softmax(z, dim=-1)``.
    """


# --- scaled dot-product attention -----------------------------------------------------


def _attention_cases() -> list[Case]:
    qk = ("query", "key")
    cases = [
        Case(
            "3 queries and 3 keys, d_k = 4",
            (seeded(3, 4, seed=10), seeded(3, 4, seed=11), seeded(3, 4, seed=12)),
            dims={"output": ("query", "feature"), "weights": qk},
        ),
        Case(
            "leading dims (2, 3), T_q = 2 < T_k = 5, d_k = 4 but d_v = 3",
            (seeded(2, 3, 2, 4, seed=13), seeded(2, 3, 5, 4, seed=14), seeded(2, 3, 5, 3, seed=15)),
            dims={
                "output": ("batch", "head", "query", "feature"),
                "weights": ("batch", "head", *qk),
            },
        ),
        Case(
            "batch 1, odd sizes: T_q = 5, T_k = 7, d_k = 3",
            (seeded(1, 5, 3, seed=16), seeded(1, 7, 3, seed=17), seeded(1, 7, 2, seed=18)),
            dims={"output": ("batch", "query", "feature"), "weights": ("batch", *qk)},
        ),
        Case(
            "float32, d_k = 64",
            tuple(seeded(2, 6, 64, seed=s, dtype=torch.float32) for s in (19, 20, 21)),
            dims={"output": ("batch", "query", "feature"), "weights": ("batch", *qk)},
        ),
        Case(
            "float16 with large scores (up to about 30; exp overflows float16 above 11 unless the "
            "softmax is stable)",
            (
                seeded(2, 4, 16, seed=22, scale=3.0, dtype=torch.float16),
                seeded(2, 6, 16, seed=23, scale=3.0, dtype=torch.float16),
                seeded(2, 6, 8, seed=24, dtype=torch.float16),
            ),
            dims={"output": ("batch", "query", "feature"), "weights": ("batch", *qk)},
        ),
    ]
    mask = torch.tensor(
        [[True, True, False, False], [False, False, False, False], [True, False, True, True]]
    )
    cases.append(
        Case(
            "a bool mask (True = may attend) whose second row is fully masked",
            (seeded(3, 4, seed=25), seeded(4, 4, seed=26), seeded(4, 2, seed=27)),
            {"mask": mask},
            dims={"output": ("query", "feature"), "weights": qk},
            needs=("mask",),
        )
    )
    causal = torch.ones(2, 4, dtype=torch.bool).tril(diagonal=2)  # bottom-right aligned
    cases.append(
        Case(
            "a causal mask for T_q = 2 < T_k = 4 (a decoding step with a cache), mask (2, 4) "
            "broadcast over (batch, heads)",
            (seeded(2, 2, 2, 4, seed=28), seeded(2, 2, 4, 4, seed=29), seeded(2, 2, 4, 4, seed=30)),
            {"mask": causal},
            dims={
                "output": ("batch", "head", "query", "feature"),
                "weights": ("batch", "head", *qk),
            },
            needs=("mask",),
        )
    )
    return cases


def _attention_expected(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's fused attention for the output; the weights from ``torch.softmax``; rows
    with no key zeroed (the book's convention)."""
    q, k, v = case.args
    mask = case.kwargs.get("mask")
    scores = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(q.size(-1))
    if mask is None:
        output = F.scaled_dot_product_attention(q, k, v)
        return output, torch.softmax(scores, dim=-1).to(q.dtype)
    has_key = mask.any(dim=-1, keepdim=True)
    output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~has_key)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    weights = weights.nan_to_num(0.0).to(q.dtype)
    return output.masked_fill(~has_key, 0.0), weights


def _attention_reference(q, k, v, mask=None, *, scale=None, axis=-1, fill=float("-inf")):
    """Written for teaching (and mutated for the bugs): ``softmax(q k^T / sqrt(d_k)) v``,
    computed in float32 for float16 inputs, with empty rows zeroed."""
    compute = torch.promote_types(q.dtype, torch.float32)
    scale = math.sqrt(q.size(-1)) if scale is None else scale
    scores = q.to(compute) @ k.to(compute).transpose(-2, -1) / scale
    if mask is not None:
        scores = scores.masked_fill(~mask, fill)
    weights = torch.softmax(scores, dim=axis)
    if mask is not None and fill == float("-inf"):
        weights = weights.nan_to_num(0.0)
    weights = weights.to(v.dtype)
    return weights @ v, weights


def _unscaled(q, k, v, mask=None):
    return _attention_reference(q, k, v, mask, scale=1.0)


def _scaled_by_d(q, k, v, mask=None):
    return _attention_reference(q, k, v, mask, scale=q.size(-1))


def _scaled_by_d_v(q, k, v, mask=None):
    return _attention_reference(q, k, v, mask, scale=math.sqrt(v.size(-1)))


def _softmax_over_queries(q, k, v, mask=None):
    return _attention_reference(q, k, v, mask, axis=-2)


def _nan_rows(q, k, v, mask=None):
    compute = torch.promote_types(q.dtype, torch.float32)
    scores = q.to(compute) @ k.to(compute).transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(v.dtype)
    return weights @ v, weights


def _finite_fill(q, k, v, mask=None):
    return _attention_reference(q, k, v, mask, fill=-1e9)


def _mask_inverted(q, k, v, mask=None):
    return _attention_reference(q, k, v, None if mask is None else ~mask)


def _mask_after_softmax(q, k, v, mask=None):
    out, weights = _attention_reference(q, k, v)
    if mask is not None:
        weights = weights * mask
    return weights @ v, weights


def _top_left(q, k, v, mask=None):
    if mask is not None and mask.size(-2) < mask.size(-1) and bool(mask.any(-1).all()):
        mask = torch.ones(mask.shape, dtype=torch.bool).tril()  # PyTorch's is_causal
    return _attention_reference(q, k, v, mask)


def _call_attention(impl, case: Case):
    return impl(*case.args, **case.kwargs)


@define(
    title="scaled dot-product attention",
    cases=_attention_cases,
    expected=_attention_expected,
    reference=_attention_reference,
    optional=("weights",),
    params=("q", "k", "v"),
    tolerances={torch.float16: (2e-2, 5e-3)},
    why="Float32 arithmetic inside is fine for float64 inputs: Hugging Face's eager attention "
    "takes the softmax in float32. For float16 inputs it multiplies q and k in float16: the "
    "float16 case's scores, up to about 30, are then off by up to 0.007, and so are the "
    "weights, relatively: hence float16's wider tolerance.",
    bugs=[
        Bug(
            "the scores are not scaled",
            "divide q k^T by sqrt(d_k), the size of one query (q.size(-1)).",
            _unscaled,
        ),
        Bug(
            "the scores are divided by d_k instead of sqrt(d_k)",
            "divide by math.sqrt(q.size(-1)), not by q.size(-1).",
            _scaled_by_d,
        ),
        Bug(
            "the scores are scaled by sqrt(d_v), the size of a value",
            "scale by the size of the queries and keys, sqrt(q.size(-1)), not of the values.",
            _scaled_by_d_v,
        ),
        Bug(
            "softmax over the queries (dim=-2) instead of the keys",
            "take the softmax over the last axis, the keys: each query's weights sum to one.",
            _softmax_over_queries,
        ),
        Bug(
            "a fully masked row gives NaN (softmax of a row of -inf)",
            "give rows with no key finite scores before the softmax, then zero their weights "
            "(or use nan_to_num(0.0) after it).",
            _nan_rows,
        ),
        Bug(
            "a fully masked row attends to every key evenly (a finite fill such as -1e9)",
            "a query with no key must get zero weights and a zero output: fill with -inf and "
            "zero the rows that have no key left.",
            _finite_fill,
        ),
        Bug(
            "the mask is read the other way round (True = masked out)",
            "in the book, as in F.scaled_dot_product_attention, True means may attend: "
            "fill where ~mask.",
            _mask_inverted,
        ),
        Bug(
            "the mask is applied after the softmax",
            "mask the scores before the softmax, so that the allowed weights still sum to one.",
            _mask_after_softmax,
        ),
    ],
    chapter="02-scaled-dot-product-attention",
)
def attention(impl):
    """Scaled dot-product attention, ``softmax(q k^T / sqrt(d_k)) v``.

    Contract: ``impl(q, k, v, mask=None) -> (output, weights)`` (or the output alone), with
    ``q`` ``(..., T_q, d_k)``, ``k`` ``(..., T_k, d_k)``, ``v`` ``(..., T_k, d_v)`` (any
    number of leading dimensions, ``T_q`` and ``T_k`` may differ), ``output``
    ``(..., T_q, d_v)`` and ``weights`` ``(..., T_q, T_k)``, in the inputs' dtype.
    ``mask`` is optional: a bool tensor that broadcasts to ``(..., T_q, T_k)``, ``True`` =
    may attend. A query whose keys are all masked gets zero weights and a zero output, never
    NaN. A function without a ``mask`` argument is checked on the unmasked cases only.
    Compared with ``torch.nn.functional.scaled_dot_product_attention``.
    """


# --- masked softmax ------------------------------------------------------------------


def _masked_softmax_cases() -> list[Case]:
    rows = ("row", "key")
    four = ("batch", "head", "query", "key")
    partly_and_empty = torch.tensor([[True, True, False, False], [False, False, False, False]])
    padding = torch.arange(5) < torch.tensor([3, 5])[:, None]  # valid lengths 3 and 5
    causal = torch.ones(2, 4, dtype=torch.bool).tril(diagonal=2)  # bottom-right, T_q < T_k
    empty_first = torch.tensor(
        [[False, False, False, False, False, False], [True, False, True, True, False, True]]
    )
    return [
        Case(
            "two rows: two keys of four allowed, then none at all",
            (torch.tensor([[2.0, 1.0, 0.5, 3.0], [0.3, -1.2, 2.2, 0.7]]), partly_and_empty),
            dims={"output": rows},
        ),
        Case(
            "a padding mask (2, 1, 1, 5) broadcast against scores (2, 2, 3, 5)",
            (seeded(2, 2, 3, 5, seed=40), padding[:, None, None, :]),
            dims={"output": four},
        ),
        Case(
            "a causal mask (2, 4) for T_q = 2 < T_k = 4, broadcast over (batch, heads)",
            (seeded(1, 2, 2, 4, seed=41), causal),
            dims={"output": four},
        ),
        Case(
            "float16 scores around 20 (exp overflows float16) with a fully masked first row",
            (seeded(2, 6, seed=42, scale=4.0, dtype=torch.float16) + 20, empty_first),
            dims={"output": rows},
        ),
    ]


def _masked_softmax_expected(case: Case) -> torch.Tensor:
    """``torch.softmax`` with the masked scores at -inf, in float64; empty rows zeroed."""
    scores, mask = case.args
    weights = torch.softmax(scores.double().masked_fill(~mask, float("-inf")), dim=-1)
    return weights.nan_to_num(0.0).to(scores.dtype)


def _masked_softmax_reference(scores, mask, *, fill=float("-inf"), zero_empty=True):
    """Written for teaching: the masked scores at -inf; a row with no key gets finite scores
    before the softmax and zero weights after it."""
    has_key = mask.any(dim=-1, keepdim=True)
    scores = scores.masked_fill(~mask, fill)
    if not zero_empty:
        return torch.softmax(scores, dim=-1)
    weights = torch.softmax(scores.masked_fill(~has_key, 0.0), dim=-1)
    return weights * has_key


def _masked_softmax_nan_rows(scores, mask):
    return _masked_softmax_reference(scores, mask, zero_empty=False)


def _masked_softmax_finite_fill(scores, mask):
    return _masked_softmax_reference(
        scores, mask, fill=torch.finfo(scores.dtype).min, zero_empty=False
    )


def _masked_softmax_inverted(scores, mask):
    return _masked_softmax_reference(scores, ~mask)


def _masked_softmax_after(scores, mask):
    return torch.softmax(scores, dim=-1) * mask


def _masked_softmax_multiplied(scores, mask):
    return torch.softmax(scores * mask, dim=-1)


@define(
    title="a softmax over the keys that a bool mask allows",
    cases=_masked_softmax_cases,
    expected=_masked_softmax_expected,
    reference=_masked_softmax_reference,
    params=("scores", "mask"),
    why="Float32 arithmetic inside is fine for float64 scores.",
    bugs=[
        Bug(
            "a fully masked row gives NaN (softmax of a row of -inf)",
            "give rows with no key finite scores before the softmax and zero weights after it "
            "(has_key = mask.any(-1, keepdim=True)), or nan_to_num(0.0) after it.",
            _masked_softmax_nan_rows,
        ),
        Bug(
            "a fully masked row attends to every key evenly (a finite fill such as -1e9 or "
            "finfo.min)",
            "a row with no key must get zero weights: multiply the weights by "
            "mask.any(-1, keepdim=True).",
            _masked_softmax_finite_fill,
        ),
        Bug(
            "the mask is read the other way round (True = masked out)",
            "in the book True means may attend: fill the scores where ~mask.",
            _masked_softmax_inverted,
        ),
        Bug(
            "the mask is applied after the softmax",
            "mask the scores before the softmax, so that the allowed weights still sum to one.",
            _masked_softmax_after,
        ),
        Bug(
            "the scores are multiplied by the mask (a masked score becomes 0, not -inf)",
            "a score of 0 still gets weight exp(0): replace the masked scores with "
            "scores.masked_fill(~mask, float('-inf')).",
            _masked_softmax_multiplied,
        ),
    ],
    chapter="03-masking",
)
def masked_softmax(impl):
    """A softmax over the last axis that gives the masked keys weight zero.

    Contract: ``impl(scores, mask) -> weights``, with ``scores`` a tensor ``(..., T_q, T_k)``
    of any float dtype and ``mask`` a bool tensor that broadcasts against it, ``True`` = may
    attend; ``weights`` has the scores' shape and dtype. A row whose keys are all masked gets
    zero weights, never NaN and never uniform weights. Compared with ``torch.softmax`` of the
    scores with the masked ones at ``-inf``, the empty rows set to zero.
    """


# --- padding mask --------------------------------------------------------------------


def _padding_mask_cases() -> list[Case]:
    dims = {"output": ("batch", "head", "query", "key")}
    return [
        Case("one sentence, no padding: valid_lens [4], 4 keys", (torch.tensor([4]), 4), dims=dims),
        Case(
            "three sentences: valid_lens [3, 1, 5], 5 keys", (torch.tensor([3, 1, 5]), 5), dims=dims
        ),
        Case(
            "an empty sentence and more keys than any length: valid_lens [0, 2], 4 keys",
            (torch.tensor([0, 2]), 4),
            dims=dims,
        ),
        Case(
            "int32 lengths: valid_lens [2, 6, 3], 7 keys",
            (torch.tensor([2, 6, 3], dtype=torch.int32), 7),
            dims=dims,
        ),
    ]


def _padding_mask_reference(valid_lens, num_keys):
    """Written for teaching: compare the key positions with each sentence's length."""
    positions = torch.arange(num_keys, device=valid_lens.device)
    return (positions < valid_lens[:, None])[:, None, None, :]


def _padding_mask_le(valid_lens, num_keys):
    positions = torch.arange(num_keys, device=valid_lens.device)
    return (positions <= valid_lens[:, None])[:, None, None, :]


def _padding_mask_inverted(valid_lens, num_keys):
    return ~_padding_mask_reference(valid_lens, num_keys)


def _padding_mask_queries(valid_lens, num_keys):
    return _padding_mask_reference(valid_lens, num_keys).transpose(-2, -1)


def _padding_mask_flat(valid_lens, num_keys):
    return _padding_mask_reference(valid_lens, num_keys)[:, 0, 0, :]


def _padding_mask_float(valid_lens, num_keys):
    return _padding_mask_reference(valid_lens, num_keys).float()


@define(
    title="the padding mask from the valid lengths",
    cases=_padding_mask_cases,
    expected=lambda case: _padding_mask_expected(*case.args),
    reference=_padding_mask_reference,
    params=("valid_lens", "num_keys"),
    tolerances="exact",
    bugs=[
        Bug(
            "one key too many: position == valid length counts as real",
            "key j is real when j < valid_lens[b] (positions count from 0): use <, not <=.",
            _padding_mask_le,
        ),
        Bug(
            "True marks the padding (nn.MultiheadAttention's key_padding_mask convention)",
            "in the book True means may attend: return positions < valid_lens[:, None], "
            "and pass ~mask only to nn.MultiheadAttention.",
            _padding_mask_inverted,
        ),
        Bug(
            "the mask hides padded queries instead of padded keys (shape (B, 1, Lk, 1))",
            "put the keys on the last axis: mask[:, None, None, :] of shape (B, 1, 1, Lk).",
            _padding_mask_queries,
        ),
        Bug(
            "the mask has no axes for the heads and the queries (shape (B, Lk))",
            "add them so that it broadcasts against the scores (B, h, Lq, Lk): "
            "mask[:, None, None, :].",
            _padding_mask_flat,
        ),
        Bug(
            "a float mask of 0s and 1s instead of a bool mask",
            "return the comparison itself, a bool tensor: ~mask and masked_fill need bools.",
            _padding_mask_float,
        ),
    ],
    chapter="03-masking",
)
def padding_mask(impl):
    """The padding mask: which keys of each sentence are real.

    Contract: ``impl(valid_lens, num_keys) -> mask``, with ``valid_lens`` an integer tensor
    ``(batch,)`` (the number of real keys of each sentence) and ``mask`` a bool tensor
    ``(batch, 1, 1, num_keys)``, ``True`` where key ``j < valid_lens[b]`` (may attend), so
    that it broadcasts against the scores ``(batch, num_heads, T_q, T_k)``. Compared with
    ``mhbook.padding_mask``.
    """


def _padding_mask_expected(valid_lens, num_keys):
    """``mhbook.padding_mask``."""
    from ..core.masks import padding_mask as book_padding_mask

    return book_padding_mask(valid_lens, num_keys)


# --- causal mask ---------------------------------------------------------------------


def _causal_mask_cases() -> list[Case]:
    dims = {"output": ("query", "key")}
    return [
        Case("one query and one key", (1, 1), dims=dims),
        Case("square: 4 queries, 4 keys", (4, 4), dims=dims),
        Case("one query against 4 keys (a decoding step with a cache)", (1, 4), dims=dims),
        Case("T_q = 2 < T_k = 5 (two new tokens after three cached)", (2, 5), dims=dims),
    ]


def _causal_mask_expected(case: Case) -> torch.Tensor:
    from ..core.masks import causal_mask as book_causal_mask

    return book_causal_mask(*case.args)


def _causal_mask_reference(num_queries, num_keys, *, offset=None):
    """Written for teaching: query i sits at position i + (T_k - T_q) and sees keys j <= it."""
    offset = num_keys - num_queries if offset is None else offset
    return torch.ones(num_queries, num_keys, dtype=torch.bool).tril(diagonal=offset)


def _causal_top_left(num_queries, num_keys):
    return _causal_mask_reference(num_queries, num_keys, offset=0)


def _causal_offset_sign(num_queries, num_keys):
    return _causal_mask_reference(num_queries, num_keys, offset=num_queries - num_keys)


def _causal_strict(num_queries, num_keys):
    return _causal_mask_reference(num_queries, num_keys, offset=num_keys - num_queries - 1)


def _causal_inverted(num_queries, num_keys):
    return ~_causal_mask_reference(num_queries, num_keys)


def _causal_upper(num_queries, num_keys):
    return torch.ones(num_queries, num_keys, dtype=torch.bool).triu(diagonal=num_keys - num_queries)


@define(
    title="the causal (look-ahead) mask, aligned bottom-right",
    cases=_causal_mask_cases,
    expected=_causal_mask_expected,
    reference=_causal_mask_reference,
    params=("num_queries", "num_keys"),
    tolerances="exact",
    bugs=[
        Bug(
            "the triangle is aligned top-left (PyTorch's is_causal=True): with fewer queries "
            "than keys the newest query cannot see the latest keys",
            "shift the diagonal by T_k - T_q: ones(T_q, T_k).tril(diagonal=num_keys - "
            "num_queries), so that the last query sees every key.",
            _causal_top_left,
        ),
        Bug(
            "the diagonal is shifted the wrong way (tril(diagonal=T_q - T_k))",
            "query i sits at position i + (T_k - T_q): use tril(diagonal=num_keys - num_queries).",
            _causal_offset_sign,
        ),
        Bug(
            "a query may not attend to itself (the diagonal is masked)",
            "position i may see keys j <= i, itself included: tril(diagonal=num_keys - "
            "num_queries), not one below.",
            _causal_strict,
        ),
        Bug(
            "True marks the future keys (the look-ahead mask of nn.Transformer's convention)",
            "in the book True means may attend: the lower triangle (tril), not its complement.",
            _causal_inverted,
        ),
        Bug(
            "the upper triangle: each query sees itself and the future, not the past",
            "use tril (keys j <= i), not triu.",
            _causal_upper,
        ),
    ],
    chapter="03-masking",
)
def causal_mask(impl):
    """The causal (look-ahead) mask, aligned bottom-right.

    Contract: ``impl(num_queries, num_keys) -> mask``, a bool tensor
    ``(num_queries, num_keys)`` with ``num_queries <= num_keys``: query ``i`` is the token
    at position ``i + (num_keys - num_queries)`` (the earlier keys are cached) and may attend
    to key ``j`` (``True``) when ``j <= i + (num_keys - num_queries)``. The last query sees
    every key. Compared with ``mhbook.causal_mask``.
    """


# --- splitting and merging heads -----------------------------------------------------


def _split_cases() -> list[Case]:
    dims = {"output": ("batch", "head", "position", "feature")}
    return [
        Case(
            "batch 1, one position, 2 heads of 3 features", (seeded(1, 1, 6, seed=50), 2), dims=dims
        ),
        Case(
            "batch 2, 3 positions, 2 heads of 4 features", (seeded(2, 3, 8, seed=51), 2), dims=dims
        ),
        Case(
            "odd sizes in float32: batch 2, 5 positions, 3 heads of 2 features",
            (seeded(2, 5, 6, seed=52, dtype=torch.float32), 3),
            dims=dims,
        ),
    ]


def _split_reference(x, num_heads):
    """Written for teaching: cut the features into heads, then move the head axis forward."""
    batch, length, d = x.shape
    return x.view(batch, length, num_heads, d // num_heads).transpose(1, 2)


def _split_no_transpose(x, num_heads):
    batch, length, d = x.shape
    return x.reshape(batch, num_heads, length, d // num_heads)


def _split_interleaved(x, num_heads):
    batch, length, d = x.shape
    return x.view(batch, length, d // num_heads, num_heads).permute(0, 3, 1, 2)


def _split_head_axis_not_moved(x, num_heads):
    batch, length, d = x.shape
    return x.view(batch, length, num_heads, d // num_heads)


@define(
    title="splitting the features into heads",
    cases=_split_cases,
    expected=lambda case: case.args[0].unflatten(-1, (case.args[1], -1)).permute(0, 2, 1, 3),
    reference=_split_reference,
    params=("x", "num_heads"),
    tolerances="exact",
    bugs=[
        Bug(
            "a view straight to (B, h, L, d_head) without the transpose: the heads get slices "
            "of the positions, not of the features",
            "cut the last axis first, x.view(B, L, h, d_head), then .transpose(1, 2).",
            _split_no_transpose,
        ),
        Bug(
            "the heads take interleaved features (view(B, L, d_head, h)) instead of "
            "contiguous blocks",
            "head i owns features i * d_head to (i + 1) * d_head - 1: view(B, L, h, d_head), "
            "then transpose(1, 2).",
            _split_interleaved,
        ),
        Bug(
            "the head axis is not moved in front of the positions (shape (B, L, h, d_head))",
            "add .transpose(1, 2): attention multiplies the last two axes, (L, d_head).",
            _split_head_axis_not_moved,
        ),
    ],
    chapter="04-multi-head-attention",
)
def split_heads(impl):
    """Split the features of every position into heads.

    Contract: ``impl(x, num_heads) -> heads``, with ``x`` ``(batch, L, num_heads * d_head)``
    and ``heads`` ``(batch, num_heads, L, d_head)``, same dtype: head ``i`` gets the
    contiguous features ``i * d_head`` to ``(i + 1) * d_head - 1`` of each position. Compared
    exactly with ``x.unflatten(-1, (num_heads, -1)).permute(0, 2, 1, 3)``.
    """


def _merge_cases() -> list[Case]:
    dims = {"output": ("batch", "position", "feature")}
    return [
        Case(
            "batch 1, one position, 2 heads of 3 features",
            (seeded(1, 2, 1, 3, seed=53),),
            dims=dims,
        ),
        Case(
            "batch 2, 2 heads, 3 positions, 4 features", (seeded(2, 2, 3, 4, seed=54),), dims=dims
        ),
        Case(
            "odd sizes in float32: batch 2, 3 heads, 5 positions, 2 features",
            (seeded(2, 3, 5, 2, seed=55, dtype=torch.float32),),
            dims=dims,
        ),
    ]


def _merge_reference(x):
    """Written for teaching: move the positions forward again, then put the heads side by
    side."""
    batch, heads, length, d_head = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * d_head)


def _merge_no_transpose(x):
    batch, heads, length, d_head = x.shape
    return x.reshape(batch, length, heads * d_head)


def _merge_interleaved(x):
    batch, heads, length, d_head = x.shape
    return x.permute(0, 2, 3, 1).reshape(batch, length, heads * d_head)


def _call_merge(impl, case: Case):
    """``impl(x)``, or ``impl(x, num_heads)`` when it takes a second argument."""
    x = case.args[0]
    try:
        params = [
            p
            for p in inspect.signature(impl).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
    except (TypeError, ValueError):
        params = []
    return impl(x, x.size(1)) if len(params) >= 2 else impl(x)


@define(
    title="merging the heads back into one vector per position",
    tolerances="exact",
    cases=_merge_cases,
    expected=lambda case: case.args[0].permute(0, 2, 1, 3).flatten(-2),
    reference=_merge_reference,
    call=_call_merge,
    params=("x",),
    bugs=[
        Bug(
            "the heads are merged in the wrong order: a reshape to (B, L, h * d_head) without "
            "moving the head axis back",
            "first x.transpose(1, 2) to (B, L, h, d_head), then reshape to (B, L, h * d_head).",
            _merge_no_transpose,
        ),
        Bug(
            "the heads' features are interleaved (permute(0, 2, 3, 1)) instead of side by side",
            "head i must fill features i * d_head to (i + 1) * d_head - 1: "
            "x.transpose(1, 2).reshape(B, L, h * d_head).",
            _merge_interleaved,
        ),
    ],
    chapter="04-multi-head-attention",
)
def merge_heads(impl):
    """Put the heads' outputs side by side again (the inverse of ``split_heads``).

    Contract: ``impl(x) -> merged`` (or ``impl(x, num_heads)``), with ``x``
    ``(batch, num_heads, L, d_head)`` and ``merged`` ``(batch, L, num_heads * d_head)``, same
    dtype: head ``i`` fills the features ``i * d_head`` to ``(i + 1) * d_head - 1``.
    Compared exactly with ``x.permute(0, 2, 1, 3).flatten(-2)``.
    """


# --- multi-head attention ------------------------------------------------------------

PROJECTIONS = ("W_q", "W_k", "W_v", "W_o")


def _heads_module(d_model: int, num_heads: int, seed: int, dtype=torch.float32):
    """An ``mhbook.MultiHeadAttention`` with seeded weights and biases (the reader's global
    random state is left alone)."""
    from ..attention.multihead import MultiHeadAttention

    with torch.random.fork_rng(devices=[]):
        m = MultiHeadAttention(d_model, num_heads).to(dtype).eval()
    with torch.no_grad():
        for n, name in enumerate(PROJECTIONS):
            layer = getattr(m, name)
            scale = 1 / math.sqrt(d_model)
            layer.weight.copy_(seeded(d_model, d_model, seed=seed + 2 * n, scale=scale))
            layer.bias.copy_(seeded(d_model, seed=seed + 2 * n + 1, scale=0.1))
    return m


def _multihead_cases() -> list[Case]:
    dims = {
        "output": ("batch", "query", "feature"),
        "weights": ("batch", "head", "query", "key"),
    }
    valid = torch.arange(4) < torch.tensor([3, 2])[:, None]
    cross = torch.arange(5) < torch.tensor([4, 2])[:, None]
    causal = torch.ones(5, 5, dtype=torch.bool).tril() & (torch.arange(5) < 4)
    narrow = torch.arange(4) < torch.tensor([3, 1])[:, None]
    X = seeded(2, 4, 8, seed=60, dtype=torch.float32)
    Y = seeded(1, 5, 15, seed=62, dtype=torch.float32)
    return [
        Case(
            "self-attention, batch 2, L = 4, d_model = 8, 2 heads, padding mask (B, 1, 1, Lk) "
            "with valid lengths [3, 2]",
            (_heads_module(8, 2, seed=70), X, X, valid[:, None, None, :]),
            dims=dims,
        ),
        Case(
            "cross-attention, T_q = 2 < T_k = 5, d_model = 12, 3 heads, valid lengths [4, 2]",
            (
                _heads_module(12, 3, seed=80),
                seeded(2, 2, 12, seed=63, dtype=torch.float32),
                seeded(2, 5, 12, seed=64, dtype=torch.float32),
                cross[:, None, None, :],
            ),
            dims=dims,
        ),
        Case(
            "batch 1, odd sizes: d_model = 15, 5 heads of 3, L = 5, causal & padding mask "
            "(1, 1, 5, 5)",
            (_heads_module(15, 5, seed=90), Y, Y, causal[None, None]),
            dims=dims,
        ),
        Case(
            "float64, cross-attention T_q = 3, T_k = 4, d_model = 6, 3 heads, valid lengths [3, 1]",
            (
                _heads_module(6, 3, seed=100, dtype=torch.float64),
                seeded(2, 3, 6, seed=65),
                seeded(2, 4, 6, seed=66),
                narrow[:, None, None, :],
            ),
            dims=dims,
        ),
    ]


def _multihead_expected(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """``nn.MultiheadAttention`` with the case's weights; its mask is the inverse of ours."""
    m, X_q, X_kv, mask = case.args
    d, h = m.d_model, m.num_heads
    torch_mha = torch.nn.MultiheadAttention(d, h, batch_first=True, dtype=X_q.dtype).eval()
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(torch.cat([m.W_q.weight, m.W_k.weight, m.W_v.weight]))
        torch_mha.in_proj_bias.copy_(torch.cat([m.W_q.bias, m.W_k.bias, m.W_v.bias]))
        torch_mha.out_proj.weight.copy_(m.W_o.weight)
        torch_mha.out_proj.bias.copy_(m.W_o.bias)
    B, Lq, Lk = X_q.size(0), X_q.size(1), X_kv.size(1)
    attn_mask = ~mask.expand(B, h, Lq, Lk).reshape(B * h, Lq, Lk)
    return torch_mha(
        X_q, X_kv, X_kv, attn_mask=attn_mask, need_weights=True, average_attn_weights=False
    )


def _positional(fn) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 4
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)])


def _reader_module(cls, m):
    """Construct the reader's class as ``cls(d_model, num_heads)`` and copy the case's weights
    into its ``W_q``, ``W_k``, ``W_v`` and ``W_o``."""
    ours = cls(m.d_model, m.num_heads)
    ours = ours.to(m.W_q.weight.dtype).eval()
    with torch.no_grad():
        for name in PROJECTIONS:
            layer, source = getattr(ours, name, None), getattr(m, name)
            if not isinstance(getattr(layer, "weight", None), torch.Tensor):
                raise TypeError(
                    f"{cls.__name__} has no {name} with a weight: name its projections W_q, "
                    "W_k, W_v, W_o, each an nn.Linear(d_model, d_model)"
                )
            if layer.weight.shape != source.weight.shape:
                raise ValueError(
                    f"{cls.__name__}(d_model={m.d_model}, num_heads={m.num_heads}).{name}.weight "
                    f"has shape {tuple(layer.weight.shape)}, expected "
                    f"{tuple(source.weight.shape)} (nn.Linear(d_model, d_model))"
                )
            layer.weight.copy_(source.weight)
            if getattr(layer, "bias", None) is None:
                raise TypeError(
                    f"{cls.__name__}.{name} has no bias: the check copies the biases of "
                    "nn.MultiheadAttention; keep nn.Linear's default bias=True"
                )
            layer.bias.copy_(source.bias)
    return ours


def _call_multihead(impl, case: Case):
    """A class: ``cls(d_model, num_heads)`` with the case's weights, called as
    ``module(query, key, value, mask)``. A function: ``fn(m, X_q, X_kv, mask)`` or
    ``fn(m, X_q, X_k, X_v, mask)``. The weights are kept only when they are a tensor."""
    m, X_q, X_kv, mask = case.args
    if isinstance(impl, type):
        got = _reader_module(impl, m)(X_q, X_kv, X_kv, mask)
    elif _positional(impl) >= 5:
        got = impl(copy.deepcopy(m), X_q, X_kv, X_kv, mask)
    else:
        got = impl(copy.deepcopy(m), X_q, X_kv, mask)
    if isinstance(got, (tuple, list)):
        if len(got) >= 2 and isinstance(got[1], torch.Tensor):
            return {"output": got[0], "weights": got[1]}
        return {"output": got[0] if got else None}
    return {"output": got}


def _multihead_reference(
    m, X_q, X_kv, mask, *, scale=None, split=None, merge=None, use_W_o=True, keep=None
):
    """Written for teaching (and mutated for the bugs): project, split into heads, attend in
    every head at once, merge the heads, project with W_o."""
    B, Lq, d = X_q.shape
    Lk, h = X_kv.size(1), m.num_heads
    d_head = d // h

    def split_heads(x, L):  # (B, L, d) -> (B, h, L, d_head)
        return x.view(B, L, h, d_head).transpose(1, 2)

    def merge_heads(x):  # (B, h, Lq, d_head) -> (B, Lq, d)
        return x.transpose(1, 2).reshape(B, Lq, d)

    split, merge = split or split_heads, merge or merge_heads
    q, k, v = split(m.W_q(X_q), Lq), split(m.W_k(X_kv), Lk), split(m.W_v(X_kv), Lk)
    scores = q @ k.transpose(-2, -1) / (math.sqrt(d_head) if scale is None else scale)
    keep = mask if keep is None else keep
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    heads = merge(weights @ v)
    return (m.W_o(heads) if use_W_o else heads), weights


def _mh_sqrt_d_model(m, X_q, X_kv, mask):
    return _multihead_reference(m, X_q, X_kv, mask, scale=math.sqrt(X_q.size(-1)))


def _mh_no_W_o(m, X_q, X_kv, mask):
    return _multihead_reference(m, X_q, X_kv, mask, use_W_o=False)


def _mh_merge_wrong_order(m, X_q, X_kv, mask):
    B, Lq, d = X_q.shape
    return _multihead_reference(m, X_q, X_kv, mask, merge=lambda x: x.reshape(B, Lq, d))


def _mh_split_without_transpose(m, X_q, X_kv, mask):
    B, _, d = X_q.shape
    h = m.num_heads

    def split(x, L):
        return x.reshape(B, h, L, d // h)

    return _multihead_reference(m, X_q, X_kv, mask, split=split)


def _mh_mask_inverted(m, X_q, X_kv, mask):
    return _multihead_reference(m, X_q, X_kv, mask, keep=~mask)


def _mh_mask_ignored(m, X_q, X_kv, mask):
    return _multihead_reference(m, X_q, X_kv, None)


@define(
    title="multi-head attention",
    cases=_multihead_cases,
    expected=_multihead_expected,
    reference=_multihead_reference,
    call=_call_multihead,
    optional=("weights",),
    params=("m (the weights)", "X_q", "X_kv", "mask"),
    why="Computing in another order (a loop over the heads, einsum, fused attention) stays "
    "well inside.",
    bugs=[
        Bug(
            "the scores are scaled by sqrt(d_model) instead of sqrt(d_head)",
            "each head compares queries and keys of size d_head = d_model / num_heads: divide "
            "by math.sqrt(d_head).",
            _mh_sqrt_d_model,
        ),
        Bug(
            "W_o is missing: the merged heads are returned as they are",
            "mix the concatenated heads with the output projection: return W_o(merged).",
            _mh_no_W_o,
        ),
        Bug(
            "the heads are merged in the wrong order (a reshape of (B, h, L, d_head) without "
            "moving the head axis back)",
            "transpose(1, 2) to (B, L, h, d_head) before reshaping to (B, L, d_model).",
            _mh_merge_wrong_order,
        ),
        Bug(
            "the heads are split with a reshape to (B, h, L, d_head), without the transpose",
            "cut the features first, view(B, L, h, d_head), then transpose(1, 2).",
            _mh_split_without_transpose,
        ),
        Bug(
            "the mask is read the other way round (True = masked out)",
            "in the book True means may attend: fill the scores where ~mask (and pass ~mask "
            "only to nn.MultiheadAttention).",
            _mh_mask_inverted,
        ),
        Bug(
            "the mask is ignored",
            "fill the masked scores with -inf before the softmax: "
            "scores.masked_fill(~mask, float('-inf')).",
            _mh_mask_ignored,
        ),
    ],
    chapter="04-multi-head-attention",
)
def multihead(impl):
    """Multi-head attention: project, split into heads, attend, merge, project with W_o.

    Contract: either a class or a function.

    * A class ``cls(d_model, num_heads)``, an ``nn.Module`` whose attributes ``W_q``, ``W_k``,
      ``W_v`` and ``W_o`` are ``nn.Linear(d_model, d_model)`` (with their default bias; the
      check copies its weights into them), and whose ``forward(query, key, value, mask)``
      returns the output ``(batch, T_q, d_model)``, or ``(output, weights)`` with per-head
      weights ``(batch, num_heads, T_q, T_k)`` (or ``None``), as ``mhbook.MultiHeadAttention``.
    * A function ``fn(m, X_q, X_kv, mask)`` (or ``fn(m, X_q, X_k, X_v, mask)``), as the
      chapter's ``multi_head_view``: ``m`` is an ``mhbook.MultiHeadAttention`` that carries the
      weights (``m.W_q``, ..., ``m.W_o``, ``m.num_heads``, ``m.d_head``); it returns the same.

    Head ``i`` owns the features ``i * d_head`` to ``(i + 1) * d_head - 1`` of each
    projection, as in PyTorch. ``mask`` is a bool tensor ``(batch, 1, 1 or T_q, T_k)``,
    ``True`` = may attend; in these cases every query may attend to some key. The keys and
    the values are the same tensor. Compared with ``torch.nn.MultiheadAttention`` holding the
    same weights (its mask is ``~mask``).
    """


# --- one attention head (chapter 1) --------------------------------------------------


def _attention_head_cases() -> list[Case]:
    dims = {"output": ("position", "feature"), "weights": ("query", "key")}
    batched = {
        "output": ("batch", "position", "feature"),
        "weights": ("batch", "query", "key"),
    }
    return [
        Case(
            "one sentence of 5 tokens, d_in = 3, d_k = 4, d_v = 2",
            ((3, 4, 2), seeded(5, 3, seed=110, dtype=torch.float32)),
            dims=dims,
        ),
        Case(
            "batch 2, 4 tokens, d_in = 6, d_k = 4, d_v = 2",
            ((6, 4, 2), seeded(2, 4, 6, seed=111, dtype=torch.float32)),
            dims=batched,
        ),
        Case(
            "batch 1, odd sizes: 7 tokens, d_in = 5, d_k = 9, d_v = 3",
            ((5, 9, 3), seeded(1, 7, 5, seed=112, dtype=torch.float32)),
            dims=batched,
        ),
        Case(
            "float64, large inputs (scores in the tens): batch 2, 3 tokens, d_in = 4, d_k = 16, "
            "d_v = 5",
            ((4, 16, 5), seeded(2, 3, 4, seed=113, scale=4.0)),
            dims=batched,
        ),
    ]


def _head_weights(sizes, dtype):
    d_in, d_k, d_v = sizes
    seed = 120 + d_in + d_k + d_v
    return {
        "W_q": seeded(d_k, d_in, seed=seed, scale=1 / math.sqrt(d_in), dtype=dtype),
        "W_k": seeded(d_k, d_in, seed=seed + 1, scale=1 / math.sqrt(d_in), dtype=dtype),
        "W_v": seeded(d_v, d_in, seed=seed + 2, scale=1 / math.sqrt(d_in), dtype=dtype),
    }


def _attention_head_expected(case: Case):
    sizes, x = case.args
    w = _head_weights(sizes, x.dtype)
    q, k, v = x @ w["W_q"].T, x @ w["W_k"].T, x @ w["W_v"].T
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.size(-1))
    return F.scaled_dot_product_attention(q, k, v), torch.softmax(scores, dim=-1).to(x.dtype)


def _call_attention_head(impl, case: Case):
    """Construct ``impl(d_in, d_k, d_v)``, copy the case's weights into ``W_q``, ``W_k``,
    ``W_v`` (biases, if any, set to zero) and call it on ``x``."""
    sizes, x = case.args
    head = impl(*sizes).to(x.dtype).eval()
    with torch.no_grad():
        for name, weight in _head_weights(sizes, x.dtype).items():
            layer = getattr(head, name, None)
            if not isinstance(getattr(layer, "weight", None), torch.Tensor):
                raise TypeError(
                    f"{type(head).__name__} has no {name} with a weight: name the maps W_q, "
                    "W_k, W_v, each an nn.Linear(d_in, d_k or d_v, bias=False)"
                )
            if layer.weight.shape != weight.shape:
                raise ValueError(
                    f"{type(head).__name__}{sizes}.{name}.weight has shape "
                    f"{tuple(layer.weight.shape)}, expected {tuple(weight.shape)} (out, in)"
                )
            layer.weight.copy_(weight)
            if getattr(layer, "bias", None) is not None:
                layer.bias.zero_()
    got = head(x)
    if isinstance(got, (tuple, list)):
        if len(got) >= 2 and isinstance(got[1], torch.Tensor):
            return {"output": got[0], "weights": got[1]}
        return {"output": got[0] if got else None}
    return {"output": got}


def _head_class(*, scale=None, axis=-1, swap=False, project_values=True):
    """The reference head, or one mutation of it."""

    class AttentionHead(torch.nn.Module):
        """Written for teaching: one self-attention head with learned maps, no bias."""

        def __init__(self, d_in, d_k, d_v):
            super().__init__()
            self.W_q = torch.nn.Linear(d_in, d_k, bias=False)
            self.W_k = torch.nn.Linear(d_in, d_k, bias=False)
            self.W_v = torch.nn.Linear(d_in, d_v, bias=False)

        def forward(self, x):
            q, k = self.W_q(x), self.W_k(x)
            v = self.W_v(x) if project_values else x
            if swap:
                q, k = k, q
            s = math.sqrt(q.size(-1)) if scale is None else scale(x, q, v)
            weights = torch.softmax(q @ k.transpose(-2, -1) / s, dim=axis)
            return weights @ v, weights

    return AttentionHead


@define(
    title="one attention head with learned query, key and value maps",
    cases=_attention_head_cases,
    expected=_attention_head_expected,
    reference=_head_class(),
    call=_call_attention_head,
    optional=("weights",),
    params=("(d_in, d_k, d_v)", "x"),
    why="Float32 arithmetic inside is fine for float64 inputs.",
    bugs=[
        Bug(
            "the scores are not scaled",
            "divide q @ k^T by math.sqrt(d_k), the size of a query (q.size(-1)).",
            _head_class(scale=lambda x, q, v: 1.0),
        ),
        Bug(
            "the scores are scaled by sqrt(d_in), the size of the input, instead of sqrt(d_k)",
            "scale by the size of the queries and keys, math.sqrt(q.size(-1)), not of x.",
            _head_class(scale=lambda x, q, v: math.sqrt(x.size(-1))),
        ),
        Bug(
            "softmax over the queries (dim=-2) instead of the keys",
            "take the softmax over the last axis, the keys: each query's weights sum to one.",
            _head_class(axis=-2),
        ),
        Bug(
            "queries and keys swapped: the scores are k @ q^T, the transpose",
            "row i of the scores is query i: q @ k.transpose(-2, -1), with q = W_q(x).",
            _head_class(swap=True),
        ),
        Bug(
            "the values are not projected: the weights average x, not W_v(x)",
            "average v = self.W_v(x): weights @ v.",
            _head_class(project_values=False),
        ),
    ],
    chapter="01-queries-keys-values",
)
def attention_head(impl):
    """One self-attention head with learned maps (chapter 1's ``AttentionHead``).

    Contract: a class ``cls(d_in, d_k, d_v)``, an ``nn.Module`` whose attributes ``W_q``,
    ``W_k`` (``nn.Linear(d_in, d_k, bias=False)``) and ``W_v`` (``nn.Linear(d_in, d_v,
    bias=False)``) the check fills with its weights, and whose ``forward(x)``, with ``x``
    ``(..., T, d_in)``, returns ``(output, weights)`` (or the output alone): output
    ``(..., T, d_v)``, weights ``(..., T, T)``, in ``x``'s dtype. Compared with
    ``torch.nn.functional.scaled_dot_product_attention`` of the projected ``x``.
    """


# --- layer norm (chapter 6) ----------------------------------------------------------


def _layer_norm_cases() -> list[Case]:
    rows = ("row", "feature")
    tokens = ("batch", "token", "feature")
    chapter_X = torch.tensor(
        [
            [[1.0, 2.0, 3.0, 4.0], [2.0, 0.0, 2.0, 0.0], [5.0, 5.0, 5.0, 9.0]],
            [[0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]],
        ]
    )
    return [
        Case(
            "chapter 6's batch (2, 3, 4), with rows of zeros (padding)",
            (chapter_X,),
            dims={"output": tokens},
        ),
        Case(
            "float64, 3 tokens of 8 features around 2 with spread 3",
            (seeded(3, 8, seed=130, scale=3.0) + 2.0,),
            dims={"output": rows},
        ),
        Case(
            "float64, tokens of small spread (variance ~1e-6 < eps), batch 2, 3 tokens, 5 features",
            (seeded(2, 3, 5, seed=131, scale=1e-3),),
            dims={"output": tokens},
        ),
        Case(
            "eps = 0.1 passed by keyword, float64 (2, 6)",
            (seeded(2, 6, seed=132, scale=0.3),),
            {"eps": 0.1},
            dims={"output": rows},
            needs=("eps",),
        ),
    ]


def _layer_norm_expected(case: Case) -> torch.Tensor:
    (x,) = case.args
    return F.layer_norm(x, (x.size(-1),), eps=case.kwargs.get("eps", 1e-5))


def _layer_norm_reference(x, eps=1e-5):
    """Written for teaching: per token, subtract the mean and divide by the standard deviation
    (the biased variance, plus eps under the square root)."""
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps)


def _ln_eps_outside(x, eps=1e-5):
    mu = x.mean(dim=-1, keepdim=True)
    return (x - mu) / (x.var(dim=-1, unbiased=False, keepdim=True).sqrt() + eps)


def _ln_bessel(x, eps=1e-5):
    mu = x.mean(dim=-1, keepdim=True)
    return (x - mu) / torch.sqrt(x.var(dim=-1, keepdim=True) + eps)


def _ln_over_tokens(x, eps=1e-5):
    dims = tuple(range(x.dim() - 1))
    mu = x.mean(dim=dims, keepdim=True)
    return (x - mu) / torch.sqrt(x.var(dim=dims, unbiased=False, keepdim=True) + eps)


def _ln_over_sequence(x, eps=1e-5):
    mu = x.mean(dim=-2, keepdim=True)
    return (x - mu) / torch.sqrt(x.var(dim=-2, unbiased=False, keepdim=True) + eps)


def _ln_no_mean(x, eps=1e-5):
    var = x.var(dim=-1, unbiased=False, keepdim=True)
    return x / torch.sqrt(var + eps)


def _ln_variance(x, eps=1e-5):
    mu = x.mean(dim=-1, keepdim=True)
    return (x - mu) / (x.var(dim=-1, unbiased=False, keepdim=True) + eps)


@define(
    title="layer norm over each token's features (no learned scale or shift)",
    cases=_layer_norm_cases,
    expected=_layer_norm_expected,
    reference=_layer_norm_reference,
    params=("x",),
    why="Float32 arithmetic inside is fine for float64 inputs (as in transformers' "
    "DebertaLayerNorm).",
    bugs=[
        Bug(
            "eps is added outside the square root",
            "divide by torch.sqrt(var + eps), as nn.LayerNorm does, not by sqrt(var) + eps.",
            _ln_eps_outside,
        ),
        Bug(
            "the variance has Bessel's correction (divides by d - 1: torch.var's default)",
            "layer norm divides by d: x.var(dim=-1, unbiased=False, keepdim=True).",
            _ln_bessel,
        ),
        Bug(
            "normalised over the tokens (each feature, as batch norm) instead of over each "
            "token's features",
            "take the mean and the variance over the last axis only: dim=-1, keepdim=True.",
            _ln_over_tokens,
        ),
        Bug(
            "normalised over the wrong axis: dim=-2, each feature across one sequence's "
            "tokens, instead of each token's features",
            "take the mean and the variance over the last axis, the features: dim=-1, "
            "keepdim=True.",
            _ln_over_sequence,
        ),
        Bug(
            "the mean is not subtracted",
            "centre first: (x - mu) / torch.sqrt(var + eps).",
            _ln_no_mean,
        ),
        Bug(
            "divided by the variance instead of the standard deviation",
            "divide by torch.sqrt(var + eps).",
            _ln_variance,
        ),
    ],
    chapter="06-transformer",
)
def layer_norm(impl):
    """Layer norm without its learned scale and shift (chapter 6's ``layer_norm_by_hand``).

    Contract: ``impl(x) -> y`` (``impl(x, eps=1e-5)`` optionally), with ``x`` ``(..., d)``
    and ``y`` of the same shape and dtype: each vector along the last axis minus its mean,
    divided by ``sqrt(variance + eps)``, the variance dividing by ``d``, and ``eps = 1e-5``.
    Compared with ``torch.nn.functional.layer_norm(x, (d,), eps=eps)``. A function without
    an ``eps`` argument is checked with the default only.
    """
