"""The copying task of chapters 15 and 16: random tokens, a block of them repeated.

A sequence is a block of ``p`` random tokens written again and again to fill ``length``:
token ``t`` is token ``t mod p`` of the block. Nothing in a first copy can be predicted,
everything in a later one can, by looking ``p`` tokens back. A model that learns it has
learned to copy from its context (an induction head, Olsson et al., 2022)::

    copying = RepeatedRandom(vocab_size=65, length=64, periods=(16, 32))
    x, y = next(copying.batches(generator=torch.Generator().manual_seed(0)))  # (16, 64) each
    test = copying.sample(64, torch.Generator().manual_seed(1), period=32)    # (64, 64)

Chapter 15 builds this class in the notebook and checks it equal to this one.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..core.validate import check_bool, check_int
from .splits import check_split

__all__ = ["RepeatedRandom"]


class RepeatedRandom:
    """Sequences of random tokens: a block of ``p`` tokens repeated to fill ``length``, with
    ``p`` drawn for each sequence from ``periods = (shortest, longest)``.

    Args:
        vocab_size: tokens are drawn uniformly from ``0 .. vocab_size - 1``.
        length: tokens per sequence (a batch's ``x`` and ``y`` are this long).
        periods: ``(shortest, longest)`` block lengths, both included, ``1 <= shortest <=
            longest``.

    :meth:`batches` follows :func:`mhbook.fit`'s batch protocol: endless ``(x, y)``
    batches, ``x`` a sequence and ``y`` the same sequence one token later.
    """

    def __init__(self, vocab_size: int, length: int = 64, periods: tuple[int, int] = (16, 32)):
        check_int("vocab_size", vocab_size)
        check_int("length", length)
        if (
            not isinstance(periods, tuple)
            or len(periods) != 2
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in periods)
            or not 1 <= periods[0] <= periods[1]
        ):
            raise ValueError(
                f"periods must be a tuple (shortest, longest) of ints with 1 <= shortest <= "
                f"longest, got {periods!r}"
            )
        self.vocab_size, self.length, self.periods = vocab_size, length, periods

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        period: int | None = None,
        length: int | None = None,
    ) -> torch.Tensor:
        """``(n, length)`` token ids (``length`` defaults to the task's), on the CPU.

        ``period``: every sequence repeats a block of this length (default: each draws
        its own from ``periods``). The draws, in this order: the blocks ``(n, longest)``,
        then the periods ``(n,)``.
        """
        check_int("n", n)
        check_int("period", period, optional=True)
        check_int("length", length, optional=True)
        shortest, longest = self.periods if period is None else (period, period)
        blocks = torch.randint(0, self.vocab_size, (n, longest), generator=generator)
        p = torch.randint(shortest, longest + 1, (n,), generator=generator)
        index = torch.arange(length or self.length)[None] % p[:, None]
        return blocks.gather(1, index)  # token t of a sequence is token t mod p of its block

    def batches(
        self,
        split: str = "train",
        batch_size: int = 16,
        shuffle: bool = True,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless ``(x, y)`` batches of ``(batch_size, length)`` ids on ``device``, ``y``
        one token after ``x``. Every split draws fresh sequences (``split`` and ``shuffle``
        are :func:`mhbook.fit`'s protocol; a random task has nothing to split or shuffle)."""
        check_split(split)
        check_bool("shuffle", shuffle)
        check_int("batch_size", batch_size)
        while True:
            sequences = self.sample(batch_size, generator, length=self.length + 1)
            yield sequences[:, :-1].to(device), sequences[:, 1:].to(device)
