"""Interactive explorers: self-contained HTML (works in the static book, no kernel) and
ipywidgets twins (need a kernel).

* :mod:`mhbook.viz.explorers.attention`: chapter 1's explorer of ``W_query``, ``W_key`` and
  ``W_value``.
* :mod:`mhbook.viz.explorers.softmax`: chapter 2's ``d_k`` and temperature explorer of the
  softmax, its Jacobian and its gradient.
* :mod:`mhbook.viz.explorers.masks`: chapter 3's mask builder (padding, causal alignment).
* :mod:`mhbook.viz.explorers.positional`: chapter 5's explorer of the sinusoidal encoding.
* :mod:`mhbook.viz.explorers.viewer`: chapters 6 and 7's viewer of the trained model's attention
  on every test number, every layer, head and kind, with single-head ablations (recorded by
  :mod:`mhbook.viz.attention_records`; the viewer only draws them).
* :mod:`mhbook.viz.explorers.passages`: a language model's heads on a few text passages
  (recorded by :func:`mhbook.viz.attention_records.passage_attention`): point at a token, see what
  it
  attends to.
* :mod:`mhbook.viz.explorers.live`: chapter 6's live translator: the trained model's weights
  exported for the browser, where ``static/live.js`` translates the reader's own numbers.
* :mod:`mhbook.viz.explorers.twin`: what the ipywidgets twins share (ipywidgets loads lazily).
* :mod:`mhbook.viz.explorers.svg`: what every explorer shares: the SVG heatmap, bar and line
  charts (redrawn by ``static/heatmap.js`` and ``static/charts.js``), the colour scale,
  and :func:`~mhbook.viz.explorers.svg.embed`, which inlines an explorer's JavaScript, CSS and
  data (files in ``static/``) into one ``<div>``.

Importing this package does not import matplotlib or ipywidgets; drawing does.
"""

from . import attention, live, masks, passages, positional, softmax, svg, viewer
from .attention import (
    attention_explorer,
    attention_explorer_html,
    explorer_attention,
    explorer_presets,
    explorer_title,
    explorer_weights,
    focus_preset,
)
from .masks import explorer_mask, mask_explorer, mask_explorer_html, masked_weights
from .passages import (
    passage_explorer_html,
    passage_payload,
    passage_payload_weights,
)
from .positional import positional_explorer, positional_explorer_html
from .softmax import softmax_explorer, softmax_explorer_html, softmax_stats
from .viewer import attention_viewer, attention_viewer_html

__all__ = [
    "attention_explorer",
    "attention_explorer_html",
    "explorer_weights",
    "explorer_attention",
    "explorer_presets",
    "focus_preset",
    "explorer_title",
    "softmax_explorer",
    "softmax_explorer_html",
    "softmax_stats",
    "mask_explorer",
    "mask_explorer_html",
    "explorer_mask",
    "masked_weights",
    "positional_explorer",
    "positional_explorer_html",
    "attention",
    "live",
    "softmax",
    "masks",
    "positional",
    "svg",
    "viewer",
    "attention_viewer_html",
    "attention_viewer",
    "passages",
    "passage_explorer_html",
    "passage_payload",
    "passage_payload_weights",
]
