"""Benchmarks of the book's code against PyTorch's, run as ``python -m benchmarks.bench``.

Six tables, all measured in one run on one machine (``--only NAME`` for one of them):

(a) forward + backward time of :class:`mhbook.MultiHeadAttention` against
    :class:`torch.nn.MultiheadAttention` (same weights, ``need_weights=False`` for both;
    on a GPU also in bfloat16 and at a larger shape);
(b) time and peak memory of the explicit :func:`mhbook.scaled_dot_product_attention`
    against PyTorch's fused :func:`torch.nn.functional.scaled_dot_product_attention`
    as the sequence length grows (to 4k on a CPU, 16k on a GPU);
(c) training throughput (target tokens per second) of the book's :class:`mhbook.Transformer`
    (``BOOK_CONFIG.model``) with the book's optimizer (:func:`mhbook.make_optimizer`);
(d) greedy decoding time with and without the KV cache, same model with random weights;
(e) target tokens per second of the book's training step (:func:`mhbook.fit`'s) against
    that of Dive into Deep Learning's Transformer code (:mod:`benchmarks.bench_d2l`, written
    for this comparison) at D2L's own configuration, and their ratio;
(f) KV-cache bytes and decoding time per new token of one self-attention layer, for
    multi-head, grouped-query, multi-query and latent attention and a sliding window, at
    contexts of 1k, 4k and 16k tokens, and their ratios to multi-head attention.

Timing: each side is warmed up, then the sides are run in alternating order, round after
round, so that noise from other processes hits both; a table shows the median round.
Two threads that share their cores with other busy processes wait for each other: time
on an otherwise quiet machine. ``--quick`` runs tiny sizes in a few seconds (a smoke
test, not a measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mhbook import (
    BOOK_CONFIG,
    Batch,
    Config,
    LayerCache,
    ModelConfig,
    MultiHeadLatentAttention,
    TrainConfig,
    Transformer,
    apply_rope,
    attention_from_torch,
    get_device,
    make_attention,
    make_optimizer,
    make_rope,
    make_scheduler,
    peak_memory_bytes,
    scaled_dot_product_attention,
    sequence_loss,
    train_step,
    translation_loss,
)

__all__ = [
    "interleaved_times",
    "interleaved_median_times",
    "bench_multihead",
    "kernels_only_attention",
    "bench_attention_memory",
    "bench_training",
    "bench_decoding",
    "D2L_CONFIG",
    "random_translation_batch",
    "bench_training_vs_d2l",
    "kv_cache_variants",
    "fill_cache",
    "cache_bytes",
    "bench_kv_cache",
    "multihead_sizes",
    "attention_lengths",
    "main",
]


# -- measuring ------------------------------------------------------------------------
def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_times(
    fns: dict[str, Callable[[], object]],
    device: torch.device,
    rounds: int = 5,
    warmup: int = 1,
) -> dict[str, list[float]]:
    """Seconds of each call of each function, the functions run in alternating order.

    Every function is called ``warmup`` times first. Then, ``rounds`` times, each
    function is called once (forward order on even rounds, reverse on odd ones), timed
    with :func:`time.perf_counter` between device synchronisations. Returns ``name ->
    [seconds of round 0, round 1, ...]``: the calls of one round ran under the same load.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    _synchronize(device)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            _synchronize(device)
            start = time.perf_counter()
            fns[name]()
            _synchronize(device)
            samples[name].append(time.perf_counter() - start)
    return samples


def interleaved_median_times(
    fns: dict[str, Callable[[], object]],
    device: torch.device,
    rounds: int = 5,
    warmup: int = 1,
) -> dict[str, float]:
    """Median seconds per call of each function over :func:`interleaved_times`' rounds."""
    samples = interleaved_times(fns, device, rounds, warmup)
    return {name: statistics.median(s) for name, s in samples.items()}


def _print_table(
    title: str, header: list[str], rows: list[list[str]], notes: list[str], left: int = 0
) -> None:
    """Columns right-aligned, except the first ``left`` ones (labels)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    print(f"\n{title}")
    print(line(header))
    print(line(["-" * w for w in widths]))
    for row in rows:
        print(line(row))
    for note in notes:
        print(f"  note: {note}")


def _describe(config: ModelConfig) -> str:
    return (
        f"d_model {config.d_model}, {config.num_heads} heads, "
        f"{config.num_layers}+{config.num_layers} layers, d_ff {config.d_ff}, "
        f"dropout {config.dropout:g}"
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


# -- (a) multi-head attention -----------------------------------------------------------
def bench_multihead(
    shapes: list[tuple[int, int, int, int]],
    device: torch.device,
    rounds: int,
    dtype: torch.dtype = torch.float32,
) -> list[dict]:
    """Forward + backward seconds of mhbook's and PyTorch's multi-head self-attention.

    Args:
        shapes: ``(batch, length, d_model, num_heads)`` tuples.
        dtype: of the weights and the input (e.g. ``torch.bfloat16`` on a GPU).

    Returns:
        One dict per shape with keys ``shape``, ``dtype``, ``mhbook_s``, ``torch_s`` and
        ``kernels_s`` (:func:`kernels_only_attention`: the same PyTorch calls, written out).
    """
    results = []
    for batch, length, d_model, num_heads in shapes:
        torch.manual_seed(0)
        theirs = nn.MultiheadAttention(d_model, num_heads, batch_first=True).to(device, dtype)
        ours = attention_from_torch(theirs)
        x = torch.randn(batch, length, d_model, device=device, dtype=dtype, requires_grad=True)

        def run_ours(x=x, ours=ours):
            ours.zero_grad(set_to_none=True)
            x.grad = None
            ours(x, x, x)[0].sum().backward()

        def run_theirs(x=x, theirs=theirs):
            theirs.zero_grad(set_to_none=True)
            x.grad = None
            theirs(x, x, x, need_weights=False)[0].sum().backward()

        def run_kernels(x=x, ours=ours):
            ours.zero_grad(set_to_none=True)
            x.grad = None
            kernels_only_attention(ours, x).sum().backward()

        fns = {"mhbook": run_ours, "torch": run_theirs, "kernels": run_kernels}
        t = interleaved_median_times(fns, device, rounds)
        results.append(
            {
                "shape": (batch, length, d_model, num_heads),
                "dtype": dtype,
                "mhbook_s": t["mhbook"],
                "torch_s": t["torch"],
                "kernels_s": t["kernels"],
            }
        )
    return results


def kernels_only_attention(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The floor of table (a): the PyTorch calls that ``layer(x, x, x)`` makes, written
    out with nothing around them (no checks, no module calls, no cache or mask logic).

    Four ``F.linear`` and one ``F.scaled_dot_product_attention``: the matrix products and
    the fused kernel that :class:`mhbook.MultiHeadAttention` and
    :class:`torch.nn.MultiheadAttention` both spend their time in. ``x``:
    ``(batch, T, d_model)``; returns ``(batch, T, d_model)``.
    """
    batch, length, _ = x.shape

    def heads(linear: nn.Linear) -> torch.Tensor:
        return F.linear(x, linear.weight, linear.bias).view(batch, length, layer.num_heads, -1)

    q, k, v = (heads(w).transpose(1, 2) for w in (layer.W_q, layer.W_k, layer.W_v))
    out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, length, -1)
    return F.linear(out, layer.W_o.weight, layer.W_o.bias)


# -- (b) fused against explicit attention ----------------------------------------------
def bench_attention_memory(
    lengths: list[int], num_heads: int, d_head: int, device: torch.device, rounds: int
) -> list[dict]:
    """Forward time and peak memory of explicit and fused attention, batch 1, no mask.

    Returns:
        One dict per length with ``length``, ``explicit_s``, ``fused_s``,
        ``explicit_bytes``, ``fused_bytes``.
    """
    results = []
    for length in lengths:
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, num_heads, length, d_head, device=device) for _ in range(3))

        def explicit(q=q, k=k, v=v):
            with torch.no_grad():
                return scaled_dot_product_attention(q, k, v)[0]

        def fused(q=q, k=k, v=v):
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v)

        t = interleaved_median_times({"explicit": explicit, "fused": fused}, device, rounds)
        results.append(
            {
                "length": length,
                "explicit_s": t["explicit"],
                "fused_s": t["fused"],
                "explicit_bytes": peak_memory_bytes(explicit, device),
                "fused_bytes": peak_memory_bytes(fused, device),
            }
        )
    return results


# -- (c) training throughput -------------------------------------------------------------
def bench_training(
    device: torch.device,
    batch: int,
    length: int,
    steps: int,
    vocab_size: int = 1000,
    config: Config = BOOK_CONFIG,
) -> dict:
    """Target tokens per second of training steps on random token batches.

    A :class:`~mhbook.Transformer` of ``config.model`` (default: the book's) and the
    optimizer of :func:`~mhbook.make_optimizer` for ``config.train``. Each step: forward
    on ``(batch, length)`` source and target ids (source lengths drawn between
    ``length // 2`` and ``length``), :func:`~mhbook.sequence_loss`, backward, clipping,
    ``optimizer.step()``.
    """
    torch.manual_seed(0)
    model = Transformer(config.model, vocab_size, vocab_size).to(device).train()
    optimizer = make_optimizer(model, config.train)
    src = torch.randint(0, vocab_size, (batch, length), device=device)
    tgt = torch.randint(0, vocab_size, (batch, length + 1), device=device)
    valid_lens = torch.randint(length // 2, length + 1, (batch,), device=device)

    def step():
        logits = model(src, tgt[:, :-1], valid_lens)
        loss = sequence_loss(logits, tgt[:, 1:], pad_id=-100)  # -100: no id is padding
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.train.clip_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), config.train.clip_norm)
        optimizer.step()

    for _ in range(2):
        step()
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _synchronize(device)
    seconds = time.perf_counter() - start
    return {"tokens_per_s": batch * length * steps / seconds, "step_s": seconds / steps}


# -- (d) greedy decoding with and without the KV cache -----------------------------------
def bench_decoding(
    new_tokens: list[int],
    device: torch.device,
    rounds: int,
    batch: int = 8,
    src_len: int = 32,
    vocab_size: int = 1000,
    config: ModelConfig = BOOK_CONFIG.model,
) -> list[dict]:
    """Seconds of greedy :meth:`Transformer.generate` with ``use_cache=True`` and ``False``.

    The model is a :class:`~mhbook.Transformer` of ``config`` (default: the book's)
    with random weights. To make every sequence run the full ``max_len`` steps, no
    ``eos_id`` is given, so decoding never stops early.
    """
    torch.manual_seed(0)
    model = Transformer(config, vocab_size, vocab_size).to(device).eval()
    src = torch.randint(0, vocab_size, (batch, src_len), device=device)
    valid_lens = torch.full((batch,), src_len, device=device)
    results = []
    for n in new_tokens:

        def decode(use_cache, n=n):
            out = model.generate(src, valid_lens, n, bos_id=1, use_cache=use_cache)
            assert out.shape == (batch, n)
            return out

        t = interleaved_median_times(
            {"cache": lambda d=decode: d(True), "no_cache": lambda d=decode: d(False)},
            device,
            rounds,
        )
        results.append({"new_tokens": n, "cache_s": t["cache"], "no_cache_s": t["no_cache"]})
    return results


# -- (e) training step against Dive into Deep Learning's code ---------------------------
#: D2L's configuration of its Transformer (chapter "Transformer", ``train_seq2seq``).
D2L_CONFIG = Config(
    model=ModelConfig(d_model=32, num_heads=4, num_layers=2, d_ff=64, dropout=0.1),
    train=TrainConfig(batch_size=64, lr=0.005),
)


def random_translation_batch(
    batch: int, length: int, vocab_size: int, device: torch.device, generator: torch.Generator
) -> Batch:
    """Random sentence pairs padded to ``length`` tokens, as a :class:`~mhbook.tasks.numbers.Batch`.

    Ids: 0 ``<pad>``, 1 ``<bos>``, 2 and up words. Source and target lengths are drawn
    between ``length // 2`` and ``length``; positions beyond them hold ``<pad>``.
    """
    lens = torch.randint(length // 2, length + 1, (2, batch), generator=generator)
    words = torch.randint(2, vocab_size, (2, batch, length), generator=generator)
    words = words.masked_fill(torch.arange(length) >= lens[..., None], 0)
    src, tgt = words
    tgt_in = torch.cat([torch.ones(batch, 1, dtype=torch.long), tgt[:, :-1]], dim=1)
    return Batch(src, lens[0], tgt_in, tgt, lens[1]).to(device)


def bench_training_vs_d2l(
    device: torch.device,
    rounds: int,
    steps: int = 10,
    num_batches: int = 4,
    length: int = 10,
    vocab_size: int = 200,
    config: Config = D2L_CONFIG,
) -> dict:
    """Target tokens per second of training steps of mhbook and of D2L's code, interleaved,
    with two more models for scale.

    All train a Transformer of ``config.model`` (default D2L's own: d_model 32, 2 + 2
    layers, 4 heads, FFN 64, dropout 0.1) on the same ``num_batches`` random batches of
    ``config.train.batch_size`` pairs of ``length`` tokens (:func:`random_translation_batch`),
    in turn:

    - ``mhbook``: :class:`~mhbook.Transformer` trained by :func:`~mhbook.fit`'s step
      (:func:`~mhbook.translation_loss`, backward, clipping to ``config.train.clip_norm``,
      :func:`~mhbook.make_optimizer`, the learning-rate schedule);
    - ``flat``: the same model written flat with no checks
      (:class:`benchmarks.bench_flat.FlatTransformer`, mhbook's initial weights), same step;
    - ``torch``: :class:`torch.nn.Transformer` of the same sizes
      (:class:`benchmarks.bench_flat.TorchTransformer`), same step;
    - ``d2l``: D2L's code and ``train_seq2seq``'s step (:mod:`benchmarks.bench_d2l`:
      ``MaskedSoftmaxCELoss``, ``grad_clipping(net, 1)``, ``torch.optim.Adam``).

    One timed call runs ``steps`` steps of one model; see :func:`interleaved_median_times`.

    Returns:
        ``{name}_tokens_per_s`` for each name above (``batch * length`` target positions
        per step) and ``ratio``, mhbook's over D2L's.
    """
    from . import bench_d2l, bench_flat

    batch_size = config.train.batch_size
    generator = torch.Generator().manual_seed(0)
    batches = [
        random_translation_batch(batch_size, length, vocab_size, device, generator)
        for _ in range(num_batches)
    ]
    torch.manual_seed(0)
    ours = Transformer(config.model, vocab_size, vocab_size).to(device).train()
    flat = bench_flat.FlatTransformer(config.model, vocab_size, vocab_size).to(device).train()
    flat.load_state_dict(ours.state_dict())
    torch_model = bench_flat.TorchTransformer(config.model, vocab_size, vocab_size)
    loss_fn = partial(translation_loss, pad_id=0)

    def fit_steps(model: nn.Module) -> Callable[[], None]:
        model = model.to(device).train()
        optimizer = make_optimizer(model, config.train)
        scheduler = make_scheduler(optimizer, config.train)

        def run():
            for i in range(steps):
                b = batches[i % num_batches]
                loss, n_tokens = train_step(
                    model, b, loss_fn, optimizer, scheduler, config.train.clip_norm
                )
                loss.item(), int(n_tokens)  # what fit logs

        return run

    m = config.model
    theirs = bench_d2l.d2l_transformer(
        vocab_size, vocab_size, m.d_model, m.num_layers, m.dropout, m.d_ff, m.num_heads
    )
    theirs = theirs.to(device).train()
    d2l_optimizer = torch.optim.Adam(theirs.parameters(), lr=config.train.lr)
    d2l_loss = bench_d2l.MaskedSoftmaxCELoss()

    def run_theirs():
        for i in range(steps):
            b = batches[i % num_batches]
            bench_d2l.train_step(
                theirs, d2l_optimizer, d2l_loss, b.src, b.src_valid_lens, b.tgt_out,
                b.tgt_valid_lens, bos_id=1,
            )  # fmt: skip

    fns = {
        "mhbook": fit_steps(ours),
        "flat": fit_steps(flat),
        "torch": fit_steps(torch_model),
        "d2l": run_theirs,
    }
    t = interleaved_median_times(fns, device, rounds)
    tokens = batch_size * length * steps
    result = {f"{name}_tokens_per_s": tokens / t[name] for name in fns}
    result["ratio"] = t["d2l"] / t["mhbook"]
    return result


# -- (f) KV-cache bytes and decoding time of the attention variants ----------------------
def kv_cache_variants(
    d_model: int = 512, num_heads: int = 8, window: int = 1024
) -> dict[str, ModelConfig]:
    """The one-layer configurations of table (f), by name; all use RoPE.

    ``MHA``: ``num_heads`` key/value heads; ``GQA-2``: 2; ``MQA``: 1; ``MLA``: latent
    attention with ``d_latent + d_rope`` = GQA-2's numbers per token (``2 * 2 * d_head``;
    :attr:`mhbook.ModelConfig.d_rope`, ``d_head // 2``); ``window``: MHA
    attending to (and caching) the last ``window`` tokens only.
    """
    base = ModelConfig(
        d_model=d_model, num_heads=num_heads, num_layers=1, d_ff=4 * d_model, position="rope"
    )
    return {
        "MHA": base,
        "GQA-2": dataclasses.replace(base, num_kv_heads=2),
        "MQA": dataclasses.replace(base, num_kv_heads=1),
        "MLA": dataclasses.replace(base, d_latent=2 * 2 * base.d_head - base.d_rope),
        "window": dataclasses.replace(base, window=window),
    }


def fill_cache(
    layer: nn.Module, x: torch.Tensor, window: int | None = None, rope: nn.Module | None = None
) -> LayerCache:
    """A :class:`~mhbook.LayerCache` holding what ``layer`` caches for the context ``x``.

    ``x``: the context ``(batch, L, d_model)``. The cache gets the keys and values of a
    :class:`~mhbook.MultiHeadAttention` (RoPE applied) or the latents of a
    :class:`~mhbook.MultiHeadLatentAttention`, made by the layer's own projections in one
    pass and added with ``update`` / ``update_latent`` as a prefill would add them, but
    without the prefill's attention (``O(L^2)``, and not what table (f) measures).
    ``window``: the layer's window, what the cache keeps (``None``: every token). ``rope``:
    the model's rotary embedding that rotates the layer (:func:`mhbook.make_rope`).
    """
    batch, length, _ = x.shape
    positions = torch.arange(length, device=x.device)
    tables = None if rope is None else rope.tables(positions, x.dtype)
    cache = LayerCache()
    if isinstance(layer, MultiHeadLatentAttention):
        cache.update_latent(layer.latent(x, tables), window=window)
        return cache
    k = layer.split_heads(layer.W_k(x), layer.num_kv_heads)  # (B, h_kv, L, d_head)
    v = layer.split_heads(layer.W_v(x), layer.num_kv_heads)
    if tables is not None:
        k = apply_rope(k, *tables)
    cache.update(k, v, window=window)
    return cache


def cache_bytes(cache: LayerCache) -> int:
    """Bytes of the storages behind the tensors ``cache`` holds, each storage once.

    The memory the cache keeps alive: more than ``cache.nbytes`` when a tensor is a view
    of a larger one (a slice keeps its whole storage).
    """
    storages = {}
    for t in cache.tensors():
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def bench_kv_cache(
    contexts: list[int],
    device: torch.device,
    rounds: int,
    steps: int = 4,
    d_model: int = 512,
    num_heads: int = 8,
    window: int = 1024,
) -> list[dict]:
    """KV-cache bytes and seconds per decoded token of one self-attention layer per variant.

    For every variant of :func:`kv_cache_variants` (its layer from
    :func:`mhbook.make_attention`; MLA in the absorbed form) and every context length
    ``L``: the cache is filled with the layer's keys and values (or latents) of ``L``
    random input vectors, batch 1 (:func:`fill_cache`); its bytes are read from its
    tensors (:func:`cache_bytes`); then one timed call decodes ``steps`` new tokens one
    at a time on a copy of the filled cache, each with the mask the book's
    :class:`~mhbook.DecoderOnlyLM` builds, in eval mode without gradients. The variants
    run interleaved (:func:`interleaved_median_times`), so noise hits all alike.

    Returns:
        One dict per context and variant, in order: ``context``, ``variant``,
        ``config`` (its :class:`~mhbook.ModelConfig`), ``bytes``, ``step_s`` (seconds
        per new token).
    """
    configs = kv_cache_variants(d_model, num_heads, window)
    layers, ropes = {}, {name: make_rope(config) for name, config in configs.items()}
    for name, config in configs.items():
        torch.manual_seed(0)
        layer = make_attention(config).to(device).eval()
        if isinstance(layer, MultiHeadLatentAttention):
            layer.absorb = True  # how latent attention decodes
        layers[name] = layer
    generator = torch.Generator(device).manual_seed(0)
    new_token = torch.randn(1, 1, d_model, device=device, generator=generator)
    results = []
    for length in contexts:
        x = torch.randn(1, length, d_model, device=device, generator=generator)
        with torch.no_grad():
            caches = {
                name: fill_cache(layer, x, configs[name].window, ropes[name])
                for name, layer in layers.items()
            }

        def decode(layer: nn.Module, rope: nn.Module | None, filled: LayerCache) -> None:
            cache = filled.copy()  # shares the tensors; each step adds new ones
            with torch.no_grad():
                for _ in range(steps):  # a layer with a window masks by it itself
                    # RoPE's tables of the new position, as the model makes them each step
                    at = torch.tensor([cache.length], device=device)
                    tables = None if rope is None else rope.tables(at, new_token.dtype)
                    layer(new_token, cache=cache, rope_tables=tables)

        fns = {name: partial(decode, layers[name], ropes[name], caches[name]) for name in layers}
        t = interleaved_median_times(fns, device, rounds)
        for name in layers:
            results.append(
                {
                    "context": length,
                    "variant": name,
                    "config": configs[name],
                    "bytes": cache_bytes(caches[name]),
                    "step_s": t[name] / steps,
                }
            )
        del x, caches, fns  # free this context's caches before the next one's
    return results


def _variant_label(name: str, config: ModelConfig) -> str:
    if config.d_latent is not None:
        return f"MLA d_c={config.d_latent}+{config.d_rope}"
    if config.window is not None:
        return f"window W={config.window}"
    return f"{name.split('-')[0]} h_kv={config.kv_heads}"


# -- the command line --------------------------------------------------------------------
#: The tables by name, for ``--only``.
SECTIONS = {
    "multihead": "a",
    "attention-memory": "b",
    "training": "c",
    "decoding": "d",
    "training-vs-d2l": "e",
    "kv-cache": "f",
}


def multihead_sizes(
    device: torch.device, quick: bool = False
) -> tuple[list[tuple[int, int, int, int]], list[torch.dtype]]:
    """Table (a)'s ``(batch, length, d_model, num_heads)`` shapes and dtypes on ``device``.

    A GPU adds a larger shape and bfloat16, the dtype models train in there.
    """
    if quick:
        return [(2, 16, 32, 4)], [torch.float32]
    shapes = [(8, 512, 256, 8), (16, 128, 256, 8)]
    if device.type == "cuda":
        return [*shapes, (8, 2048, 1024, 16)], [torch.float32, torch.bfloat16]
    return shapes, [torch.float32]


def attention_lengths(device: torch.device, quick: bool = False) -> list[int]:
    """Table (b)'s sequence lengths: up to 4k on a CPU, up to 16k on a GPU.

    At 16k the explicit path's float32 scores take 8 GiB (8 heads x 16384^2 x 4 bytes).
    """
    if quick:
        return [64, 128]
    lengths = [256, 512, 1024, 2048, 4096]
    return [*lengths, 8192, 16384] if device.type == "cuda" else lengths


def main(argv: list[str] | None = None) -> None:
    """Run the benchmarks and print their tables (see ``python -m benchmarks.bench --help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes: a smoke test of a few seconds"
    )
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, or auto")
    parser.add_argument(
        "--sections",
        default="abcdef",
        help="which tables to print, a subset of 'abcdef' (default all)",
    )
    parser.add_argument(
        "--only",
        choices=sorted(SECTIONS),
        help="print only this table (overrides --sections): "
        + ", ".join(f"{name} ({letter})" for name, letter in SECTIONS.items()),
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)"
    )
    args = parser.parse_args(argv)
    sections = SECTIONS[args.only] if args.only else args.sections
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.device == "auto":
        device = get_device()
    else:
        device = torch.device(args.device)

    threads = torch.get_num_threads()
    print(f"benchmarks.bench  torch {torch.__version__}  device {device}  threads {threads}")
    if args.quick:
        print("--quick: tiny sizes, a smoke test; the numbers mean nothing")
    print("times are medians over rounds that alternate the sides compared (noise hits all)")

    if "a" in sections:
        shapes, dtypes = multihead_sizes(device, args.quick)
        rows = []
        for dtype in dtypes:
            for r in bench_multihead(shapes, device, rounds=2 if args.quick else 15, dtype=dtype):
                rows.append(
                    [
                        str(r["shape"]),
                        str(dtype).removeprefix("torch."),
                        _ms(r["mhbook_s"]),
                        _ms(r["torch_s"]),
                        _ms(r["kernels_s"]),
                        f"{r['mhbook_s'] / r['torch_s']:.2f}",
                        f"{r['kernels_s'] / r['torch_s']:.2f}",
                        f"{r['mhbook_s'] / r['kernels_s']:.2f}",
                    ]
                )
        _print_table(
            "(a) multi-head self-attention, forward + backward (ms); goals (benchmarks."
            "attention_guard): mhbook/kernels <= 1.02, mhbook/nn.MHA <= 0.95",
            [
                "(batch, L, d_model, heads)",
                "dtype",
                "mhbook",
                "nn.MHA",
                "kernels",
                "mhbook/nn.MHA",
                "kernels/nn.MHA",
                "mhbook/kernels",
            ],
            rows,
            [
                "same weights, train mode, dropout 0, need_weights=False, "
                "grads of input and weights",
                "kernels: the same PyTorch calls written out (4 F.linear, 1 fused attention), "
                "the floor for both layers",
            ],
        )

    if "b" in sections:
        lengths = attention_lengths(device, args.quick)
        rows = []
        for r in bench_attention_memory(lengths, 8, 64, device, rounds=2 if args.quick else 3):
            rows.append(
                [
                    str(r["length"]),
                    _ms(r["explicit_s"]),
                    _ms(r["fused_s"]),
                    f"{r['explicit_s'] / r['fused_s']:.1f}",
                    f"{r['explicit_bytes'] / 2**20:.1f}",
                    f"{r['fused_bytes'] / 2**20:.1f}",
                ]
            )
        memory_method = (
            "torch.cuda.max_memory_allocated"
            if device.type == "cuda"
            else "peak running sum of torch.profiler's alloc/free events (profile_memory=True)"
        )
        _print_table(
            "(b) attention forward, batch 1, 8 heads, d_head 64, float32, no mask, no grad",
            ["L", "explicit ms", "fused ms", "speed-up", "explicit MiB", "fused MiB"],
            rows,
            [
                "explicit = mhbook.scaled_dot_product_attention; "
                "fused = torch.nn.functional.scaled_dot_product_attention",
                f"peak memory: tensors allocated during one call, output included; {memory_method}",
                f"explicit stores L*L scores per head: at L={lengths[-1]} one float32 scores "
                f"tensor is {8 * lengths[-1] ** 2 * 4 / 2**20:.1f} MiB",
            ],
        )

    if "c" in sections:
        batch, length, steps = (4, 8, 2) if args.quick else (64, 32, 20)
        r = bench_training(device, batch, length, steps)
        _print_table(
            f"(c) training the book's Transformer ({_describe(BOOK_CONFIG.model)})",
            ["batch x length", "ms/step", "target tokens/s"],
            [[f"{batch} x {length}", _ms(r["step_s"]), f"{r['tokens_per_s']:,.0f}"]],
            [
                "BOOK_CONFIG: vocabulary 1000, random tokens, the book's AdamW "
                f"(mhbook.make_optimizer) and clipping, {steps} timed steps after 2 warm-up steps"
            ],
        )

    if "d" in sections:
        counts = [4, 8] if args.quick else [64, 256]
        rows = []
        for r in bench_decoding(counts, device, rounds=2 if args.quick else 3):
            rows.append(
                [
                    str(r["new_tokens"]),
                    _ms(r["cache_s"]),
                    _ms(r["no_cache_s"]),
                    f"{r['no_cache_s'] / r['cache_s']:.1f}",
                ]
            )
        _print_table(
            "(d) greedy decoding, batch 8, source length 32 (ms); goal: >= 3x at 256 tokens",
            ["new tokens", "KV cache", "no cache", "speed-up"],
            rows,
            [
                f"the book's Transformer with random weights ({_describe(BOOK_CONFIG.model)}, "
                "vocabulary 1000); eos_id = 1000 can never be the argmax, so every run "
                "decodes all the tokens"
            ],
        )
    if "e" in sections:
        rounds, steps = (2, 2) if args.quick else (21, 10)
        r = bench_training_vs_d2l(device, rounds, steps)
        c = D2L_CONFIG
        models = {
            "mhbook": "mhbook.Transformer, fit's step",
            "flat": "the same model flat, no checks",
            "torch": "torch.nn.Transformer, fit's step",
            "d2l": "D2L's code, train_seq2seq's step",
        }
        d2l = r["d2l_tokens_per_s"]
        _print_table(
            f"(e) training step against D2L's code at D2L's configuration ({_describe(c.model)}, "
            f"batch {c.train.batch_size} x 10 tokens); goal: mhbook/D2L >= 1.5",
            ["model", "tokens/s", "/ D2L"],
            [
                [
                    label,
                    f"{r[f'{name}_tokens_per_s']:,.0f}",
                    f"{r[f'{name}_tokens_per_s'] / d2l:.2f}",
                ]
                for name, label in models.items()
            ],
            [
                f"mhbook/D2L = {r['ratio']:.2f}",
                "fit's step: translation_loss, clipping, mhbook.make_optimizer, schedule; "
                "D2L's (benchmarks/bench_d2l.py): MaskedSoftmaxCELoss, grad_clipping, Adam",
                "flat (benchmarks/bench_flat.py): mhbook's model and weights as plain functions, "
                "no input checks (it trains to the same bits): what the book's code could gain",
                "torch.nn.Transformer (benchmarks/bench_flat.py): PyTorch's own; its dropout also "
                "on the attention weights and inside the FFN, plus a final norm per stack",
                f"the same random batches, vocabulary 200; {steps} steps per timed call, "
                f"median of {rounds} interleaved calls each",
            ],
            left=1,
        )
    if "f" in sections:
        if args.quick:
            contexts, d_model, window, rounds, steps = [32, 128, 512], 64, 32, 2, 2
        else:
            contexts, d_model, window, rounds, steps = [1024, 4096, 16384], 512, 1024, 9, 4
        results = bench_kv_cache(contexts, device, rounds, steps, d_model, 8, window)
        mha = {r["context"]: r for r in results if r["variant"] == "MHA"}
        rows = []
        for r in results:
            base = mha[r["context"]]
            rows.append(
                [
                    str(r["context"]),
                    _variant_label(r["variant"], r["config"]),
                    f"{r['bytes']:,}",
                    f"{r['bytes'] / base['bytes']:.3f}",
                    _ms(r["step_s"]),
                    f"{r['step_s'] / base['step_s']:.2f}",
                ]
            )
        config = results[0]["config"]
        _print_table(
            f"(f) KV cache of one self-attention layer, batch 1, d_model {d_model}, 8 heads "
            f"(d_head {config.d_head}), RoPE, float32, eval, no grad",
            ["context", "variant", "KV bytes", "bytes/MHA", "ms/token", "time/MHA"],
            rows,
            [
                "one layer, mhbook.make_attention only (no embedding, FFN or other layers): "
                "a model's cache is this times its number of layers",
                "h_kv = key/value heads; MLA in the absorbed form, caching d_latent + d_rope "
                "numbers per token, GQA-2's budget; window: MHA with a sliding window of W "
                "keys and a rolling cache of the last W tokens",
                "the cache holds the layer's keys and values (MLA: latents) of `context` random "
                "inputs, made by its projections without the prefill's attention; KV bytes: "
                "the storages of its tensors",
                f"ms/token: one call decodes {steps} tokens one by one on a copy of the filled "
                f"cache (each step appends to it by concatenation), median of {rounds} rounds "
                "that alternate the variants",
            ],
        )
    print("\ndone")


if __name__ == "__main__":
    main()
