"""The book's tasks and data: English-to-French number words (and their prompt/completion
form for decoder-only models), BLEU, the Tiny Shakespeare corpus with its tokenizers, and
the copying task of random repeated blocks."""

from ..core.public import gather

#: The modules whose public names this folder offers (and ``mhbook`` with it).
__all__ = gather(globals(), ("numbers", "number_prompts", "bleu", "shakespeare", "copying"))
