"""Training (mhbook.training.trainer), evaluation, checkpoints and the book's model
(mhbook.training.translation, mhbook.training.checkpoints), on the CPU.

One test trains long enough to check accuracy (:data:`SHORT_CONFIG`, a few seconds);
the plumbing tests train :data:`TINY_CONFIG` for a dozen steps.
"""

import copy
import dataclasses
import math
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mhbook.training.translation as translation_module
from mhbook.core.config import BOOK_CONFIG, FAST_CONFIG, TrainConfig
from mhbook.core.utils import save_checkpoint, set_seed
from mhbook.tasks.bleu import corpus_bleu, exact_match, translation_scores
from mhbook.tasks.numbers import (
    NumberTranslation,
    english_words,
    french_words,
    sequence_loss,
    tokenize,
    translation_loss,
)
from mhbook.training.checkpoints import TrainedModel
from mhbook.training.trainer import (
    TrainingLog,
    cpu_threads,
    fit,
    lr_lambda,
    make_optimizer,
    make_scheduler,
    valid_loss,
)
from mhbook.training.translation import book_model, evaluate, load_model, make_data, make_model

HISTORY_KEYS = {"step", "loss", "lr", "tokens_per_s", "valid_step", "valid_loss", "time_s"}

# Numbers below 10,000: every French rule of the task (et, vingts, cents, quatre-vingt-dix)
# within four digits, learnt in 300 steps (98.7 to 100 % exact on the test split for
# training seeds 0 to 4, about 6 s of one CPU core).
SHORT_CONFIG = FAST_CONFIG.replace(
    data={"max_number": 9_999, "num_train": 3_000, "num_valid": 200, "num_test": 300},
    train={"num_steps": 300, "warmup_steps": 30, "eval_every": 100},
)

# Held-out numbers (test split) that the models trained from seeds 0 to 4 all translate
# right: "et", "soixante et onze", "quatre-vingts" at the end, "quatre-vingt-dix-sept".
HELD_OUT = [41, 671, 1777, 4680, 9497]

# A fraction of a second of training: for the plumbing, not the accuracy.
TINY_CONFIG = FAST_CONFIG.replace(
    data={"num_train": 300, "num_valid": 50, "num_test": 50},
    model={"d_model": 16, "num_heads": 2, "num_layers": 1, "d_ff": 32},
    train={"num_steps": 12, "warmup_steps": 4, "eval_every": 5, "batch_size": 32},
)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: one thread is quicker, above all on a busy machine, and repeatable."""
    with cpu_threads(1):
        yield


@pytest.fixture(scope="module")
def trained():
    """:data:`SHORT_CONFIG`, trained once for this module."""
    data = make_data(SHORT_CONFIG)
    set_seed(SHORT_CONFIG.train.seed)
    model = make_model(data, SHORT_CONFIG, device="cpu")
    history = fit(model, data, SHORT_CONFIG.train, progress=False)
    return model, data, history


@pytest.fixture(scope="module")
def tiny_data():
    return make_data(TINY_CONFIG)


def tiny_model(data, seed: int = 0):
    set_seed(seed)
    return make_model(data, TINY_CONFIG, device="cpu")


# -- the accuracy test ----------------------------------------------------------------------
def test_short_training_translates_held_out_numbers(trained):
    model, data, history = trained
    result = evaluate(model, data, split="test")
    assert result["exact_match"] >= 0.95, result["exact_match"]
    assert result["bleu"] >= 97, result["bleu"]
    assert len(result["hypotheses"]) == len(result["references"]) == len(data.pairs("test"))
    assert result["references"] == [fr for _, fr in data.pairs("test")]
    exact = sum(h == r for h, r in zip(result["hypotheses"], result["references"]))
    assert result["exact_match"] == exact / len(result["references"])
    hyps, refs = ([tokenize(s) for s in result[k]] for k in ("hypotheses", "references"))
    assert result["bleu"] == corpus_bleu(hyps, refs)
    assert history["valid_step"] == [100, 200, 300]
    assert history["valid_loss"][-1] < 0.1 < history["valid_loss"][0] < math.log(20)


def test_translation_scores_are_exact_match_and_corpus_bleu():
    """One score of sentences for evaluate, evaluate_lm and the attention viewer."""
    hyps = ["deux cents", "deux cent un", "trois"]
    refs = ["deux cents", "deux cent deux", "trois"]
    assert exact_match(hyps, refs) == 2 / 3
    assert exact_match([], []) == 0.0
    scores = translation_scores(hyps, refs)
    assert list(scores) == ["exact_match", "bleu"] and scores["exact_match"] == 2 / 3
    assert scores["bleu"] == corpus_bleu([tokenize(h) for h in hyps], [tokenize(r) for r in refs])
    with pytest.raises(ValueError, match="one reference per hypothesis"):
        exact_match(hyps, refs[:2])


def test_translate_after_training(trained):
    model, data, _ = trained
    assert set(HELD_OUT) <= set(data.numbers["test"])  # never seen in training
    assert data.translate(model, HELD_OUT) == [french_words(n) for n in HELD_OUT]
    assert data.translate(model, [english_words(671)]) == ["six cent soixante et onze"]
    assert not model.training


# -- fit's plumbing ---------------------------------------------------------------------------
def test_history(tiny_data):
    config = TINY_CONFIG.train
    history = fit(tiny_model(tiny_data), tiny_data, config, progress=False)
    assert set(history) == HISTORY_KEYS
    for key in ("step", "loss", "lr", "tokens_per_s", "time_s"):
        assert len(history[key]) == config.num_steps
    assert history["step"] == list(range(1, config.num_steps + 1))
    assert history["valid_step"] == [5, 10, 12]
    assert len(history["valid_loss"]) == 3
    assert history["valid_loss"][-1] < history["valid_loss"][0]
    lr = history["lr"]
    peak = lr.index(max(lr))
    assert peak in (config.warmup_steps - 1, config.warmup_steps)  # warm-up then decay
    assert max(lr) == pytest.approx(config.lr)
    assert all(a <= b for a, b in zip(lr[:peak], lr[1 : peak + 1]))
    assert all(a >= b for a, b in zip(lr[peak:], lr[peak + 1 :]))
    assert all(s > 0 for s in history["tokens_per_s"])
    assert all(a < b for a, b in zip(history["time_s"], history["time_s"][1:]))


def test_fit_defaults_are_the_books(tiny_data):
    assert TrainConfig() == BOOK_CONFIG.train
    history = fit(tiny_model(tiny_data), tiny_data, num_steps=2, eval_every=0, progress=False)
    book = BOOK_CONFIG.train
    assert history["lr"][0] == pytest.approx(book.lr * lr_lambda(0, book.warmup_steps, 2))
    assert history["valid_step"] == []


def test_fit_overrides_and_errors(tiny_data):
    model = tiny_model(tiny_data)
    history = fit(model, tiny_data, TINY_CONFIG.train, num_steps=3, eval_every=0, progress=False)
    assert history["step"] == [1, 2, 3]
    with pytest.raises(TypeError, match=r"\['nope'\].*num_steps"):
        fit(model, tiny_data, nope=1)
    with pytest.raises(TypeError, match="TrainConfig .*got Config"):
        fit(model, tiny_data, TINY_CONFIG)
    with pytest.raises(ValueError, match="num_steps"):
        fit(model, tiny_data, num_steps=0)
    with pytest.raises(ValueError, match="label_smoothing"):
        fit(model, tiny_data, label_smoothing=0.1, loss_fn=lambda m, b: None)


def test_fit_is_deterministic(tiny_data):
    weights = []
    for _ in range(2):
        model = tiny_model(tiny_data)
        fit(model, tiny_data, TINY_CONFIG.train, num_steps=5, progress=False)
        weights.append(model.state_dict())
    for name, p in weights[0].items():
        assert torch.equal(p, weights[1][name]), name


def test_optimizer_and_schedule():
    model = nn.Linear(3, 2)
    config = TrainConfig(lr=0.5, num_steps=10, warmup_steps=2, min_lr_ratio=0.1, weight_decay=0.01)
    optimizer = make_optimizer(model, config)
    group = optimizer.param_groups[0]
    assert isinstance(optimizer, torch.optim.AdamW)
    assert group["fused"] or group["foreach"]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.9, 0.98), 1e-9, 0.01)
    scheduler = make_scheduler(optimizer, config)
    seen = []
    for _ in range(10):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.5 * lr_lambda(s, 2, 10, 0.1) for s in range(10)])


def test_training_log_without_a_bar():
    log = TrainingLog(num_steps=2, progress=False)
    log.train_step(1, 2.0, 1e-3, n_tokens=100, seconds=0.5)
    log.train_step(2, 1.0, 2e-3, n_tokens=300, seconds=1.0)
    log.valid_step(2, 1.5)
    log.close()
    assert log.history == {
        "step": [1, 2],
        "loss": [2.0, 1.0],
        "lr": [1e-3, 2e-3],
        "tokens_per_s": [200.0, 300.0],
        "valid_step": [2],
        "valid_loss": [1.5],
        "time_s": [0.5, 1.5],
    }


# -- losses ---------------------------------------------------------------------------------
def smoothed_cross_entropy(logits, tgt, pad_id, eps):
    """Written out: ``(1 - eps) * NLL + eps * mean over the vocabulary of -log p``,
    averaged over the positions whose target is not ``pad_id``."""
    log_p = logits.double().log_softmax(-1)
    nll = -log_p.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    uniform = -log_p.mean(-1)
    per_token = (1 - eps) * nll + eps * uniform
    return per_token[tgt != pad_id].mean()


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
    with pytest.raises(ValueError, match="batch, T"):
        sequence_loss(logits, tgt[:, :2], pad_id=0)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_is_the_written_out_formula(eps):
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 7) * 3
    tgt = torch.tensor([[4, 2, 6, 0], [1, 5, 0, 0], [3, 3, 3, 2]])
    expected = smoothed_cross_entropy(logits, tgt, 0, eps).float()
    torch.testing.assert_close(sequence_loss(logits, tgt, 0, eps), expected)


def test_fit_trains_on_the_smoothed_loss_of_its_batches(tiny_data):
    """The first recorded loss is the smoothed cross-entropy of the first shuffled batch,
    and the first tokens per second count that batch's target tokens."""
    eps = 0.2
    config = dataclasses.replace(TINY_CONFIG.train, label_smoothing=eps, num_steps=1)
    model = tiny_model(tiny_data)
    start = copy.deepcopy(model)
    history = fit(model, tiny_data, config, progress=False)
    generator = torch.Generator().manual_seed(config.seed)
    batch = next(tiny_data.batches("train", config.batch_size, generator=generator))
    pad_id = tiny_data.tgt_vocab.pad_id
    with torch.no_grad():
        logits = start(batch.src, batch.tgt_in, batch.src_valid_lens)
    expected = smoothed_cross_entropy(logits, batch.tgt_out, pad_id, eps)
    assert history["loss"][0] == pytest.approx(expected.item(), rel=1e-5)
    n_tokens = int((batch.tgt_out != pad_id).sum())
    assert history["tokens_per_s"][0] * history["time_s"][0] == pytest.approx(n_tokens)
    # Validation is not smoothed.
    with torch.no_grad():
        logits = model(batch.src, batch.tgt_in, batch.src_valid_lens)
    loss, count = translation_loss(model, batch, pad_id=pad_id)
    assert int(count) == n_tokens
    torch.testing.assert_close(loss, sequence_loss(logits, batch.tgt_out, pad_id))


def test_valid_loss_is_the_mean_over_all_target_tokens(tiny_data):
    model = tiny_model(tiny_data).eval()
    total, count = 0.0, 0
    pad_id = tiny_data.tgt_vocab.pad_id
    with torch.no_grad():
        for batch in tiny_data.batches("test", 7):
            logits = model(batch.src, batch.tgt_in, batch.src_valid_lens)
            total += F.cross_entropy(
                logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=pad_id, reduction="sum"
            ).item()
            count += int(batch.tgt_valid_lens.sum())
    assert valid_loss(model, tiny_data, "test", batch_size=16) == pytest.approx(total / count)
    empty = NumberTranslation(max_number=99, num_train=20, num_valid=0, num_test=0)
    assert math.isnan(valid_loss(make_model(empty, TINY_CONFIG, "cpu"), empty))


# -- another model, another data set, the same fit ---------------------------------------------
class CountingSequences:
    """A stand-in for a decoder-only data set: windows of 0, 1, ..., 7, 0, 1, ... whose
    next token is always the current one plus 1 (mod 8). Batches are ``(x, y)``."""

    def batches(self, split, batch_size, shuffle=None, device=None, generator=None):
        n = 64 if split == "train" else 16
        ids = (torch.arange(n)[:, None] + torch.arange(9)) % 8  # (n, 9)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for start in range(0, n, batch_size):
            chunk = ids[order[start : start + batch_size]].to(device)
            yield chunk[:, :-1], chunk[:, 1:]


def next_token_loss(model, batch):
    x, y = batch
    logits = model(x)  # (batch, T, 8)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten()), y.numel()


def test_fit_trains_another_model_with_its_own_loss():
    data = CountingSequences()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(8, 16), nn.Linear(16, 8))
    config = TrainConfig(num_steps=40, batch_size=16, lr=0.05, warmup_steps=5, eval_every=20)
    history = fit(model, data, config, loss_fn=next_token_loss, progress=False)
    assert history["valid_step"] == [20, 40]
    assert history["loss"][0] > 1.0 and history["valid_loss"][-1] < 0.1
    assert valid_loss(model, data, loss_fn=next_token_loss) == history["valid_loss"][-1]
    with pytest.raises(TypeError, match="CountingSequences has no loss_fn"):
        fit(model, data, config)
    with pytest.raises(TypeError, match="no loss_fn"):
        valid_loss(model, data)


def test_fit_takes_the_loss_from_the_data_and_smooths_only_training():
    """No loss_fn: fit and valid_loss use ``data.loss_fn``; label_smoothing reaches the
    training steps as ``loss_fn(..., label_smoothing=...)``, never validation."""
    seen = []

    class WithLoss(CountingSequences):
        def loss_fn(self, model, batch, label_smoothing=0.0):
            seen.append(label_smoothing)
            x, y = batch
            logits = model(x)
            loss = F.cross_entropy(
                logits.flatten(0, 1), y.flatten(), label_smoothing=label_smoothing
            )
            return loss, y.numel()

    data = WithLoss()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(8, 16), nn.Linear(16, 8))
    config = TrainConfig(num_steps=4, batch_size=16, warmup_steps=1, eval_every=4)
    fit(model, data, config, label_smoothing=0.1, progress=False)
    assert seen == [0.1] * 4 + [0.0]  # 4 training steps, then one validation batch
    valid_loss(model, data, batch_size=16)
    assert seen[-1] == 0.0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fit_and_evaluate_on_cuda(tiny_data):
    model = tiny_model(tiny_data).cuda()
    history = fit(model, tiny_data, TINY_CONFIG.train, progress=False)
    assert history["valid_loss"] and all(p.is_cuda for p in model.parameters())
    assert evaluate(model, tiny_data, "test")["references"]


# -- threads, checkpoints, the book's model ----------------------------------------------------
def test_cpu_threads_is_restored():
    before = torch.get_num_threads()
    with cpu_threads(before + 1):
        assert torch.get_num_threads() == before + 1
        with cpu_threads(None):
            assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before


def test_load_model_from_the_checkpoint_alone(tmp_path, tiny_data):
    model = tiny_model(tiny_data).eval()
    path = tmp_path / "model.pt"
    vocabs = {
        "src_vocab": tiny_data.src_vocab.id_to_token,
        "tgt_vocab": tiny_data.tgt_vocab.id_to_token,
    }
    save_checkpoint(path, model, config=TINY_CONFIG, note="hello", **vocabs)
    assert not list(tmp_path.glob("*.partial"))
    loaded, stored = load_model(path, device="cpu")
    assert stored["config"] == TINY_CONFIG and stored["note"] == "hello"
    assert make_data(stored["config"]).tgt_vocab == tiny_data.tgt_vocab
    assert not loaded.training
    for name, p in model.state_dict().items():
        assert torch.equal(p, loaded.state_dict()[name]), name
    save_checkpoint(tmp_path / "bare.pt", model)
    with pytest.raises(ValueError, match=r"lacks \['config', 'src_vocab', 'tgt_vocab'\]"):
        load_model(tmp_path / "bare.pt", device="cpu")


def test_book_model_is_deterministic_and_checkpointed(tmp_path, capsys):
    path = tmp_path / "sub" / "tiny.pt"
    trained = book_model(device="cpu", checkpoint=path, progress=False, config=TINY_CONFIG)
    assert isinstance(trained, TrainedModel)
    model1, data, history1 = trained
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
    # The checkpoint alone rebuilds the model.
    model4, stored = load_model(path, device="cpu")
    assert stored["config"] == TINY_CONFIG and stored["history"] == history1
    assert data.translate(model4, sentences) == data.translate(model1, sentences)
    # A checkpoint of an older fit, or of another configuration, is trained again.
    stored = torch.load(path, weights_only=True)
    torch.save({**stored, "trainer_version": 1}, tmp_path / "old.pt")
    # It says why when it shows progress, and prints nothing when it does not.
    capsys.readouterr()
    book_model(device="cpu", checkpoint=tmp_path / "old.pt", progress=True, config=TINY_CONFIG)
    assert "older fit" in capsys.readouterr().out
    other = TINY_CONFIG.replace(train={"num_steps": 6})
    book_model(device="cpu", checkpoint=tmp_path / "old.pt", progress=False, config=other)
    assert capsys.readouterr().out == ""
    _, _, history5 = book_model(device="cpu", checkpoint=path, progress=True, config=other)
    assert "another configuration" in capsys.readouterr().out
    assert len(history5["step"]) == 6


def test_book_config_is_complete():
    data = NumberTranslation(num_train=50, num_valid=5, num_test=5)
    model = make_model(data, BOOK_CONFIG, device="cpu")
    assert model.encoder.d_model == BOOK_CONFIG.model.d_model
    assert len(model.encoder.blocks) == BOOK_CONFIG.model.num_layers
    assert model.encoder.config == model.decoder.config == BOOK_CONFIG.model


def test_book_model_retrains_over_a_broken_checkpoint(tmp_path, capsys):
    path = tmp_path / "broken.pt"
    path.write_bytes(b"not a checkpoint")
    model, data, history = book_model(
        device="cpu", checkpoint=path, progress=True, config=TINY_CONFIG
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


@pytest.mark.skipif(sys.platform == "win32", reason="the checkpoint lock is POSIX flock")
def test_book_model_waits_for_a_training_elsewhere(tmp_path, monkeypatch):
    """While another process holds the checkpoint's lock (it is training the same model),
    book_model waits, then loads that process's checkpoint instead of training again."""
    import fcntl
    import threading

    path = tmp_path / "tiny.pt"
    trained, _, _ = book_model(device="cpu", checkpoint=path, progress=False, config=TINY_CONFIG)
    calls = []
    monkeypatch.setattr(translation_module, "fit", lambda *a, **k: calls.append(1))
    result = {}
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # "another process" is training
        waiter = threading.Thread(
            target=lambda: result.update(
                model=book_model(device="cpu", checkpoint=path, progress=False, config=TINY_CONFIG)[
                    0
                ]
            )
        )
        waiter.start()
        waiter.join(timeout=1.0)
        assert waiter.is_alive(), "book_model did not wait for the lock"
        fcntl.flock(lock, fcntl.LOCK_UN)
    waiter.join(timeout=60)
    assert not waiter.is_alive() and not calls  # loaded, not trained
    for p1, p2 in zip(trained.parameters(), result["model"].parameters()):
        assert torch.equal(p1, p2)


def test_book_model_retrain_trains_over_a_good_checkpoint(tmp_path, monkeypatch):
    """retrain=True (chapter 6) trains and writes the checkpoint anew even where a good one
    is there; without it the checkpoint is loaded and nothing trains."""
    path = tmp_path / "tiny.pt"
    book_model(device="cpu", checkpoint=path, progress=False, config=TINY_CONFIG)
    written = path.stat().st_mtime_ns
    calls = []
    real_fit = translation_module.fit
    monkeypatch.setattr(
        translation_module, "fit", lambda *a, **k: calls.append(1) or real_fit(*a, **k)
    )
    book_model(device="cpu", checkpoint=path, progress=False, config=TINY_CONFIG)
    assert calls == []
    _, _, history = book_model(
        device="cpu", checkpoint=path, progress=False, config=TINY_CONFIG, retrain=True
    )
    assert calls == [1] and path.stat().st_mtime_ns > written
    assert len(history["step"]) == TINY_CONFIG.train.num_steps
