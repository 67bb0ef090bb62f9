"""The number task as prompt and completion, for a decoder-only language model.

Chapter 6's encoder-decoder reads an English sentence and writes a French one with two
vocabularies. A decoder-only model reads one sequence in one vocabulary, the English
*prompt* then ``=`` then the French *completion*::

    seventy - one = soixante et onze <eos>
    `--- prompt --'  `----- completion -----'

It is trained to predict every next token, but the loss counts only the predictions of
the completion (:func:`completion_loss`): the prompt is given, never to be learnt. It is
scored by generating the completion greedily after each test prompt
(:func:`evaluate_lm`, exact match).

The numbers and the train/valid/test split are those of
:class:`~mhbook.tasks.numbers.NumberTranslation`: the same task, as one sequence.

:class:`PromptStream` reads the training pairs the way language models read text: one
stream of ``english = french <eos>`` pairs, cut into windows at random places, with the
loss :func:`stream_loss` on the completions that lie whole in a window (chapter 11 trains
on windows of 32 tokens and tests on longer ones).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..core.validate import check_int
from .bleu import translation_scores
from .numbers import NumberTranslation, Vocab, detokenize, english_words, tokenize
from .splits import SPLITS, PaddedSplits, check_split, pad

__all__ = [
    "SEPARATOR",
    "LMBatch",
    "PromptCompletion",
    "completion_loss",
    "evaluate_lm",
    "StreamBatch",
    "PromptStream",
    "stream_loss",
]

#: The token between the prompt and the completion.
SEPARATOR = "="


class LMBatch(NamedTuple):
    """Padded prompt + completion sequences.

    Attributes:
        tokens: ``(batch, L)`` ids: prompt (English then ``=``), completion (French then
            ``<eos>``), then ``<pad>``.
        prompt_lens: ``(batch,)`` prompt lengths, ``=`` included.
        valid_lens: ``(batch,)`` prompt plus completion lengths, ``<eos>`` included.
    """

    tokens: torch.Tensor
    prompt_lens: torch.Tensor
    valid_lens: torch.Tensor

    def to(self, device) -> LMBatch:
        """The same batch with every tensor on ``device``."""
        return LMBatch(*(t.to(device) for t in self))


class PromptCompletion:
    """English-to-French number words as ``english = french <eos>`` sequences.

    Args:
        data: the :class:`~mhbook.tasks.numbers.NumberTranslation` whose numbers and splits to
            use; default: a new one made with ``kwargs``.
        kwargs: passed to :class:`~mhbook.tasks.numbers.NumberTranslation` (``max_number``,
            ``num_train``, ...).

    Attributes:
        translation: the underlying :class:`~mhbook.tasks.numbers.NumberTranslation`.
        vocab: one :class:`~mhbook.tasks.numbers.Vocab` for both languages and ``=``, built from
            the training sequences.
        separator_id: the id of ``=``.
    """

    def __init__(self, data: NumberTranslation | None = None, **kwargs):
        if data is None:
            data = NumberTranslation(**kwargs)
        elif kwargs:
            raise TypeError(f"give data or NumberTranslation's arguments, not both: {kwargs}")
        if not isinstance(data, NumberTranslation):
            raise TypeError(f"data must be a NumberTranslation, got {type(data).__name__}")
        self.translation = data
        train = data.pairs("train")
        self.vocab = Vocab(t for en, fr in train for t in (*tokenize(en), SEPARATOR, *tokenize(fr)))
        self.separator_id = self.vocab.token_to_id[SEPARATOR]
        self._splits = PaddedSplits(self._encode_split, LMBatch, lengths={"tokens": "valid_lens"})

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s}={len(self.translation.numbers[s])}" for s in SPLITS)
        return f"PromptCompletion({sizes}, vocab={len(self.vocab)})"

    # -- text <-> ids ------------------------------------------------------------------
    def encode_prompt(self, english: str | int) -> list[int]:
        """English words (or an int) -> the prompt's ids, ``=`` included."""
        text = english_words(english) if isinstance(english, int) else english
        return self.vocab.encode(tokenize(text)) + [self.separator_id]

    def encode_completion(self, french: str) -> list[int]:
        """French words -> the completion's ids, ``<eos>`` included."""
        return self.vocab.encode(tokenize(french)) + [self.vocab.eos_id]

    def encode_pair(self, english: str | int, french: str) -> tuple[list[int], list[bool]]:
        """The ids of ``english = french <eos>``, and for each id whether it is in the
        completion (French then ``<eos>``)."""
        prompt, completion = self.encode_prompt(english), self.encode_completion(french)
        return prompt + completion, [False] * len(prompt) + [True] * len(completion)

    def decode_completion(self, ids: torch.Tensor | Sequence[int]) -> str:
        """Generated ids -> French words, cut at the first ``<eos>``."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        if self.vocab.eos_id in ids:
            ids = ids[: ids.index(self.vocab.eos_id)]
        return detokenize(self.vocab.decode(ids, skip_specials=True))

    def pairs(self, split: str = "train") -> list[tuple[str, str]]:
        """The ``(english, french)`` pairs of ``split``."""
        return self.translation.pairs(split)

    def max_completion_len(self) -> int:
        """The longest completion in tokens, ``<eos>`` included, over all splits."""
        return self.translation.max_target_len()

    # -- batches (the batch protocol of mhbook.fit) ---------------------------------------
    def _encode_split(self, split: str) -> LMBatch:
        """The whole split, encoded and padded once (on the CPU)."""
        pairs = self.pairs(split)
        prompts = [self.encode_prompt(en) for en, _ in pairs]
        sequences = [p + self.encode_completion(fr) for p, (_, fr) in zip(prompts, pairs)]
        tokens, lens = pad(sequences, self.vocab.pad_id)
        prompt_lens = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        return LMBatch(tokens, prompt_lens, lens)

    def batches(
        self,
        split: str = "train",
        batch_size: int = 64,
        shuffle: bool | None = None,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
        drop_last: bool = False,
    ) -> Iterator[LMBatch]:
        """One pass over ``split`` in mini-batches, each padded to its longest sequence.

        Arguments as for :meth:`mhbook.tasks.numbers.NumberTranslation.batches`.

        Yields:
            :class:`LMBatch`.
        """
        return self._splits.batches(split, batch_size, shuffle, device, generator, drop_last)

    def loss_fn(self, model: nn.Module, batch: LMBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """This task's loss, the one :func:`mhbook.fit` and :func:`mhbook.valid_loss` take
        from the data: :func:`completion_loss`."""
        return completion_loss(model, batch)

    # -- generation ----------------------------------------------------------------------
    @torch.no_grad()
    def complete(
        self,
        model: nn.Module,
        english: Sequence[str | int],
        *,
        max_new_tokens: int | None = None,
        device: torch.device | str | None = None,
        **sampling,
    ) -> list[str]:
        """Generate the French completion of each English prompt with ``model.generate``.

        Prompts of one length are generated together (no padding in the prompts); the
        answers come back in the order of ``english``.

        Args:
            model: a :class:`mhbook.DecoderOnlyLM` trained on this data.
            english: English number words or ints.
            max_new_tokens: default: the longest completion plus 5.
            device: default: the device of the model's parameters.
            sampling: ``temperature``, ``top_k``, ``generator`` for ``model.generate``
                (default: greedy).
        """
        if isinstance(english, (str, int)):
            raise TypeError("english must be a list of str (or int), not a single one")
        if device is None:
            device = next(model.parameters()).device
        if max_new_tokens is None:
            max_new_tokens = self.max_completion_len() + 5
        prompts = [self.encode_prompt(e) for e in english]
        by_length: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            by_length.setdefault(len(p), []).append(i)
        answers = [""] * len(prompts)
        for length in sorted(by_length):
            rows = by_length[length]
            prompt = torch.tensor([prompts[i] for i in rows], device=device)
            new = model.generate(prompt, max_new_tokens, eos_id=self.vocab.eos_id, **sampling)
            for i, ids in zip(rows, new):
                answers[i] = self.decode_completion(ids)
        return answers


def completion_loss(model: nn.Module, batch: LMBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the next-token predictions of the completion only.

    The model reads ``tokens[:, :-1]`` and predicts ``tokens[:, 1:]`` (teacher forcing).
    The prediction at position ``t`` is of token ``t + 1``; it counts when that token is
    in the completion: ``prompt_len <= t + 1 < valid_len``. The predictions of the
    prompt's own tokens (and of the padding) are left out: the prompt is given.

    :meth:`PromptCompletion.loss_fn`, the loss ``mhbook.fit(model, data)`` takes from the data.

    Returns:
        ``(loss, n_tokens)``: the mean over the completion tokens, and their number.
    """
    inputs, targets = batch.tokens[:, :-1], batch.tokens[:, 1:]
    # Padding comes after each sequence, so the causal mask keeps it out of view already.
    logits = model(inputs)  # (batch, L - 1, vocab)
    position = torch.arange(1, batch.tokens.size(1), device=targets.device)  # of the target
    counted = (position >= batch.prompt_lens[:, None]) & (position < batch.valid_lens[:, None])
    losses = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (batch, L-1)
    n_tokens = counted.sum()
    return (losses * counted).sum() / n_tokens.clamp(min=1), n_tokens


@torch.no_grad()
def evaluate_lm(
    model: nn.Module,
    data: PromptCompletion,
    split: str = "test",
    *,
    max_new_tokens: int | None = None,
    device: torch.device | str | None = None,
) -> dict:
    """Complete every prompt of ``split`` greedily (KV cache on) and score it.

    Returns:
        A dict with ``exact_match`` (the fraction of completions exactly right, 0 to 1),
        ``bleu`` (corpus BLEU, 0 to 100), both from :func:`mhbook.tasks.bleu.translation_scores`,
        and the lists ``sources``, ``hypotheses`` and ``references`` (strings in the
        split's order), as :func:`mhbook.evaluate`.
    """
    pairs = data.pairs(split)  # NumberTranslation.pairs checks the split
    sources = [en for en, _ in pairs]
    references = [fr for _, fr in pairs]
    hypotheses = data.complete(model, sources, max_new_tokens=max_new_tokens, device=device)
    return {
        **translation_scores(hypotheses, references),
        "sources": sources,
        "hypotheses": hypotheses,
        "references": references,
    }


class StreamBatch(NamedTuple):
    """Windows of :class:`PromptStream`'s stream.

    Attributes:
        tokens: ``(batch, length + 1)`` ids: the model reads the first ``length`` and
            predicts the last ``length``.
        counted: ``(batch, length + 1)`` bool: the completion tokens whose whole pair lies in
            the window, the ones the loss counts (as targets).
    """

    tokens: torch.Tensor
    counted: torch.Tensor


class PromptStream:
    """The training pairs of a :class:`PromptCompletion` as one stream, in windows.

    The stream is ``english = french <eos> english = french <eos> ...`` in the order of
    ``data.pairs("train")``. Each epoch cuts it into windows of ``length + 1`` tokens from a
    new random offset (below ``length``) and shuffles them, with fit's generator, the way
    language models are trained on text. Windows start and end anywhere, in the middle of a
    pair too; :func:`stream_loss` counts only the completions whose whole pair is in the
    window. Only ``"train"`` has windows (the other splits yield none, so ``fit`` skips
    validation).

    Args:
        data: the pairs, their vocabulary and their encoding.
        length: the tokens a window gives the model (its context in training).

    Attributes:
        ids, completion, pair_start: ``(N,)`` the stream's ids, whether each is a completion
            token, and where its pair starts in the stream.
    """

    def __init__(self, data: PromptCompletion, length: int):
        if not isinstance(data, PromptCompletion):
            raise TypeError(f"data must be a PromptCompletion, got {type(data).__name__}")
        check_int("length", length, 1)
        ids, completion, pair_start = [], [], []
        for english, french in data.pairs("train"):
            pair, is_completion = data.encode_pair(english, french)
            pair_start += [len(ids)] * len(pair)
            ids += pair
            completion += is_completion
        self.data, self.length = data, length
        self.ids, self.completion = torch.tensor(ids), torch.tensor(completion)
        self.pair_start = torch.tensor(pair_start)

    def __repr__(self) -> str:
        return f"PromptStream({self.ids.numel():,} tokens, windows of {self.length})"

    def batches(
        self,
        split: str = "train",
        batch_size: int = 64,
        shuffle: bool | None = None,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
        drop_last: bool = False,
    ) -> Iterator[StreamBatch]:
        """One pass over the stream in windows of ``length + 1`` tokens (the batch protocol
        of :func:`mhbook.fit`).

        Args:
            shuffle: ``None`` or ``True`` (training): the stream cut from a random offset
                below ``length``, the windows in a random order, both drawn from
                ``generator``; ``False``: cut from offset 0, the windows in stream order.
            drop_last: leave out a last batch smaller than ``batch_size``.

        Yields:
            :class:`StreamBatch` of ``(batch_size, length + 1)`` tensors on ``device``.
        """
        if check_split(split) != "train":
            return
        check_int("batch_size", batch_size, 1)
        shuffle = shuffle is not False
        # a new cut each epoch
        offset = int(torch.randint(self.length, (1,), generator=generator)) if shuffle else 0
        n = (self.ids.numel() - 1 - offset) // self.length
        rows = offset + torch.arange(n)[:, None] * self.length + torch.arange(self.length + 1)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for chunk in order.split(batch_size):
            if drop_last and chunk.numel() < batch_size:
                return
            index = rows[chunk]  # (batch, length + 1) positions in the stream
            whole_pair = self.pair_start[index] >= index[:, :1]  # the pair starts in the window
            counted = self.completion[index] & whole_pair
            yield StreamBatch(self.ids[index].to(device), counted.to(device))

    def loss_fn(self, model: nn.Module, batch: StreamBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """This data's loss, the one :func:`mhbook.fit` takes from it: :func:`stream_loss`."""
        return stream_loss(model, batch)


def stream_loss(model: nn.Module, batch: StreamBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the next-token predictions of the counted (completion) tokens of
    :class:`PromptStream`'s windows.

    The model reads ``tokens[:, :-1]`` and predicts ``tokens[:, 1:]``; the prediction of a
    target counts where ``counted[:, 1:]`` is true.

    Returns:
        ``(loss, n_tokens)``: the mean over the counted tokens, and their number.
    """
    tokens, counted = batch
    logits = model(tokens[:, :-1])  # (batch, length, vocab)
    losses = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    n_tokens = counted[:, 1:].sum()
    return (losses * counted[:, 1:]).sum() / n_tokens.clamp(min=1), n_tokens
