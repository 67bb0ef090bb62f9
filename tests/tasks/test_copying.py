"""The copying task (mhbook.tasks.RepeatedRandom) of chapters 15 and 16: each sequence is one
random block repeated, the periods are drawn from the range asked for, the batches follow
fit's protocol, and bad arguments are refused by name."""

from __future__ import annotations

import pytest
import torch

from mhbook.tasks import RepeatedRandom


def _period(sequence: torch.Tensor) -> int:
    """The smallest p with token t == token t - p for every t >= p."""
    return next(p for p in range(1, len(sequence)) if torch.equal(sequence[p:], sequence[:-p]))


def test_every_sequence_repeats_one_block_with_a_period_in_the_range():
    task = RepeatedRandom(vocab_size=1000, length=80, periods=(5, 9))
    sequences = task.sample(200, torch.Generator().manual_seed(0))
    assert sequences.shape == (200, 80) and sequences.dtype == torch.long
    periods = [_period(s) for s in sequences]
    assert set(periods) == set(range(5, 10))  # every period drawn, none outside
    assert 0 <= sequences.min() and sequences.max() < 1000


def test_a_fixed_period_and_length():
    task = RepeatedRandom(vocab_size=50, length=64)
    sequences = task.sample(8, torch.Generator().manual_seed(1), period=12, length=30)
    assert sequences.shape == (8, 30)
    assert all(_period(s) == 12 for s in sequences)


def test_the_draws_are_seeded():
    task = RepeatedRandom(vocab_size=65)
    a, b = (task.sample(4, torch.Generator().manual_seed(3)) for _ in range(2))
    assert torch.equal(a, b)
    assert not torch.equal(a, task.sample(4, torch.Generator().manual_seed(4)))


def test_batches_are_next_token_pairs_on_the_device():
    task = RepeatedRandom(vocab_size=65, length=16)
    batches = task.batches(batch_size=3, generator=torch.Generator().manual_seed(0))
    x, y = next(batches)
    assert x.shape == y.shape == (3, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x one token later
    x2, _ = next(batches)
    assert not torch.equal(x, x2)  # endless and fresh
    x_meta, y_meta = next(task.batches(batch_size=2, device="meta"))
    assert x_meta.device.type == y_meta.device.type == "meta"


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(vocab_size=0), "vocab_size"),
        (dict(vocab_size=10, length=0), "length"),
        (dict(vocab_size=10, periods=(8, 4)), "periods"),
        (dict(vocab_size=10, periods=(0, 4)), "periods"),
        (dict(vocab_size=10, periods=[4, 8]), "periods"),
        (dict(vocab_size=10, periods=(4.0, 8)), "periods"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        RepeatedRandom(**kwargs)


def test_bad_sample_arguments_are_refused_by_name():
    task = RepeatedRandom(vocab_size=10)
    for kwargs, name in [(dict(n=0), "n"), (dict(n=2, period=0), "period")]:
        with pytest.raises(ValueError, match=name):
            task.sample(**kwargs)


def test_bad_batch_arguments_are_refused_by_name():
    task = RepeatedRandom(vocab_size=10)
    for kwargs, name in [
        (dict(split="validation"), "split"),
        (dict(shuffle="yes"), "shuffle"),
        (dict(batch_size=0), "batch_size"),
    ]:
        with pytest.raises(ValueError, match=name):
            next(task.batches(**kwargs))
