"""The hand-written BLEU of mhbook.tasks.bleu against sacrebleu on the same tokens."""

import random

import pytest

from mhbook.tasks.bleu import (
    bleu_details,
    brevity_penalty,
    corpus_bleu,
    ngram_counts,
    sentence_bleu,
)

sacrebleu = pytest.importorskip("sacrebleu")


def sacre_corpus(hyps, refs):
    return sacrebleu.corpus_bleu(
        [" ".join(h) for h in hyps],
        [[" ".join(r) for r in refs]],
        tokenize="none",
        smooth_method="none",
    ).score


def sacre_sentence(hyp, ref):
    # sacrebleu.sentence_bleu's defaults: smooth_method="exp", use_effective_order=True.
    return sacrebleu.sentence_bleu(" ".join(hyp), [" ".join(ref)], tokenize="none").score


def random_sentence(rng, words, max_len=10):
    return [rng.choice(words) for _ in range(rng.randint(0, max_len))]


@pytest.mark.parametrize("seed", range(5))
def test_random_corpora_match_sacrebleu(seed):
    rng = random.Random(seed)
    words = "un deux trois cent mille - vingt".split()
    for _ in range(40):
        k = rng.randint(1, 8)
        hyps = [random_sentence(rng, words) for _ in range(k)]
        refs = [random_sentence(rng, words) for _ in range(k)]
        assert corpus_bleu(hyps, refs) == pytest.approx(sacre_corpus(hyps, refs), abs=1e-9)
        assert sentence_bleu(hyps[0], refs[0]) == pytest.approx(
            sacre_sentence(hyps[0], refs[0]), abs=1e-9
        )


def test_near_translations_match_sacrebleu():
    # Realistic case: hypotheses that differ from their references in a token or two,
    # so every order has matches and the score is far from 0 and 100.
    rng = random.Random(0)
    words = "un deux trois quatre cinq six sept huit neuf dix cent mille - et".split()
    refs = [[rng.choice(words) for _ in range(rng.randint(4, 15))] for _ in range(50)]
    hyps = []
    for ref in refs:
        hyp = list(ref)
        for _ in range(rng.randint(0, 2)):
            action = rng.choice(["swap", "drop", "add"])
            i = rng.randrange(len(hyp))
            if action == "swap":
                hyp[i] = rng.choice(words)
            elif action == "drop" and len(hyp) > 1:
                del hyp[i]
            else:
                hyp.insert(i, rng.choice(words))
        hyps.append(hyp)
    score = corpus_bleu(hyps, refs)
    assert 20 < score < 99
    assert score == pytest.approx(sacre_corpus(hyps, refs), abs=1e-9)
    for h, r in zip(hyps, refs):
        assert sentence_bleu(h, r) == pytest.approx(sacre_sentence(h, r), abs=1e-9)


@pytest.mark.parametrize(
    "hyp, ref",
    [
        (["deux", "cents"], ["deux", "cents"]),  # perfect but shorter than 4 tokens
        ("quatre - vingt - dix - sept".split(), "quatre - vingt - dix - sept".split()),
        (["cent"], "cent vingt et un".split()),  # much too short
        ([], ["mille"]),  # empty hypothesis
        (["mille"], []),  # empty reference
        ([], []),
        ("un deux trois".split(), "quatre cinq six".split()),  # nothing in common
        ("mille mille mille mille".split(), "mille cent".split()),  # clipping
        ("vingt et un mille".split(), "mille vingt et un".split()),  # same words, other order
    ],
)
def test_edge_cases_match_sacrebleu(hyp, ref):
    assert corpus_bleu([hyp], [ref]) == pytest.approx(sacre_corpus([hyp], [ref]), abs=1e-9)
    assert sentence_bleu(hyp, ref) == pytest.approx(sacre_sentence(hyp, ref), abs=1e-9)


def test_perfect_translation_scores_100():
    sentence = "neuf cent quatre - vingt - dix - neuf mille".split()
    assert corpus_bleu([sentence], [sentence]) == pytest.approx(100.0)
    assert sentence_bleu(sentence, sentence) == pytest.approx(100.0)


def test_short_perfect_sentence_corpus_vs_sentence():
    # Papineni's corpus BLEU has no 4-grams here, so it is 0; sentence BLEU uses the
    # effective order and gives 100.
    assert corpus_bleu([["deux", "cents"]], [["deux", "cents"]]) == 0.0
    assert sentence_bleu(["deux", "cents"], ["deux", "cents"]) == pytest.approx(100.0)


def test_pieces():
    assert ngram_counts("a b a b".split(), 2) == {("a", "b"): 2, ("b", "a"): 1}
    assert brevity_penalty(5, 4) == 1.0
    assert brevity_penalty(0, 4) == 0.0
    assert brevity_penalty(2, 4) == pytest.approx(2.718281828459045**-1)
    d = bleu_details([["mille", "mille"]], [["mille"]], max_order=1)
    assert d["correct"] == [1] and d["total"] == [2]  # clipped to the reference's count
    assert d["score"] == pytest.approx(50.0)


def test_strings_are_rejected():
    with pytest.raises(TypeError, match="token lists"):
        corpus_bleu(["deux cents"], ["deux cents"])
    with pytest.raises(ValueError, match="one reference per hypothesis"):
        corpus_bleu([["a"]], [["a"], ["b"]])
