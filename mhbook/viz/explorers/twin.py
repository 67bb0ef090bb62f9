"""What the ipywidgets twins of the explorers share.

Each explorer has a self-contained HTML version (for the static book) and an ipywidgets
version (for Jupyter and Colab, where a kernel runs). ipywidgets is optional: it is imported
only when a twin is drawn.
"""

from __future__ import annotations


def widget_modules(explorer: str):
    """``(ipywidgets, IPython.display.display)`` for the twin named ``explorer``.

    Raises:
        ImportError: If ipywidgets is not installed; the message names ``explorer`` and its
            HTML version, which needs no kernel.
    """
    try:
        import ipywidgets
        from IPython.display import display
    except ImportError as err:  # optional dependency
        raise ImportError(
            f"{explorer} needs ipywidgets: pip install ipywidgets "
            f"(or use {explorer}_html, which needs no kernel)"
        ) from err
    return ipywidgets, display
