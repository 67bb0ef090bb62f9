"""Training: ``fit`` and its optimiser and schedule, the book's Transformer trained once
(``book_model``), and Part V's Shakespeare model (``shakespeare_model``)."""

from . import shakespeare_lm, train
from .shakespeare_lm import *  # noqa: F403
from .train import *  # noqa: F403

__all__ = [*train.__all__, *shakespeare_lm.__all__]
