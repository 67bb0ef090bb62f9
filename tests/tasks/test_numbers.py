"""The English-to-French number-words task of mhbook.tasks.numbers."""

import random

import pytest
import torch

from mhbook.tasks.numbers import (
    Batch,
    NumberTranslation,
    Vocab,
    detokenize,
    english_words,
    french_words,
    tokenize,
)

FRENCH = {
    0: "zéro",
    1: "un",
    17: "dix-sept",
    21: "vingt et un",
    71: "soixante et onze",
    80: "quatre-vingts",
    81: "quatre-vingt-un",
    91: "quatre-vingt-onze",
    97: "quatre-vingt-dix-sept",
    100: "cent",
    101: "cent un",
    200: "deux cents",
    201: "deux cent un",
    1000: "mille",
    2000: "deux mille",
    21000: "vingt et un mille",
    80000: "quatre-vingt mille",
    200000: "deux cent mille",
    999999: "neuf cent quatre-vingt-dix-neuf mille neuf cent quatre-vingt-dix-neuf",
}

ENGLISH = {
    0: "zero",
    71: "seventy-one",
    101: "one hundred and one",
    1100: "one thousand one hundred",
    21000: "twenty-one thousand",
    999999: "nine hundred and ninety-nine thousand nine hundred and ninety-nine",
}


@pytest.fixture(scope="module")
def data():
    return NumberTranslation(num_train=1500, num_valid=200, num_test=200, seed=0)


@pytest.mark.parametrize("n, words", FRENCH.items())
def test_french_spelling(n, words):
    assert french_words(n) == words


@pytest.mark.parametrize("n, words", ENGLISH.items())
def test_english_spelling(n, words):
    assert english_words(n) == words


def test_words_reject_bad_numbers():
    with pytest.raises(ValueError, match="non-negative"):
        french_words(-1)
    with pytest.raises(TypeError, match="int"):
        english_words(1.5)


def test_tokenize_keeps_hyphens():
    assert tokenize("seventy-one") == ["seventy", "-", "one"]
    assert tokenize("quatre-vingt-dix-sept mille") == [
        "quatre", "-", "vingt", "-", "dix", "-", "sept", "mille",
    ]  # fmt: skip
    for n in [0, 71, 80, 97, 1080, 21071, 999999]:
        for text in (english_words(n), french_words(n)):
            assert detokenize(tokenize(text)) == text


def test_vocab_round_trip(data):
    for vocab in (data.src_vocab, data.tgt_vocab):
        assert vocab.id_to_token[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
        assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2, 3)
        assert len(vocab) == len(set(vocab.id_to_token))
        assert Vocab.from_tokens(vocab.id_to_token) == vocab
    for en, fr in data.pairs("test"):
        assert data.src_vocab.decode(data.src_vocab.encode(tokenize(en))) == tokenize(en)
        assert data.tgt_vocab.decode(data.tgt_vocab.encode(tokenize(fr))) == tokenize(fr)
    assert data.tgt_vocab.encode(["cent", "zzz"])[1] == data.tgt_vocab.unk_id
    with pytest.raises(TypeError, match="tokenize"):
        data.tgt_vocab.encode("deux cents")


def test_held_out_words_are_known(data):
    # The training vocabulary covers every word of the held-out splits.
    for split in ("valid", "test"):
        for en, fr in data.pairs(split):
            assert data.src_vocab.unk_id not in data.src_vocab.encode(tokenize(en))
            assert data.tgt_vocab.unk_id not in data.tgt_vocab.encode(tokenize(fr))


def test_splits_are_disjoint_by_number(data):
    train, valid, test = (set(data.numbers[s]) for s in ("train", "valid", "test"))
    assert (len(train), len(valid), len(test)) == (1500, 200, 200)
    assert not train & valid and not train & test and not valid & test
    assert all(0 <= n <= 999_999 for n in train | valid | test)
    # A mix of short and long numbers.
    digits = {len(str(n)) for n in test}
    assert {3, 4, 5, 6} <= digits
    en, fr = data.pairs("test")[0]
    n = data.numbers["test"][0]
    assert (en, fr) == (english_words(n), french_words(n))


def test_deterministic_from_seed(data):
    again = NumberTranslation(num_train=1500, num_valid=200, num_test=200, seed=0)
    assert again.numbers == data.numbers
    assert again.src_vocab == data.src_vocab and again.tgt_vocab == data.tgt_vocab
    small = NumberTranslation(num_train=200, num_valid=10, num_test=10, seed=0)
    other = NumberTranslation(num_train=200, num_valid=10, num_test=10, seed=1)
    assert other.numbers["train"] != small.numbers["train"]
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    b1 = next(data.batches("train", 16, generator=g1))
    b2 = next(again.batches("train", 16, generator=g2))
    assert all(torch.equal(x, y) for x, y in zip(b1, b2))


def test_too_many_numbers():
    with pytest.raises(ValueError, match="do not fit"):
        NumberTranslation(max_number=99, num_train=90, num_valid=5, num_test=6)
    small = NumberTranslation(max_number=99, num_train=90, num_valid=5, num_test=5)
    assert sorted(sum(small.numbers.values(), [])) == list(range(100))


def test_batch_shapes_and_padding(data):
    batches = list(data.batches("valid", batch_size=64))
    assert [b.src.size(0) for b in batches] == [64, 64, 64, 8]
    pairs = data.pairs("valid")
    b = batches[0]
    assert isinstance(b, Batch)
    B = 64
    assert b.src_valid_lens.shape == b.tgt_valid_lens.shape == (B,)
    assert b.tgt_in.shape == b.tgt_out.shape
    assert b.src.size(1) == int(b.src_valid_lens.max())  # padded to its own longest
    assert b.tgt_in.size(1) == int(b.tgt_valid_lens.max())
    src_v, tgt_v = data.src_vocab, data.tgt_vocab
    for i, (en, fr) in enumerate(pairs[:B]):  # not shuffled: in order
        en_ids, fr_ids = src_v.encode(tokenize(en)), tgt_v.encode(tokenize(fr))
        s, t = len(en_ids) + 1, len(fr_ids) + 1
        assert b.src_valid_lens[i] == s and b.tgt_valid_lens[i] == t
        assert b.src[i, :s].tolist() == en_ids + [src_v.eos_id]
        assert b.tgt_in[i, :t].tolist() == [tgt_v.bos_id] + fr_ids
        assert b.tgt_out[i, :t].tolist() == fr_ids + [tgt_v.eos_id]
        assert (b.src[i, s:] == src_v.pad_id).all()
        assert (b.tgt_in[i, t:] == tgt_v.pad_id).all() and (b.tgt_out[i, t:] == tgt_v.pad_id).all()
    for t in b:
        assert t.dtype == torch.long and t.device.type == "cpu"


def test_shuffled_batches_cover_the_split(data):
    batches = list(
        data.batches("train", batch_size=128, generator=torch.Generator().manual_seed(0))
    )
    assert sum(b.src.size(0) for b in batches) == 1500
    assert len(list(data.batches("train", batch_size=128, drop_last=True))) == 1500 // 128
    with pytest.raises(ValueError, match="split"):
        next(data.batches("dev"))


def test_encode_and_decode_helpers(data):
    src, lens = data.encode_source(["seventy-one", 200], device="cpu")
    assert lens.tolist() == [4, 3]
    assert data.src_vocab.decode(src[0]) == ["seventy", "-", "one", "<eos>"]
    assert data.src_vocab.decode(src[1]) == ["two", "hundred", "<eos>", "<pad>"]
    v = data.tgt_vocab
    ids = torch.tensor(
        [
            v.encode(tokenize("soixante et onze")) + [v.eos_id, v.eos_id],
            v.encode(tokenize("deux cents")) + [v.eos_id, v.eos_id, v.eos_id],
        ]
    )
    assert data.decode_target(ids) == ["soixante et onze", "deux cents"]
    with pytest.raises(ValueError, match="batch, n"):
        data.decode_target(ids[0])


class _Echo(torch.nn.Module):
    """A fake model whose generate returns fixed French ids (tests the plumbing)."""

    def __init__(self, ids):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.ids = ids
        self.calls = []

    def generate(self, src, src_valid_lens, max_new_tokens, *, bos_id, eos_id, use_cache=True):
        self.calls.append((tuple(src.shape), bos_id, eos_id, max_new_tokens, use_cache))
        return self.ids


def test_translate_plumbing(data):
    v = data.tgt_vocab
    model = _Echo(torch.tensor([v.encode(tokenize("quatre-vingts")) + [v.eos_id]]))
    assert data.translate(model, [80], max_len=7) == ["quatre-vingts"]
    assert model.calls == [((1, 2), v.bos_id, v.eos_id, 7, True)]


def test_the_words_are_num2words_own():
    """english_words and french_words take num2words' converters with their table cut at a
    million (its whole table makes it several times slower): the same words, every number
    below 2,000, the edges of each power of ten, and thousands of random ones."""
    from num2words import num2words

    import mhbook.tasks.numbers as numbers

    rng = random.Random(0)
    edges = [k * 10**p + d for p in range(1, 7) for k in (1, 2, 9) for d in (-1, 0, 1)]
    for n in [*range(2_000), *edges, *(rng.randrange(10**6) for _ in range(5_000)), 12_345_678]:
        assert english_words(n) == num2words(n, lang="en").lower().replace(",", ""), n
        assert french_words(n) == num2words(n, lang="fr").lower(), n
    assert numbers._below_a_million("fr").cards is not numbers.CONVERTER_CLASSES["fr"].cards
