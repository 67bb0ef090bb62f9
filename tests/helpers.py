"""Small helpers shared by the tests (imported as ``helpers``): seeded inputs, the
tolerances of float64 comparisons, and Hugging Face's additive masks.

The Hugging Face attention layers themselves (Llama, Mistral, DeepSeek-V3, random weights)
are fixtures of ``conftest.py``: they skip a test when ``transformers`` is missing.
"""

import contextlib
import json
import re

import torch

#: float64, the same arithmetic in another order or on another path (cache, fused kernel).
EXACT = {"rtol": 0, "atol": 1e-12}
#: float64 through many operations done otherwise: transformers' code (its own projections
#: and rotary embedding), or a whole model stepped through its KV cache.
CLOSE = {"rtol": 0, "atol": 1e-10}
#: float64 through RoPE at other positions of the same distances (attention with sinks
#: rotates its recent keys at their columns, not its slots): RoPE's angles are float32, as
#: in transformers, so the scores agree to the float32 rounding of the angles.
ANGLES = {"rtol": 0, "atol": 1e-8}


def seeded(*shape, seed=0, dtype=torch.float64):
    """A seeded standard normal tensor (float64 unless told), the same on every run."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def randn(*shape, dtype, seed):
    """A seeded random tensor that requires grad."""
    return seeded(*shape, seed=seed, dtype=dtype).requires_grad_()


def upstream(output, seed=99):
    """A seeded random upstream gradient shaped like ``output``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(output.shape, generator=g, dtype=output.dtype)


def additive_mask(allowed, dtype=torch.float64):
    """mhbook's bool mask (``True`` = may attend) as the float mask of Hugging Face's
    attention layers: 0 where allowed, ``-inf`` elsewhere, with the head dimension
    ``(batch, 1, T, S)`` they expect (a ``(T, S)`` mask gets ``(1, 1, T, S)``)."""
    while allowed.dim() < 4:
        allowed = allowed.unsqueeze(0)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, float("-inf"))


def recorded_seconds(path) -> float:
    """How long the committed run of a notebook took: the sum of its code cells' times, from
    the timestamps nbclient stored in their metadata (``inf`` without any). Cell by cell, so
    that a cell run again on its own later does not stretch the total."""
    import datetime
    import json
    from pathlib import Path

    def moment(stamp: str) -> datetime.datetime:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    total, timed = 0.0, False
    for cell in json.loads(Path(path).read_text(encoding="utf-8"))["cells"]:
        timing = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in timing and "shell.execute_reply" in timing:
            start, end = timing["iopub.execute_input"], timing["shell.execute_reply"]
            total += (moment(end) - moment(start)).total_seconds()
            timed = True
    return total if timed else float("inf")


@contextlib.contextmanager
def head_zeroed(layer, head: int, width: int):
    """The reference for ``head_mask``: inside the block, head ``head``'s slice of the merged
    heads (``width`` features each) is zeroed just before ``layer.W_o``, by a forward
    pre-hook, so the layer's output is that of the layer without the head."""

    def zero_head(module, args):
        (merged,) = args
        merged = merged.clone()
        merged[..., head * width : (head + 1) * width] = 0
        return (merged,)

    handle = layer.W_o.register_forward_pre_hook(zero_head)
    try:
        yield layer
    finally:
        handle.remove()


def stepped(lm, tokens, chunks=(1,)):
    """Logits of `tokens` fed to `lm` in chunks of these sizes (cycled), with its cache."""
    cache, outputs, start, i = lm.new_cache(), [], 0, 0
    while start < tokens.size(1):
        size = chunks[i % len(chunks)]
        outputs.append(lm(tokens[:, start : start + size], cache=cache))
        start, i = start + size, i + 1
    return torch.cat(outputs, dim=1), cache


# -- the explorers' HTML ----------------------------------------------------------------------
def explorer_data(html: str) -> dict:
    """The JSON an explorer hands to its JavaScript."""
    pattern = r'<script type="application/json" class="mhbook-explorer-data">(.*?)</script>'
    return json.loads(re.search(pattern, html, re.S).group(1))


def root_id(html: str) -> str:
    return re.search(r'class="mhbook-explorer" id="([^"]+)"', html).group(1)


def assert_self_contained(html: str) -> None:
    """No external resource, one script, unique ids, every control labelled, SVGs are images."""
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", html)
    assert "http" not in html  # no external script, style, font or namespace
    assert html.count("<script>") == 1
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "ids repeat inside one explorer"
    labelled = set(re.findall(r'<label[^>]* for="([^"]+)"', html))
    for control in re.findall(r"<(?:input|select|button)\b[^>]*>", html):
        if "aria-label=" in control:
            continue
        if control.startswith("<button"):  # a button is labelled by its text
            continue
        cid = re.search(r'\bid="([^"]+)"', control)
        assert cid and cid.group(1) in labelled, f"control without a label: {control}"
    for tag in re.findall(r"<svg\b[^>]*>", html):
        assert 'role="img"' in tag and re.search(r'aria-label="[^"]{10,}"', tag), tag


def short_validation(data, windows: int = 20):
    """``data`` (a :class:`mhbook.tasks.shakespeare.TextData`) with only its first ``windows``
    validation windows: a benchmark's validation loss over all 111,540 characters is most of
    the time of a test that trains for two steps."""
    from mhbook.tasks.shakespeare import TextData

    valid = data.ids["valid"][: windows * data.context + 1]
    return TextData(data.ids["train"], valid, data.context, tokenizer=data.tokenizer)
