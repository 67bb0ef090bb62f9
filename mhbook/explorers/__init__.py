"""Interactive explorers: self-contained HTML (works in the static book, no kernel) and
ipywidgets twins (need a kernel).

* :mod:`mhbook.explorers.attention`: chapter 1's explorer of ``W_query`` and ``W_key``.
* :mod:`mhbook.explorers.viewer`: chapters 6 and 7's viewer of the trained model's attention
  on every test number, every layer, head and kind, with single-head ablations.
* :mod:`mhbook.explorers.svg`: what every explorer shares: the SVG heatmap, the colour
  scale, and :func:`~mhbook.explorers.svg.embed`, which inlines an explorer's JavaScript,
  CSS and data (files in ``static/``) into one ``<div>``.

Importing this package does not import matplotlib or ipywidgets; drawing does.
"""

from . import attention, svg, viewer
from .attention import (
    attention_explorer,
    attention_explorer_html,
    explorer_title,
    explorer_weights,
    focus_preset,
)
from .viewer import attention_viewer, attention_viewer_html, viewer_data

__all__ = [
    "attention_explorer",
    "attention_explorer_html",
    "explorer_weights",
    "focus_preset",
    "explorer_title",
    "attention",
    "svg",
    "viewer",
    "viewer_data",
    "attention_viewer_html",
    "attention_viewer",
]
