"""Pictures for the book: attention heatmaps, grids of heads, masks and training curves.

Every function accepts PyTorch tensors on any device (also ones that require grad)
as well as NumPy arrays and nested lists; tensors are detached and copied to the
CPU before drawing. Attention maps always carry a title, axis labels and, when
given, the tokens on both axes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import LogFormatterSciNotation

from ..core.utils import to_numpy
from .colours import COLOURMAP, MASK_COLORS, text_colour

__all__ = ["plot_heatmap", "plot_attention_grid", "plot_mask", "plot_history", "plot_lines"]


def _as_matrix(x, name: str) -> np.ndarray:
    """A float ``(Lq, Lk)`` array; leading dimensions of size 1 are dropped."""
    a = to_numpy(x, name)
    while a.ndim > 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 2:
        raise ValueError(
            f"{name} must have shape (num_queries, num_keys), got {a.shape}; pick one map, "
            "e.g. weights[0, 0] for batch 0, head 0, or use plot_attention_grid"
        )
    return a


def _check_labels(labels, size: int, name: str, axis: str) -> list[str] | None:
    if labels is None:
        return None
    labels = [str(t) for t in labels]
    if len(labels) != size:
        raise ValueError(f"{name} has {len(labels)} labels but the {axis} axis has {size} entries")
    return labels


def _set_token_ticks(ax: Axes, query_labels, key_labels, shape, show_x=True, show_y=True) -> None:
    """Put the tokens on the axes (or integer positions when there are no tokens)."""
    num_queries, num_keys = shape
    if key_labels is not None:
        ax.set_xticks(range(num_keys))
        if show_x:
            rotation = 90 if num_keys > 12 or max(map(len, key_labels), default=0) > 6 else 45
            ax.set_xticklabels(key_labels, rotation=rotation, ha="right", rotation_mode="anchor")
        else:
            ax.set_xticklabels([])
    elif num_keys <= 20:
        ax.set_xticks(range(num_keys))
    if query_labels is not None:
        ax.set_yticks(range(num_queries))
        ax.set_yticklabels(query_labels if show_y else [])
    elif num_queries <= 20:
        ax.set_yticks(range(num_queries))
    ax.tick_params(length=0)


def _annotate(ax: Axes, values: np.ndarray, image, fmt: str = "{:.2f}") -> None:
    """Write each value in its cell, in white on dark cells and black on light ones."""
    norm = image.norm
    for i, j in np.ndindex(values.shape):
        v = values[i, j]
        if np.isfinite(v):
            text, colour = fmt.format(v), text_colour(norm(v))
        else:
            text, colour = ("-inf" if v < 0 else "inf" if v > 0 else "nan"), "black"
        ax.text(j, i, text, ha="center", va="center", fontsize=8, color=colour)


def _heatmap_figsize(num_queries: int, num_keys: int) -> tuple[float, float]:
    width = min(14.0, max(3.5, 0.5 * num_keys + 2.0))
    height = min(12.0, max(2.5, 0.45 * num_queries + 1.2))
    return width, height


def plot_heatmap(
    weights,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    title: str | None = None,
    ax: Axes | None = None,
    xlabel: str = "keys",
    ylabel: str = "queries",
    cmap: str = COLOURMAP,
    colorbar: bool = True,
    annotate: bool = False,
    vmin: float | None = None,
    vmax: float | None = None,
    *,
    fmt: str = "{:.2f}",
    colorbar_label: str | None = None,
) -> Axes:
    """Draw one attention map (or a matrix of scores) as a heatmap.

    Row ``i`` is query ``i``, column ``j`` is key ``j``. Non-finite entries (such as
    ``-inf`` scores of masked keys) are drawn in grey.

    Args:
        weights: ``(Lq, Lk)`` tensor or array; leading dimensions of size 1, as in
            ``(1, 1, Lq, Lk)``, are dropped.
        query_labels: ``Lq`` tokens for the rows, or ``None`` for positions.
        key_labels: ``Lk`` tokens for the columns, or ``None`` for positions.
        title: Title of the axes.
        ax: Axes to draw into; a new figure sized to the matrix when ``None``.
        xlabel: Label of the horizontal (key) axis.
        ylabel: Label of the vertical (query) axis.
        cmap: A matplotlib colour map name.
        colorbar: Whether to add a colour bar next to the axes.
        annotate: Whether to write each value in its cell.
        vmin: Value at the bottom of the colour scale (default: the smallest value).
        vmax: Value at the top of the colour scale (default: the largest value).
        fmt: Format of the numbers written by ``annotate``.
        colorbar_label: Label of the colour bar.

    Returns:
        The matplotlib ``Axes``; the image is ``ax.images[0]``.

    Raises:
        ValueError: If ``weights`` is not 2-D or the labels do not match its shape.
    """
    values = _as_matrix(weights, "weights")
    query_labels = _check_labels(query_labels, values.shape[0], "query_labels", "query (row)")
    key_labels = _check_labels(key_labels, values.shape[1], "key_labels", "key (column)")
    if ax is None:
        _, ax = plt.subplots(figsize=_heatmap_figsize(*values.shape), layout="constrained")
    colours = plt.get_cmap(cmap).with_extremes(bad="#bdbdbd")
    image = ax.imshow(
        np.ma.masked_invalid(values.astype(float)),
        cmap=colours,
        vmin=vmin,
        vmax=vmax,
        aspect="auto",
        interpolation="nearest",
    )
    _set_token_ticks(ax, query_labels, key_labels, values.shape)
    if annotate:
        _annotate(ax, values, image, fmt)
    if colorbar:
        bar = ax.figure.colorbar(image, ax=ax, fraction=0.05, pad=0.03)
        if colorbar_label:
            bar.set_label(colorbar_label)
    if title:
        ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return ax


def _as_grid(weights) -> tuple[np.ndarray, list[str] | None, bool]:
    """``(rows, cols, Lq, Lk)`` array, row names from a mapping, and whether rows are layers."""
    names = None
    if isinstance(weights, Mapping):
        names = [str(k) for k in weights]
        weights = list(weights.values())
    if isinstance(weights, (list, tuple)):
        layers = [to_numpy(w, f"weights[{i}]") for i, w in enumerate(weights)]
        if not layers:
            raise ValueError("weights is an empty list; expected per-layer (h, Lq, Lk) tensors")
        for i, w in enumerate(layers):
            while w.ndim > 3 and w.shape[0] == 1:
                w = w[0]
            if w.ndim != 3 or w.shape != layers[0].shape[-3:]:
                raise ValueError(
                    f"every layer must have the same shape (num_heads, Lq, Lk); weights[{i}] has "
                    f"shape {w.shape}, weights[0] has {layers[0].shape}"
                )
            layers[i] = w
        return np.stack(layers), names, True
    grid = to_numpy(weights, "weights")
    if grid.ndim == 4:
        return grid, names, True
    if grid.ndim == 3:
        return grid[None], names, False
    if grid.ndim == 2:
        return grid[None, None], names, False
    raise ValueError(
        "weights must have shape (num_layers, num_heads, Lq, Lk) or (num_heads, Lq, Lk), "
        f"or be a list of (num_heads, Lq, Lk) tensors; got shape {grid.shape}"
    )


def plot_attention_grid(
    weights,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    title: str | None = None,
    row_names: Sequence[str] | None = None,
    col_names: Sequence[str] | None = None,
    xlabel: str = "keys",
    ylabel: str = "queries",
    cmap: str = COLOURMAP,
    *,
    vmin: float | None = None,
    vmax: float | None = None,
    annotate: bool = False,
) -> Figure:
    """Draw many attention maps in a grid: one row per layer, one column per head.

    All maps share one colour scale and one colour bar, so the heads can be compared.
    Tokens are written on the outer axes (keys below the bottom row, queries left of the
    first column).

    Args:
        weights: ``(num_layers, num_heads, Lq, Lk)`` or ``(num_heads, Lq, Lk)`` tensor, a
            list of per-layer ``(num_heads, Lq, Lk)`` tensors, or a dict of them (as
            returned by :func:`mhbook.record_attention` after indexing the batch), whose
            keys become the row names.
        query_labels: ``Lq`` tokens for the rows of each map.
        key_labels: ``Lk`` tokens for the columns of each map.
        title: Title of the whole figure.
        row_names: One name per row; default ``"layer 1"``, ``"layer 2"``, ... (no row
            names for a single ``(num_heads, Lq, Lk)`` tensor).
        col_names: One name per column; default ``"head 1"``, ``"head 2"``, ...
        xlabel: Label under the bottom row.
        ylabel: Label left of the first column.
        cmap: A matplotlib colour map name.
        vmin: Bottom of the shared colour scale (``None``: 0 when no value is negative,
            else the smallest value).
        vmax: Top of the shared colour scale (``None``: the largest weight).
        annotate: Whether to write each value in its cell.

    Returns:
        The matplotlib ``Figure``; its first ``rows * cols`` axes are the maps, the last
        one is the colour bar.

    Raises:
        ValueError: If the shapes, labels or names do not fit together.
    """
    grid, mapping_names, rows_are_layers = _as_grid(weights)
    num_rows, num_cols, num_queries, num_keys = grid.shape
    query_labels = _check_labels(query_labels, num_queries, "query_labels", "query (row)")
    key_labels = _check_labels(key_labels, num_keys, "key_labels", "key (column)")
    if row_names is None:
        row_names = mapping_names
    if row_names is None and (rows_are_layers or num_rows > 1):
        row_names = [f"layer {i + 1}" for i in range(num_rows)]
    if row_names is not None and len(row_names) != num_rows:
        raise ValueError(f"row_names has {len(row_names)} names for {num_rows} rows")
    if col_names is None:
        col_names = [f"head {j + 1}" for j in range(num_cols)]
    if len(col_names) != num_cols:
        raise ValueError(f"col_names has {len(col_names)} names for {num_cols} columns")

    finite = grid[np.isfinite(grid)]
    low = vmin if vmin is not None else min(0.0, finite.min()) if finite.size else 0.0
    high = vmax if vmax is not None else (finite.max() if finite.size else 1.0)
    cell_w = min(4.0, max(1.8, 0.32 * num_keys + 0.6))
    cell_h = min(4.0, max(1.6, 0.3 * num_queries + 0.5))
    extra_w = 1.4 + (0.5 if row_names is not None else 0.0)
    figsize = (min(24.0, num_cols * cell_w + extra_w), min(30.0, num_rows * cell_h + 1.2))
    fig, axes = plt.subplots(
        num_rows, num_cols, figsize=figsize, squeeze=False, layout="constrained"
    )
    for r, c in np.ndindex(num_rows, num_cols):
        ax = axes[r, c]
        plot_heatmap(
            grid[r, c],
            query_labels,
            key_labels,
            ax=ax,
            xlabel=xlabel if r == num_rows - 1 else "",
            ylabel="",
            cmap=cmap,
            colorbar=False,
            annotate=annotate,
            vmin=low,
            vmax=high,
        )
        _set_token_ticks(
            ax, query_labels, key_labels, (num_queries, num_keys), r == num_rows - 1, c == 0
        )
        if r == 0:
            ax.set_title(str(col_names[c]))
        if c == 0:
            name = f"{row_names[r]}\n" if row_names is not None else ""
            ax.set_ylabel(name + ylabel)
    fig.colorbar(axes[0, 0].images[0], ax=axes, shrink=min(1.0, 0.5 + 0.25 * num_rows))
    if title:
        fig.suptitle(title)
    return fig


def plot_mask(
    mask,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    title: str | None = None,
    ax: Axes | None = None,
    *,
    xlabel: str = "keys",
    ylabel: str = "queries",
) -> Axes:
    """Draw a bool attention mask in two colours, with a legend: ``True`` = may attend.

    Args:
        mask: bool ``(Lq, Lk)`` tensor or array; leading dimensions of size 1, as in a
            padding mask ``(1, 1, 1, Lk)``, are dropped.
        query_labels: ``Lq`` tokens for the rows.
        key_labels: ``Lk`` tokens for the columns.
        title: Title of the axes.
        ax: Axes to draw into; a new figure when ``None``.
        xlabel: Label of the horizontal (key) axis.
        ylabel: Label of the vertical (query) axis.

    Returns:
        The matplotlib ``Axes``.

    Raises:
        TypeError: If ``mask`` is not boolean.
        ValueError: If ``mask`` is not 2-D or the labels do not match its shape.
    """
    values = _as_matrix(mask, "mask")
    if values.dtype != np.bool_:
        raise TypeError(f"mask must be a bool tensor (True = may attend), got dtype {values.dtype}")
    query_labels = _check_labels(query_labels, values.shape[0], "query_labels", "query (row)")
    key_labels = _check_labels(key_labels, values.shape[1], "key_labels", "key (column)")
    if ax is None:
        width, height = _heatmap_figsize(*values.shape)
        _, ax = plt.subplots(figsize=(width + 1.0, height), layout="constrained")
    ax.imshow(
        values.astype(float),
        cmap=ListedColormap(list(MASK_COLORS)),
        vmin=0.0,
        vmax=1.0,
        aspect="auto",
        interpolation="nearest",
    )
    # Thin white lines between the cells make single entries easy to count.
    ax.set_xticks(np.arange(values.shape[1] + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(values.shape[0] + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1.0)
    ax.tick_params(which="minor", length=0)
    _set_token_ticks(ax, query_labels, key_labels, values.shape)
    handles = [
        Patch(facecolor=MASK_COLORS[1], edgecolor="black", label="True: may attend"),
        Patch(facecolor=MASK_COLORS[0], edgecolor="black", label="False: masked out"),
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    if title:
        ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return ax


def _series(history: Mapping, key: str) -> np.ndarray | None:
    values = history.get(key)
    if values is None or len(values) == 0:
        return None
    return np.asarray([float(to_numpy(v, key)) for v in values])


def plot_history(history: Mapping, title: str | None = None) -> Figure:
    """Draw a training run: the losses against the step, and the learning rate.

    Missing keys are skipped: without ``lr`` there is a single panel, without
    ``step`` the entries are numbered 1, 2, ...

    Args:
        history: A dict of lists such as ``fit`` returns, with any of the keys
            ``step``, ``loss`` (training loss), ``lr``, ``valid_step`` and ``valid_loss``.
            When ``valid_step`` is missing, validation losses are spread evenly over the
            training steps, the last one at the last step.
        title: Title of the whole figure.

    Returns:
        The matplotlib ``Figure``: the loss panel first, then the learning rate panel.

    Raises:
        ValueError: If ``history`` has neither ``loss`` nor ``valid_loss``.
    """
    if not isinstance(history, Mapping):
        raise TypeError(f"history must be a dict of lists, got {type(history).__name__}")
    loss, valid_loss, lr = (_series(history, k) for k in ("loss", "valid_loss", "lr"))
    if loss is None and valid_loss is None:
        raise ValueError(f"history has no 'loss' or 'valid_loss'; its keys are {sorted(history)}")
    step = _series(history, "step")

    def steps_for(values: np.ndarray) -> np.ndarray:
        if step is not None and len(step) == len(values):
            return step
        return np.arange(1, len(values) + 1, dtype=float)

    num_panels = 2 if lr is not None else 1
    figsize = (10.0, 3.6) if lr is not None else (6.0, 3.6)
    fig, axes = plt.subplots(1, num_panels, figsize=figsize, squeeze=False, layout="constrained")
    ax = axes[0, 0]
    last_step = None
    if loss is not None:
        x = steps_for(loss)
        last_step = x[-1]
        ax.plot(x, loss, label="training loss", color="C0", linewidth=1.2)
    if valid_loss is not None:
        valid_step = _series(history, "valid_step")
        if valid_step is None or len(valid_step) != len(valid_loss):
            n = len(valid_loss)
            end = last_step if last_step is not None else n
            valid_step = end * np.arange(1, n + 1) / n
        ax.plot(valid_step, valid_loss, "o-", label="validation loss", color="C1", linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (cross-entropy)")
    ax.set_title("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    if lr is not None:
        ax = axes[0, 1]
        ax.plot(steps_for(lr), lr, color="C2", linewidth=1.2)
        ax.set_xlabel("step")
        ax.set_ylabel("learning rate")
        ax.set_title("learning rate schedule")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig


class _PlainLogFormatter(LogFormatterSciNotation):
    """Log-axis tick labels as plain numbers (1000, 2, 0.5), not 10^3 or 2 x 10^0.

    Matplotlib's own formatter still decides which ticks get a label.
    """

    def __call__(self, x, pos=None):
        return f"{x:g}" if super().__call__(x, pos) else ""


def plot_lines(
    x,
    ys: Mapping[str, Sequence[float]],
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    ax: Axes | None = None,
    *,
    logx: bool = False,
    logy: bool = False,
    marker: str | None = "o",
) -> Axes:
    """Draw several named curves over the same x values, with a legend.

    Handy for measurements such as time or memory against sequence length.

    Args:
        x: The x values, length ``n``.
        ys: ``{name: n values}``; one line per entry. A ``None`` or NaN value leaves a gap.
        title: Title of the axes.
        xlabel: Label of the x axis.
        ylabel: Label of the y axis.
        ax: Axes to draw into; a new figure when ``None``.
        logx: Logarithmic x axis.
        logy: Logarithmic y axis.
        marker: Marker of the points (``None`` for plain lines).

    Returns:
        The matplotlib ``Axes``.

    Raises:
        ValueError: If a curve does not have one value per x value.
    """
    xs = np.asarray([float(to_numpy(v, "x")) for v in x])
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.8), layout="constrained")
    for name, values in ys.items():
        y = np.asarray([np.nan if v is None else float(to_numpy(v, name)) for v in values])
        if len(y) != len(xs):
            raise ValueError(f"ys[{name!r}] has {len(y)} values for {len(xs)} x values")
        ax.plot(xs, y, marker=marker, label=str(name))
    for log, axis, set_scale in ((logx, ax.xaxis, ax.set_xscale), (logy, ax.yaxis, ax.set_yscale)):
        if log:
            set_scale("log")
            axis.set_major_formatter(_PlainLogFormatter())
            axis.set_minor_formatter(
                _PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.4))
            )
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ys:
        ax.legend()
    return ax
