"""mhbook: the reference code of the book *Multi-Head Attention, Run and Checked*.

The package is its layers, one folder each, from the bottom up (a folder imports only from the
folders below it; ``tests/test_hygiene.py`` checks it):

* :mod:`mhbook.core`: argument validation, configs, masks, devices and seeds;
* :mod:`mhbook.attention`: the attention core, RoPE, ALiBi, the cache, the attention layers;
* :mod:`mhbook.tasks`: the number-words task, BLEU, the Shakespeare corpus;
* :mod:`mhbook.models`: layers, blocks, the two models, ``generate``, the conversions to
  and from Hugging Face and PyTorch;
* :mod:`mhbook.distributed`: launching ranks, tensor and context parallelism;
* :mod:`mhbook.training`: ``fit``, the book's trained models;
* :mod:`mhbook.check`: the checks of the reader's own code;
* :mod:`mhbook.viz`: plots, diagrams and the explorers.

Every public name of these folders is also a name of ``mhbook`` (``mhbook.MultiHeadAttention``),
gathered from their ``__all__``. ``import mhbook`` is cheap: the plots and explorers
(matplotlib, ipywidgets) are imported the first time one of their names is used, and the checks
when ``mhbook.check`` is imported.
"""

from . import attention, core, distributed, models, tasks, training, viz
from .attention import *  # noqa: F403
from .core import *  # noqa: F403
from .distributed import *  # noqa: F403
from .models import *  # noqa: F403
from .tasks import *  # noqa: F403
from .training import *  # noqa: F403

__version__ = "0.3.0"

#: The folders whose public names ``mhbook`` gathers, bottom up.
LAYERS = (core, attention, tasks, models, distributed, training)

__all__ = [
    *(name for layer in LAYERS for name in layer.__all__),
    *(name for name in viz.NAMES),
]

# In Jupyter, figures are retina PNGs (sharp on HiDPI screens); nothing happens elsewhere.
use_sharp_figures()  # noqa: F405


def __getattr__(name: str):
    """A plot, a diagram or an explorer, imported the first time it is used."""
    if name in viz.NAMES:
        value = getattr(viz, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mhbook' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
