"""Training: the trainer (``fit``, any model on any data), models trained once and kept in a
checkpoint (``train_once``), the book's translation model (``book_model``, Part II) and its
Shakespeare language model (``shakespeare_model``, Part V), the small language models of the
number task (``position_model``, ``window_model``, Part III), and the results of benchmarks the
chapters plot (``load_measured``)."""

from ..core.public import gather

#: The modules whose public names this folder offers (and ``mhbook`` with it).
__all__ = gather(
    globals(),
    (
        "trainer",
        "checkpoints",
        "translation",
        "shakespeare_lm",
        "live_copier",
        "number_lms",
        "measured",
    ),
)
