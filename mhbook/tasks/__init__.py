"""The book's tasks and data: English-to-French number words (and their prompt/completion
form for decoder-only models), BLEU, the Tiny Shakespeare corpus with its tokenizers, and
the copying task of random repeated blocks."""

from . import bleu, copying, number_prompts, numbers, shakespeare
from .bleu import *  # noqa: F403
from .copying import *  # noqa: F403
from .number_prompts import *  # noqa: F403
from .numbers import *  # noqa: F403
from .shakespeare import *  # noqa: F403

__all__ = [
    *numbers.__all__,
    *number_prompts.__all__,
    *bleu.__all__,
    *shakespeare.__all__,
    *copying.__all__,
]
