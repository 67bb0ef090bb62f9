"""Part V's corpus, tokenizers, batches and baselines (mhbook.tasks.shakespeare), checked against
Hugging Face ``tokenizers``/``transformers`` and hand counts."""

import hashlib
import math

import pytest
import torch
import torch.nn.functional as F

from mhbook.tasks.shakespeare import (
    SHAKESPEARE_SHA256,
    CharTokenizer,
    TextData,
    lm_loss,
    load_shakespeare,
    ngram_losses,
    shakespeare_path,
    split_text,
    train_bpe,
)


@pytest.fixture(scope="module")
def text():
    return load_shakespeare()


def test_the_corpus_is_the_one_the_book_was_measured_on(text):
    raw = shakespeare_path().read_bytes()
    assert len(raw) == 1_115_394
    assert hashlib.sha256(raw).hexdigest() == SHAKESPEARE_SHA256
    assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.")


def test_a_changed_corpus_is_refused_with_both_digests(tmp_path, text):
    changed = tmp_path / "input.txt"
    changed.write_text(text.replace("First Citizen", "Second Citizen", 1))
    with pytest.raises(ValueError) as error:
        load_shakespeare(changed)
    message = str(error.value)
    assert str(changed) in message and SHAKESPEARE_SHA256 in message
    assert hashlib.sha256(changed.read_bytes()).hexdigest() in message
    with pytest.raises(FileNotFoundError, match="not at"):
        load_shakespeare(tmp_path / "missing.txt")


def test_the_split_is_nanogpts(text):
    train, valid = split_text(text)
    assert (len(train), len(valid)) == (1_003_854, 111_540)
    assert train + valid == text
    with pytest.raises(ValueError, match="train_fraction"):
        split_text(text, 1.5)


def test_characters_get_nanogpts_ids_and_come_back(text):
    chars = CharTokenizer(text)
    assert chars.vocab_size == 65
    assert chars.encode("\n !") == [0, 1, 2]
    assert chars.encode("First") == [18, 47, 56, 57, 58]
    assert chars.decode(chars.encode(text[:5000])) == text[:5000]
    assert chars.decode(torch.tensor([18, 47])) == "Fi"


def test_a_character_outside_the_vocabulary_is_named(text):
    chars = CharTokenizer(text)
    with pytest.raises(ValueError, match=r"\['é'\] \(the first at index 1\)"):
        chars.encode("Héllo")
    # Listed in order of appearance: "ù" at 1 comes first, though "é" sorts before it.
    with pytest.raises(ValueError, match=r"\['ù', 'é'\] \(the first at index 1\)"):
        chars.encode("Où es-tu, Roméo?")
    with pytest.raises(ValueError, match=r"ids must be in \[0, 65\)"):
        chars.decode([3, 65])


def test_the_hugging_face_character_tokenizer_is_the_same(tmp_path, text):
    from transformers import AutoTokenizer

    chars = CharTokenizer(text)
    chars.to_hf().save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    sample = text[-20_000:]  # spaces, newlines, punctuation, capitals
    ids = loaded(sample)["input_ids"]
    assert ids == chars.encode(sample)
    assert loaded.decode(ids) == sample


def test_a_byte_level_bpe_trains_in_seconds_and_loads_with_autotokenizer(tmp_path, text):
    from transformers import AutoTokenizer

    train, valid = split_text(text)
    bpe = train_bpe(train, vocab_size=512)
    assert len(bpe) == 512
    bpe.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    ids = loaded(valid)["input_ids"]
    assert ids == bpe(valid)["input_ids"]
    assert loaded.decode(ids) == valid
    assert 1.7 < len(valid) / len(ids) < 2.2  # characters per token
    assert loaded.decode(loaded("naïve café ☃")["input_ids"]) == "naïve café ☃"  # any bytes
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe(train, vocab_size=100)


def test_batches_are_windows_and_their_next_tokens():
    data = TextData(list(range(100)), list(range(1000, 1050)), context=8)
    x, y = next(data.batches("train", 4, generator=torch.Generator().manual_seed(0)))
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    valid = list(data.batches("valid", 100, shuffle=False))
    assert len(valid) == 1 and valid[0][0].shape == (6, 8)  # 50 tokens: 6 whole windows
    assert torch.equal(valid[0][0].flatten(), torch.arange(1000, 1048))
    again = next(data.batches("train", 4, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(again[0], x)  # the generator decides the windows


def test_bad_text_data_is_named():
    with pytest.raises(ValueError, match="context must be an int >= 1"):
        TextData([1, 2, 3], [1, 2, 3], context=0)
    with pytest.raises(ValueError, match="the valid split has 3 tokens"):
        TextData(list(range(20)), [1, 2, 3], context=4)
    with pytest.raises(ValueError, match="split must be one of"):
        next(TextData(list(range(20)), list(range(20)), 4).batches("test"))
    with pytest.raises(ValueError, match="train must be 1-D integer token ids"):
        TextData(torch.zeros(20), list(range(20)), 4)


def test_the_lm_loss_is_the_cross_entropy_of_the_next_token():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 10))
    x, y = torch.randint(10, (3, 5)), torch.randint(10, (3, 5))
    loss, n = lm_loss(model, (x, y))
    expected = -torch.log_softmax(model(x), -1).gather(-1, y[..., None]).mean()
    assert n == 15 and torch.allclose(loss, expected)
    assert torch.allclose(loss, F.cross_entropy(model(x).transpose(1, 2), y))


def test_ngram_baselines_are_the_counts():
    train, valid = [0, 1, 0, 1, 0, 2], [0, 1, 2]
    losses = ngram_losses(train, valid, vocab_size=3)
    assert losses["uniform"] == pytest.approx(math.log(3))
    p = {0: 4 / 9, 1: 3 / 9, 2: 2 / 9}  # counts 3, 2, 1 plus one each
    assert losses["unigram"] == pytest.approx(
        -(math.log(p[0]) + math.log(p[1]) + math.log(p[2])) / 3
    )
    # after 0: 1 twice, 2 once (+1 each: 1, 3, 2 of 6); after 1: 0 twice (+1: 3, 1, 1 of 5)
    assert losses["bigram"] == pytest.approx(-(math.log(3 / 6) + math.log(1 / 5)) / 2)
