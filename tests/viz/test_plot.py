"""Tests of mhbook.viz.plot and mhbook.viz.explorers: titles, labels, shapes, and the HTML
explorer."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from mhbook.core.masks import causal_mask  # noqa: E402
from mhbook.viz import colours, plot  # noqa: E402
from mhbook.viz.explorers import svg  # noqa: E402

TOKENS = ["the", "cat", "sat", "down"]
AXES = ["entertainment", "time", "other"]
X = np.array([[2.0, 0.0, 0.5], [1.5, 1.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.5, 0.2]])
SENTENCE = ["Star Wars", "premiere", "tonight", "at", "eight"]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def tick_texts(labels):
    return [t.get_text() for t in labels]


def random_weights(*shape):
    return torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(0)), dim=-1)


# -- plot_heatmap ------------------------------------------------------------------


def test_heatmap_has_title_axis_labels_tokens_and_colorbar():
    weights = random_weights(4, 4).requires_grad_()
    ax = plot.plot_heatmap(weights, TOKENS, TOKENS, title="one head")
    assert ax.get_title() == "one head"
    assert ax.get_xlabel() == "keys" and ax.get_ylabel() == "queries"
    assert tick_texts(ax.get_xticklabels()) == TOKENS
    assert tick_texts(ax.get_yticklabels()) == TOKENS
    assert len(ax.figure.axes) == 2  # the map and its colour bar
    np.testing.assert_allclose(ax.images[0].get_array(), weights.detach().numpy(), rtol=1e-6)


def test_heatmap_annotates_every_cell_and_marks_minus_inf():
    scores = torch.zeros(3, 4).masked_fill(~causal_mask(3, 4), float("-inf"))
    ax = plot.plot_heatmap(scores, TOKENS[:3], TOKENS, annotate=True, colorbar=False)
    texts = tick_texts(ax.texts)
    assert len(texts) == 12
    assert texts.count("-inf") == 3 and texts.count("0.00") == 9
    assert len(ax.figure.axes) == 1


def test_heatmap_into_given_axes_with_custom_labels():
    fig, (left, right) = plt.subplots(1, 2)
    ax = plot.plot_heatmap(
        random_weights(1, 1, 2, 3), ax=right, xlabel="source", ylabel="target", vmin=0, vmax=1
    )
    assert ax is right and right.get_xlabel() == "source" and right.get_ylabel() == "target"
    assert ax.images[0].get_clim() == (0, 1)
    assert not left.images


def test_heatmap_rejects_bad_input():
    with pytest.raises(ValueError, match="num_queries, num_keys"):
        plot.plot_heatmap(torch.rand(2, 3, 4))
    with pytest.raises(ValueError, match="3 labels"):
        plot.plot_heatmap(torch.rand(4, 4), query_labels=TOKENS[:3])
    with pytest.raises(ValueError, match="meta"):
        plot.plot_heatmap(torch.rand(4, 4, device="meta"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_plots_take_cuda_tensors_that_require_grad():
    weights = random_weights(2, 4, 4).cuda().requires_grad_()
    ax = plot.plot_heatmap(weights[0], TOKENS, TOKENS)
    np.testing.assert_allclose(ax.images[0].get_array(), weights[0].detach().cpu().numpy())
    assert len(plot.plot_attention_grid(weights).axes) == 3
    plot.plot_mask(causal_mask(4, device="cuda"))


# -- plot_attention_grid -----------------------------------------------------------


def test_grid_of_layers_and_heads():
    weights = random_weights(2, 3, 4, 4)
    fig = plot.plot_attention_grid(weights, TOKENS, TOKENS, title="all heads")
    maps, bar = fig.axes[:6], fig.axes[6:]
    assert len(maps) == 6 and len(bar) == 1
    assert fig.get_suptitle() == "all heads"
    assert [ax.get_title() for ax in maps[:3]] == ["head 1", "head 2", "head 3"]
    assert maps[0].get_ylabel() == "layer 1\nqueries" and maps[3].get_ylabel() == "layer 2\nqueries"
    assert all(tick_texts(ax.get_xticklabels()) == TOKENS for ax in maps[3:])  # bottom row
    assert all(tick_texts(ax.get_yticklabels()) == TOKENS for ax in maps[::3])  # left column
    assert all(ax.get_xlabel() == "keys" for ax in maps[3:])
    assert len({ax.images[0].get_clim() for ax in maps}) == 1  # one shared scale
    width, height = fig.get_size_inches()
    assert width > height  # three columns, two rows


def test_grid_from_one_layer_list_and_dict():
    fig = plot.plot_attention_grid(random_weights(4, 3, 5), TOKENS[:3], SENTENCE)
    assert len(fig.axes) == 5
    assert fig.axes[0].get_ylabel() == "queries"  # a single layer has no row name
    layers = [random_weights(2, 3, 3), random_weights(2, 3, 3)]
    fig = plot.plot_attention_grid(layers, col_names=["a", "b"])
    assert [ax.get_title() for ax in fig.axes[:2]] == ["a", "b"]
    assert fig.axes[2].get_ylabel().startswith("layer 2")
    fig = plot.plot_attention_grid({"encoder": random_weights(1, 2, 3, 3)})
    assert fig.axes[0].get_ylabel().startswith("encoder")


def test_grid_rejects_bad_input():
    with pytest.raises(ValueError, match="same shape"):
        plot.plot_attention_grid([random_weights(2, 3, 3), random_weights(2, 4, 4)])
    with pytest.raises(ValueError, match="row_names"):
        plot.plot_attention_grid(random_weights(2, 2, 3, 3), row_names=["only one"])
    with pytest.raises(ValueError, match="got shape"):
        plot.plot_attention_grid(torch.rand(1, 2, 2, 3, 3))


# -- plot_mask -----------------------------------------------------------------------


def test_mask_two_colours_and_legend():
    mask = causal_mask(4)
    ax = plot.plot_mask(mask, TOKENS, TOKENS, title="causal")
    assert ax.get_title() == "causal"
    assert ax.get_xlabel() == "keys" and ax.get_ylabel() == "queries"
    assert tick_texts(ax.get_xticklabels()) == TOKENS
    legend = tick_texts(ax.get_legend().get_texts())
    assert legend == ["True: may attend", "False: masked out"]
    np.testing.assert_array_equal(ax.images[0].get_array(), mask.numpy().astype(float))


def test_mask_accepts_broadcast_shape_and_rejects_floats():
    ax = plot.plot_mask(torch.tensor([True, True, False])[None, None, None, :])
    assert ax.images[0].get_array().shape == (1, 3)
    with pytest.raises(TypeError, match="bool"):
        plot.plot_mask(torch.ones(3, 3))


# -- plot_history and plot_lines -----------------------------------------------------


def test_history_loss_and_learning_rate_panels():
    history = {
        "step": [1, 2, 3, 4],
        "loss": [4.0, 3.0, 2.5, 2.0],
        "lr": [1e-4, 2e-4, 3e-4, 3e-4],
        "valid_step": [2, 4],
        "valid_loss": [3.2, 2.4],
        "tokens_per_s": [100.0] * 4,
    }
    fig = plot.plot_history(history, title="run")
    loss_ax, lr_ax = fig.axes
    assert fig.get_suptitle() == "run"
    assert loss_ax.get_xlabel() == "step" and "loss" in loss_ax.get_ylabel()
    assert lr_ax.get_xlabel() == "step" and lr_ax.get_ylabel() == "learning rate"
    assert tick_texts(loss_ax.get_legend().get_texts()) == ["training loss", "validation loss"]
    np.testing.assert_array_equal(loss_ax.lines[1].get_xdata(), [2, 4])


def test_history_tolerates_missing_keys():
    fig = plot.plot_history({"loss": [3.0, 2.0, 1.0], "valid_loss": [2.5]})
    assert len(fig.axes) == 1  # no learning rate
    np.testing.assert_array_equal(fig.axes[0].lines[0].get_xdata(), [1, 2, 3])
    np.testing.assert_array_equal(fig.axes[0].lines[1].get_xdata(), [3])
    with pytest.raises(ValueError, match="no 'loss'"):
        plot.plot_history({"step": [1, 2]})


def test_lines():
    ax = plot.plot_lines(
        [128, 256, 512],
        {"explicit": [1.0, 4.0, 16.0], "fused": [0.5, 1.0, None]},
        title="time",
        xlabel="L",
        ylabel="ms",
        logy=True,
    )
    assert ax.get_title() == "time" and ax.get_xlabel() == "L" and ax.get_ylabel() == "ms"
    assert tick_texts(ax.get_legend().get_texts()) == ["explicit", "fused"]
    assert ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="2 values for 3"):
        plot.plot_lines([1, 2, 3], {"short": [1, 2]})


def test_log_axes_label_ticks_as_plain_numbers():
    ax = plot.plot_lines(
        [1024, 4096, 16384], {"a": [1.1, 1.5, 3.7]}, title="t", logx=True, logy=True
    )
    ax.figure.canvas.draw()
    labels = [
        t.get_text() for axis in (ax.xaxis, ax.yaxis) for t in axis.get_ticklabels(which="both")
    ]
    shown = [t for t in labels if t]
    assert "1000" in shown and "10000" in shown and "2" in shown, shown
    assert not any("times" in t or "^" in t or "$" in t for t in shown), shown


# -- the explorers' colour scale (the explorers: tests/viz/test_explorers.py) -----------


def test_text_colour_threshold_is_shared_by_plots():
    assert colours.text_colour(colours.DARK_ABOVE) == "black"
    assert colours.text_colour(colours.DARK_ABOVE + 1e-9) == "white"
    values = np.array([[0.0, colours.DARK_ABOVE - 0.01, colours.DARK_ABOVE + 0.01, 1.0]])
    ax = plot.plot_heatmap(values, annotate=True, vmin=0.0, vmax=1.0, colorbar=False)
    assert [t.get_color() for t in ax.texts] == ["black", "black", "white", "white"]


def test_plots_and_explorers_share_one_set_of_colours():
    """mhbook.viz.colours holds them; the explorers re-export them, the plots use them."""
    assert (svg.COLOURMAP, svg.DARK_ABOVE, svg.text_colour) == (
        colours.COLOURMAP,
        colours.DARK_ABOVE,
        colours.text_colour,
    )
    assert plot.MASK_COLORS is colours.MASK_COLORS
    ax = plot.plot_heatmap(np.eye(2), colorbar=False)
    assert ax.images[0].get_cmap().name == colours.COLOURMAP
