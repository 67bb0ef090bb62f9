"""Tests of the attention viewer of chapters 6 and 7: what mhbook.viz.attention_records records (the
model's side), and what mhbook.viz.explorers.viewer makes of it: the packed payload the JavaScript
reads, the HTML, and the ipywidgets twin.

A small untrained model stands in for the book's: the viewer must record what the model does,
whatever it does (an untrained model's translations even change when any head is removed).
"""

import json
import re

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import mhbook  # noqa: E402
from mhbook.tasks.numbers import (  # noqa: E402
    NumberTranslation,
    detokenize,
    sequence_loss,
    tokenize,
)
from mhbook.training.trainer import valid_loss  # noqa: E402
from mhbook.viz import attention_records as analysis  # noqa: E402
from mhbook.viz.explorers import svg, viewer  # noqa: E402

NUM_TEST = 24
THREADS_BEFORE = torch.get_num_threads()


@pytest.fixture(scope="module")
def model_and_data():
    data = NumberTranslation(num_train=300, num_valid=20, num_test=NUM_TEST, seed=0)
    mhbook.set_seed(0)
    config = mhbook.ModelConfig(d_model=16, num_heads=2, num_layers=2, d_ff=32, dropout=0.0)
    model = mhbook.Transformer(config, len(data.src_vocab), len(data.tgt_vocab)).eval()
    return model, data


@pytest.fixture(scope="module")
def view(model_and_data):
    model, data = model_and_data
    return analysis.viewer_data(model, data, batch_size=10, max_len=8)


@pytest.fixture(scope="module")
def payload(view):
    return viewer.viewer_payload(view)


def _set_head(model, name, i, num_heads=2):
    mask = torch.ones(num_heads)
    mask[i] = 0.0
    model.get_submodule(name).head_mask = mask


def test_records_every_number_layer_head_and_kind(view, model_and_data):
    model, data = model_and_data
    assert len(view) == NUM_TEST and view.numbers == data.numbers["test"]
    assert (view.num_layers, view.num_heads) == (2, 2)
    names = {analysis.layer_name(k, layer) for k in range(3) for layer in range(2)}
    assert names == {
        "encoder.blocks.0.self_attn",
        "encoder.blocks.1.self_attn",
        "decoder.blocks.0.self_attn",
        "decoder.blocks.1.self_attn",
        "decoder.blocks.0.cross_attn",
        "decoder.blocks.1.cross_attn",
    }
    for n in range(len(view)):
        S, T = len(view.src_tokens[n]), len(view.out_tokens[n])
        assert set(view.weights[n]) == names
        for name, w in view.weights[n].items():
            shape = (S, S) if name.startswith("encoder") else (T, T)
            if name.endswith("cross_attn"):
                shape = (T, S)
            assert w.shape == (2, *shape), (name, w.shape)
            np.testing.assert_allclose(w.sum(axis=-1), 1.0, atol=1e-5)
            if name.startswith("decoder") and name.endswith("self_attn"):
                assert not np.triu(w, k=1).any()  # causal: nothing above the diagonal
    assert len(view.heads) == 12 and len(set(view.heads)) == 12


def test_labels_are_the_tokens_and_the_greedy_translation(view, model_and_data):
    model, data = model_and_data
    english = [en for en, _ in data.pairs("test")]
    assert view.translation == data.translate(model, english, max_len=8)
    assert view.reference == [fr for _, fr in data.pairs("test")]
    for n, en in enumerate(english):
        assert view.src_tokens[n] == tokenize(en) + ["<eos>"]
        out = view.out_tokens[n]
        words = out[:-1] if out[-1] == "<eos>" else out
        assert "<eos>" not in words and len(out) <= 8
        # as data.translate writes it: without <pad> and <bos> (an untrained model writes them)
        assert detokenize(t for t in words if t not in ("<pad>", "<bos>")) == view.translation[n]
        assert view.tgt_in_tokens(n) == ["<bos>"] + out[:-1]


def test_weights_are_teacher_forced_on_the_models_own_output(view, model_and_data):
    """One sentence alone (no padding in its batch) gives the same weights, and the argmax of
    the teacher-forced logits is the greedy output itself."""
    model, data = model_and_data
    for n in (0, 5):
        src, lens = data.encode_source([view.english[n]])
        tgt_in = torch.tensor([data.tgt_vocab.encode(view.tgt_in_tokens(n))])
        with torch.no_grad(), mhbook.record_attention(model) as recorded:
            logits = model(src, tgt_in, lens)
        for name, w in recorded().items():
            np.testing.assert_allclose(view.weights[n][name], w[0].numpy(), atol=1e-5)
        assert data.tgt_vocab.decode(logits[0].argmax(-1)) == view.out_tokens[n]


def test_ablations_are_those_of_head_mask(view, model_and_data):
    model, data = model_and_data
    english = [en for en, _ in data.pairs("test")]
    for name, i in [("encoder.blocks.0.self_attn", 1), ("decoder.blocks.1.cross_attn", 0)]:
        _set_head(model, name, i)
        try:
            assert view.head_translation[name, i] == data.translate(model, english, max_len=8)
            assert view.head_loss[name, i] == pytest.approx(valid_loss(model, data, "test", 10))
        finally:
            model.get_submodule(name).head_mask = None
    assert view.loss == pytest.approx(valid_loss(model, data, "test", 10))
    # viewer_data leaves every head on, and PyTorch's thread count as it was
    assert torch.get_num_threads() == THREADS_BEFORE
    assert all(
        m.head_mask is None for m in model.modules() if isinstance(m, mhbook.MultiHeadAttention)
    )
    # an untrained model's translations change when a head goes
    assert any(view.head_translation[h] != view.translation for h in view.heads)


def test_the_first_numbers_are_those_of_the_whole_view(view, model_and_data):
    """viewer_data(first=n) records the first n numbers as the whole split's view does, and
    their losses as a split of those n alone would have them (chapter 7's viewer)."""
    model, data = model_and_data
    n = 10
    part = analysis.viewer_data(model, data, batch_size=10, max_len=8, first=n)
    assert len(part) == n and part.numbers == view.numbers[:n]
    assert part.translation == view.translation[:n] and part.reference == view.reference[:n]
    assert all(part.head_translation[h] == view.head_translation[h][:n] for h in view.heads)
    assert all(
        np.array_equal(part.weights[k][name], view.weights[k][name])
        for k in range(n)
        for name in view.weights[k]
    )
    # the loss of the first n alone: the cross-entropy of their teacher-forced predictions
    batch = next(iter(data.batches("test", n)))
    with torch.no_grad():
        logits = model(batch.src, batch.tgt_in, batch.src_valid_lens)
    assert part.loss == pytest.approx(
        sequence_loss(logits, batch.tgt_out, data.tgt_vocab.pad_id).item()
    )
    assert part.loss != pytest.approx(view.loss)
    all_of_it = analysis.viewer_data(model, data, batch_size=10, max_len=8, first=NUM_TEST)
    assert all_of_it.loss == pytest.approx(view.loss)
    assert all_of_it.head_loss == pytest.approx(view.head_loss)
    for bad in (0, NUM_TEST + 1, 2.0, True):
        with pytest.raises(ValueError, match=f"first must be an int from 1 to {NUM_TEST}"):
            analysis.viewer_data(model, data, first=bad)


def test_refuses_a_model_with_heads_removed(model_and_data):
    model, data = model_and_data
    _set_head(model, "encoder.blocks.0.self_attn", 0)
    try:
        with pytest.raises(ValueError, match="every head on"):
            analysis.viewer_data(model, data)
    finally:
        model.get_submodule("encoder.blocks.0.self_attn").head_mask = None


def test_the_viewer_only_draws_what_analysis_records():
    """The recording is model work, in mhbook.viz.attention_records, its one home: the viewer
    draws it and exports none of its names."""
    from mhbook.viz import explorers

    for name in ("KINDS", "layer_name", "ViewerData", "viewer_data"):
        assert name in analysis.__all__
        assert name not in viewer.__all__ and name not in explorers.__all__, name


def test_payload_decodes_to_the_recorded_weights(view, payload):
    decoded = viewer.payload_weights(payload)
    assert len(decoded) == len(view)
    for n in range(len(view)):
        for name, w in view.weights[n].items():
            q = decoded[n][name]
            assert q.dtype == np.uint8 and q.shape == w.shape
            np.testing.assert_array_equal(q, viewer.quantise(w))
            assert np.abs(q / 255 - w).max() <= 0.5 / 255 + 1e-7


def test_payload_text_and_heads(view, payload):
    text = viewer.payload_text(payload)
    assert text["src"] == view.src_tokens and text["out"] == view.out_tokens
    assert text["english"] == view.english and text["reference"] == view.reference
    assert text["translation"] == view.translation
    assert payload["numbers"] == view.numbers and payload["split"] == "test"
    assert (payload["numLayers"], payload["numHeads"]) == (2, 2)
    assert payload["scale"] == svg.colour_scale()
    assert payload["loss"] == view.loss and payload["exact"] == view.exact
    assert [k["name"] for k in payload["kinds"]] == [k.name for k in viewer.KINDS]
    assert len(payload["heads"]) == len(view.heads) == len(text["ablated"])
    for j, (head, info) in enumerate(zip(view.heads, payload["heads"])):
        assert (info["name"], info["head"]) == head
        assert info["name"] == viewer.layer_name(info["kind"], info["layer"])
        assert info["loss"] == view.head_loss[head]
        ablated = view.head_translation[head]
        right = sum(a == r for a, r in zip(ablated, view.reference))
        assert info["exact"] == right / len(view)
        # the JavaScript rebuilds the ablated translations from the changed ones
        changed = dict(text["ablated"][j])
        rebuilt = [changed.get(n, fr) for n, fr in enumerate(view.translation)]
        assert rebuilt == ablated
        assert all(view.translation[n] != fr for n, fr in changed.items())


def test_payload_weights_checks_its_size(payload):
    broken = dict(payload, text=viewer.pack(b'{"src": [], "out": []}'))
    with pytest.raises(ValueError, match="bytes"):
        viewer.payload_weights(broken)


def _data(html: str) -> dict:
    pattern = r'<script type="application/json" class="mhbook-explorer-data">(.*?)</script>'
    return json.loads(re.search(pattern, html, re.S).group(1))


def test_html_is_self_contained_with_stable_ids(view, payload):
    number = sorted(view.numbers)[3]
    remove = ("decoder.blocks.1.cross_attn", 1)
    html = viewer.attention_viewer_html(
        view, number=number, kind="encoder self-attention", layer=1, remove=remove
    ).data
    uid = re.search(r'class="mhbook-explorer mhbook-viewer" id="([^"]+)"', html).group(1)
    assert re.fullmatch(r"mhbook-viewer-\d+", uid)
    for suffix in ["-number", "-numbers", "-pick", "-kind", "-layer", "-head", "-maps"]:
        assert f'id="{uid}{suffix}"' in html
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", html)
    assert "http" not in html  # no external script, style, font or namespace
    assert html.count("<script>") == 1
    for name in ("heatmap.js", "viewer.js", "explorer.css", "viewer.css"):
        assert svg.static_text(name) in html
    data = _data(html)
    initial = data.pop("initial")
    assert data == json.loads(json.dumps(payload))
    j = view.heads.index(remove)
    assert initial == {
        "index": view.numbers.index(number),
        "kind": 0,
        "layer": 1,
        "head": -1,
        "remove": j,
    }
    assert html.count(f'name="{uid}-remove"') == len(view.heads) + 1
    assert re.search(rf'id="{uid}-remove-{j}" value="{j}" checked', html)
    assert '<option value="0" selected>encoder self-attention</option>' in html
    assert '<option value="1" selected>2</option>' in html  # layer 2
    assert '<option value="all" selected>all heads</option>' in html
    options = re.findall(rf'<select id="{uid}-pick".*?</select>', html, re.S)[0]
    values = [int(v) for v in re.findall(r'<option value="(\d+)"', options)]
    assert [view.numbers[v] for v in values] == sorted(view.numbers)
    # the ablation table says what removing each head costs, as the payload has it
    info = payload["heads"][j]
    drop = 100 * (payload["exact"] - info["exact"])
    assert f"exact match {viewer._points(-drop)} points" in html
    other = viewer.attention_viewer_html(view).data
    assert f'id="{uid}"' not in other  # a second viewer on the page gets its own ids


def test_html_checks_its_arguments(view):
    with pytest.raises(ValueError, match="kind must be one of"):
        viewer.attention_viewer_html(view, kind="self")
    with pytest.raises(ValueError, match="not in the test split"):
        viewer.attention_viewer_html(view, number=-1)
    with pytest.raises(ValueError, match="layer must be"):
        viewer.attention_viewer_html(view, layer=2)
    with pytest.raises(ValueError, match="remove must be"):
        viewer.attention_viewer_html(view, remove=("decoder.blocks.9.cross_attn", 0))


def test_points_are_signed():
    assert viewer._points(-5.24) == "\u22125.2"
    assert viewer._points(0.1) == "+0.1"
    assert viewer._points(-0.04) == viewer._points(0.0) == "0.0"


def test_ipywidgets_viewer_follows_its_controls(view):
    pytest.importorskip("ipywidgets")
    box = viewer.attention_viewer(view)
    number, kind, remove = box.children[0].children
    first = view.numbers.index(min(view.numbers))
    assert box.state == {"index": first, "kind": 2, "remove": -1}
    target = sorted(view.numbers)[-1]
    number.value = str(target)
    kind.value = 0
    remove.value = 3
    n = view.numbers.index(target)
    assert box.state == {"index": n, "kind": 0, "remove": 3}
    text = box.children[1].value
    assert view.english[n] in text and view.head_translation[view.heads[3]][n] in text
    number.value = "12"  # typing: not a number of the split yet, nothing changes
    assert box.state["index"] == n
