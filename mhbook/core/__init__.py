"""The foundations: argument validation with one message style, the configurations every
model obeys, bool masks (``True`` = may attend), devices and seeds, and memory measurement.

Imports nothing else of mhbook."""

from . import config, masks, measure, utils, validate
from .config import *  # noqa: F403
from .masks import *  # noqa: F403
from .measure import *  # noqa: F403
from .utils import *  # noqa: F403
from .validate import *  # noqa: F403

__all__ = [*validate.__all__, *config.__all__, *masks.__all__, *utils.__all__, *measure.__all__]
