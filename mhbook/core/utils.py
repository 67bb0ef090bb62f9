"""Devices, seeds, checkpoints, and tensors to NumPy."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

__all__ = [
    "get_device",
    "cpu_or_gpu",
    "set_seed",
    "save_checkpoint",
    "load_checkpoint",
    "to_numpy",
    "describe_machine",
    "glue",
    "use_sharp_figures",
]


def get_device() -> torch.device:
    """The best device here: CUDA, then Apple's MPS, then the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def cpu_or_gpu(cpu, gpu, device: torch.device):
    """``cpu`` on a CPU, ``gpu`` on a CUDA GPU: the size of a chapter's training run.

    Chapters train CPU-sized by default (minutes on a laptop and in CI) and larger on a
    GPU, e.g. ``num_steps = mhbook.cpu_or_gpu(400, 1200, device)``.

    With the environment variable ``MHBOOK_GPU_SIZES=1`` it returns ``gpu`` on any
    device, so that a maintainer without a GPU can run a chapter at the GPU's sizes on
    the CPU (slowly) and see that its asserted claims still hold there.
    """
    if device.type == "cuda" or os.environ.get("MHBOOK_GPU_SIZES") == "1":
        return gpu
    return cpu


def set_seed(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's (CPU and CUDA) random number generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def save_checkpoint(path: str | os.PathLike, model: nn.Module, config=None, **extra) -> None:
    """Save ``model``'s state dict, its ``config`` and ``extra`` plain values.

    The file is written next to ``path`` and then renamed, so a reader (another
    notebook running now) never sees half a file.

    Args:
        config: a :class:`mhbook.Config` (stored as ``config.to_dict()``, read back with
            :meth:`mhbook.Config.from_dict`) or such a dict, or ``None`` to store none.
        extra: numbers, strings, lists and dicts of them, e.g. ``history=...``.
    """
    if config is not None:
        extra["config"] = config if isinstance(config, dict) else config.to_dict()
    path = Path(path)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        torch.save({"model": model.state_dict(), **extra}, partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def load_checkpoint(path: str | os.PathLike, model: nn.Module, map_location=None) -> dict:
    """Load a checkpoint written by :func:`save_checkpoint` into ``model``.

    Uses ``torch.load(..., weights_only=True)``, which refuses to run code stored
    in the file. Returns the checkpoint's other values (``config`` as a plain dict).
    """
    if map_location is None:
        map_location = next(model.parameters()).device
    checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    model.load_state_dict(checkpoint.pop("model"))
    return checkpoint


def describe_machine() -> str:
    """One line naming what runs the code: the processor architecture, the CPU kernels
    PyTorch picked (``AVX2``, ``AVX512``, ``DEFAULT``, ...), its threads, the torch version
    and the GPU if there is one.

    Each chapter prints it first, so that a reader sees where the stored outputs came
    from: float results differ in their last digits between CPU kernels and thread counts.
    """
    import platform

    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (
        f"{platform.machine()}, CPU kernels {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, "
        f"Python {platform.python_version()}{gpu}"
    )


def glue(name: str, value) -> None:
    """Hand ``value`` to the chapter's text, where ``{glue:text}`name:.1f``` shows it.

    The book's prose quotes computed results through this (myst-nb's ``glue``), so the
    text always shows what the reader's own run printed. NumPy and one-element torch
    values are glued as plain Python numbers, so that a format such as ``:.1f`` applies.
    Where myst-nb is not installed (Colab, a plain Jupyter) it does nothing. Glue only in
    cells tagged ``nbval-ignore-output``: the glued value is an output, and nbval compares
    outputs.
    """
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return
    if isinstance(value, (np.generic, torch.Tensor)):
        # myst-nb formats the repr: np.float64(0.5) would not read as a number.
        value = value.item()
    myst_glue(name, value, display=False)


def to_numpy(x, name: str = "x") -> np.ndarray:
    """A tensor (any device, grad or not), array or nested list as a NumPy array.

    Tensors are detached and copied to the CPU; all but ``bool`` ones become float32.

    Raises:
        ValueError: for a tensor on the ``meta`` device, which holds no values.
    """
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            raise ValueError(f"{name} is on the meta device and holds no values to plot")
        x = x.detach().cpu()
        if x.dtype != torch.bool:
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def use_sharp_figures(formats=None) -> bool:
    """Have Jupyter show matplotlib figures sharp on HiDPI screens (``import mhbook`` calls it).

    In an IPython kernel (Jupyter, Colab, the book's build) this sets the inline backend's
    ``figure_formats``, as ``%config InlineBackend.figure_formats = ['retina']`` would: each
    figure is stored as a PNG of twice the resolution, with its display size in the output's
    metadata. It imports neither matplotlib nor IPython: outside a running IPython it does
    nothing. Before pyplot is imported the setting waits in the backend's configuration.

    Args:
        formats: figure formats, e.g. ``("retina",)`` or ``("png",)``; default
            ``$MHBOOK_FIGURE_FORMATS`` (comma-separated) or ``retina``. Keep PNG-based
            formats: nbval compares SVG outputs as text, PNG ones not.

    Returns:
        Whether an IPython shell was found and configured.
    """
    if formats is None:
        formats = os.environ.get("MHBOOK_FIGURE_FORMATS", "retina").split(",")
    formats = {f.strip() for f in formats if f.strip()}
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not formats:
        return False
    try:
        from matplotlib_inline.config import InlineBackend  # imports no matplotlib
    except ImportError:
        return False
    # The singleton the inline backend reads when pyplot is imported; once the backend
    # is active, setting the trait re-registers the formatters at once.
    InlineBackend.instance(parent=shell).figure_formats = formats
    return True
