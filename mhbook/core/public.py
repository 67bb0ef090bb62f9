"""How a folder of mhbook offers its modules' public names: its ``__init__`` says, once,
which modules it gathers, and :func:`gather` imports them and copies their ``__all__``."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence

__all__ = ["gather"]


def gather(namespace: dict, modules: Sequence[str] | Mapping[str, Sequence[str]]) -> list[str]:
    """Import each module of a package, in order, and give the package their public names.

    In a package's ``__init__``: ``__all__ = gather(globals(), ("sdpa", "rope"))`` offers
    every name of ``sdpa.__all__`` and ``rope.__all__``; a mapping
    ``{"masks": ("mask_explorer",)}`` offers only the names it lists. Returns the package's
    ``__all__``. Each name has one home: a name offered by two modules is refused, and so is
    a name that is a module (``package.masks`` must not be mistaken for a mechanism).
    """
    package = namespace["__name__"]
    home: dict[str, str] = {}
    for module_name in modules:
        module = importlib.import_module(f"{package}.{module_name}")
        names = modules[module_name] if isinstance(modules, Mapping) else module.__all__
        for name in names:
            if name in home:
                raise ImportError(
                    f"{package}: {name!r} is offered by both {home[name]} and {module_name}; "
                    "each public name has one home"
                )
            value = getattr(module, name)
            if type(value).__name__ == "module":
                raise ImportError(f"{package}.{module_name}: public name {name!r} is a module")
            home[name] = module_name
            namespace[name] = value
    return list(home)
