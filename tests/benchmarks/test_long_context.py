"""``benchmarks/long_context.py`` (chapter 16's runs that train) still runs and measures what
it says, and its committed results are complete."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import short_validation

import mhbook
from benchmarks import long_context
from mhbook import DecoderOnlyLM
from mhbook.tasks.shakespeare import lm_loss
from mhbook.training.checkpoints import TrainedModel
from mhbook.training.shakespeare_lm import SHAKESPEARE_MODEL, SHAKESPEARE_TRAIN

pytestmark = pytest.mark.slow(seconds=10)  # trains seven small runs of two steps


def test_the_start_token_comes_before_every_window():
    data = long_context._data()
    x, y = next(data.batches("train", 3, generator=torch.Generator().manual_seed(0)))
    xs, ys = next(
        long_context.WithStartToken(data).batches(
            "train", 3, generator=torch.Generator().manual_seed(0)
        )
    )
    assert torch.equal(xs[:, 0], torch.full((3,), long_context.START))
    assert torch.equal(xs[:, 1:], x[:, :-1]) and torch.equal(ys, x)
    assert long_context.START == 65 and int(x.max()) < 65


def test_first_token_weights_are_gu_et_als_importance_and_sink_rate():
    """The importance of the first token is the mean of column 0 over every query; the
    sink rate counts (window, layer, head) above 0.3, in percent."""
    torch.manual_seed(0)
    model = DecoderOnlyLM(SHAKESPEARE_MODEL.replace(num_layers=2), 65).eval()
    windows = long_context.validation_windows()[:8]
    out = long_context.first_token_weights(model, windows)
    w = mhbook.viz.attention_records.passage_attention(model, windows)  # (8, 2, 4, 64, 64)
    importance = w[..., 0].mean(-1)  # (8, 2, 4)
    np.testing.assert_allclose(out["importance"], importance.mean(0), rtol=1e-6)
    assert out["sink_rate_percent"] == pytest.approx(100 * (importance > 0.3).mean())
    even = (1 / np.arange(17, 65)).mean()
    np.testing.assert_allclose(
        out["ratio_to_even_share"], w[..., 16:, 0].mean(axis=(0, 3)) / even, rtol=1e-5
    )


def test_the_probing_loop_gives_fits_weights():
    config = SHAKESPEARE_TRAIN.replace(num_steps=3, warmup_steps=1, eval_every=0)
    small = SHAKESPEARE_MODEL.replace(num_layers=1)
    data = long_context._data()
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(DecoderOnlyLM(small, 65))
    mhbook.fit(models[0], data, config, loss_fn=lm_loss, progress=False)
    log = long_context.fine_tune_with_probes(models[1], data, config, lambda m: {}, every=2)
    assert [r["step"] for r in log] == [0, 2, 3]
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)


def test_the_benchmark_runs_for_two_steps(tmp_path, monkeypatch):
    """Every run of the benchmark, two steps each; chapter 14's model stands in as an
    untrained model of its config (no minute of training in a test)."""

    def untrained(checkpoint, **_):
        torch.manual_seed(0)
        return TrainedModel(DecoderOnlyLM(SHAKESPEARE_MODEL, 65).eval(), None, None)

    monkeypatch.setattr(long_context, "shakespeare_model", untrained)
    sequences, windows = (
        long_context.validation_sequences()[:2],
        long_context.validation_windows()[:4],
    )
    monkeypatch.setattr(long_context, "validation_sequences", lambda: sequences)
    monkeypatch.setattr(long_context, "validation_windows", lambda: windows)
    full_data = long_context._data
    monkeypatch.setattr(long_context, "_data", lambda *a: short_validation(full_data(*a)))
    out = tmp_path / "long_context.json"
    argv = ["--sink-steps", "2", "--sink-seeds", "0", "--tune-steps", "2", "--tune-every", "1"]
    long_context.main([*argv, "--workers", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert (
        result["commit"]
        and result["machine"]
        and result["command"].endswith("--workers 1 --out " + str(out))
    )
    sinks = result["sinks"]["runs"]
    assert [(r["variant"], r["seed"]) for r in sinks] == [("vanilla", 0), ("start token", 0)]
    assert all(np.shape(r["ratio_to_even_share"]) == (4, 4) for r in sinks)
    runs = result["fine_tuning"]["runs"]
    assert [r["method"] for r in runs] == list(long_context.METHODS)
    assert all(r["steps"] == [0, 1, 2] and np.shape(r["loss_by_block"]) == (3, 8) for r in runs)
    plain = runs[-1]
    assert np.shape(plain["far_weight_256"]) == (4, 4) and "before_far_weight_256" in plain
    # far weights are shares of a softmax row: keys 256+ back are among keys 64+ back
    assert (np.array(plain["far_weight_256"]) <= np.array(plain["far_weight_64"]) + 1e-6).all()


def test_the_committed_results_are_complete_and_say_where_they_come_from():
    result = mhbook.load_measured("long_context")
    assert result["command"].startswith("python -m benchmarks.long_context")
    assert result["commit"] != "unknown" and result["machine"] and result["date"]
    sinks = result["sinks"]["runs"]
    assert {(r["variant"], r["seed"]) for r in sinks} == {
        (v, s) for v in ("vanilla", "start token") for s in (1337, 0)
    }
    assert all(r["steps"] == 1000 for r in sinks)
    runs = result["fine_tuning"]["runs"]
    assert [r["method"] for r in runs] == list(long_context.METHODS)
    assert all(r["steps"][0] == 0 and r["steps"][-1] == 200 for r in runs)
