"""Chapter 15's induction heads trained in the reader's browser: the PyTorch side.

Chapter 15's "Train" panel (``mhbook/viz/explorers/static/live_train.js``) trains
:data:`LIVE_COPIER_MODEL`, the chapter's toy (two layers of attention only, RoPE, RMSNorm) at a
size a page can train in seconds, on :data:`LIVE_COPIER_TASK`'s repeated random blocks, with
:data:`LIVE_COPIER_TRAIN`'s AdamW. Both sides draw every random number from the same seeded
generator, :func:`mulberry32`, so that this module can reproduce the page exactly:

* :func:`live_copier_init` the initial weights (``nn.Embedding``'s N(0, 1) by Box-Muller,
  ``nn.Linear``'s U(-1/sqrt(in), 1/sqrt(in)), the norms' ones), in ``state_dict`` order;
* :func:`live_copier_batches` the training batches, :func:`live_copier_test` the fixed
  sequences the panel looks at;
* :func:`live_copier_run` the whole run with a look every ``every`` steps (loss on each copy,
  every head's previous-token and induction score), as the page computes them, on a
  :class:`mhbook.DecoderOnlyLM` trained with :func:`mhbook.training.trainer.make_optimizer`'s
  ``torch.optim.AdamW`` and ``clip_grad_norm_``.

The browser test (``tests/viz/test_browser_live_train.py``) compares the two.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..core.config import ModelConfig, TrainConfig
from ..core.validate import check_int
from ..models.lm import DecoderOnlyLM
from ..tasks.copying import RepeatedRandom
from .shakespeare_lm import COPIER_MODEL, COPIER_TRAIN
from .trainer import make_optimizer

__all__ = [
    "LIVE_COPIER_MODEL",
    "LIVE_COPIER_TRAIN",
    "LIVE_COPIER_TASK",
    "LIVE_THRESHOLD",
    "mulberry32",
    "live_copier_init",
    "live_copier_batches",
    "live_copier_test",
    "live_copier_run",
]

#: The chapter's toy (:data:`~mhbook.training.shakespeare_lm.COPIER_MODEL`: two layers of
#: attention alone, RoPE, RMSNorm, no biases) at a size the page trains: ``d_model`` 32, four
#: heads of 8.
LIVE_COPIER_MODEL: ModelConfig = COPIER_MODEL.replace(d_model=32)

#: The task: ``vocab_size`` tokens, sequences of ``length``, blocks of ``periods`` (both
#: included); the looks use ``test_sequences`` sequences of the longest block, written twice.
LIVE_COPIER_TASK: dict = {
    "vocab_size": 32,
    "length": 32,
    "periods": (8, 16),
    "test_sequences": 8,
}

#: The chapter's training (AdamW, betas (0.9, 0.98), constant learning rate, gradients clipped
#: at 1) with the page's batches and steps.
LIVE_COPIER_TRAIN: TrainConfig = COPIER_TRAIN.replace(num_steps=1500, batch_size=8, lr=1e-2)

#: A head "is" a previous-token or induction head above this score, as chapter 15 counts them.
LIVE_THRESHOLD = 0.5

_BATCH_SALT = 0x5BD1E995  # the batches' generator: mulberry32(seed ^ _BATCH_SALT)
_TEST_SEED = 0x7E57  # the looks' fixed sequences


def mulberry32(seed: int):
    """mulberry32 (Tommy Ettinger, public domain), as ``live_lm.js`` and ``live_train.js``
    write it: a function returning the next float in [0, 1) of the stream ``seed``."""
    state = seed & 0xFFFFFFFF

    def imul(a: int, b: int) -> int:  # Math.imul: the low 32 bits of the product
        return (a * b) & 0xFFFFFFFF

    def random() -> float:
        nonlocal state
        state = (state + 0x6D2B79F5) & 0xFFFFFFFF
        t = state
        t = imul(t ^ (t >> 15), t | 1)
        t ^= (t + imul(t ^ (t >> 7), t | 61)) & 0xFFFFFFFF
        return ((t ^ (t >> 14)) & 0xFFFFFFFF) / 4294967296

    return random


def live_copier_init(model: DecoderOnlyLM, seed: int) -> DecoderOnlyLM:
    """Fill ``model``'s parameters from ``mulberry32(seed)``, in ``state_dict`` order, as the
    page does: embeddings N(0, 1) (Box-Muller, ``sqrt(-2 ln(1 - u1)) cos(2 pi u2)``, two
    draws a number), linear weights U(-1/sqrt(in), 1/sqrt(in)) (``(2u - 1) / sqrt(in)``),
    norm gains 1 (no draw). PyTorch's initialisation in distribution, the page's in value.
    Returns ``model``."""
    check_int("seed", seed, 0)
    random = mulberry32(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            n = p.numel()
            if name.endswith("norm.weight"):
                values = np.ones(n)
            elif name == "embedding.weight":
                values = np.empty(n)
                for i in range(n):
                    u1, u2 = 1.0 - random(), random()
                    values[i] = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
            else:
                bound = 1.0 / math.sqrt(p.shape[1])
                values = np.array([(2.0 * random() - 1.0) * bound for _ in range(n)])
            p.copy_(torch.from_numpy(values.astype(np.float32).reshape(p.shape)))
    return model


def _sequences(random, n: int, periods: tuple[int, int], length: int, vocab_size: int):
    """``(n, length)`` ids: per sequence, ``periods[1]`` tokens ``floor(u * vocab_size)``,
    then its period ``periods[0] + floor(u * (periods[1] - periods[0] + 1))``; token ``t``
    is token ``t mod period`` of the block (as :class:`mhbook.tasks.RepeatedRandom`)."""
    shortest, longest = periods
    out = np.empty((n, length), dtype=np.int64)
    for s in range(n):
        block = [int(random() * vocab_size) for _ in range(longest)]
        period = shortest + int(random() * (longest - shortest + 1))
        out[s] = [block[t % period] for t in range(length)]
    return torch.from_numpy(out)


def live_copier_batches(seed: int, batch_size: int | None = None, task: dict | None = None):
    """Endless ``(x, y)`` batches of ``(batch_size, length)`` ids, the page's: from
    ``mulberry32(seed ^ 0x5bd1e995)``, sequences of ``length + 1`` tokens cut into
    ``x = s[:, :-1]``, ``y = s[:, 1:]``."""
    task = task or LIVE_COPIER_TASK
    batch_size = batch_size or LIVE_COPIER_TRAIN.batch_size
    random = mulberry32((seed ^ _BATCH_SALT) & 0xFFFFFFFF)
    while True:
        s = _sequences(random, batch_size, task["periods"], task["length"] + 1, task["vocab_size"])
        yield s[:, :-1], s[:, 1:]


def live_copier_test(task: dict | None = None) -> torch.Tensor:
    """The fixed ``(test_sequences, length)`` sequences the looks use: blocks of the longest
    period written twice (as chapter 15's test set, 32 random characters twice), from
    ``mulberry32(0x7e57)``."""
    task = task or LIVE_COPIER_TASK
    p = task["periods"][1]
    return _sequences(
        mulberry32(_TEST_SEED), task["test_sequences"], (p, p), task["length"], task["vocab_size"]
    )


def _attention_weights(model: DecoderOnlyLM, x: torch.Tensor) -> torch.Tensor:
    """``(batch, layers, heads, T, T)``: every head's weights on ``x`` (``need_weights``)."""
    layers = [block.self_attn for block in model.blocks]
    for layer in layers:
        layer.keep_weights = True
    try:
        model(x)
        return torch.stack([layer.weights for layer in layers], dim=1)
    finally:
        for layer in layers:
            layer.keep_weights, layer.weights = False, None


def look(model: DecoderOnlyLM, test: torch.Tensor, period: int) -> dict:
    """What the panel plots at a look, computed as chapter 15 does: the mean loss (nats) on
    the tokens 1..p-1 of the first copy and p+1.. of the second (``first``, ``second``), and
    each head's previous-token and induction score, ``[layer][head]``."""
    with torch.no_grad():
        logits = model(test)
        losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), test[:, 1:], reduction="none")
        w = _attention_weights(model, test).double()
    i = torch.arange(period, test.shape[1])
    return {
        "first": losses[:, : period - 1].mean().item(),
        "second": losses[:, period:].mean().item(),
        "previous": w.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, -1)).tolist(),
        "induction": w[..., i, i - period + 1].mean(dim=(0, -1)).tolist(),
    }


def live_copier_run(
    seed: int = 0,
    num_steps: int | None = None,
    *,
    num_layers: int = 2,
    lr: float | None = None,
    every: int = 10,
    after: int | None = None,
    config: ModelConfig | None = None,
) -> dict:
    """The page's run in PyTorch: a :class:`~mhbook.DecoderOnlyLM` of ``config`` (default
    :data:`LIVE_COPIER_MODEL` with ``num_layers``) initialised by :func:`live_copier_init`,
    trained on :func:`live_copier_batches` with ``make_optimizer``'s AdamW and the gradients'
    global norm clipped at ``clip_norm``, in float32 on one CPU thread.

    Returns:
        ``{"model", "losses" (every step's training loss), "looks" ([{"step", **look}] every
        ``every`` steps, step 0 included; the run stops ``after`` steps past the phase change
        if given), "change" (the first look whose second-copy loss is
        below half of ln(vocab_size), or None), "crossed" ({"previous"|"induction":
        [layer][head] step of the first look above LIVE_THRESHOLD, or None})}``.
    """
    train = LIVE_COPIER_TRAIN.replace(
        num_steps=num_steps or LIVE_COPIER_TRAIN.num_steps, lr=lr or LIVE_COPIER_TRAIN.lr
    )
    config = config or LIVE_COPIER_MODEL.replace(num_layers=num_layers)
    task = LIVE_COPIER_TASK
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = live_copier_init(DecoderOnlyLM(config, task["vocab_size"]), seed)
        optimizer = make_optimizer(model, train)
        batches = live_copier_batches(seed, train.batch_size, task)
        test, period = live_copier_test(task), task["periods"][1]
        losses, looks = [], [{"step": 0, **look(model, test, period)}]
        for step in range(1, train.num_steps + 1):
            x, y = next(batches)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(list(model.parameters()), train.clip_norm)
            optimizer.step()
            losses.append(loss.item())
            if step % every == 0:
                looks.append({"step": step, **look(model, test, period)})
                change = phase_change(looks, task)["change"]
                if after is not None and change is not None and step >= change + after:
                    break
    finally:
        torch.set_num_threads(previous_threads)
    return {"model": model, "losses": losses, "looks": looks, **phase_change(looks, task)}


def phase_change(looks: list[dict], task: dict | None = None) -> dict:
    """``{"change", "crossed"}`` of a list of looks, as :func:`live_copier_run` documents."""
    chance = math.log((task or LIVE_COPIER_TASK)["vocab_size"])
    change = next((r["step"] for r in looks if r["second"] < chance / 2), None)
    crossed = {}
    for kind in ("previous", "induction"):
        layers = len(looks[0][kind])
        heads = len(looks[0][kind][0])
        crossed[kind] = [
            [
                next((r["step"] for r in looks if r[kind][layer][h] > LIVE_THRESHOLD), None)
                for h in range(heads)
            ]
            for layer in range(layers)
        ]
    return {"change": change, "crossed": crossed}


def live_copier_task() -> RepeatedRandom:
    """The task as a :class:`mhbook.tasks.RepeatedRandom` (the same sequences in
    distribution; the page's come from :func:`live_copier_batches`)."""
    t = LIVE_COPIER_TASK
    return RepeatedRandom(t["vocab_size"], length=t["length"], periods=t["periods"])
