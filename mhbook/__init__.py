"""mhbook: the reference code of the book *Multi-Head Attention, Run and Checked*.

The package is its layers, one folder each, listed floor by floor in :data:`FLOORS` (a
folder imports only from its own floor and those below; ``tests/test_hygiene.py`` checks it):

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

from . import viz
from .core.public import gather

__version__ = "0.3.0"

#: The folders of mhbook, which are its layers, floor by floor from the bottom up. A module
#: imports only from its own folder, the folders on its floor and the floors below, and the
#: imports make no cycle (``tests/test_hygiene.py`` holds the code to this list). This is the
#: one list of the layers: the README and CONTRIBUTING.md point here.
FLOORS = (
    ("core",),  # argument validation, configs, masks, devices and seeds, measuring
    ("attention", "tasks"),  # the attention core and layers; the tasks and their data
    ("models", "distributed"),  # blocks, models, generation, conversions; heads across ranks
    ("training", "check"),  # fit and the trained models; the checks of the reader's code
    ("viz",),  # plots, diagrams, what a trained model does, the explorers
)

#: ``mhbook.check`` is imported when asked for (``from mhbook import check``), and ``viz``'s
#: names the first time one is used (matplotlib and ipywidgets load only then).
__all__ = [
    *gather(globals(), [f for floor in FLOORS for f in floor if f not in ("check", "viz")]),
    *viz.NAMES,
]

# In Jupyter, figures are retina PNGs (sharp on HiDPI screens); nothing happens elsewhere.
use_sharp_figures()  # noqa: F821 (gathered from core.utils)


def __getattr__(name: str):
    """A plot, a diagram or an explorer, imported the first time it is used."""
    if name in viz.NAMES:
        value = getattr(viz, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mhbook' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
