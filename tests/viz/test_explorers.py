"""Tests of mhbook.viz.explorers: the HTML each explorer writes (its data, ids, labels, the first
picture) and, in headless Chromium on a local file, that its JavaScript computes what the
Python reference computes. (The same explorers in the built book:
tests/book/test_browser_panels.py.)"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import assert_self_contained, explorer_data, root_id  # noqa: E402

from mhbook.viz import explorers  # noqa: E402
from mhbook.viz.explorers import svg  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def drawn(locator, attribute: str = "data-weights") -> np.ndarray:
    return np.array(json.loads(locator.get_attribute(attribute)))


def _chromium(playwright):
    """Playwright's own Chromium, else a system Chromium; skip when there is none."""
    try:
        return playwright.chromium.launch()
    except Exception:
        pass
    for path in ["/usr/lib/chromium/chromium", shutil.which("chromium"), shutil.which("chrome")]:
        if path:
            try:
                return playwright.chromium.launch(executable_path=path, args=["--no-sandbox"])
            except Exception:
                continue
    pytest.skip("no Chromium for playwright")


@pytest.fixture(scope="module")
def chromium():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = _chromium(p)
        yield browser
        browser.close()


@pytest.fixture
def open_page(chromium, tmp_path):
    """open_page(*htmls) -> a page holding those explorers; checks no JS error, no request."""
    pages, errors, requests = [], [], []

    def open_(*htmls):
        page_file = tmp_path / f"page{len(pages)}.html"
        page_file.write_text(
            "<!doctype html><html lang='en'><meta charset='utf-8'><title>t</title><body>"
            + "".join(htmls)
            + "</body></html>"
        )
        page = chromium.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(page_file.as_uri())
        pages.append(page)
        return page

    yield open_
    for page in pages:
        page.close()
    assert errors == []
    assert all(url.startswith("file:") for url in requests)


# ---- explorers ch1/2/3/5

# -- chapter 1: queries, keys and values ----------------------------------------------

TOKENS = ["we", "watch", "movies", "after", "dinner"]
AXES = ["entertainment", "time", "food"]
X = np.array([[0.2, 0.2, 0.2], [1.5, 0.5, 0.0], [2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 1.0, 1.5]])
ASK = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # time words ask for ent.
EYE = np.eye(3)


def test_explorer_weights_and_presets():
    q, k = explorers.focus_preset(1, 3)
    assert q == [1.0, 2.0, 1.0] and k == [0.5, 1.0, 0.5]
    assert explorers.focus_preset(None, 3) == ([1.0] * 3, [1.0] * 3)
    w = explorers.explorer_weights(torch.tensor(X), q, k)
    Xt = torch.tensor(X)
    expected = torch.softmax((Xt * torch.tensor(q)) @ (Xt * torch.tensor(k)).T / 3**0.5, dim=-1)
    np.testing.assert_allclose(w, expected.numpy(), rtol=1e-6)
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    # the full-matrix reference agrees with the diagonal one, and W_value moves only outputs
    out, w_full = explorers.explorer_attention(X, np.diag(q), np.diag(k))
    np.testing.assert_allclose(w_full, w, rtol=1e-6)
    np.testing.assert_allclose(out, w @ X, rtol=1e-6)
    perm = EYE[[1, 0, 2]]
    out_perm, w_perm = explorers.explorer_attention(X, np.diag(q), np.diag(k), perm)
    np.testing.assert_allclose(w_perm, w)
    np.testing.assert_allclose(out_perm, out[:, [1, 0, 2]])
    # an asymmetric W_query: row "after" asks what "movies" asks
    _, w_ask = explorers.explorer_attention(X, ASK, EYE)
    np.testing.assert_allclose(w_ask[3], w_ask[2])


def test_presets_are_the_chapters_matrices():
    presets = explorers.explorer_presets(AXES, {"ask": (ASK, EYE)})
    assert list(presets) == [
        "identity",
        "focus on entertainment",
        "focus on time",
        "focus on food",
        "ask",
    ]
    q, k = explorers.focus_preset(0, 3)
    assert presets["focus on entertainment"] == [
        np.diag(q).tolist(),
        np.diag(k).tolist(),
        EYE.tolist(),
    ]
    assert presets["ask"] == [ASK.tolist(), EYE.tolist(), EYE.tolist()]
    with pytest.raises(ValueError, match=r"shape \(3, 3\)"):
        explorers.explorer_presets(AXES, {"bad": (np.eye(2), EYE)})


def test_attention_explorer_html_is_self_contained_with_stable_ids():
    html = explorers.attention_explorer_html(TOKENS, X, AXES, {"ask": (ASK, EYE)}).data
    assert_self_contained(html)
    uid = root_id(html)
    for suffix in ["-preset", "-reset", "-q-0-0", "-k-2-1", "-v-1-2", "-heatmap", "-output"]:
        assert f'id="{uid}{suffix}"' in html
    for token in TOKENS:
        assert f">{token}</text>" in html  # token labels on the heatmaps
    assert 'aria-label="W_query, row time, column entertainment"' in html
    other = explorers.attention_explorer_html(TOKENS, X, AXES).data
    assert root_id(other) != uid  # a second explorer on the page gets its own ids
    for name in ("heatmap.js", "charts.js", "attention.js", "explorer.css"):
        assert svg.static_text(name) in html


def test_attention_explorer_html_takes_its_numbers_from_python():
    html = explorers.attention_explorer_html(TOKENS, X, AXES, {"ask": (ASK, EYE)}).data
    data = explorer_data(html)
    assert data["X"] == X.tolist()
    presets = explorers.explorer_presets(AXES, {"ask": (ASK, EYE)})
    assert data["names"] == list(presets) and data["presets"] == list(presets.values())
    assert data["scale"] == {"colours": list(svg.colour_table()), "darkAbove": svg.DARK_ABOVE}
    # The first picture (identity matrices): every cell's colour and text from the same scale.
    out, weights = explorers.explorer_attention(X, EYE, EYE, EYE)
    lut = svg.colour_table()
    for i, j in np.ndindex(weights.shape):
        w = weights[i, j]
        cell = re.search(
            rf'<rect class="mhbook-explorer-cell" data-i="{i}" data-j="{j}"[^>]*>', html
        )
        assert f'fill="{lut[round(w * 100)]}"' in cell.group(0)
        value = re.search(
            rf'<text class="mhbook-explorer-value" data-i="{i}" data-j="{j}"[^>]*>{w:.2f}<',
            html,
        )
        assert f'fill="{svg.text_colour(w)}"' in value.group(0)
    shown = re.search(r'id="[^"]+-output"[^>]*data-weights=\'([^\']+)\'', html).group(1)
    np.testing.assert_allclose(json.loads(shown), out, atol=1e-4)


def test_attention_explorer_html_escapes_tokens_and_checks_shapes():
    html = explorers.attention_explorer_html(["<b>", "&"], X[:2], AXES).data
    assert "&lt;b&gt;" in html and "<b>" not in html
    # A preset name that tries to end the data's <script> early stays inside the JSON.
    html = explorers.attention_explorer_html(["a", "b"], X[:2], AXES, {"</script>x": (EYE, EYE)})
    assert html.data.count("</script>") == 2  # the data's and the code's
    assert explorer_data(html.data)["names"][-1] == "</script>x"
    with pytest.raises(ValueError, match="5 tokens"):
        explorers.attention_explorer_html(TOKENS, X[:3], AXES)
    with pytest.raises(ValueError, match="axis_names"):
        explorers.attention_explorer_html(TOKENS, X, AXES[:2])


def test_attention_widget_follows_its_controls():
    pytest.importorskip("ipywidgets")
    ui = explorers.attention_explorer(TOKENS, torch.tensor(X), AXES, {"ask": (ASK, EYE)})
    np.testing.assert_allclose(ui.weights, explorers.explorer_attention(X, EYE, EYE)[1])
    ui.preset.value = "focus on entertainment"
    assert [ui.boxes["q"][i][i].value for i in range(3)] == [2.0, 1.0, 1.0]
    assert [ui.boxes["k"][i][i].value for i in range(3)] == [1.0, 0.5, 0.5]
    np.testing.assert_allclose(
        ui.weights, explorers.explorer_weights(X, *explorers.focus_preset(0, 3))
    )
    ui.preset.value = "ask"
    ui.boxes["v"][0][1].value = 0.5
    Wv = EYE.copy()
    Wv[0, 1] = 0.5
    out, w = explorers.explorer_attention(X, ASK, EYE, Wv)
    np.testing.assert_allclose(ui.weights, w)
    np.testing.assert_allclose(ui.output, out)
    ui.reset.click()
    assert ui.preset.value == "identity" and ui.boxes["v"][0][1].value == 0.0
    np.testing.assert_allclose(ui.output, explorers.explorer_attention(X, EYE, EYE)[0])


def test_attention_explorer_redraws_in_a_browser(open_page):
    first = explorers.attention_explorer_html(TOKENS, X, AXES, {"ask": (ASK, EYE)}).data
    second = explorers.attention_explorer_html(TOKENS, X, AXES).data
    page = open_page(first, second)
    uid, other = page.eval_on_selector_all(".mhbook-explorer", "els => els.map(e => e.id)")
    heatmap, output = page.locator(f"#{uid}-heatmap"), page.locator(f"#{uid}-output")
    before = drawn(heatmap)
    page.locator(f"#{uid}-q-1-0").fill("3")  # time -> entertainment, off the diagonal
    Wq = EYE.copy()
    Wq[1, 0] = 3
    out, w = explorers.explorer_attention(X, Wq, EYE)
    np.testing.assert_allclose(drawn(heatmap), w, atol=1e-4)
    np.testing.assert_allclose(drawn(output), out, atol=1e-4)
    cells = heatmap.locator(".mhbook-explorer-value")
    shown = cells.evaluate_all("ts => ts.map(t => [t.textContent, t.getAttribute('fill')])")
    assert shown == [[f"{v:.2f}", svg.text_colour(v)] for v in w.ravel()]
    # the keyboard: arrow up on W_value's (entertainment, time) entry
    page.locator(f"#{uid}-v-0-1").focus()
    page.keyboard.press("ArrowUp")
    Wv = EYE.copy()
    Wv[0, 1] = 0.1
    out, w2 = explorers.explorer_attention(X, Wq, EYE, Wv)
    np.testing.assert_allclose(drawn(heatmap), w2, atol=1e-4)  # the weights ignore W_value
    np.testing.assert_allclose(drawn(output), out, atol=1e-4)
    page.select_option(f"#{uid}-preset", label="ask")
    assert page.locator(f"#{uid}-q-1-0").input_value() == "1"
    np.testing.assert_allclose(
        drawn(heatmap), explorers.explorer_attention(X, ASK, EYE)[1], atol=1e-4
    )
    page.locator(f"#{uid}-reset").press("Enter")
    assert page.locator(f"#{uid}-preset").input_value() == "0"
    np.testing.assert_allclose(drawn(heatmap), before)
    np.testing.assert_allclose(drawn(page.locator(f"#{other}-heatmap")), before)  # untouched


# -- chapter 2: the softmax, d_k and the temperature ----------------------------------

DIMS = [4, 16, 64, 256, 1024]


def _softmax_data(num_queries: int = 3, num_keys: int = 8):
    g = torch.Generator().manual_seed(0)
    raw = torch.stack(
        [
            (torch.randn(num_queries, 1, d, generator=g, dtype=torch.float64)
             @ torch.randn(num_queries, d, num_keys, generator=g, dtype=torch.float64))[:, 0]
            for d in DIMS
        ]
    )  # fmt: skip
    return raw, torch.randn(len(DIMS), num_queries, num_keys, generator=g, dtype=torch.float64)


def test_softmax_stats_match_the_closed_forms():
    raw, up = _softmax_data()
    st = explorers.softmax_stats(raw[2, 0], up[2, 0], 64, scaled=True, temperature=0.5)
    s = raw[2, 0] / 8 / 0.5
    a = torch.softmax(s, -1)
    J = torch.diag(a) - torch.outer(a, a)
    np.testing.assert_allclose(st["weights"], a.numpy(), rtol=1e-6)
    np.testing.assert_allclose(st["jacobian_norm"], J.norm().item(), rtol=1e-6)
    np.testing.assert_allclose(st["jacobian_max"], J.abs().max().item(), rtol=1e-6)
    g = up[2, 0]
    np.testing.assert_allclose(st["grad_norm"], (a * (g - (a * g).sum())).norm().item(), rtol=1e-6)
    np.testing.assert_allclose(st["entropy"], -(a * a.log()).sum().item(), rtol=1e-6)
    # raw scores at d_k = 1024 saturate: a near one-hot row passes back almost nothing
    cold = explorers.softmax_stats(raw[-1, 0], up[-1, 0], 1024, scaled=False)
    warm = explorers.softmax_stats(raw[-1, 0], up[-1, 0], 1024, scaled=True)
    assert cold["jacobian_norm"] < 0.1 * warm["jacobian_norm"]
    with pytest.raises(ValueError, match="temperature"):
        explorers.softmax_stats(raw[0, 0], up[0, 0], 4, temperature=0.0)


def test_softmax_explorer_html():
    raw, up = _softmax_data()
    html = explorers.softmax_explorer_html(DIMS, raw, up, start=1).data
    assert_self_contained(html)
    uid = root_id(html)
    assert uid.startswith("mhbook-softmax-")
    for suffix in ["-dk", "-temperature", "-query", "-scaled", "-weights", "-norms", "-readouts"]:
        assert f'id="{uid}{suffix}"' in html
    data = explorer_data(html)
    assert data["dims"] == DIMS
    np.testing.assert_allclose(data["raw"], raw.numpy(), atol=1e-9)
    first = json.loads(re.search(r"data-values='([^']+)'", html).group(1))
    want = explorers.softmax_stats(raw[1, 0], up[1, 0], 16)["weights"]
    np.testing.assert_allclose(first, want, atol=1e-4)  # the first picture, before any JS
    assert root_id(explorers.softmax_explorer_html(DIMS, raw, up).data) != uid
    with pytest.raises(ValueError, match="num_queries"):
        explorers.softmax_explorer_html(DIMS, raw[:, 0], up[:, 0])


def test_softmax_widget_follows_its_controls():
    pytest.importorskip("ipywidgets")
    raw, up = _softmax_data()
    ui = explorers.softmax_explorer(DIMS, raw, up)
    ui.d_k.value, ui.scaled.value, ui.query.value, ui.temperature.value = 1024, False, 2, 2.0
    want = explorers.softmax_stats(raw[-1, 2], up[-1, 2], 1024, False, 2.0)
    assert ui.stats == want


def test_softmax_explorer_redraws_in_a_browser(open_page):
    raw, up = _softmax_data()
    page = open_page(explorers.softmax_explorer_html(DIMS, raw, up, start=0).data)
    uid = page.eval_on_selector(".mhbook-explorer", "e => e.id")
    readouts = page.locator(f"#{uid}-readouts")
    bars = page.locator(f"#{uid}-weights")
    before = bars.inner_html()
    page.locator(f"#{uid}-dk").focus()
    page.keyboard.press("End")  # d_k = 1024
    page.locator(f"#{uid}-scaled").press("Space")  # untick: raw scores
    page.locator(f"#{uid}-query").fill("2")
    page.locator(f"#{uid}-temperature").fill("0.5")
    assert bars.inner_html() != before
    shown = json.loads(readouts.get_attribute("data-stats"))
    want = explorers.softmax_stats(raw[-1, 2], up[-1, 2], 1024, scaled=False, temperature=0.5)
    for name, value in want.items():
        np.testing.assert_allclose(shown[name], value, rtol=1e-5, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(drawn(bars, "data-values"), want["weights"], atol=1e-4)


# -- chapter 3: the mask builder --------------------------------------------------------

SCORES = torch.randn(6, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_explorer_mask_matches_the_library():
    from mhbook import causal_mask, padding_mask

    m = explorers.explorer_mask(3, 5, 4, "bottom-right")
    assert torch.equal(m, causal_mask(3, 5) & padding_mask(torch.tensor([4]), 5)[0, 0])
    assert torch.equal(explorers.explorer_mask(3, 5, 5, "top-left"), torch.ones(3, 5).tril().bool())
    assert (
        explorers.explorer_mask(3, 5, 2, "none").tolist() == [[True, True, False, False, False]] * 3
    )
    wide = explorers.explorer_mask(6, 4, 4, "bottom-right")  # Lq > Lk: two rows see no key
    assert wide.any(-1).tolist() == [False, False, True, True, True, True]
    w = explorers.masked_weights(SCORES[:6, :4], wide)
    assert (w[:2] == 0).all() and np.allclose(w[2:].sum(-1), 1)
    assert not np.isnan(w).any()
    s = SCORES[:6, :4].masked_fill(~wide, float("-inf"))[2:]
    np.testing.assert_allclose(w[2:], torch.softmax(s, -1).numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="causal"):
        explorers.explorer_mask(2, 2, 2, "diagonal")


def test_mask_explorer_html():
    html = explorers.mask_explorer_html(SCORES, 4, 6, 5, "top-left").data
    assert_self_contained(html)
    uid = root_id(html)
    assert uid.startswith("mhbook-masks-")
    for suffix in ["-lq", "-lk", "-valid", "-causal", "-mask", "-weights"]:
        assert f'id="{uid}{suffix}"' in html
    mask = explorers.explorer_mask(4, 6, 5, "top-left")
    shown = json.loads(re.search(r'-mask"[^>]*data-weights=\'([^\']+)\'', html).group(1))
    assert np.array(shown)[:4, :6].tolist() == mask.double().tolist()
    assert ">True</text>" in html and ">False</text>" in html
    # rows 4 and 5 are laid out for larger shapes but hidden
    assert re.search(r'class="mhbook-explorer-query" data-i="5"[^>]*visibility="hidden"', html)
    assert root_id(explorers.mask_explorer_html(SCORES).data) != uid


def test_mask_widget_follows_its_controls():
    pytest.importorskip("ipywidgets")
    ui = explorers.mask_explorer(SCORES)
    ui.lq.value, ui.lk.value, ui.causal.value = 6, 4, "bottom-right"
    want = explorers.explorer_mask(6, 4, 4, "bottom-right")
    assert torch.equal(ui.mask, want) and (ui.weights[:2] == 0).all()


def test_mask_explorer_redraws_in_a_browser(open_page):
    page = open_page(explorers.mask_explorer_html(SCORES, 4, 6).data)
    uid = page.eval_on_selector(".mhbook-explorer", "e => e.id")
    mask_svg, weights_svg = page.locator(f"#{uid}-mask"), page.locator(f"#{uid}-weights")
    before = mask_svg.inner_html()
    page.locator(f"#{uid}-lq").fill("6")
    page.locator(f"#{uid}-lk").focus()
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")  # Lk = 4 < Lq = 6, bottom-right
    assert mask_svg.inner_html() != before
    want = explorers.explorer_mask(6, 4, 4, "bottom-right")
    assert drawn(mask_svg).tolist() == want.double().tolist()
    np.testing.assert_allclose(
        drawn(weights_svg), explorers.masked_weights(SCORES[:6, :4], want), atol=1e-4
    )
    assert "no key for q0, q1" in weights_svg.locator(".mhbook-explorer-subtitle").text_content()
    page.locator(f"#{uid}-valid").fill("2")
    page.select_option(f"#{uid}-causal", "top-left")
    want = explorers.explorer_mask(6, 4, 2, "top-left")
    assert drawn(mask_svg).tolist() == want.double().tolist()
    np.testing.assert_allclose(
        drawn(weights_svg), explorers.masked_weights(SCORES[:6, :4], want), atol=1e-4
    )
    hidden = mask_svg.locator(".mhbook-explorer-key[data-j='5']").get_attribute("visibility")
    assert hidden == "hidden"


# -- chapter 5: positional encoding ---------------------------------------------------


def test_positional_reference_is_the_library():
    from mhbook import sinusoidal_encoding
    from mhbook.viz.explorers import positional

    P = positional.encoding(20, 8)
    np.testing.assert_array_equal(P, sinusoidal_encoding(20, 8, dtype=torch.float64).numpy())
    offsets, dots = positional.offset_dots(5, 20, 8)
    assert offsets == list(range(-5, 15))
    np.testing.assert_allclose(dots, P[5] @ P.T, rtol=1e-12)
    omegas = 10000.0 ** (-np.arange(0, 8, 2) / 8)
    np.testing.assert_allclose(dots, [np.cos(omegas * k).sum() for k in offsets], atol=1e-12)


def test_positional_explorer_html():
    from mhbook.viz.explorers import positional

    html = explorers.positional_explorer_html(32, 16, t=3, s=7, i=2).data
    assert_self_contained(html)
    uid = root_id(html)
    assert uid.startswith("mhbook-positional-")
    for suffix in ["-t", "-s", "-i", "-code", "-column", "-dots", "-readouts"]:
        assert f'id="{uid}{suffix}"' in html
    code = json.loads(re.search(r"data-values='([^']+)'", html).group(1))
    np.testing.assert_allclose(code, positional.encoding(32, 16)[3], atol=1e-4)
    with pytest.raises(ValueError, match="even"):
        explorers.positional_explorer_html(32, 15)


def test_positional_widget_follows_its_controls():
    pytest.importorskip("ipywidgets")
    from mhbook.viz.explorers import positional

    ui = explorers.positional_explorer(32, 16)
    ui.t.value, ui.s.value = 20, 2
    P = positional.encoding(32, 16)
    np.testing.assert_allclose(ui.dot, P[20] @ P[2])


def test_positional_explorer_redraws_in_a_browser(open_page):
    from mhbook.viz.explorers import positional

    page = open_page(explorers.positional_explorer_html(64, 32).data)
    uid = page.eval_on_selector(".mhbook-explorer", "e => e.id")
    code = page.locator(f"#{uid}-code")
    before = code.inner_html()
    page.locator(f"#{uid}-t").fill("40")
    page.locator(f"#{uid}-i").focus()
    page.keyboard.press("ArrowRight")  # i = 5
    page.locator(f"#{uid}-s").fill("50")
    assert code.inner_html() != before
    P = positional.encoding(64, 32)
    np.testing.assert_allclose(drawn(code, "data-values"), P[40], atol=1e-4)
    shown = json.loads(page.locator(f"#{uid}-readouts").get_attribute("data-stats"))
    np.testing.assert_allclose(shown["dot"], P[40] @ P[50], rtol=1e-6)
    np.testing.assert_allclose(shown["value"], P[40, 5], atol=1e-7)
    np.testing.assert_allclose(shown["dots"], positional.offset_dots(40, 64, 32)[1], rtol=1e-6)


def test_twins_without_ipywidgets_name_their_html_version(monkeypatch):
    from mhbook.viz.explorers.twin import widget_modules

    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # as if it were not installed
    with pytest.raises(
        ImportError, match=r"softmax_explorer needs ipywidgets.*softmax_explorer_html"
    ):
        widget_modules("softmax_explorer")


def test_committed_chapter_outputs_hold_the_current_static_files():
    """A chapter's explorers carry their JavaScript and CSS inline, so that they work in the
    HTML book, in Jupyter, in Colab and on a notebook viewer alike. The price: an edit of a
    file in ``static/`` leaves the committed outputs stale until the chapters that show it
    are run again. Each file that an output shows must be shown as it is now."""
    import nbformat

    static = Path(svg.__file__).parent / "static"
    files = {
        p.name: p.read_text() for p in sorted(static.glob("*.js")) + sorted(static.glob("*.css"))
    }
    markers = {
        name: next(line for line in text.splitlines() if line.strip())
        for name, text in files.items()
    }
    stale = set()
    shown = set()
    for path in sorted((Path(__file__).parents[2] / "chapters").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            for output in cell.get("outputs", []):
                page = output.get("data", {}).get("text/html", "")
                page = "".join(page) if isinstance(page, list) else page
                if 'class="mhbook-explorer"' not in page:
                    continue
                for name, text in files.items():
                    if markers[name] in page:
                        shown.add(name)
                        pieces = re.split(r"/\* UID \*/|/\* CODE \*/", text)  # embed.js's holes
                        if not all(piece in page for piece in pieces):
                            stale.add(f"{path.name}: {name}")
    assert {"live_core.js", "heatmap.js", "embed.js"} <= shown, shown
    assert not stale, f"re-run these chapters, their outputs hold an old copy: {sorted(stale)}"
