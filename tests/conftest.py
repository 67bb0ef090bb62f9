"""Shared fixtures: a dtype parameter with matching tolerances, and a way to compare
mhbook's parameters (or their gradients) with those of PyTorch's layers."""

from __future__ import annotations

import os
import re

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # make test runs three workers on two cores, others often a chapter's kernel: one
    # thread each, so that no test's threads wait for cores the other worker holds.
    torch.set_num_threads(1)

# make test hands whole files to three xdist workers (--dist loadfile). xdist would order
# them by their number of tests (--no-loadscope-reorder turns that off); these files take
# longest, so they start first and the short ones fill the end of the run, where the workers
# would otherwise wait for one long file. Seconds from `pytest --durations=0` with make
# test's options on 2 cores (2026-11); the rest keep pytest's order.
LONGEST_FIRST = {
    "tests/test_browser.py": 340,  # builds the book, then opens every page in Chromium
    "chapters/07-why-several-heads.ipynb": 250,
    "chapters/12-sliding-windows.ipynb": 95,
    "chapters/06-transformer.ipynb": 95,
    "chapters/11-position-inside-attention.ipynb": 87,
    "chapters/10-sharing-keys-and-values.ipynb": 80,
    "chapters/09-decoder-only.ipynb": 77,
    "chapters/08-efficient-attention.ipynb": 57,
    "tests/test_colab.py": 45,
    "chapters/13-heads-across-devices.ipynb": 34,
    "tests/test_parallel.py": 31,
}


def pytest_collection_modifyitems(config, items) -> None:
    """Put the files of :data:`LONGEST_FIRST` first, longest first (a stable sort)."""

    def seconds(item) -> float:
        return LONGEST_FIRST.get(item.path.relative_to(config.rootpath).as_posix(), 0)

    items.sort(key=seconds, reverse=True)


# float32 keeps about 7 digits; the two sides sum in different orders (fused kernels,
# packed projections), so allow a few ulps of the largest values. float64 must agree
# almost to the last digit.
TOLERANCES = {
    torch.float32: {"rtol": 1e-4, "atol": 1e-5},
    torch.float64: {"rtol": 1e-9, "atol": 1e-11},
}


@pytest.fixture(params=[torch.float32, torch.float64], ids=["float32", "float64"])
def dtype(request) -> torch.dtype:
    """Run a test in float32 and in float64."""
    return request.param


@pytest.fixture
def assert_close(dtype):
    """``assert_close(actual, expected)`` with the tolerances of the test's ``dtype``."""

    def check(actual, expected, what: str = "") -> None:
        torch.testing.assert_close(
            actual, expected, **TOLERANCES[dtype], msg=lambda m: f"{what}: {m}" if what else m
        )

    return check


def torch_layout(named: dict[str, torch.Tensor], separate: bool = False) -> dict[str, torch.Tensor]:
    """Rename mhbook tensors (parameters or their gradients) to PyTorch's layer names.

    ``W_q, W_k, W_v`` are concatenated into ``in_proj_weight``/``in_proj_bias``,
    ``W_o`` becomes ``out_proj``, ``cross_attn`` becomes ``multihead_attn``,
    ``ffn.linear1`` becomes ``linear1`` and ``addnorm1.norm`` becomes ``norm1``.
    With ``separate`` (PyTorch's layout when ``kdim``/``vdim`` differ from ``embed_dim``)
    the weights become ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight``; the
    biases are still packed into ``in_proj_bias``.
    """
    out = {}
    for name, tensor in named.items():
        match = re.fullmatch(r"(.*?)W_([qkvo])\.(weight|bias)", name)
        if match is None:
            new = re.sub(r"addnorm(\d)\.norm\.", r"norm\1.", name).replace("ffn.", "")
            out[new] = tensor
            continue
        prefix, which, kind = match.groups()
        prefix = prefix.replace("cross_attn.", "multihead_attn.")
        if which == "o":
            out[f"{prefix}out_proj.{kind}"] = tensor
        elif separate and kind == "weight":
            out[f"{prefix}{which}_proj_weight"] = tensor
        elif which == "q":
            parts = [named[f"{match.group(1)}W_{c}.{kind}"] for c in "qkv"]
            out[f"{prefix}in_proj_{kind}"] = torch.cat(parts)
    return out


@pytest.fixture(name="torch_layout")
def torch_layout_fixture():
    """The function :func:`torch_layout`."""
    return torch_layout


@pytest.fixture
def assert_same_grads(assert_close):
    """Check that an mhbook module and a PyTorch layer hold the same gradients."""

    def check(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
        reference = {n: p.grad for n, p in theirs.named_parameters()}
        separate = any(n.endswith("q_proj_weight") for n in reference)
        mine = torch_layout({n: p.grad for n, p in ours.named_parameters()}, separate)
        assert mine.keys() == reference.keys()
        for name, grad in reference.items():
            assert grad is not None and mine[name] is not None, name
            assert_close(mine[name], grad, f"gradient of {name}")

    return check
