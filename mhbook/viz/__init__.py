"""What the book draws: the colours, plots and diagrams (matplotlib), what the viewer shows of a
trained model (:mod:`~mhbook.viz.attention_records`), and the kernel-free explorers
(:mod:`~mhbook.viz.explorers`).

Importing this package imports none of them: matplotlib and ipywidgets load when a plot or an
explorer is first used (PEP 562). ``NAMES`` maps every public name of these modules to
the module that defines it, read from each module's ``__all__`` without importing it.
"""

import ast
import importlib
from pathlib import Path

#: The modules whose public names :mod:`mhbook` offers, imported on first use.
MODULES = ("colours", "plot", "diagrams", "attention_records", "explorers")


def _public_names(module: str) -> list[str]:
    """The public names of a module of this package, read from its source: its ``__all__``,
    or for a package the names its ``PUBLIC`` table gathers (:func:`mhbook.core.public.gather`)."""
    folder = Path(__file__).parent
    path = (
        folder / module / "__init__.py" if (folder / module).is_dir() else folder / f"{module}.py"
    )
    for node in ast.parse(path.read_text()).body:
        targets = [getattr(t, "id", None) for t in getattr(node, "targets", ())]
        if "__all__" in targets and isinstance(node.value, (ast.List, ast.Tuple)):
            return [ast.literal_eval(e) for e in node.value.elts]
        if "PUBLIC" in targets:
            return [name for names in ast.literal_eval(node.value).values() for name in names]
    raise ValueError(f"{path} has neither a literal __all__ nor a PUBLIC table")


#: Every public name -> the module of this package that defines it.
NAMES = {name: module for module in MODULES for name in _public_names(module)}

__all__ = ["NAMES", *NAMES]


def __getattr__(name: str):
    """Import a module of this package, or the one that defines ``name``, on first use."""
    if name in MODULES:
        return importlib.import_module(f".{name}", __name__)
    if name not in NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{NAMES[name]}", __name__), name)
    globals()[name] = value
    return value
