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
  exported for the browser, where ``static/live.js`` translates the reader's own numbers; and
  chapter 14's live language model (``static/live_lm.js``).
* :mod:`mhbook.viz.explorers.live_step`: the operations of one character's forward pass that
  chapter 14's live model steps through (``STEP_OPS``, one description for the page and for
  the PyTorch check, ``step_reference``).
* :mod:`mhbook.viz.explorers.live_train`: chapter 15's "Train" panel: the induction-head toy
  trained in the page (``static/live_train.js``, a forward and a hand-written backward pass).
* :mod:`mhbook.viz.explorers.quiz`: the chapters' quizzes: the one reading of a question's
  source (the book's ``{question}``), and the quiz of a reader copy in Jupyter and Colab
  (``static/quiz.js``, which the book's pages use too; ``static/quiz_review.js``, the review).
* :mod:`mhbook.viz.explorers.twin`: what the ipywidgets twins share (ipywidgets loads lazily).
* :mod:`mhbook.viz.explorers.svg`: what every explorer shares: the SVG heatmap, bar and line
  charts (redrawn by ``static/heatmap.js`` and ``static/charts.js``), the colour scale,
  and :func:`~mhbook.viz.explorers.svg.embed`, which inlines an explorer's JavaScript, CSS and
  data (files in ``static/``) into one ``<div>``.

Importing this package does not import matplotlib or ipywidgets; drawing does.
"""

from ...core.public import gather

#: The explorers' public names, by the module that defines each (``mhbook`` offers them too).
#: The modules' other names (``svg``'s charts, ``live``'s exports, helpers) stay in their modules.
PUBLIC = {
    "attention": (
        "attention_explorer",
        "attention_explorer_html",
        "explorer_weights",
        "explorer_attention",
        "explorer_presets",
        "focus_preset",
        "explorer_title",
    ),
    "softmax": ("softmax_explorer", "softmax_explorer_html", "softmax_stats"),
    "masks": ("mask_explorer", "mask_explorer_html", "explorer_mask", "masked_weights"),
    "positional": ("positional_explorer", "positional_explorer_html"),
    "viewer": ("attention_viewer", "attention_viewer_html"),
    "passages": ("passage_explorer_html", "passage_payload", "passage_payload_weights"),
}

__all__ = gather(globals(), PUBLIC)
