"""mhbook.generate, the one generation loop of both models: the sampling distribution
against softmax(logits / T) written out, eval mode, the KV cache, and bad arguments."""

from __future__ import annotations

import math

import pytest
import torch

import mhbook
from mhbook import DecoderOnlyLM, ModelConfig, Transformer, next_token_probs

VOCAB = 19


def _lm(**changes):
    torch.manual_seed(0)
    config = ModelConfig(d_model=16, num_heads=4, num_layers=2, d_ff=32, norm_first=True)
    return DecoderOnlyLM(config.replace(**changes), VOCAB).double().eval()


def _prompt(batch=3, length=4):
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(0))


# -- the distribution ---------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_probs_are_the_softmax_of_the_logits_divided_by_the_temperature(temperature):
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.3, 0.3, 3.0, -5.0]])
    expected = torch.softmax(logits / temperature, dim=-1)
    torch.testing.assert_close(next_token_probs(logits, temperature), expected)


def test_top_k_keeps_the_k_most_likely():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    probs = next_token_probs(logits, 1.0, top_k=2)
    two = torch.softmax(torch.tensor([[2.0, 1.0]]), -1)
    torch.testing.assert_close(probs, torch.cat([two, torch.zeros(1, 2)], dim=1))


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    kept = next_token_probs(logits, 1.0, top_p=0.7)  # 0.5 < 0.7 <= 0.5 + 0.3
    torch.testing.assert_close(kept, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    torch.testing.assert_close(next_token_probs(logits, 1.0, top_p=0.5), torch.eye(4)[:1])
    torch.testing.assert_close(next_token_probs(logits, 1.0, top_p=1.0), probs)


def test_a_tiny_temperature_gives_the_argmax_not_nan():
    logits = torch.tensor([[1.0, 3.0, 2.0], [5.0, 5.0, 0.0]])
    probs = next_token_probs(logits, 1e-40)
    assert not probs.isnan().any()
    torch.testing.assert_close(probs, torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]]))


# -- the loop -----------------------------------------------------------------------------
def test_cache_and_no_cache_give_the_same_tokens():
    lm = _lm(position="rope", num_kv_heads=2)
    prompt = _prompt()
    assert torch.equal(lm.generate(prompt, 9), lm.generate(prompt, 9, use_cache=False))


def test_sampling_is_reproducible_with_a_seeded_generator():
    lm, prompt = _lm(), _prompt()

    def sample():
        g = torch.Generator().manual_seed(7)
        return lm.generate(prompt, 8, temperature=1.3, top_k=5, top_p=0.9, generator=g)

    assert torch.equal(sample(), sample())


def test_generate_runs_in_eval_mode_and_restores_the_mode():
    """With dropout on, training-mode generation would draw other tokens."""
    lm = _lm(dropout=0.5, attention_dropout=0.5)
    prompt = _prompt()
    expected = lm.generate(prompt, 8)  # in eval mode
    lm.train()
    for _ in range(3):
        assert torch.equal(lm.generate(prompt, 8), expected)
    assert lm.training


def test_transformer_generate_runs_in_eval_mode_and_restores_it():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=16, num_heads=4, d_ff=32, dropout=0.5), 20, 20)
    src = torch.randint(3, 20, (2, 6), generator=torch.Generator().manual_seed(1))
    lens = torch.tensor([6, 4])
    model.eval()
    expected = model.generate(src, lens, 10, bos_id=1, eos_id=2)
    model.train()
    assert torch.equal(model.generate(src, lens, 10, bos_id=1, eos_id=2), expected)
    assert torch.equal(model.generate(src, lens, 10, bos_id=1, eos_id=2, use_cache=False), expected)
    assert model.training


def test_one_generate_for_both_models_is_the_loop_written_out():
    """Greedy generation is argmax, feed back, repeat: written out here without a cache."""
    lm, prompt = _lm(), _prompt()
    tokens = prompt
    for _ in range(6):
        tokens = torch.cat([tokens, lm(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(mhbook.generate(lm, prompt, 6), tokens[:, prompt.size(1) :])


def test_eos_fills_the_rest_and_stops():
    lm, prompt = _lm(), _prompt()
    free = lm.generate(prompt, 10)
    eos = int(free[0, 2])  # the third token of row 0 becomes the end
    out = lm.generate(prompt, 10, eos_id=eos)
    for row in out:
        hits = (row == eos).nonzero()
        if len(hits):
            assert (row[int(hits[0]) :] == eos).all()


# -- bad arguments ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": math.nan}, r"temperature must be a number in \[0.0, inf\), got nan"),
        ({"temperature": -1.0}, r"temperature must be a number in \[0.0, inf\), got -1.0"),
        ({"temperature": math.inf}, r"temperature must be a number in \[0.0, inf\), got inf"),
        ({"top_k": 0}, r"top_k must be an int >= 1 or None, got 0"),
        ({"top_p": 0.0}, r"top_p must be a number in \(0.0, 1.0\], got 0.0"),
        ({"eos_id": VOCAB}, rf"eos_id must be a token id in \[0, {VOCAB - 1}\].*got {VOCAB}"),
        ({"eos_id": -1}, r"eos_id must be an int >= 0, got -1"),
        ({"max_length": 0}, r"max_length must be an int >= 1 or None, got 0"),
        ({"max_length": 4}, r"the prompt has 4 tokens, but max_length=4 bounds the prompt"),
    ],
)
def test_bad_sampling_arguments_name_themselves(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _lm().generate(_prompt(), 3, **kwargs)


def test_max_length_bounds_the_prompt_and_the_new_tokens_together():
    lm, prompt = _lm(), _prompt()  # 4 tokens
    free = lm.generate(prompt, 10)
    bounded = lm.generate(prompt, 10, max_length=7)
    assert bounded.shape == (3, 3) and torch.equal(bounded, free[:, :3])
    assert lm.generate(prompt, 2, max_length=100).shape == (3, 2)


def test_prompt_on_another_device_is_named():
    with pytest.raises(ValueError, match="prompt are on meta but the model is on cpu"):
        _lm().generate(_prompt().to("meta"), 3)


def test_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="prompt must hold at least one token"):
        _lm().generate(torch.zeros(2, 0, dtype=torch.long), 3)
