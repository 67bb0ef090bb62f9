"""Chapter 15's "Train" panel: the induction heads form in the reader's browser.

:func:`live_train_html` is a folded ``<details>``; opened, it builds
:data:`~mhbook.training.live_copier.LIVE_COPIER_MODEL` from a seeded initialisation and trains
it in plain JavaScript (``static/live_train.js``: the forward pass and a backward pass written
by hand, AdamW, in slices that yield to the page) on repeated random blocks, drawing the loss
on each copy, every head's previous-token and induction score, the phase change and every
head's attention on one fixed sequence as it trains. Nothing is downloaded: the weights come
from the seed (``mulberry32``, which :mod:`mhbook.training.live_copier` reproduces in Python,
so that ``tests/viz/test_browser_live_train.py`` checks the page against PyTorch).
"""

from __future__ import annotations

import dataclasses
import hashlib

from ...training.live_copier import (
    LIVE_COPIER_MODEL,
    LIVE_COPIER_TASK,
    LIVE_COPIER_TRAIN,
    LIVE_THRESHOLD,
)
from .live import fill_panel
from .svg import colour_scale, embed

__all__ = ["live_train_html", "live_train_data"]


def live_train_data() -> dict:
    """What the page's JavaScript reads: the model's config, the task, the training (AdamW's
    betas and eps as :func:`mhbook.training.trainer.make_optimizer` sets them), the
    threshold and the colour scale."""
    config = dataclasses.asdict(LIVE_COPIER_MODEL)
    train = LIVE_COPIER_TRAIN
    return {
        "config": {
            k: config[k] for k in ("d_model", "num_heads", "num_layers", "norm_eps", "rope_theta")
        },
        "task": {**LIVE_COPIER_TASK, "periods": list(LIVE_COPIER_TASK["periods"])},
        "train": {
            "lr": train.lr,
            "batch_size": train.batch_size,
            "num_steps": train.num_steps,
            "clip_norm": train.clip_norm,
            "weight_decay": train.weight_decay,
            "betas": [0.9, 0.98],
            "eps": 1e-9,
        },
        "threshold": LIVE_THRESHOLD,
        "scale": colour_scale(),
    }


def live_train_html(uid: str = "train", open: bool = False) -> str:
    """The panel's HTML with its JavaScript and CSS inline. ``window.mhbookLive`` gains
    ``trainInit({seed, layers, lr})`` (the initial weights by name), ``trainStep()`` (one step
    of that run: ``{loss, norm, grads}``, the gradients before clipping) and
    ``trainRun({seed, layers, lr, steps, every, after})`` (a whole run: every step's loss,
    the looks, the phase change, steps per second).

    Args:
        uid: names the panel's elements (two panels on one page need two).
        open: show the panel open (the appendix's page of its own); a chapter shows it folded.

    Returns:
        An ``IPython.display.HTML`` object (its ``data`` attribute is the HTML string).
    """
    from IPython.display import HTML

    uid = "mhbook-live-train-" + hashlib.sha1(uid.encode()).hexdigest()[:8]
    period = LIVE_COPIER_TASK["periods"][1]
    body = fill_panel(
        "live_train.html",
        uid=uid,
        open="open" if open else "",
        period=str(period),
        back=str(period - 1),
    )
    return HTML(
        embed(
            uid,
            body,
            ["live_core.js", "live_train.js"],
            live_train_data(),
            css=["explorer.css", "live.css", "live_train.css"],
        )
    )
