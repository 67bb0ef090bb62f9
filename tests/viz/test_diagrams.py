"""Tests of mhbook.viz.diagrams: each draws, with the book's names on it, and no label overlaps."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from mhbook.viz import diagrams  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def labels(fig) -> list:
    """The figure's text objects that hold text: titles and labels (the axes are off)."""
    found = list(fig.texts)
    for ax in fig.axes:
        found += [ax.title, *ax.texts]
    return [t for t in found if t.get_text() and t.get_visible()]


def texts(fig) -> list[str]:
    return [t.get_text() for t in labels(fig)]


def assert_labels(fig, *wanted: str) -> None:
    joined = "\n".join(texts(fig))
    missing = [w for w in wanted if w not in joined]
    assert not missing, f"labels missing from the diagram: {missing}"


def assert_no_text_overlaps(fig) -> None:
    """No two labels' bounding boxes intersect."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels(fig)]
    clashes = [
        (a, b)
        for i, (a, box_a) in enumerate(boxes)
        for b, box_b in boxes[i + 1 :]
        if box_a.overlaps(box_b) and box_a.width > 0 and box_b.width > 0
    ]
    assert not clashes, f"labels overlap: {clashes[:5]}"


def assert_text_fits_boxes(fig) -> None:
    """A label written in a box stays inside it."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [
        p.get_window_extent(renderer)
        for ax in fig.axes
        for p in ax.patches
        if isinstance(p, matplotlib.patches.FancyBboxPatch)
    ]
    spilled = []
    for t in labels(fig):
        extent = t.get_window_extent(renderer)
        x, y = (extent.x0 + extent.x1) / 2, (extent.y0 + extent.y1) / 2
        for box in boxes:
            inside = box.x0 - 1 <= extent.x0 and extent.x1 <= box.x1 + 1
            inside = inside and box.y0 - 1 <= extent.y0 and extent.y1 <= box.y1 + 1
            if box.contains(x, y) and not inside:
                spilled.append(t.get_text())
    assert not spilled, f"labels spill out of their boxes: {spilled}"


def assert_inside_figure(fig) -> None:
    """Every label lies inside the figure (nothing cut off at an edge)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox
    outside = []
    for t in labels(fig):
        box = t.get_window_extent(renderer)
        if box.x0 < frame.x0 - 1 or box.x1 > frame.x1 + 1 or box.y0 < 0 or box.y1 > frame.y1 + 1:
            outside.append(t.get_text())
    assert not outside, f"labels cut off at the figure's edge: {outside}"


def test_transformer_diagram():
    fig = diagrams.draw_transformer()
    assert fig.axes[0].get_title() == "The encoder-decoder Transformer"
    assert_labels(
        fig,
        "TransformerEncoder",
        "TransformerDecoder",
        "num_layers ×\nEncoderBlock",
        "num_layers ×\nDecoderBlock",
        "multi-head self-attention\n(padding mask)",
        "masked multi-head\nself-attention (causal mask)",
        "multi-head cross-attention",
        "feed-forward (FFN)",
        "add & norm",
        "embedding × √d_model",
        "positional\nencoding",
        "memory (batch, S, d_model)",
        "src: source token ids",
        "tgt_in",
        "logits (batch, T, tgt_vocab_size)",
    )
    # one add & norm per sublayer: two in an encoder block, three in a decoder block
    assert texts(fig).count("add & norm") == 5
    assert_no_text_overlaps(fig)
    assert_text_fits_boxes(fig)
    assert_inside_figure(fig)


@pytest.mark.parametrize("num_heads", [1, 4, 7])
def test_multihead_diagram(num_heads):
    fig = diagrams.draw_multihead(num_heads, title="split, attend, concat")
    assert fig.axes[0].get_title() == "split, attend, concat"
    assert_labels(fig, "X_q", "W_q", "W_k", "W_v", "W_o", "split_heads", "merge_heads", "concat")
    assert_labels(fig, f"{num_heads} blocks of d_head = d_model / {num_heads} columns")
    heads = [t for t in texts(fig) if t.startswith("head ")]
    assert [h.split(" = ")[0] for h in heads] == [f"head {i + 1}" for i in range(num_heads)]
    for i in range(num_heads):  # each head gets its own block of Q, K and V
        assert_labels(fig, f"Q{i + 1}", f"K{i + 1}", f"V{i + 1}")
    assert_no_text_overlaps(fig)
    assert_text_fits_boxes(fig)
    assert_inside_figure(fig)


def test_multihead_diagram_rejects_bad_head_counts():
    with pytest.raises(ValueError, match="num_heads must be between 1 and 7, got 0"):
        diagrams.draw_multihead(0)
    with pytest.raises(ValueError, match="got 8"):
        diagrams.draw_multihead(8)


def test_kv_cache_diagram():
    tokens = ["<bos>", "deux", "cents", "et", "un"]
    fig = diagrams.draw_kv_cache(tokens)
    ax = fig.axes[0]
    assert ax.get_title() == "The KV cache grows by one token per step"
    assert_labels(fig, "keys", "values", "(batch, num_heads, t, d_head)", "read from the cache")
    for t, token in enumerate(tokens, start=1):
        assert_labels(fig, f"step {t}: feed {token!r}", f"query {t} attends")
    # step t holds t keys and t values: 2 * (1 + 2 + ... + T) cells, one new key and value
    # per step, and the legend's two swatches
    cells = [p for p in ax.patches if isinstance(p, matplotlib.patches.Rectangle)]
    num_steps = len(tokens)
    assert len(cells) == num_steps * (num_steps + 1) + 2
    new = [c for c in cells[:-2] if c.get_facecolor() == cells[-2].get_facecolor()]
    assert len(new) == 2 * num_steps
    assert_no_text_overlaps(fig)
    assert_text_fits_boxes(fig)
    assert_inside_figure(fig)
    with pytest.raises(ValueError, match="at least one token"):
        diagrams.draw_kv_cache([])


def test_diagrams_are_lazy_names_of_mhbook():
    import mhbook

    assert mhbook.draw_transformer is diagrams.draw_transformer
    assert mhbook.draw_multihead is diagrams.draw_multihead
    assert mhbook.draw_kv_cache is diagrams.draw_kv_cache
