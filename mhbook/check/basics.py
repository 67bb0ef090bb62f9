"""Checks of Part I's mechanisms: the softmax and scaled dot-product attention.

Each check's docstring is its contract; the references are PyTorch's ``torch.softmax`` and
``torch.nn.functional.scaled_dot_product_attention``, with the book's one convention on top:
a query that may attend to no key gets zero weights and a zero output, never NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .grader import Bug, Case, define

__all__ = ["softmax", "attention"]


def seeded(*shape, seed: int, dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    """A seeded standard normal tensor (times ``scale``), the same on every machine."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


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
    ],
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
            "float16 with large scores (around 100; exp overflows unless the softmax is stable)",
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
    outputs=("output", "weights"),
    params=("q", "k", "v"),
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
