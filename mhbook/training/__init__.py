"""Training: the trainer (``fit``, any model on any data), models trained once and kept in a
checkpoint (``train_once``), the book's translation model (``book_model``, Part II) and its
Shakespeare language model (``shakespeare_model``, Part V), and the results of benchmarks the
chapters plot (``load_measured``)."""

from . import checkpoints, measured, shakespeare_lm, trainer, translation
from .checkpoints import *  # noqa: F403
from .measured import *  # noqa: F403
from .shakespeare_lm import *  # noqa: F403
from .trainer import *  # noqa: F403
from .translation import *  # noqa: F403

__all__ = [
    *trainer.__all__,
    *checkpoints.__all__,
    *translation.__all__,
    *shakespeare_lm.__all__,
    *measured.__all__,
]
