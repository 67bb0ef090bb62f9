"""Encoded, padded, cached splits and their mini-batches: the batches of the number tasks.

:class:`~mhbook.tasks.numbers.NumberTranslation` (source and target sentences) and
:class:`~mhbook.tasks.number_prompts.PromptCompletion` (one prompt + completion sequence)
both hold sequences of ids of different lengths, split into ``"train"``, ``"valid"`` and
``"test"``. :class:`PaddedSplits` encodes each split once into padded tensors (on the CPU)
and cuts a pass over it into mini-batches, each padded only to its own longest sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch

from ..core.validate import check_int

__all__ = ["SPLITS", "check_split", "pad", "PaddedSplits"]

#: The splits of the number tasks, in their order.
SPLITS = ("train", "valid", "test")


def check_split(split: str) -> str:
    """``split`` if it is one of :data:`SPLITS`, else a ``ValueError``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


def pad(sequences: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Lists of ids -> ``(len(sequences), longest)`` int64 padded with ``pad_id``, and their
    lengths ``(len(sequences),)``."""
    lens = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    longest = max((len(s) for s in sequences), default=0)
    out = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out, lens


class PaddedSplits:
    """Each split encoded once into padded tensors, and one pass over it in mini-batches.

    Args:
        encode: ``encode(split)`` -> a ``batch_type`` of the whole split (on the CPU):
            tensors with one row per example, the 2-D ones padded to the split's longest.
        batch_type: a ``NamedTuple`` of tensors with a ``to(device)`` method.
        lengths: for each 2-D field of ``batch_type``, the name of the 1-D field that
            holds its rows' lengths: a mini-batch cuts it to its own longest row.
    """

    def __init__(
        self,
        encode: Callable[[str], NamedTuple],
        batch_type: type,
        lengths: dict[str, str],
    ):
        fields = batch_type._fields
        unknown = sorted((set(lengths) | set(lengths.values())) - set(fields))
        if unknown:
            raise ValueError(f"lengths names {unknown}, which are not fields of {fields}")
        self._encode = encode
        self._batch_type = batch_type
        self._lengths = [lengths.get(name) for name in fields]
        self._tensors: dict[str, NamedTuple] = {}

    def tensors(self, split: str) -> NamedTuple:
        """The whole ``split``, encoded and padded (once, then kept)."""
        split = check_split(split)
        if split not in self._tensors:
            self._tensors[split] = self._encode(split)
        return self._tensors[split]

    def batches(
        self,
        split: str = "train",
        batch_size: int = 64,
        shuffle: bool | None = None,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
        drop_last: bool = False,
    ) -> Iterator[NamedTuple]:
        """One pass over ``split`` in mini-batches, each padded only to its own longest
        sequence.

        Args:
            split: ``"train"``, ``"valid"`` or ``"test"``.
            batch_size: examples per batch.
            shuffle: shuffle the order; defaults to ``True`` for ``"train"`` only.
            device: where the tensors go (default: the CPU).
            generator: a CPU ``torch.Generator`` for the shuffle (default: PyTorch's global one).
            drop_last: skip a last, smaller batch.
        """
        split = check_split(split)
        check_int("batch_size", batch_size)
        if shuffle is None:
            shuffle = split == "train"
        whole = self.tensors(split)
        n = whole[0].size(0)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        stop = n - n % batch_size if drop_last else n
        names = self._batch_type._fields
        for start in range(0, stop, batch_size):
            idx = order[start : start + batch_size]
            rows = {name: t[idx] for name, t in zip(names, whole) if t.dim() == 1}
            batch = self._batch_type(
                *(
                    rows[name] if length is None else t[idx, : int(rows[length].max())]
                    for name, t, length in zip(names, whole, self._lengths)
                )
            )
            yield batch if device is None else batch.to(device)
