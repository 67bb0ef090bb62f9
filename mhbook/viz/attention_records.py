"""What a trained translation model does on every number of a split: its greedy translations,
the attention weights it used to write them, and what removing each head costs.

:func:`viewer_data` runs the book's model over a whole split (the 1,000 test numbers) once
and keeps, for every number:

* the English tokens and the model's own greedy translation (its French tokens);
* the attention weights of every layer, every head and the three kinds of attention
  (encoder self-attention, decoder self-attention, cross-attention), recorded with
  :func:`mhbook.record_attention` in one teacher-forced pass on the model's *own* output
  tokens: the decoder reads ``<bos>`` and the tokens it generated, so the weights are those
  it used while translating (not those of the reference translation);
* for every single head removed (its ``head_mask`` entry set to 0, as in chapter 7), the
  greedy translation without that head,

and, per head, the teacher-forced loss of the split (on the reference translations) with
that head removed. The result, a :class:`ViewerData`, is what the attention viewer of
chapters 6 and 7 (:mod:`mhbook.viz.explorers.viewer`) shows; this module only measures.

:func:`passage_attention` does the same for a decoder-only language model
(:class:`mhbook.DecoderOnlyLM`) on a few text passages: the weights of every layer and head,
which the passage explorer (:mod:`mhbook.viz.explorers.passages`) shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ..attention.base import record_attention
from ..tasks.bleu import exact_match
from ..tasks.numbers import detokenize, tokenize
from ..training.trainer import cpu_threads, valid_loss

__all__ = ["Kind", "KINDS", "layer_name", "ViewerData", "viewer_data", "passage_attention"]


class Kind(NamedTuple):
    """One kind of attention: its name, where its layers are, and what its axes hold."""

    name: str  # e.g. "cross-attention"
    stack: str  # "encoder" or "decoder"
    attr: str  # the attribute of a block: "self_attn" or "cross_attn"
    queries: str  # what the rows (queries) are
    keys: str  # what the columns (keys) are


#: The three kinds of attention of the encoder-decoder Transformer, in the viewer's order.
KINDS = (
    Kind("encoder self-attention", "encoder", "self_attn", "English (queries)", "English (keys)"),
    Kind(
        "decoder self-attention",
        "decoder",
        "self_attn",
        "French read (queries)",
        "French read (keys)",
    ),
    Kind("cross-attention", "decoder", "cross_attn", "French predicted", "English (keys)"),
)


def layer_name(kind: int, layer: int) -> str:
    """The module name of layer ``layer`` (0-based) of ``KINDS[kind]``, e.g.
    ``"decoder.blocks.1.cross_attn"``, as :func:`mhbook.record_attention` names it."""
    k = KINDS[kind]
    return f"{k.stack}.blocks.{layer}.{k.attr}"


@dataclass
class ViewerData:
    """What ``viewer_data`` recorded for every number of a split.

    Per number ``n`` (lists in the split's order): ``english[n]``, ``reference[n]`` and the
    model's greedy ``translation[n]`` (strings); ``src_tokens[n]``, the ``S`` English tokens
    with ``<eos>``; ``out_tokens[n]``, the ``T`` French tokens the model generated, ending
    with ``<eos>`` (what the decoder *predicts*; it *reads* ``tgt_in_tokens``);
    ``weights[n]``, ``{layer name: (num_heads, Lq, Lk) float32}`` for the six attention
    layers, with ``(Lq, Lk)`` = ``(S, S)``, ``(T, T)`` or ``(T, S)`` by kind.

    Per head ``(layer name, i)`` (``i`` from 0): ``head_loss``, the teacher-forced loss of
    the split (reference translations) without that head, and ``head_translation``, the
    greedy translations of every number without it. ``loss`` is the loss with all heads.
    """

    split: str
    numbers: list[int]
    english: list[str]
    reference: list[str]
    translation: list[str]
    src_tokens: list[list[str]]
    out_tokens: list[list[str]]
    weights: list[dict[str, np.ndarray]]
    num_layers: int
    num_heads: int
    loss: float
    head_loss: dict[tuple[str, int], float]
    head_translation: dict[tuple[str, int], list[str]]

    def __len__(self) -> int:
        return len(self.numbers)

    @property
    def heads(self) -> list[tuple[str, int]]:
        """Every head as ``(layer name, i)``, kind by kind, layer by layer (the viewer's order)."""
        return [
            (layer_name(k, layer), i)
            for k in range(len(KINDS))
            for layer in range(self.num_layers)
            for i in range(self.num_heads)
        ]

    def tgt_in_tokens(self, n: int) -> list[str]:
        """The ``T`` French tokens the decoder reads for number ``n``: ``<bos>`` and its output."""
        return ["<bos>"] + self.out_tokens[n][:-1]

    @property
    def exact(self) -> float:
        """The fraction of the split the model translates exactly right."""
        return exact_match(self.translation, self.reference)

    def head_exact(self, head: tuple[str, int]) -> float:
        """The fraction translated exactly right without ``head``."""
        return exact_match(self.head_translation[head], self.reference)


# ------------------------------------------------------------------------------ recording


def _attention_layers(model) -> dict[str, torch.nn.Module]:
    layers = {}
    for k in range(len(KINDS)):
        for layer in range(len(model.encoder.blocks)):
            name = layer_name(k, layer)
            layers[name] = model.get_submodule(name)
    return layers


def _greedy_ids(model, data, english, device, max_len, batch_size) -> list[list[int]]:
    """The generated French ids of each sentence, up to and with its first ``<eos>``."""
    eos = data.tgt_vocab.eos_id
    out = []
    for start in range(0, len(english), batch_size):
        src, lens = data.encode_source(english[start : start + batch_size], device)
        bos = data.tgt_vocab.bos_id
        ids = model.generate(src, lens, max_len, bos_id=bos, eos_id=eos).tolist()
        out += [row[: row.index(eos) + 1] if eos in row else row for row in ids]
    return out


def _teacher_forced_weights(model, data, english, out_ids, device, batch_size):
    """``[{layer name: (h, Lq, Lk) float32}]``, one dict per sentence, on the given outputs."""
    bos, pad = data.tgt_vocab.bos_id, data.tgt_vocab.pad_id
    result = []
    for start in range(0, len(english), batch_size):
        chunk = english[start : start + batch_size]
        outs = out_ids[start : start + batch_size]
        src, src_lens = data.encode_source(chunk, device)
        T = max(len(o) for o in outs)
        tgt_in = torch.full((len(outs), T), pad, dtype=torch.long)
        for b, o in enumerate(outs):
            tgt_in[b, : len(o)] = torch.tensor([bos] + o[:-1], dtype=torch.long)
        with torch.no_grad(), record_attention(model) as recorded:
            model(src, tgt_in.to(device), src_lens)
        weights = {name: w.float().cpu().numpy() for name, w in recorded().items()}
        for b, o in enumerate(outs):
            S, T_b = int(src_lens[b]), len(o)
            sizes = {"encoder": (S, S), "self_attn": (T_b, T_b), "cross_attn": (T_b, S)}
            one = {}
            for name, w in weights.items():
                attr = name.rsplit(".", 1)[1]
                lq, lk = sizes["encoder"] if name.startswith("encoder") else sizes[attr]
                one[name] = np.ascontiguousarray(w[b, :, :lq, :lk])
            result.append(one)
    return result


@torch.no_grad()
def _loss(model, data, split: str, batch_size: int, first: int | None) -> float:
    """The teacher-forced loss per token of the split (:func:`mhbook.valid_loss`), or of its
    first ``first`` sentences (one batch of them)."""
    if first is None:
        return valid_loss(model, data, split, batch_size)
    batch = next(iter(data.batches(split, first, device=next(model.parameters()).device)))
    return data.loss_fn(model, batch)[0].item()


def viewer_data(
    model,
    data,
    split: str = "test",
    batch_size: int = 500,
    max_len: int | None = None,
    num_threads: int | None = 1,
    first: int | None = None,
) -> ViewerData:
    """Record what the viewer shows, for every number of ``split`` (see ``ViewerData``), or
    for its first ``first`` numbers.

    The weights come from one teacher-forced pass over the model's own greedy output. Each
    head is then removed in turn with ``head_mask``, as chapter 7 does: one teacher-forced
    pass for its loss (:func:`mhbook.valid_loss`) and one batched greedy decoding of
    the split. For the book's model and the 1,000 test numbers that is 25 passes and 25
    decodings, about 20 s on one CPU thread.

    Args:
        model: a trained :class:`mhbook.Transformer` (the book's model).
        data: its :class:`mhbook.tasks.numbers.NumberTranslation`.
        split: ``"test"`` (default), ``"valid"`` or ``"train"``.
        batch_size: sentences per batch.
        max_len: at most this many French tokens; default: the longest target plus 5.
        num_threads: on a CPU, run PyTorch on this many threads meanwhile (``None``: as it
            is). One thread, the default, as :func:`mhbook.fit` trains: small batches
            gain little from more, and threads that wait for a busy core lose a lot.
        first: only the first ``first`` numbers of the split, their losses too (chapter 7's
            viewer: the 500 numbers its ablation table scores); default every number.
    """
    device = next(model.parameters()).device
    if max_len is None:
        max_len = data.max_target_len() + 5
    was_training = model.training
    model.eval()
    layers = _attention_layers(model)
    saved_masks = {name: layer.head_mask for name, layer in layers.items()}
    if any(m is not None for m in saved_masks.values()):
        raise ValueError("viewer_data needs a model with every head on (head_mask None)")
    num_layers = len(model.encoder.blocks)
    num_heads = next(iter(layers.values())).num_heads
    pairs = data.pairs(split)
    if first is not None:
        if isinstance(first, bool) or not isinstance(first, int) or not 1 <= first <= len(pairs):
            raise ValueError(
                f"first must be an int from 1 to {len(pairs)} ({split}), got {first!r}"
            )
        pairs = pairs[:first]
    english = [en for en, _ in pairs]
    tgt_tokens = data.tgt_vocab.id_to_token
    with cpu_threads(num_threads if device.type == "cpu" else None):
        try:
            out_ids = _greedy_ids(model, data, english, device, max_len, batch_size)
            weights = _teacher_forced_weights(model, data, english, out_ids, device, batch_size)

            specials = {data.tgt_vocab.pad_id, data.tgt_vocab.bos_id, data.tgt_vocab.eos_id}

            def words(ids: list[int]) -> str:  # as data.translate writes them
                return detokenize(tgt_tokens[i] for i in ids if i not in specials)

            view = ViewerData(
                split=split,
                numbers=list(data.numbers[split])[: len(pairs)],
                english=english,
                reference=[fr for _, fr in pairs],
                translation=[words(o) for o in out_ids],
                src_tokens=[
                    data.src_vocab.decode(data.src_vocab.encode(tokenize(en))) + ["<eos>"]
                    for en in english
                ],
                out_tokens=[[tgt_tokens[i] for i in o] for o in out_ids],
                weights=weights,
                num_layers=num_layers,
                num_heads=num_heads,
                loss=_loss(model, data, split, batch_size, first),
                head_loss={},
                head_translation={},
            )
            for name, i in view.heads:  # remove one head at a time, as chapter 7 does
                mask = torch.ones(num_heads, device=device)
                mask[i] = 0.0
                layers[name].head_mask = mask
                view.head_loss[name, i] = _loss(model, data, split, batch_size, first)
                ablated = _greedy_ids(model, data, english, device, max_len, batch_size)
                view.head_translation[name, i] = [words(o) for o in ablated]
                layers[name].head_mask = None
        finally:
            for name, layer in layers.items():
                layer.head_mask = saved_masks[name]
            model.train(was_training)
    return view


# ------------------------------------------------------------------------------ passages


def passage_attention(model, passages, batch_size: int = 16) -> np.ndarray:
    """The attention weights of every layer and head of a decoder-only model on each passage.

    One forward pass per batch of passages, recorded with :func:`mhbook.record_attention`
    (the layers' own weights: the same softmax that gives the model's output), on the
    model's device, in eval mode (restored after), without gradients.

    Args:
        model: a :class:`mhbook.DecoderOnlyLM` (anything whose ``blocks[i].self_attn`` are
            mhbook attention layers and whose ``model(tokens)`` runs them).
        passages: ``P`` lists of ``T`` token ids each (all of the same length ``T``), or a
            ``(P, T)`` array or tensor.
        batch_size: passages per forward pass.

    Returns:
        ``(P, L, H, T, T)`` float32 on the CPU: ``[p, l, h, q, k]`` is the weight that query
        ``q`` of passage ``p`` gives key ``k`` in head ``h`` of layer ``l``; each row sums to
        1, and is 0 past the query (causal) and outside a sliding window.

    Raises:
        ValueError: If there is no passage, a passage is empty, or the passages are not all
            of one length (the message names their lengths).
    """
    rows = [[int(t) for t in passage] for passage in passages]
    lengths = [len(row) for row in rows]
    if not rows or min(lengths) == 0:
        raise ValueError(f"passage_attention needs passages of at least one token, got {lengths}")
    if len(set(lengths)) != 1:
        raise ValueError(
            "passage_attention needs passages of one length T, got lengths "
            f"{lengths} (cut them to the shortest, {min(lengths)})"
        )
    device = next(model.parameters()).device
    names = [f"blocks.{i}.self_attn" for i in range(len(model.blocks))]
    was_training = model.training
    model.eval()
    out = []
    try:
        for start in range(0, len(rows), batch_size):
            tokens = torch.tensor(rows[start : start + batch_size], device=device)
            with torch.no_grad(), record_attention(model) as recorded:
                model(tokens)
            weights = recorded()
            # (L, batch, H, T, T) -> (batch, L, H, T, T)
            layers = torch.stack([weights[name].float() for name in names], dim=1)
            out.append(layers.cpu().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(out)
