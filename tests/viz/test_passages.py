"""Tests of the passage explorer: what mhbook.viz.attention_records.passage_attention records (the
weights
of every layer and head of a decoder-only model, against a hand computation), and what
mhbook.viz.explorers.passages makes of them: the packed payload the JavaScript reads and the HTML.
(In a browser: tests/viz/test_browser_passages.py.)"""

from __future__ import annotations

import math
import re

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import assert_self_contained, explorer_data

import mhbook  # noqa: E402
from mhbook.training.shakespeare_lm import SHAKESPEARE_MODEL  # noqa: E402
from mhbook.viz import attention_records as analysis  # noqa: E402
from mhbook.viz import explorers
from mhbook.viz.explorers import passages, svg  # noqa: E402


def root_id(html: str) -> str:
    return re.search(r'class="mhbook-explorer mhbook-passages" id="([^"]+)"', html).group(1)


#: Part V's Llama shape (pre-norm RMSNorm, SwiGLU, no biases, RoPE), smaller and with one
#: key/value head per query head.
LLAMA = SHAKESPEARE_MODEL.replace(d_model=32, num_heads=4, num_kv_heads=None, num_layers=2, d_ff=64)
VOCAB, T = 20, 9


@pytest.fixture(scope="module")
def model():
    mhbook.set_seed(0)
    return mhbook.DecoderOnlyLM(LLAMA, VOCAB)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, VOCAB, (3, T), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.fixture(scope="module")
def weights(model, ids):
    return analysis.passage_attention(model, ids)


@torch.no_grad()
def _by_hand(model, ids) -> np.ndarray:
    """softmax(Q K^T / sqrt(d_head) + causal mask) per head, from each attention layer's input
    (caught by a hook on a plain forward), its own W_q and W_k and the model's rotary embedding."""
    inputs = []
    hooks = [
        block.self_attn.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
        for block in model.blocks
    ]
    try:
        model(torch.tensor(ids))
    finally:
        for hook in hooks:
            hook.remove()
    layers = []
    for block, x in zip(model.blocks, inputs):
        attn = block.self_attn
        B, n, _ = x.shape
        q = attn.W_q(x).view(B, n, attn.num_heads, attn.d_head).transpose(1, 2)
        k = attn.W_k(x).view(B, n, attn.num_heads, attn.d_head).transpose(1, 2)
        positions = torch.arange(n)
        q, k = model.rope(q, positions), model.rope(k, positions)  # the model's RoPE
        scores = q @ k.transpose(-1, -2) / math.sqrt(attn.d_head)
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        layers.append(torch.softmax(scores.masked_fill(future, -math.inf), dim=-1))
    return torch.stack(layers, dim=1).numpy()  # (P, L, H, T, T)


# ---- what the model does


def test_weights_of_every_layer_and_head(weights, ids):
    assert weights.shape == (3, 2, 4, T, T) and weights.dtype == np.float32
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)  # every row sums to 1
    assert not np.triu(weights, k=1).any()  # causal: nothing after the query
    assert (weights[..., np.tri(T, dtype=bool)] > 0).all()  # and something up to it


def test_weights_are_the_hand_computation(model, ids, weights):
    np.testing.assert_allclose(weights, _by_hand(model, ids), atol=1e-6)


def test_batches_eval_mode_and_inputs(model, ids, weights):
    model.train()
    try:
        again = analysis.passage_attention(model, torch.tensor(ids), batch_size=2)
        assert model.training  # restored
    finally:
        model.eval()
    np.testing.assert_allclose(again, weights, atol=1e-6)
    assert "passage_attention" not in explorers.__all__  # defined once, in attention_records


def test_ragged_passages_are_named(model):
    with pytest.raises(ValueError, match=r"one length T, got lengths \[3, 2\]"):
        analysis.passage_attention(model, [[1, 2, 3], [4, 5]])
    with pytest.raises(ValueError, match="at least one token"):
        analysis.passage_attention(model, [])


# ---- the payload


def test_payload_round_trip(weights):
    tokens = [list("abcdefgh\n")] * 3
    payload = passages.passage_payload(tokens, weights)
    assert (payload["numPassages"], payload["numLayers"], payload["numHeads"]) == (3, 2, 4)
    assert payload["length"] == T and payload["tokens"] == tokens
    decoded = passages.passage_payload_weights(payload)
    assert decoded.shape == weights.shape and decoded.dtype == np.uint8
    assert np.abs(decoded / 255 - weights).max() <= 1 / 510 + 1e-7
    np.testing.assert_array_equal(decoded, explorers.viewer.quantise(weights))
    broken = dict(payload, numHeads=5)
    with pytest.raises(ValueError, match="bytes"):
        passages.passage_payload_weights(broken)


def test_text_on_every_shade_reads(weights):
    """The text colour of each shade (black or white) contrasts at least 4.5:1 (WCAG AA)."""
    from matplotlib.colors import to_rgb

    def luminance(colour):
        c = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in to_rgb(colour)]
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]

    scale = passages.passage_payload([["a"] * T] * 3, weights)["scale"]
    assert scale["colours"] == list(svg.colour_table())
    for colour, text in zip(scale["colours"], scale["text"]):
        lighter, darker = sorted([luminance(colour), luminance(text)], reverse=True)
        assert (lighter + 0.05) / (darker + 0.05) >= 4.5, (colour, text)


def test_glyphs():
    assert passages.token_glyphs(" ") == "\u2423" and passages.token_glyphs("\n") == "\u21b5"
    assert passages.token_glyphs("a b\n") == "a\u2423b\u21b5"


# ---- the HTML


def test_html_is_self_contained_with_stable_ids(weights):
    tokens = [list("To be, or<\n")[:T]] * 3
    html = explorers.passage_explorer_html(
        tokens,
        weights,
        title="Heads <on> Shakespeare",
        head_labels={(1, 2): "previous"},
        caption="Point at a token.",
        layer=1,
        head=2,
    ).data
    assert_self_contained(html)
    uid = root_id(html)
    assert uid.startswith("mhbook-passages-")
    assert 'class="mhbook-explorer mhbook-passages"' in html
    for suffix in ("-passage", "-layer", "-head", "-text", "-title"):
        assert f'id="{uid}{suffix}"' in html
    assert "Heads &lt;on&gt; Shakespeare" in html and "Point at a token." in html
    assert '<option value="2" selected>3: previous</option>' in html
    data = explorer_data(html)
    payload = passages.passage_payload(tokens, weights)
    assert {k: data[k] for k in payload} == payload
    assert data["initial"] == {"passage": 0, "layer": 1, "head": 2}
    assert data["headLabels"][1][2] == "previous" and data["headLabels"][0] == [""] * 4
    for name in ("passages.js", "passages.css", "explorer.css", "viewer.css"):
        assert svg.static_text(name) in html
    other = explorers.passage_explorer_html(tokens, weights, title="again").data
    assert root_id(other) != uid  # a second explorer on the page gets its own ids


def test_html_names_bad_input(weights):
    tokens = [list("abcdefghi")] * 3
    with pytest.raises(ValueError, match=r"same number T > 0 of tokens, got \[9, 8, 9\]"):
        explorers.passage_explorer_html([tokens[0], tokens[0][:8], tokens[0]], weights, title="t")
    with pytest.raises(ValueError, match=r"\(P, L, H, T, T\) = \(2, L, H, 9, 9\).*\(3, 2, 4"):
        explorers.passage_explorer_html(tokens[:2], weights, title="t")
    with pytest.raises(ValueError, match=r"\(3, L, H, 9, 9\).*got \(3, 2, 4, 9\)"):
        explorers.passage_explorer_html(tokens, weights[..., 0], title="t")
    with pytest.raises(ValueError, match="at least one passage"):
        explorers.passage_explorer_html([], weights, title="t")
    with pytest.raises(ValueError, match=r"head must be in \[0, 4\), got 4"):
        explorers.passage_explorer_html(tokens, weights, title="t", head=4)
    with pytest.raises(ValueError, match=r"head_labels keys.*got \(2, 0\)"):
        explorers.passage_explorer_html(tokens, weights, title="t", head_labels={(2, 0): "x"})
