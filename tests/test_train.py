"""Training, evaluation and the book's model (mhbook.train), on the CPU."""

import dataclasses
import math

import pytest
import torch

from mhbook.data import NumberTranslation
from mhbook.train import (
    BOOK_CONFIG,
    FAST_CONFIG,
    book_model,
    cpu_threads,
    evaluate,
    fit,
    lr_lambda,
    make_data,
    make_model,
    sequence_loss,
)
from mhbook.utils import set_seed

HISTORY_KEYS = {"step", "loss", "lr", "tokens_per_s", "valid_step", "valid_loss", "time_s"}

# A few seconds of training: for the plumbing, not the accuracy.
TINY_CONFIG = FAST_CONFIG.replace(
    data={"num_train": 300, "num_valid": 50, "num_test": 50},
    model={"d_model": 16, "num_heads": 2, "num_layers": 1, "d_ff": 32},
    train={"num_steps": 12, "warmup_steps": 4, "eval_every": 5, "batch_size": 32},
)


@pytest.fixture(scope="module")
def trained():
    """The fast configuration, trained once for this module (about 20 s of one CPU core)."""
    data = make_data(FAST_CONFIG)
    set_seed(FAST_CONFIG.train.seed)
    model = make_model(data, FAST_CONFIG, device="cpu")
    history = fit(
        model, data, device="cpu", progress=False, **dataclasses.asdict(FAST_CONFIG.train)
    )
    return model, data, history


def test_short_training_translates_held_out_numbers(trained):
    model, data, _ = trained
    with cpu_threads(1):  # tiny matrices: one thread is quicker, above all on a busy machine
        result = evaluate(model, data, split="test")
    assert result["exact_match"] >= 0.90, result["exact_match"]
    assert result["bleu"] >= 90
    assert len(result["hypotheses"]) == len(result["references"]) == len(data.pairs("test"))
    assert result["references"] == [fr for _, fr in data.pairs("test")]
    exact = sum(h == r for h, r in zip(result["hypotheses"], result["references"]))
    assert result["exact_match"] == exact / len(result["references"])


def test_history(trained):
    _, _, history = trained
    assert set(history) == HISTORY_KEYS
    num_steps = FAST_CONFIG.train.num_steps
    for key in ("step", "loss", "lr", "tokens_per_s", "time_s"):
        assert len(history[key]) == num_steps
    assert history["step"] == list(range(1, num_steps + 1))
    assert history["valid_step"] == [200, 400, 600]
    assert len(history["valid_loss"]) == 3
    assert history["valid_loss"][-1] < history["valid_loss"][0] < math.log(20)
    assert sum(history["loss"][-20:]) < sum(history["loss"][:20])
    lr = history["lr"]
    peak = lr.index(max(lr))
    warmup = FAST_CONFIG.train.warmup_steps
    assert peak in (warmup - 1, warmup)  # warm-up then decay
    assert max(lr) == pytest.approx(FAST_CONFIG.train.lr)
    assert all(a <= b for a, b in zip(lr[:peak], lr[1 : peak + 1]))
    assert all(a >= b for a, b in zip(lr[peak:], lr[peak + 1 :]))
    assert all(s > 0 for s in history["tokens_per_s"])
    assert all(a < b for a, b in zip(history["time_s"], history["time_s"][1:]))


def test_translate_after_training(trained):
    model, data, _ = trained
    with cpu_threads(1):
        out = data.translate(model, ["seventy-one", 200])
    assert len(out) == 2 and all(isinstance(s, str) for s in out)
    assert not model.training


def test_lr_lambda():
    factors = [lr_lambda(s, warmup_steps=10, num_steps=100, min_lr_ratio=0.1) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[10] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(0.1, abs=1e-3)
    assert lr_lambda(500, 10, 100, 0.1) == pytest.approx(0.1)


def test_sequence_loss_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    tgt = torch.tensor([[4, 2, 0], [1, 0, 0]])  # 0 = <pad>
    expected = torch.stack(
        [
            -logits[0, 0].log_softmax(-1)[4],
            -logits[0, 1].log_softmax(-1)[2],
            -logits[1, 0].log_softmax(-1)[1],
        ]
    ).mean()
    torch.testing.assert_close(sequence_loss(logits, tgt, pad_id=0), expected)
    smoothed = sequence_loss(logits, tgt, pad_id=0, label_smoothing=0.1)
    assert not torch.isclose(smoothed, expected)
    with pytest.raises(ValueError, match="batch, T"):
        sequence_loss(logits, tgt[:, :2], pad_id=0)


def test_cpu_threads_is_restored():
    before = torch.get_num_threads()
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_book_model_is_deterministic_and_checkpointed(tmp_path, capsys):
    path = tmp_path / "sub" / "tiny.pt"
    model1, data, history1 = book_model(
        device="cpu", checkpoint=path, progress=False, config=TINY_CONFIG
    )
    assert path.exists() and not model1.training
    assert set(history1) == HISTORY_KEYS
    # Same seed, same weights.
    model2, _, _ = book_model(
        data, device="cpu", checkpoint=None, progress=False, config=TINY_CONFIG
    )
    for (name, p1), p2 in zip(model1.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(p1, p2), name
    # Loaded from the checkpoint: same weights, the stored history, same translations.
    model3, _, history3 = book_model(
        device="cpu", checkpoint=path, progress=False, config=TINY_CONFIG
    )
    for p1, p3 in zip(model1.state_dict().values(), model3.state_dict().values()):
        assert torch.equal(p1, p3)
    assert history3 == history1
    sentences = [en for en, _ in data.pairs("test")[:5]]
    assert data.translate(model1, sentences) == data.translate(model3, sentences)
    # Another configuration does not load this checkpoint: it trains again.
    other = TINY_CONFIG.replace(train={"num_steps": 6})
    capsys.readouterr()
    _, _, history4 = book_model(device="cpu", checkpoint=path, progress=False, config=other)
    assert "another configuration" in capsys.readouterr().out
    assert len(history4["step"]) == 6


def test_book_config_is_complete():
    data = NumberTranslation(num_train=50, num_valid=5, num_test=5)
    model = make_model(data, BOOK_CONFIG, device="cpu")
    assert model.encoder.d_model == BOOK_CONFIG.model.d_model
    assert len(model.encoder.blocks) == BOOK_CONFIG.model.num_layers
    # Every training entry is an argument of fit().
    fit_args = fit.__code__.co_varnames[: fit.__code__.co_argcount]
    assert set(dataclasses.asdict(BOOK_CONFIG.train)) <= set(fit_args)
    assert set(dataclasses.asdict(FAST_CONFIG.train)) <= set(fit_args)


def test_book_model_retrains_over_a_broken_checkpoint(tmp_path, capsys):
    path = tmp_path / "broken.pt"
    path.write_bytes(b"not a checkpoint")
    model, data, history = book_model(
        device="cpu", checkpoint=path, progress=False, config=TINY_CONFIG
    )
    assert "could not read" in capsys.readouterr().out
    assert len(history["step"]) == TINY_CONFIG.train.num_steps
    assert not list(tmp_path.glob("*.partial"))
    again, _, _ = book_model(
        data, device="cpu", checkpoint=path, progress=False, config=TINY_CONFIG
    )
    assert capsys.readouterr().out == ""
    for p1, p2 in zip(model.parameters(), again.parameters()):
        assert torch.equal(p1, p2)
