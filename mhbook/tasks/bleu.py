"""BLEU (Papineni et al., 2002), on lists of tokens, scored from 0 to 100.

Hand-written on purpose, so that a reader can see every step; ``sacrebleu`` is the
well-kept library to use in practice, and ``tests/tasks/test_bleu.py`` checks that these
functions give its numbers (with ``tokenize="none"``).

For each order ``n = 1..4`` the *modified precision* ``p_n`` counts the hypothesis
n-grams that occur in the reference, each clipped to the number of times it occurs
there, divided by the number of hypothesis n-grams. With ``c`` the hypothesis length
and ``r`` the reference length (summed over the corpus),

    BLEU = BP * exp(sum_n (1/4) log p_n),      BP = 1 if c > r else exp(1 - r/c).

:func:`corpus_bleu` adds up the counts over all sentences before dividing, as in the
paper (no smoothing: one order without any match gives 0). :func:`sentence_bleu`
smooths like ``sacrebleu.sentence_bleu``'s default (``"exp"``, the NIST
smoothing): the k-th order without matches gets precision ``1 / (2^k * total)``,
and orders the hypothesis is too short to have are left out of the mean.

:func:`translation_scores` is the book's score of whole sentences: the exact match (the
fraction right, :func:`exact_match`) and the corpus BLEU of their tokens.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from .numbers import tokenize

__all__ = [
    "ngram_counts",
    "brevity_penalty",
    "bleu_details",
    "corpus_bleu",
    "sentence_bleu",
    "exact_match",
    "translation_scores",
]

MAX_ORDER = 4


def ngram_counts(tokens: Sequence[str], n: int) -> Counter:
    """How often each n-gram (a tuple of ``n`` tokens) occurs in ``tokens``."""
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def brevity_penalty(hyp_len: int, ref_len: int) -> float:
    """``1`` if the hypotheses are longer than the references, else ``exp(1 - r / c)``
    (``0`` for an empty hypothesis)."""
    if hyp_len >= ref_len:
        return 1.0
    return math.exp(1 - ref_len / hyp_len) if hyp_len > 0 else 0.0


def _statistics(hypothesis: Sequence[str], reference: Sequence[str], max_order: int):
    """Clipped matches and totals per order for one sentence pair."""
    correct, total = [0] * max_order, [0] * max_order
    for n in range(1, max_order + 1):
        hyp, ref = ngram_counts(hypothesis, n), ngram_counts(reference, n)
        correct[n - 1] = sum(min(count, ref[gram]) for gram, count in hyp.items())
        total[n - 1] = sum(hyp.values())
    return correct, total


def bleu_details(
    hypotheses: Sequence[Sequence[str]],
    references: Sequence[Sequence[str]],
    max_order: int = MAX_ORDER,
    smooth: str = "none",
    effective_order: bool = False,
) -> dict:
    """BLEU and the numbers it is made of.

    Args:
        hypotheses: one list of tokens per sentence.
        references: one list of tokens per sentence (a single reference each).
        max_order: the longest n-gram (4 in the paper), weights ``1 / max_order``.
        smooth: ``"none"`` (the paper) or ``"exp"`` (sacrebleu's sentence-level default).
        effective_order: leave out the orders the hypotheses have no n-grams of.

    Returns:
        ``{"score", "precisions", "brevity_penalty", "hyp_len", "ref_len", "correct", "total"}``;
        ``score`` and ``precisions`` are in percent.
    """
    _check_corpus(hypotheses, references)
    if smooth not in ("none", "exp"):
        raise ValueError(f"smooth must be 'none' or 'exp', got {smooth!r}")
    correct, total = [0] * max_order, [0] * max_order
    hyp_len = ref_len = 0
    for hyp, ref in zip(hypotheses, references):
        c, t = _statistics(hyp, ref, max_order)
        correct = [a + b for a, b in zip(correct, c)]
        total = [a + b for a, b in zip(total, t)]
        hyp_len += len(hyp)
        ref_len += len(ref)

    bp = brevity_penalty(hyp_len, ref_len)
    precisions = [0.0] * max_order
    order = max_order
    smooth_factor = 1.0
    for n in range(1, max_order + 1):
        if total[n - 1] == 0:  # the hypotheses are all shorter than n tokens
            if effective_order:
                order = n - 1
            break
        if correct[n - 1] > 0:
            precisions[n - 1] = correct[n - 1] / total[n - 1]
        elif smooth == "exp":
            smooth_factor *= 2
            precisions[n - 1] = 1 / (smooth_factor * total[n - 1])
    if not any(correct) or any(p == 0 for p in precisions[:order]):
        score = 0.0  # log 0: some order without a single match
    else:
        score = bp * math.exp(sum(math.log(p) for p in precisions[:order]) / order)
    return {
        "score": 100 * score,
        "precisions": [100 * p for p in precisions],
        "brevity_penalty": bp,
        "hyp_len": hyp_len,
        "ref_len": ref_len,
        "correct": correct,
        "total": total,
    }


def corpus_bleu(
    hypotheses: Sequence[Sequence[str]],
    references: Sequence[Sequence[str]],
    max_order: int = MAX_ORDER,
) -> float:
    """Corpus BLEU of Papineni et al. (2002), 0 to 100: counts summed over all
    sentences, uniform weights, brevity penalty, no smoothing.

    Equals ``sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", smooth_method="none").score``
    on the space-joined tokens.
    """
    return bleu_details(hypotheses, references, max_order)["score"]


def sentence_bleu(
    hypothesis: Sequence[str], reference: Sequence[str], max_order: int = MAX_ORDER
) -> float:
    """BLEU of one sentence, 0 to 100, smoothed like ``sacrebleu.sentence_bleu``'s
    default (``smooth_method="exp"``, effective order)."""
    return bleu_details([hypothesis], [reference], max_order, smooth="exp", effective_order=True)[
        "score"
    ]


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """The fraction of ``hypotheses`` (strings) equal to their reference, 0 to 1 (0 for
    none): how the book scores a translation, a completion or a head's removal."""
    if len(hypotheses) != len(references):
        raise ValueError(
            f"need one reference per hypothesis: got {len(hypotheses)} hypotheses and "
            f"{len(references)} references"
        )
    return sum(h == r for h, r in zip(hypotheses, references)) / max(1, len(references))


def translation_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """``{"exact_match": ..., "bleu": ...}`` of sentences (strings) against their references:
    :func:`exact_match` (0 to 1) and :func:`corpus_bleu` (0 to 100) on the tokens of
    :func:`mhbook.tasks.numbers.tokenize`. What :func:`mhbook.evaluate` and
    :func:`mhbook.evaluate_lm`
    report."""
    return {
        "exact_match": exact_match(hypotheses, references),
        "bleu": corpus_bleu([tokenize(h) for h in hypotheses], [tokenize(r) for r in references]),
    }


def _check_corpus(hypotheses, references) -> None:
    for name, corpus in (("hypotheses", hypotheses), ("references", references)):
        if isinstance(corpus, str) or any(isinstance(s, str) for s in corpus):
            raise TypeError(
                f"{name} must be a list of token lists, e.g. [['deux', 'cents']], not strings: "
                "split them first (mhbook.tasks.numbers.tokenize)"
            )
    if len(hypotheses) != len(references):
        raise ValueError(
            f"need one reference per hypothesis: got {len(hypotheses)} hypotheses and "
            f"{len(references)} references"
        )
