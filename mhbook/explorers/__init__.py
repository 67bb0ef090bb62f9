"""Interactive explorers: self-contained HTML (works in the static book, no kernel) and
ipywidgets twins (need a kernel).

* :mod:`mhbook.explorers.attention`: chapter 1's explorer of ``W_query``, ``W_key`` and
  ``W_value``.
* :mod:`mhbook.explorers.svg`: what every explorer shares: the SVG heatmap, bar and line
  charts (redrawn by ``static/heatmap.js`` and ``static/charts.js``), the colour scale,
  and :func:`~mhbook.explorers.svg.embed`, which inlines an explorer's JavaScript, CSS and
  data (files in ``static/``) into one ``<div>``.

Importing this package does not import matplotlib or ipywidgets; drawing does.
"""

from . import attention, svg
from .attention import (
    attention_explorer,
    attention_explorer_html,
    explorer_attention,
    explorer_presets,
    explorer_title,
    explorer_weights,
    focus_preset,
)

__all__ = [
    "attention_explorer",
    "attention_explorer_html",
    "explorer_weights",
    "explorer_attention",
    "explorer_presets",
    "focus_preset",
    "explorer_title",
    "attention",
    "svg",
]
