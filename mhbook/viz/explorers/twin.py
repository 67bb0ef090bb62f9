"""What the ipywidgets twins of the explorers share.

Each explorer has a self-contained HTML version (for the static book) and an ipywidgets
version (for Jupyter and Colab, where a kernel runs). ipywidgets is optional: it is imported
only when a twin is drawn.
"""

from __future__ import annotations


def widget_modules(explorer: str):
    """The ``ipywidgets`` module, for the twin named ``explorer``.

    Raises:
        ImportError: If ipywidgets is not installed; the message names ``explorer`` and its
            HTML version, which needs no kernel.
    """
    try:
        import IPython.display  # noqa: F401 (redraw_on needs it)
        import ipywidgets
    except ImportError as err:  # optional dependency
        raise ImportError(
            f"{explorer} needs ipywidgets: pip install ipywidgets "
            f"(or use {explorer}_html, which needs no kernel)"
        ) from err
    return ipywidgets


def redraw_on(controls, out, draw):
    """Show ``draw()``'s figure in the ipywidgets ``Output`` ``out``, now and whenever one of
    ``controls`` changes value; returns the function that redraws.

    ``draw()`` reads the controls, may update the twin's state, and returns a new matplotlib
    figure, or ``None`` to keep the one shown. The old figure is cleared and each new one is
    closed once shown, so Jupyter does not draw it a second time.
    """
    import matplotlib.pyplot as plt
    from IPython.display import display

    def redraw(*_):
        with out:
            fig = draw()
            if fig is None:
                return
            out.clear_output(wait=True)
            display(fig)
            plt.close(fig)

    for control in controls:
        control.observe(redraw, names="value")
    redraw()
    return redraw
