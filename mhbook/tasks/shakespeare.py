"""Real text for Part V: the Tiny Shakespeare corpus, its tokenizers, and its batches.

Every model before Part V learns one synthetic task. Part V trains a language model on
real text, nanoGPT's ``shakespeare_char`` setting::

    text = load_shakespeare()                      # 1,115,394 characters, sha256 checked
    train_text, valid_text = split_text(text)      # the first 90 % and the last 10 %
    chars = CharTokenizer(text)                    # 65 symbols, one id per character
    data = TextData(chars.encode(train_text), chars.encode(valid_text), context=64)
    for x, y in data.batches("train", 12):         # (12, 64) inputs, (12, 64) next tokens
        ...

The corpus ships inside the package (``mhbook/tasks/corpus/``, with its provenance): nothing is
downloaded. Two tokenizers: :class:`CharTokenizer` (characters, as nanoGPT) and
:func:`train_bpe` (a byte-level BPE trained on the training split with Hugging Face
``tokenizers`` in about a second). Both become a ``transformers.PreTrainedTokenizerFast``
that ``AutoTokenizer.from_pretrained`` loads again, so that a model trained here is a real
Hugging Face checkpoint, tokenizer included.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..core.validate import check_int, check_number

__all__ = [
    "SHAKESPEARE_SHA256",
    "shakespeare_path",
    "load_shakespeare",
    "split_text",
    "CharTokenizer",
    "train_bpe",
    "TextData",
    "lm_loss",
    "ngram_losses",
]

SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


def shakespeare_path() -> Path:
    """Where the package keeps the corpus: ``mhbook/tasks/corpus/tinyshakespeare/input.txt``."""
    return Path(__file__).parent / "corpus" / "tinyshakespeare" / "input.txt"


def load_shakespeare(path: str | os.PathLike | None = None) -> str:
    """The Tiny Shakespeare corpus as one string, after checking its sha256.

    Args:
        path: default :func:`shakespeare_path` (the copy inside the package). Another
            file must have the same contents (the check is the point: every number in
            Part V was measured on exactly these bytes).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file's sha256 is not ``SHAKESPEARE_SHA256``; the message names
            the file, the expected and the actual digest.
    """
    path = Path(shakespeare_path() if path is None else path)
    if not path.is_file():
        raise FileNotFoundError(f"the Tiny Shakespeare corpus is not at {path}")
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SHAKESPEARE_SHA256:
        raise ValueError(
            f"{path} is not the Tiny Shakespeare corpus the book was measured on: its sha256 "
            f"is {digest} ({len(raw):,} bytes), expected {SHAKESPEARE_SHA256} (1,115,394 bytes)"
        )
    return raw.decode("utf-8")


def split_text(text: str, train_fraction: float = 0.9) -> tuple[str, str]:
    """``(train, valid)``: the first ``train_fraction`` of the characters and the rest,
    nanoGPT's split (no shuffling: the validation text is a part of the plays the model
    never saw)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    check_number("train_fraction", train_fraction, 0.0, 1.0, low_inclusive=False)
    n = int(train_fraction * len(text))
    return text[:n], text[n:]


# -- tokenizers ---------------------------------------------------------------------------
class CharTokenizer:
    """One token per character: the sorted characters of ``text`` get the ids 0, 1, ...

    (The same ids as nanoGPT's ``shakespeare_char``: for Tiny Shakespeare, ``"\\n"`` is 0 and
    ``" "`` is 1.) Written by hand because it is two dictionaries; :meth:`to_hf` gives the
    same tokenizer as a Hugging Face one.

    Attributes:
        chars: the vocabulary, ``chars[i]`` is token ``i``.
        vocab_size: ``len(chars)``.
    """

    def __init__(self, text: str):
        if not isinstance(text, str) or not text:
            raise ValueError(f"text must be a non-empty str, got {text!r:.40}")
        self.chars: list[str] = sorted(set(text))
        self._ids = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def __repr__(self) -> str:
        return f"CharTokenizer({self.vocab_size} characters)"

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``'s characters. A character outside the vocabulary raises a
        ``ValueError`` naming it and where it is (no silent unknown token)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        try:
            return [self._ids[c] for c in text]
        except KeyError:
            # In order of appearance, so that the first one named is the first in the text.
            unknown = list(dict.fromkeys(c for c in text if c not in self._ids))
            where = text.index(unknown[0])
            raise ValueError(
                f"text has {len(unknown)} character(s) outside this tokenizer's "
                f"{self.vocab_size}: {unknown!r} (the first at index {where}); the vocabulary is "
                f"{''.join(self.chars)!r}"
            ) from None

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """The text of token ids (a list or a 1-D tensor)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids must be in [0, {self.vocab_size}), got {bad[:5]}")
        return "".join(self.chars[i] for i in ids)

    def to_hf(self):
        """The same tokenizer as a ``transformers.PreTrainedTokenizerFast``: a
        ``tokenizers`` word-level model whose words are single characters (a ``Split``
        pre-tokenizer isolates each one) and a ``Fuse`` decoder that joins them back. Its
        ``save_pretrained(folder)`` is loaded again by ``AutoTokenizer.from_pretrained``."""
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        tokenizer = Tokenizer(models.WordLevel(dict(self._ids), unk_token=None))
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tokenizer.decoder = decoders.Fuse()
        return PreTrainedTokenizerFast(
            tokenizer_object=tokenizer, clean_up_tokenization_spaces=False
        )


def train_bpe(text: str, vocab_size: int = 512):
    """A byte-level BPE (as GPT-2's) trained on ``text`` with Hugging Face ``tokenizers``,
    as a ``transformers.PreTrainedTokenizerFast``.

    Byte-level: the 256 byte values are the first tokens, so any text can be encoded, and
    ``vocab_size - 256`` merges of frequent pairs follow. No special tokens, no prefix
    space: ``decode(encode(s)) == s`` for every string. On the training split of Tiny
    Shakespeare with 512 tokens it takes about a second and a token is about two characters.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not isinstance(text, str) or not text:
        raise ValueError(f"text must be a non-empty str, got {text!r:.40}")
    check_int("vocab_size", vocab_size, 257)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, clean_up_tokenization_spaces=False)


# -- batches -------------------------------------------------------------------------------
class TextData:
    """Token ids of a training and a validation text, cut into windows of ``context``
    tokens: the batch protocol of :func:`mhbook.fit`.

    A batch is ``(x, y)``, both ``(batch, context)`` int64: ``x`` a window of the text and
    ``y`` the same window one token later (the next token at every position).

    * ``"train"`` with ``shuffle=True``: windows that start anywhere, drawn at random
      (nanoGPT's sampling); an epoch is ``len(train) // context`` windows.
    * otherwise (and always for ``"valid"``): the split cut into consecutive windows that
      do not overlap, in order, so a validation loss is over every token once.

    Args:
        train, valid: 1-D token ids (lists or tensors).
        context: ``T``, the tokens a model reads at once.
        tokenizer: what made the ids (e.g. a :class:`CharTokenizer`), kept as
            ``data.tokenizer`` for the model's users; ``None`` if not given.
    """

    def __init__(self, train: Sequence[int] | torch.Tensor, valid, context: int, tokenizer=None):
        check_int("context", context, 1)
        self.context = context
        self.tokenizer = tokenizer
        self.ids = {"train": _ids("train", train), "valid": _ids("valid", valid)}
        for split, ids in self.ids.items():
            if ids.numel() < context + 1:
                raise ValueError(
                    f"the {split} split has {ids.numel()} tokens: it needs at least context + 1 "
                    f"= {context + 1}"
                )

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s}={ids.numel():,}" for s, ids in self.ids.items())
        return f"TextData({sizes} tokens, context={self.context})"

    def batches(
        self,
        split: str = "train",
        batch_size: int = 12,
        shuffle: bool = True,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(x, y)`` batches of ``split``, each ``(batch_size, context)`` (the last one of
        an ordered pass may be smaller)."""
        if split not in self.ids:
            raise ValueError(f"split must be one of {sorted(self.ids)}, got {split!r}")
        check_int("batch_size", batch_size, 1)
        ids, T = self.ids[split], self.context
        if shuffle and split == "train":
            count = ids.numel() // T
            starts = torch.randint(ids.numel() - T, (count,), generator=generator)
        else:
            starts = torch.arange(0, ids.numel() - T, T)
        offsets = torch.arange(T + 1)
        for i in range(0, len(starts), batch_size):
            windows = ids[starts[i : i + batch_size, None] + offsets]  # (B, T + 1)
            yield windows[:, :-1].to(device), windows[:, 1:].to(device)


def _ids(name: str, ids) -> torch.Tensor:
    ids = torch.as_tensor(ids)
    if ids.dim() != 1 or ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise ValueError(
            f"{name} must be 1-D integer token ids, got {ids.dtype} {tuple(ids.shape)}"
        )
    return ids.long()


def lm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):
    """The next-token cross-entropy of a :class:`TextData` batch, in nats per token, and the
    number of tokens: ``loss_fn`` of :func:`mhbook.fit`."""
    x, y = batch
    logits = model(x)  # (B, T, vocab)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    return loss, y.numel()


def ngram_losses(train: Sequence[int], valid: Sequence[int], vocab_size: int) -> dict:
    """The validation loss (nats per token) of the two simplest models, fitted by counting
    on ``train``: ``"unigram"`` (every token with its frequency, ignoring context) and
    ``"bigram"`` (the next token given the current one). Counts get add-one smoothing, so
    an unseen pair costs a finite loss. Also ``"uniform"``: ``ln(vocab_size)``.

    These are the baselines a language model must beat: it learns something past the
    previous token only when its loss falls below the bigram's.
    """
    check_int("vocab_size", vocab_size, 1)
    train, valid = _ids("train", train), _ids("valid", valid)
    unigram = torch.bincount(train, minlength=vocab_size).double() + 1
    pairs = torch.bincount(train[:-1] * vocab_size + train[1:], minlength=vocab_size**2)
    bigram = pairs.double().view(vocab_size, vocab_size) + 1
    log_unigram = (unigram / unigram.sum()).log()
    log_bigram = (bigram / bigram.sum(dim=1, keepdim=True)).log()
    return {
        "uniform": math.log(vocab_size),
        "unigram": -log_unigram[valid].mean().item(),
        "bigram": -log_bigram[valid[:-1], valid[1:]].mean().item(),
    }
