"""The argument checks every module shares: one place for each rule and its message.

Bad input gets an error that names the argument, what it expects and what it got, e.g.
``num_heads must be an int >= 1, got 0 (int)``. Checks read shapes, dtypes and devices,
and read values only of CPU tensors, where that waits for nothing: on an accelerator a
value check would wait for the device at every call.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

__all__ = [
    "check_int",
    "check_number",
    "check_bool",
    "check_choice",
    "check_module",
    "check_tokens",
    "check_positions",
    "check_integers",
    "check_heads",
    "check_window",
    "check_features",
    "autocasting",
]


def check_int(name: str, value: Any, minimum: int = 1, *, optional: bool = False) -> None:
    """``value`` must be an int ``>= minimum`` (or ``None`` when ``optional``); bools are
    refused, although Python counts them as ints."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        allowed = " or None" if optional else ""
        raise ValueError(
            f"{name} must be an int >= {minimum}{allowed}, got {value!r} ({type(value).__name__})"
        )


def check_number(
    name: str,
    value: Any,
    low: float,
    high: float | None = None,
    *,
    high_inclusive: bool = False,
    low_inclusive: bool = True,
) -> None:
    """``value`` must be a real number (not a bool, not NaN) in the range from ``low`` to
    ``high`` (``None``: no upper bound); by default ``[low, high)``."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value
    if ok:
        ok = value >= low if low_inclusive else value > low
    if ok and high is not None:
        ok = value <= high if high_inclusive else value < high
    if not ok:
        left = "[" if low_inclusive else "("
        if high is None:
            limit = f">= {low}" if low_inclusive else f"> {low}"
        else:
            limit = f"in {left}{low}, {high}{']' if high_inclusive else ')'}"
        raise ValueError(f"{name} must be a number {limit}, got {value!r}")


def check_bool(name: str, value: Any) -> None:
    """``value`` must be ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def check_choice(name: str, value: Any, choices: tuple) -> None:
    """``value`` must be one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_module(name: str, value: Any) -> None:
    """``value`` must be ``None`` or an ``nn.Module``."""
    if value is not None and not isinstance(value, torch.nn.Module):
        raise TypeError(f"{name} must be None or an nn.Module, got {type(value).__name__}")


def autocasting(device: torch.device) -> bool:
    """Whether autocast is on for ``device``: PyTorch then casts for the matrix products,
    so inputs of another dtype than the weights are fine."""
    return torch.amp.is_autocast_available(device.type) and torch.is_autocast_enabled(device.type)


def check_features(
    name: str,
    x: Any,
    size: int,
    weight: torch.Tensor,
    *,
    layout: str = "(batch, length, {size_name}={size})",
    size_name: str = "d_model",
) -> None:
    """``x`` must be a ``(batch, length, size)`` tensor on ``weight``'s device and of its
    dtype (any dtype while autocast is on): the input of a layer whose weight is ``weight``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.size(-1) != size:
        expected = layout.format(size_name=size_name, size=size)
        raise ValueError(f"{name} must have shape {expected}, got {tuple(x.shape)}")
    if x.device != weight.device:
        raise ValueError(
            f"{name} is on {x.device} but the module is on {weight.device}; "
            f"move one of them (e.g. {name}.to({str(weight.device)!r}))"
        )
    if x.dtype != weight.dtype and not autocasting(x.device):
        raise TypeError(
            f"{name} has dtype {x.dtype} but the module's weights are {weight.dtype}; "
            f"convert one of them (e.g. {name}.to({weight.dtype}))"
        )


def check_tokens(
    name: str,
    tokens: Any,
    vocab_size: int | None = None,
    device: torch.device | None = None,
) -> None:
    """``tokens`` must be a ``(batch, length)`` tensor of integer ids; on ``device`` (the
    model's embedding) when given; with ``vocab_size``, ids in ``[0, vocab_size)``, which
    is read only on the CPU."""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(tokens).__name__}")
    if tokens.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, length), got {tuple(tokens.shape)}")
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
    if device is not None and tokens.device != device:
        raise ValueError(
            f"{name} are on {tokens.device} but the model is on {device}; "
            f"move them (e.g. {name}.to({str(device)!r}))"
        )
    if vocab_size is not None and tokens.device.type == "cpu" and tokens.numel() > 0:
        low, high = (int(v) for v in torch.aminmax(tokens))
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{name} holds token ids from {low} to {high}, but the vocabulary has "
                f"{vocab_size} tokens: ids must be in [0, {vocab_size - 1}]"
            )


def check_integers(name: str, value: Any) -> None:
    """``value`` must be a tensor of integers (positions, indices): not floating-point,
    complex or bool."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got dtype {value.dtype}")


def check_positions(positions: Any, batch: int, length: int, device: torch.device) -> None:
    """``positions`` must be an integer tensor ``(T,)`` or ``(batch, T)`` (one row of
    positions per sequence, e.g. a left-padded batch) on ``device``."""
    check_integers("positions", positions)
    if positions.shape not in ((length,), (batch, length)):
        raise ValueError(
            f"positions must have shape (T,) = ({length},) or (batch, T) = ({batch}, {length}), "
            f"got {tuple(positions.shape)}"
        )
    if positions.device != device:
        raise ValueError(f"positions must be on x's device {device}, got {positions.device}")


def check_heads(
    num_heads: int,
    num_kv_heads: int | None = None,
    d_model: int | None = None,
    d_head: int | None = None,
    *,
    prefix: str = "",
) -> None:
    """The heads' rules: ``num_kv_heads`` divides ``num_heads`` (each key/value head serves
    a group of query heads), and without a fixed ``d_head`` ``num_heads`` divides
    ``d_model``. ``prefix`` names the owner of the arguments (``"ModelConfig."``)."""
    if num_kv_heads is not None and num_heads % num_kv_heads != 0:
        raise ValueError(
            f"{prefix}num_heads must be divisible by num_kv_heads (each key/value head serves "
            f"a group of query heads): got num_heads={num_heads}, num_kv_heads={num_kv_heads}"
        )
    if d_model is not None and d_head is None and d_model % num_heads != 0:
        raise ValueError(
            f"{prefix}d_model must be divisible by num_heads (or give d_head): got "
            f"d_model={d_model}, num_heads={num_heads}"
        )


def check_window(window: Any, sinks: Any, *, prefix: str = "") -> None:
    """A sliding ``window`` (``None`` or an int >= 1) and its attention ``sinks`` (an int
    >= 0): sinks need a window, they are the first keys a query sees besides its window."""
    check_int(f"{prefix}window", window, 1, optional=True)
    check_int(f"{prefix}sinks", sinks, 0)
    if sinks and window is None:
        raise ValueError(
            f"{prefix}sinks={sinks} needs a sliding window: the sinks are the first keys "
            "that a query sees besides its window (without one it sees every key)"
        )
