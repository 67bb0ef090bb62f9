"""The book's translation task: English number words to French number words.

Both sides are written by ``num2words`` on this machine, so nothing is downloaded:

    "seventy-one"                       -> "soixante et onze"
    "two hundred"                       -> "deux cents"
    "eighty thousand and ninety-seven"  -> "quatre-vingt mille quatre-vingt-dix-sept"

The task is small enough to train on a laptop CPU in a couple of minutes, yet not
trivial: French counts in twenties above sixty (97 = "quatre-vingt-dix-sept", four
twenties and seventeen), writes "et" only in 21, 31, ..., 71, and puts an "s" on
"vingts" and "cents" only at the end of a number ("deux cents" but "deux cent un",
"quatre-vingts" but "quatre-vingt mille"). The source and target lengths differ, and
the order of the pieces does not always match, so the model has to learn where to look.

Train, validation and test sets hold *different numbers*, so the test measures
generalisation to numbers never seen in training.
"""

from __future__ import annotations

import copy
import functools
import random
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from num2words import CONVERTER_CLASSES, num2words
from torch import nn

from .splits import SPLITS, PaddedSplits, check_split, pad

__all__ = [
    "english_words",
    "french_words",
    "tokenize",
    "detokenize",
    "Vocab",
    "Batch",
    "NumberTranslation",
    "sequence_loss",
    "translation_loss",
]


def english_words(n: int) -> str:
    """``n`` in English words, lower case, without commas: 71 -> ``"seventy-one"``,
    101 -> ``"one hundred and one"``."""
    _check_number(n)
    return _num2words(n, "en").replace(",", "")


def french_words(n: int) -> str:
    """``n`` in French words: 71 -> ``"soixante et onze"``, 80 -> ``"quatre-vingts"``,
    97 -> ``"quatre-vingt-dix-sept"``, 200 -> ``"deux cents"``."""
    _check_number(n)
    return _num2words(n, "fr")


@functools.cache
def _num2words(n: int, lang: str) -> str:
    # The cache makes rebuilding a data set in one process cheap.
    if n < _MILLION:
        return _below_a_million(lang).to_cardinal(n).lower()
    return num2words(n, lang=lang).lower()


_MILLION = 10**6


@functools.cache
def _below_a_million(lang: str):
    """num2words' own converter for ``lang``, its table of numbers cut at a million.

    At every step of every number, num2words' ``splitnum`` walks its table of named numbers
    from the largest (10^600 and more) down, skipping those above the number: most of its
    0.1-0.3 ms a number (5 s for a data set of 20,000 numbers). Below a million the skipped
    entries are never used, so the cut table gives the same words, several times faster
    (tests/tasks/test_numbers.py compares it with ``num2words`` itself)."""
    converter = copy.copy(CONVERTER_CLASSES[lang])
    converter.cards = OrderedDict((k, w) for k, w in converter.cards.items() if k <= _MILLION)
    return converter


def tokenize(text: str) -> list[str]:
    """Split on spaces and make each hyphen a token of its own.

    ``"seventy-one thousand"`` -> ``["seventy", "-", "one", "thousand"]``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    tokens = []
    for word in text.split():
        parts = word.split("-")
        for i, part in enumerate(parts):
            if i > 0:
                tokens.append("-")
            if part:
                tokens.append(part)
    return tokens


def detokenize(tokens: Iterable[str]) -> str:
    """The inverse of :func:`tokenize`: join with spaces, but glue hyphens to both neighbours."""
    text = ""
    previous = None
    for token in tokens:
        if previous is not None and token != "-" and previous != "-":
            text += " "
        text += token
        previous = token
    return text


class Vocab:
    """A map between tokens and integer ids.

    Ids 0 to 3 are the special tokens ``<pad>``, ``<bos>``, ``<eos>`` and ``<unk>``;
    the others follow sorted by decreasing count, ties in alphabetical order, so a
    vocabulary built from the same text always gets the same ids.

    Args:
        tokens: every token occurrence of the text (a flat iterable of strings).
        min_count: tokens seen fewer times are left out (they encode as ``<unk>``).
    """

    PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
    SPECIALS = (PAD, BOS, EOS, UNK)

    def __init__(self, tokens: Iterable[str] = (), min_count: int = 1):
        counts = Counter(tokens)
        for special in self.SPECIALS:
            counts.pop(special, None)
        ordered = sorted(
            (t for t, c in counts.items() if c >= min_count), key=lambda t: (-counts[t], t)
        )
        self.id_to_token: list[str] = list(self.SPECIALS) + ordered
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(self.id_to_token)}
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, 1, 2, 3

    @classmethod
    def from_tokens(cls, id_to_token: Sequence[str]) -> Vocab:
        """Rebuild a vocabulary from its list of tokens in id order (e.g. from a checkpoint)."""
        if tuple(id_to_token[:4]) != cls.SPECIALS:
            raise ValueError(
                f"the first tokens must be {cls.SPECIALS}, got {tuple(id_to_token[:4])}"
            )
        vocab = cls()
        vocab.id_to_token = list(id_to_token)
        vocab.token_to_id = {t: i for i, t in enumerate(vocab.id_to_token)}
        return vocab

    def __len__(self) -> int:
        return len(self.id_to_token)

    def __repr__(self) -> str:
        more = "..." if len(self) > 10 else ""
        return f"Vocab(size={len(self)}, tokens={self.id_to_token[:10]}{more})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocab) and self.id_to_token == other.id_to_token

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Tokens -> ids; unknown tokens become ``unk_id``."""
        if isinstance(tokens, str):
            raise TypeError("encode takes a list of tokens, not a str: use encode(tokenize(text))")
        return [self.token_to_id.get(t, self.unk_id) for t in tokens]

    def decode(self, ids: Iterable[int] | torch.Tensor, skip_specials: bool = False) -> list[str]:
        """Ids -> tokens. With ``skip_specials``, ``<pad>``, ``<bos>`` and ``<eos>`` are dropped."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        tokens = [self.id_to_token[i] for i in ids]
        if skip_specials:
            tokens = [t for t in tokens if t not in (self.PAD, self.BOS, self.EOS)]
        return tokens


class Batch(NamedTuple):
    """One mini-batch of padded sentence pairs.

    Attributes:
        src: ``(batch, S)`` English ids, each sentence followed by ``<eos>``, then ``<pad>``.
        src_valid_lens: ``(batch,)`` source lengths counting ``<eos>``.
        tgt_in: ``(batch, T)`` the decoder's input, ``<bos>`` + French ids, then ``<pad>``.
        tgt_out: ``(batch, T)`` what it must predict, French ids + ``<eos>``, then ``<pad>``.
        tgt_valid_lens: ``(batch,)`` target lengths counting ``<eos>``.
    """

    src: torch.Tensor
    src_valid_lens: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_valid_lens: torch.Tensor

    def to(self, device) -> Batch:
        """The same batch with every tensor on ``device``."""
        return Batch(*(t.to(device) for t in self))


class NumberTranslation:
    """English-to-French number words, split by number into train, valid and test.

    The numbers are drawn without replacement from ``0..max_number`` by a
    ``random.Random(seed)``, the same on every machine. To mix short and long
    sentences, each number of digits (1, 2, ..., 6) gets an equal share of the
    numbers where it has enough of them; the few one- to three-digit numbers are
    then all taken and the remaining share goes to the longer ones. The drawn
    numbers are shuffled and cut into the three splits, so no number is in two
    splits. The vocabularies are built from the training sentences only.

    Args:
        max_number: the largest number (inclusive).
        num_train, num_valid, num_test: how many numbers go to each split.
        seed: fixes which numbers are drawn and how they are split.

    Attributes:
        numbers: ``{"train": [...], "valid": [...], "test": [...]}``, the numbers.
        src_vocab, tgt_vocab: :class:`Vocab` of English and French.
    """

    def __init__(
        self,
        max_number: int = 999_999,
        num_train: int = 20_000,
        num_valid: int = 1_000,
        num_test: int = 1_000,
        seed: int = 0,
    ):
        _check_number(max_number)
        sizes = {"train": num_train, "valid": num_valid, "test": num_test}
        for name, size in sizes.items():
            if not isinstance(size, int) or size < 0:
                raise ValueError(f"num_{name} must be a non-negative int, got {size!r}")
        total = num_train + num_valid + num_test
        if total > max_number + 1:
            raise ValueError(
                f"num_train + num_valid + num_test = {total} distinct numbers do not fit "
                f"in 0..max_number={max_number}"
            )
        self.max_number = max_number
        self.seed = seed
        rng = random.Random(seed)
        drawn = _draw_numbers(total, max_number, rng)
        rng.shuffle(drawn)
        self.numbers = {
            "train": drawn[:num_train],
            "valid": drawn[num_train : num_train + num_valid],
            "test": drawn[num_train + num_valid :],
        }
        self._pairs = {
            split: [(english_words(n), french_words(n)) for n in nums]
            for split, nums in self.numbers.items()
        }
        train = self._pairs["train"]
        self.src_vocab = Vocab(t for en, _ in train for t in tokenize(en))
        self.tgt_vocab = Vocab(t for _, fr in train for t in tokenize(fr))
        self._splits = PaddedSplits(
            self._encode_split,
            Batch,
            lengths={
                "src": "src_valid_lens",
                "tgt_in": "tgt_valid_lens",
                "tgt_out": "tgt_valid_lens",
            },
        )
        self._max_target_len: int | None = None

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s}={len(self.numbers[s])}" for s in SPLITS)
        return (
            f"NumberTranslation(max_number={self.max_number}, {sizes}, seed={self.seed}, "
            f"src_vocab={len(self.src_vocab)}, tgt_vocab={len(self.tgt_vocab)})"
        )

    def pairs(self, split: str = "train") -> list[tuple[str, str]]:
        """The ``(english, french)`` sentence pairs of ``split``."""
        return list(self._pairs[check_split(split)])

    def max_target_len(self) -> int:
        """The longest French sentence in tokens, ``<eos>`` included, over all splits."""
        if self._max_target_len is None:
            lengths = (len(tokenize(fr)) + 1 for ps in self._pairs.values() for _, fr in ps)
            self._max_target_len = max(lengths, default=1)
        return self._max_target_len

    # -- batches (the batch protocol of mhbook.fit) -------------------------------------
    def _encode_split(self, split: str) -> Batch:
        """The whole split, encoded and padded once (on the CPU)."""
        pairs = self._pairs[split]
        eos = self.src_vocab.eos_id
        src, src_lens = pad([self.src_vocab.encode(tokenize(en)) + [eos] for en, _ in pairs])
        fr_ids = [self.tgt_vocab.encode(tokenize(fr)) for _, fr in pairs]
        bos, eos = self.tgt_vocab.bos_id, self.tgt_vocab.eos_id
        tgt_in, tgt_lens = pad([[bos] + ids for ids in fr_ids])
        tgt_out, _ = pad([ids + [eos] for ids in fr_ids])
        return Batch(src, src_lens, tgt_in, tgt_out, tgt_lens)

    def batches(
        self,
        split: str = "train",
        batch_size: int = 64,
        shuffle: bool | None = None,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
        drop_last: bool = False,
    ) -> Iterator[Batch]:
        """One pass over ``split`` in mini-batches.

        Each batch is padded only to its own longest sentence.

        Args:
            split: ``"train"``, ``"valid"`` or ``"test"``.
            batch_size: sentences per batch.
            shuffle: shuffle the order; defaults to ``True`` for ``"train"`` only.
            device: where the tensors go (default: the CPU).
            generator: a CPU ``torch.Generator`` for the shuffle (default: PyTorch's global one).
            drop_last: skip a last, smaller batch.

        Yields:
            :class:`Batch` with ``src`` ``(batch, S)``, ``tgt_in`` and ``tgt_out`` ``(batch, T)``.
        """
        return self._splits.batches(split, batch_size, shuffle, device, generator, drop_last)

    def loss_fn(
        self, model: nn.Module, batch: Batch, label_smoothing: float = 0.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This task's loss, the one :func:`mhbook.fit` and :func:`mhbook.valid_loss` take
        from the data: :func:`translation_loss` with this target vocabulary's ``<pad>``."""
        return translation_loss(
            model, batch, pad_id=self.tgt_vocab.pad_id, label_smoothing=label_smoothing
        )

    def encode_source(
        self, sentences: Sequence[str | int], device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """English sentences (or plain ints) -> ``(src, src_valid_lens)``.

        Returns:
            ``src`` ``(batch, S)``, ids with ``<eos>`` and ``<pad>``, and
            ``src_valid_lens`` ``(batch,)``.
        """
        if isinstance(sentences, (str, int)):
            raise TypeError("sentences must be a list of str (or int), not a single one")
        if len(sentences) == 0:
            raise ValueError("sentences is empty")
        texts = [english_words(s) if isinstance(s, int) else s for s in sentences]
        eos = self.src_vocab.eos_id
        src, lens = pad([self.src_vocab.encode(tokenize(t)) + [eos] for t in texts])
        return src.to(device), lens.to(device)

    def decode_target(self, ids: torch.Tensor) -> list[str]:
        """Generated French ids ``(batch, n)`` -> strings, each cut at its first ``<eos>``.

        Padding and ``<bos>`` are dropped; ``<unk>`` stays visible.
        """
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ValueError(f"ids must be a tensor of shape (batch, n), got {shape}")
        sentences = []
        for row in ids.tolist():
            if self.tgt_vocab.eos_id in row:
                row = row[: row.index(self.tgt_vocab.eos_id)]
            sentences.append(detokenize(self.tgt_vocab.decode(row, skip_specials=True)))
        return sentences

    def translate(
        self,
        model: torch.nn.Module,
        english_sentences: Sequence[str | int],
        device: torch.device | str | None = None,
        max_len: int | None = None,
    ) -> list[str]:
        """Translate greedily with ``model.generate`` (KV cache on).

        Args:
            model: a :class:`mhbook.Transformer` trained on this data.
            english_sentences: English number words, or ints (written out by
                :func:`english_words`).
            device: default: the device of the model's parameters.
            max_len: at most this many French tokens; default: the longest target plus 5.

        Returns:
            The French sentences.
        """
        if device is None:
            device = next(model.parameters()).device
        if max_len is None:
            max_len = self.max_target_len() + 5
        src, src_valid_lens = self.encode_source(english_sentences, device)
        ids = model.generate(
            src,
            src_valid_lens,
            max_len,
            bos_id=self.tgt_vocab.bos_id,
            eos_id=self.tgt_vocab.eos_id,
            use_cache=True,
        )
        return self.decode_target(ids)


def _check_number(n) -> None:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"expected an int, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"expected a non-negative int, got {n}")


# -- losses -------------------------------------------------------------------------------
def sequence_loss(
    logits: torch.Tensor, tgt_out: torch.Tensor, pad_id: int, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Mean cross-entropy over the non-padding target tokens.

    With label smoothing ``ε`` the target of each token is ``1 - ε`` on the right id
    plus ``ε / vocab_size`` everywhere: the loss is ``(1 - ε) NLL + ε mean_v(-log p_v)``.

    Args:
        logits: ``(batch, T, vocab_size)``.
        tgt_out: ``(batch, T)`` the ids to predict; positions holding ``pad_id`` are ignored.
        label_smoothing: ``ε`` in ``[0, 1)``.

    Returns:
        A 0-dim tensor.
    """
    if logits.dim() != 3 or logits.shape[:2] != tgt_out.shape:
        raise ValueError(
            "logits must be (batch, T, vocab_size) for tgt_out (batch, T) = "
            f"{tuple(tgt_out.shape)}, got {tuple(logits.shape)}"
        )
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)),
        tgt_out.reshape(-1),
        ignore_index=pad_id,
        label_smoothing=label_smoothing,
    )


def translation_loss(
    model: nn.Module, batch: Batch, *, pad_id: int, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder-decoder's loss on a :class:`Batch`, with teacher forcing.

    ``model(batch.src, batch.tgt_in, batch.src_valid_lens)`` gives logits
    ``(batch, T, vocab_size)``, scored by :func:`sequence_loss` against ``batch.tgt_out``.
    :meth:`NumberTranslation.loss_fn` is this loss with the task's ``pad_id``.

    Returns:
        ``(loss, n_tokens)``: the mean cross-entropy over the non-padding target tokens,
        and their number (a 0-dim tensor on the batch's device).
    """
    logits = model(batch.src, batch.tgt_in, batch.src_valid_lens)
    loss = sequence_loss(logits, batch.tgt_out, pad_id, label_smoothing)
    return loss, (batch.tgt_out != pad_id).sum()


def _draw_numbers(total: int, max_number: int, rng: random.Random) -> list[int]:
    """``total`` distinct numbers in ``0..max_number``, an equal share per number of digits
    where possible (water filling: a class with too few numbers gives all it has)."""
    classes = []  # [lo, hi) by number of digits: [0, 10), [10, 100), ...
    lo, hi = 0, 10
    while lo <= max_number:
        classes.append((lo, min(hi, max_number + 1)))
        lo, hi = hi, hi * 10
    counts = [0] * len(classes)
    remaining = total
    open_classes = list(range(len(classes)))
    while remaining > 0:
        share, extra = divmod(remaining, len(open_classes))
        still_open = []
        for j, k in enumerate(open_classes):
            room = classes[k][1] - classes[k][0] - counts[k]
            take = min(room, share + (1 if j < extra else 0))
            counts[k] += take
            remaining -= take
            if take < room:
                still_open.append(k)
        open_classes = still_open
    drawn = []
    for (lo, hi), count in zip(classes, counts):
        drawn.extend(rng.sample(range(lo, hi), count))
    return drawn
