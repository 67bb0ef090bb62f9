"""Shared fixtures: a dtype parameter with matching tolerances, a way to compare mhbook's
parameters (or their gradients) with those of PyTorch's layers, and Hugging Face's
attention layers (Llama, Mistral, DeepSeek-V3) with random weights.

Plain functions and constants the tests import (seeded inputs, the float64 tolerances
``EXACT`` and ``CLOSE``, Hugging Face's additive masks) are in ``helpers.py``."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # make test runs three workers on two cores, others often a chapter's kernel: one
    # thread each, so that no test's threads wait for cores the other worker holds.
    torch.set_num_threads(1)

# make test hands whole files to three xdist workers (--dist loadfile). xdist would order
# them by their number of tests (--no-loadscope-reorder turns that off); the longest files
# start first, so that the short ones fill the end of the run, where the workers would
# otherwise wait for one long file. How long a file takes is not kept in a table here: a
# chapter's is that of its own committed run (chapters/conftest.py marks its cells
# `slow(seconds=...)` from the timestamps nbclient stored), and a slow test file says so
# itself with `pytestmark = pytest.mark.slow(seconds=...)`. `pytest -m "not slow"` leaves
# them all out, for a quick run (about a minute on 2 cores).


def slow_seconds(item) -> float:
    """The rough seconds of ``item``'s file: its ``slow`` mark's, or 0."""
    mark = item.get_closest_marker("slow")
    return 0.0 if mark is None else float(mark.kwargs.get("seconds", 60))


def pytest_collection_modifyitems(config, items) -> None:
    """Put the files marked ``slow`` first, longest first (a stable sort)."""
    items.sort(key=slow_seconds, reverse=True)


def pytest_sessionstart(session) -> None:
    session.config._mhbook_started = time.time()


def pytest_terminal_summary(terminalreporter, config) -> None:
    """The editions' statistics, where tests/book/test_editions.py wrote them in this run (on
    whichever worker: the summary is the controller's)."""
    stats = Path(__file__).resolve().parents[1] / "_build" / "editions-stats.txt"
    started = getattr(config, "_mhbook_started", None)
    if started is not None and stats.is_file() and stats.stat().st_mtime >= started:
        terminalreporter.section("editions: translated, fuzzy and empty messages")
        terminalreporter.write(stats.read_text(encoding="utf8"))


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


# -- Hugging Face's attention layers, random weights (nothing is downloaded) ----------------
# Every one is float64-ready and uses PyTorch's SDPA: transformers' "eager" path takes the
# softmax in float32, SDPA keeps float64, so that comparisons can be tight (helpers.CLOSE).
# mhbook's copy of a Llama or Mistral layer is mhbook.attention_from_hf(layer); test_multihead
# checks attention_from_hf against the weights mapped by hand.


@pytest.fixture
def hf_llama_attention():
    """``make(num_kv_heads, *, d_model=32, num_heads=4, rope_theta=10000.0, bias=False)``
    gives ``(config, LlamaAttention, LlamaRotaryEmbedding)``: float64, eval mode, the
    weights of ``torch.manual_seed(0)``."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    def make(num_kv_heads, *, d_model=32, num_heads=4, rope_theta=10000.0, bias=False):
        config = transformers.LlamaConfig(
            hidden_size=d_model,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            attention_bias=bias,
            attention_dropout=0.0,
            rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
            attn_implementation="sdpa",
        )
        torch.manual_seed(0)
        layer = LlamaAttention(config, layer_idx=0).double().eval()
        return config, layer, LlamaRotaryEmbedding(config)

    return make


@pytest.fixture
def hf_mistral_attention():
    """``make(window, *, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8)`` gives
    ``(config, MistralAttention, MistralRotaryEmbedding)`` with ``sliding_window=window``:
    float64, eval mode, the weights of ``torch.manual_seed(0)``."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.mistral.modeling_mistral import (
        MistralAttention,
        MistralRotaryEmbedding,
    )

    def make(window, *, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8):
        config = transformers.MistralConfig(
            hidden_size=d_model,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=head_dim,
            sliding_window=window,
            num_hidden_layers=1,
            attention_dropout=0.0,
            attn_implementation="sdpa",
        )
        torch.manual_seed(0)
        layer = MistralAttention(config, layer_idx=0).double().eval()
        return config, layer, MistralRotaryEmbedding(config)

    return make


@pytest.fixture
def hf_deepseek_attention():
    """``make(dtype, *, q_lora_rank=None, rope_interleave=True, attention_bias=False)``
    gives ``(config, DeepseekV3Attention, DeepseekV3RotaryEmbedding)``: ``d_model=32``, 4
    heads, ``kv_lora_rank=12``, heads of 8 + 6 (RoPE) features and values of 10, eval mode,
    random weights of ``torch.manual_seed(0)`` (not Hugging Face's init, which may be zeros)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

    def make(dtype, *, q_lora_rank=None, rope_interleave=True, attention_bias=False):
        config = transformers.DeepseekV3Config(
            vocab_size=50,
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=4,
            kv_lora_rank=12,
            q_lora_rank=q_lora_rank,
            qk_nope_head_dim=8,
            qk_rope_head_dim=6,
            v_head_dim=10,
            rope_interleave=rope_interleave,
            attention_bias=attention_bias,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            attn_implementation="sdpa",
        )
        torch.manual_seed(0)
        layer = deepseek.DeepseekV3Attention(config, layer_idx=0).to(dtype).eval()
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn_like(p) * 0.3)
        return config, layer, deepseek.DeepseekV3RotaryEmbedding(config)

    return make


@pytest.fixture(scope="module")
def chromium():
    """Chromium alone, for the tests that open a standalone page of one panel
    (``tests/viz/test_browser_passages.py``, ``tests/viz/test_browser_live_lm.py``)."""
    from browser import launch_chromium

    yield from launch_chromium()
