"""Diagrams of the book, drawn with matplotlib in the book's own names.

* :func:`draw_transformer`: the encoder-decoder Transformer, block by block (chapter 6);
* :func:`draw_multihead`: multi-head attention: ``W_q``, ``W_k``, ``W_v``, the split into
  heads, the heads in parallel, the concatenation and ``W_o`` (chapter 4);
* :func:`draw_kv_cache`: the KV cache growing by one token per decoding step (chapter 8).

They draw boxes and arrows, no data, so they stay in step with the code only through their
labels: the names of ``mhbook``'s classes, arguments and shapes. Each returns its
``Figure``; its title is the ``title`` argument.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyBboxPatch, Rectangle

__all__ = ["draw_transformer", "draw_multihead", "draw_kv_cache", "HEAD_COLOURS"]

#: One colour per head (colour-blind friendly, from matplotlib's ``tab10``), in turn.
HEAD_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
ATTENTION, NORM, FFN, EMBED, OUTPUT = "#c6dbef", "#fdd49e", "#c7e9c0", "#f2f2f2", "#dadaeb"
RESIDUAL = "#7f7f7f"


def _box(ax: Axes, x: float, y: float, w: float, h: float, text: str, fc: str, **kw) -> None:
    """A rounded box centred at ``(x, y)`` with ``text`` in it."""
    ax.add_patch(
        FancyBboxPatch(
            (x - w / 2, y - h / 2),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.12",
            fc=fc,
            ec="black",
            lw=1.0,
        )
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=kw.pop("fontsize", 10), **kw)


def _arrow(ax: Axes, start, end, colour: str = "black", lw: float = 1.2, **kw) -> None:
    ax.annotate(
        "",
        xy=end,
        xytext=start,
        arrowprops=dict(arrowstyle="-|>", color=colour, lw=lw, shrinkA=0, shrinkB=0, **kw),
    )


def _new_axes(figsize, xlim, ylim) -> tuple[Figure, Axes]:
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax


# --------------------------------------------------------------------------- the Transformer


def _stack(ax: Axes, x: float, y0: float, layers: list[tuple[str, str]], side: float):
    """Draw sublayers bottom-up from ``y0``, each ``add & norm`` with its residual on ``side``.

    Returns the centre height of every layer and the top of the last one.
    """
    w, h, gap = 3.6, 0.62, 0.42
    ys = []
    y = y0
    block_input = y0 - gap / 2  # where the residual of the first sublayer leaves
    for i, (text, colour) in enumerate(layers):
        centre = y + h / 2
        ys.append(centre)
        _box(ax, x, centre, w, h, text, colour)
        if i + 1 < len(layers):
            _arrow(ax, (x, y + h), (x, y + h + gap))
        if text == "add & norm":  # the residual: from below the sublayer into this box
            leave = block_input
            rx = x + side * (w / 2 + 0.35)
            ax.plot([x, rx, rx], [leave, leave, centre], color=RESIDUAL, lw=1.2)
            _arrow(ax, (rx, centre), (x + side * w / 2, centre), colour=RESIDUAL)
            block_input = y + h + gap / 2
        y += h + gap
    return ys, y - gap


def draw_transformer(title: str | None = "The encoder-decoder Transformer") -> Figure:
    """The Transformer of :class:`mhbook.Transformer`: encoder (left), decoder (right).

    Bottom-up, as the data flows: token ids, embedding times ``sqrt(d_model)``, the
    positional encoding, ``num_layers`` encoder or decoder blocks (each sublayer with its
    residual connection and ``add & norm``), the encoder's output (the *memory*) into every
    decoder block's cross-attention, and the final linear layer to one logit per target word.
    """
    fig, ax = _new_axes((9.6, 8.6), (-0.6, 14.6), (-0.95, 14.6))
    enc_x, dec_x = 3.4, 10.2

    # inputs, embeddings, positions
    for x, tokens, name in (
        (enc_x, "src: source token ids\n(batch, S)", "embedding × √d_model"),
        (dec_x, "tgt_in: <bos> + target so far\n(batch, T)", "embedding × √d_model"),
    ):
        ax.text(x, -0.45, tokens, ha="center", va="center", fontsize=10)
        _arrow(ax, (x, 0.0), (x, 0.45))
        _box(ax, x, 0.8, 3.6, 0.62, name, EMBED)
        _arrow(ax, (x, 1.11), (x, 1.52))
        ax.add_patch(Circle((x, 1.8), 0.26, fc="white", ec="black", lw=1.0))
        ax.text(x, 1.8, "+", ha="center", va="center", fontsize=13)
        side = -1 if x == enc_x else 1
        ax.text(
            x + side * 0.45,
            1.8,
            "positional\nencoding",
            ha="right" if side < 0 else "left",
            va="center",
            fontsize=9,
        )
        _arrow(ax, (x, 2.06), (x, 2.62))

    # encoder blocks
    enc_layers = [
        ("multi-head self-attention\n(padding mask)", ATTENTION),
        ("add & norm", NORM),
        ("feed-forward (FFN)", FFN),
        ("add & norm", NORM),
    ]
    enc_ys, enc_top = _stack(ax, enc_x, 2.85, enc_layers, side=-1)
    # decoder blocks
    dec_layers = [
        ("masked multi-head\nself-attention (causal mask)", ATTENTION),
        ("add & norm", NORM),
        ("multi-head cross-attention\n(memory mask)", ATTENTION),
        ("add & norm", NORM),
        ("feed-forward (FFN)", FFN),
        ("add & norm", NORM),
    ]
    dec_ys, dec_top = _stack(ax, dec_x, 2.85, dec_layers, side=1)

    for x, top, name, side in (
        (enc_x, enc_top, "EncoderBlock", -1),
        (dec_x, dec_top, "DecoderBlock", 1),
    ):
        ax.add_patch(
            Rectangle(
                (x - 2.75, 2.55), 5.5, top - 2.55 + 0.3, fill=False, ec="#555555", lw=1.0, ls="--"
            )
        )
        ax.text(
            x + side * 2.95,
            (top + 2.55) / 2,
            f"num_layers ×\n{name}",
            ha="right" if side < 0 else "left",
            va="center",
            fontsize=10,
            fontweight="bold",
        )

    # the memory: the encoder's output, to the keys and values of every cross-attention
    memory_y = enc_top + 0.95
    _arrow(ax, (enc_x, enc_top), (enc_x, memory_y - 0.33))
    _box(ax, enc_x, memory_y, 3.6, 0.62, "memory (batch, S, d_model)", EMBED)
    cross_y = dec_ys[2]
    turn_x = (enc_x + dec_x) / 2
    ax.plot([enc_x + 1.8, turn_x, turn_x], [memory_y, memory_y, cross_y], color="black", lw=1.2)
    _arrow(ax, (turn_x, cross_y), (dec_x - 1.8, cross_y))
    ax.text(
        turn_x + 0.2,
        (memory_y + cross_y) / 2,
        "keys and\nvalues",
        ha="left",
        va="center",
        fontsize=9,
    )

    # output layer
    out_y = dec_top + 0.95
    _arrow(ax, (dec_x, dec_top), (dec_x, out_y - 0.31))
    _box(ax, dec_x, out_y, 4.2, 0.62, "linear: one logit per target word", OUTPUT)
    _arrow(ax, (dec_x, out_y + 0.31), (dec_x, out_y + 0.8))
    ax.text(
        dec_x,
        out_y + 1.05,
        "logits (batch, T, tgt_vocab_size)\nsoftmax: the next word",
        ha="center",
        va="bottom",
        fontsize=10,
    )
    ax.text(enc_x, memory_y + 0.75, "TransformerEncoder", ha="center", fontsize=12)
    ax.text(dec_x, out_y + 2.25, "TransformerDecoder", ha="center", fontsize=12)
    ax.set_ylim(-0.95, out_y + 2.75)
    if title:
        ax.set_title(title, fontsize=13)
    return fig


# --------------------------------------------------------------------------- multi-head


def _matrix(ax, x, y, w, h, colours, label=None, below=None, hatch_new=None):
    """A matrix drawn as ``len(colours)`` column blocks from ``(x, y)`` (lower left)."""
    bw = w / len(colours)
    for i, c in enumerate(colours):
        ax.add_patch(Rectangle((x + i * bw, y), bw, h, fc=c, ec="black", lw=0.8, alpha=0.85))
    if label:
        ax.text(x + w / 2, y + h + 0.15, label, ha="center", va="bottom", fontsize=10)
    if below:
        ax.text(x + w / 2, y - 0.15, below, ha="center", va="top", fontsize=9)


def draw_multihead(num_heads: int = 4, title: str | None = "Multi-head attention") -> Figure:
    """Multi-head attention as :class:`mhbook.MultiHeadAttention` computes it.

    ``X_q``, ``X_k`` and ``X_v`` are projected by ``W_q``, ``W_k`` and ``W_v`` (each
    ``d_model x d_model``); ``split_heads`` cuts the ``d_model`` columns into ``num_heads``
    blocks of ``d_head`` columns, one colour per head; each head attends on its own blocks,
    all heads in parallel; ``merge_heads`` concatenates their outputs and ``W_o`` mixes them.
    """
    if not 1 <= num_heads <= len(HEAD_COLOURS):
        raise ValueError(f"num_heads must be between 1 and {len(HEAD_COLOURS)}, got {num_heads}")
    colours = HEAD_COLOURS[:num_heads]
    fig, ax = _new_axes((10.8, 4.9), (-0.3, 28.4), (-0.4, 11.6))
    mw, mh = 3.0, 1.9  # an (L, d_model) matrix
    bw = mw / num_heads  # one head's d_head columns

    # inputs and projections
    rows = {"Q": 8.4, "K": 4.7, "V": 1.0}
    inputs = {"Q": "X_q", "K": "X_k", "V": "X_v"}
    for name, y in rows.items():
        _matrix(ax, 0.0, y, mw, mh, ["#d9d9d9"], label=f"{inputs[name]}  (L, d_model)")
        _arrow(ax, (mw + 0.1, y + mh / 2), (5.0, y + mh / 2))
        ax.text(4.05, y + mh / 2 + 0.15, f"W_{name.lower()}", ha="center", va="bottom", fontsize=10)
        _matrix(ax, 5.2, y, mw, mh, colours, label=f"{name}  (L, d_model)")

    # split_heads: every head gets its own block of columns of Q, K and V
    _arrow(ax, (8.6, 5.65), (11.0, 5.65), lw=2.0)
    ax.text(9.8, 5.85, "split_heads", ha="center", va="bottom", fontsize=10)
    ax.text(
        5.2 + mw / 2,
        0.75,
        f"{num_heads} blocks of d_head = d_model / {num_heads} columns",
        ha="center",
        va="top",
        fontsize=9,
    )
    span = 10.0
    slot = span / num_heads
    hh = min(1.5, 0.72 * slot)
    head_ys = [0.6 + slot * (num_heads - 1 - i + 0.5) for i in range(num_heads)]
    hx, hw = 17.3, 5.4
    sw = min(bw, 0.75)  # a head's block, drawn narrower when there are few heads
    for i, (c, y) in enumerate(zip(colours, head_ys)):
        n = i + 1
        formula = rf"$\mathrm{{Attention}}(Q_{n}, K_{n}, V_{n})$"
        for j, name in enumerate("QKV"):
            x = 11.3 + j * 0.95
            ax.add_patch(Rectangle((x, y - hh / 2), sw, hh, fc=c, ec="black", lw=0.8, alpha=0.85))
            ax.text(x + sw / 2, y, f"{name}{i + 1}", ha="center", va="center", fontsize=8)
        _arrow(ax, (14.2, y), (hx - hw / 2 - 0.05, y))
        _box(
            ax,
            hx,
            y,
            hw,
            hh,
            f"head {n} = {formula}",
            "white",
            fontsize=9,
        )
        ax.patches[-1].set_edgecolor(c)
        ax.patches[-1].set_linewidth(2.0)
        _arrow(ax, (hx + hw / 2 + 0.05, y), (20.5, y))
        ax.add_patch(Rectangle((20.55, y - hh / 2), sw, hh, fc=c, ec="black", lw=0.8, alpha=0.85))
    ax.text(hx, 11.0, "all heads attend in parallel", ha="center", va="center", fontsize=10)

    # merge_heads (the concatenation) and W_o
    cx = 22.2
    _arrow(ax, (20.65 + sw, 5.65), (cx - 0.1, 5.65), lw=2.0)
    _matrix(ax, cx, 4.7, mw, mh, colours, label="concat  (L, d_model)", below="merge_heads")
    _arrow(ax, (cx + mw + 0.1, 4.7 + mh / 2), (cx + mw + 0.9, 4.7 + mh / 2))
    ax.text(cx + mw + 0.5, 4.7 + mh / 2 + 0.15, "W_o", ha="center", va="bottom", fontsize=10)
    _matrix(ax, cx + mw + 1.0, 4.7, 1.9, mh, ["#969696"], label="output", below="(L, d_model)")
    if title:
        ax.set_title(title, fontsize=13)
    return fig


# --------------------------------------------------------------------------- KV cache


def draw_kv_cache(
    tokens: Sequence[str] = ("<bos>", "quatre", "-", "vingts"),
    title: str | None = "The KV cache grows by one token per step",
) -> Figure:
    """Greedy decoding with a :class:`mhbook.KVCache`, one row per step.

    At step ``t`` the decoder is fed only the newest token: its query, key and value are
    projected, the key and the value are appended to the layer's cache (``keys`` and
    ``values`` of shape ``(batch, num_heads, t, d_head)``), and the one query attends over
    all ``t`` cached keys. The keys and values of the earlier tokens are reused, not
    recomputed.
    """
    tokens = [str(t) for t in tokens]
    if not tokens:
        raise ValueError("tokens must hold at least one token")
    steps = len(tokens)
    cell, gap_y = 1.0, 1.55
    k_x0 = 4.6
    v_x0 = k_x0 + steps * cell + 1.4
    width = v_x0 + steps * cell + 2.6
    height = steps * gap_y + 1.9
    fig, ax = _new_axes((max(7.0, 0.5 * width), 0.55 * height + 0.6), (-0.3, width), (-1.4, height))
    new_colour, cached_colour = HEAD_COLOURS[1], "#d9d9d9"
    top = steps * gap_y
    for x0, name in ((k_x0, "keys"), (v_x0, "values")):
        ax.text(x0 + steps * cell / 2, top + 0.95, name, ha="center", fontsize=11, weight="bold")
        ax.text(
            x0 + steps * cell / 2,
            top + 0.45,
            "(batch, num_heads, t, d_head)",
            ha="center",
            fontsize=10,
        )
    for t in range(1, steps + 1):
        y = top - t * gap_y + 0.3
        ax.text(
            0.0,
            y + cell / 2,
            f"step {t}: feed {tokens[t - 1]!r}",
            ha="left",
            va="center",
            fontsize=10,
        )
        _arrow(ax, (3.6, y + cell / 2), (k_x0 - 0.15, y + cell / 2), colour=new_colour)
        for x0 in (k_x0, v_x0):
            for j in range(t):
                colour = new_colour if j == t - 1 else cached_colour
                ax.add_patch(
                    Rectangle((x0 + j * cell, y), cell * 0.92, cell, fc=colour, ec="black", lw=0.8)
                )
                if t == steps:
                    ax.text(
                        x0 + j * cell + cell * 0.46,
                        y - 0.12,
                        tokens[j],
                        ha="center",
                        va="top",
                        fontsize=10,
                        rotation=30 if max(map(len, tokens)) > 4 else 0,
                    )
        ax.text(
            v_x0 + steps * cell + 0.3,
            y + cell / 2,
            f"query {t} attends\nto {t} key{'s' if t > 1 else ''}",
            ha="left",
            va="center",
            fontsize=10,
        )
    ax.add_patch(Rectangle((0.0, -1.3), 0.5, 0.3, fc=new_colour, ec="black", lw=0.8))
    ax.text(0.65, -1.15, "projected at this step", va="center", fontsize=10)
    ax.add_patch(Rectangle((4.6, -1.3), 0.5, 0.3, fc=cached_colour, ec="black", lw=0.8))
    ax.text(5.25, -1.15, "read from the cache", va="center", fontsize=10)
    if title:
        ax.set_title(title, fontsize=13)
    return fig
