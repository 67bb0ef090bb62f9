"""The book's colours, shared by the matplotlib plots (:mod:`mhbook.viz.plot`) and the HTML
explorers (:mod:`mhbook.viz.explorers`), so that a figure and an explorer draw attention the same
way. Plain constants and one rule, no imports: both can take them from here, below them.
"""

from __future__ import annotations

__all__ = ["COLOURMAP", "DARK_ABOVE", "MASK_COLORS", "text_colour"]

#: The colour map of attention weights, in the explorers and in :func:`mhbook.plot_heatmap`.
COLOURMAP = "Reds"

#: A value written in a heatmap cell is white where the cell's colour is more than this
#: fraction of the way up the scale (a dark cell), black elsewhere.
DARK_ABOVE = 0.6

#: Colours of :func:`mhbook.plot_mask` and the mask explorer: ``False`` (masked out) and
#: ``True`` (may attend).
MASK_COLORS = ("#d9d9d9", "#2171b5")


def text_colour(fraction: float) -> str:
    """``"white"`` on a cell ``fraction`` (0 to 1) up the colour scale past
    :data:`DARK_ABOVE`, else ``"black"``."""
    return "white" if fraction > DARK_ABOVE else "black"
