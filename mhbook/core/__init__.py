"""The foundations: argument validation with one message style, the configurations every
model obeys, bool masks (``True`` = may attend), devices and seeds, and memory measurement.

Imports nothing else of mhbook."""

from .public import gather

#: The modules whose public names this folder offers (and ``mhbook`` with it).
__all__ = gather(globals(), ("validate", "config", "masks", "utils", "measure"))
