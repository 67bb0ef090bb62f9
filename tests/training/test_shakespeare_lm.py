"""Part V's shared model (mhbook.training.shakespeare_lm): trained once under a lock, loaded
again, and exported as a Hugging Face checkpoint that ``transformers.pipeline`` runs to the
same text and the same perplexity as mhbook."""

import math

import pytest
import torch
import torch.nn.functional as F

from mhbook import DecoderOnlyLM, lm_to_hf, set_seed
from mhbook.training.shakespeare_lm import SHAKESPEARE_MODEL, SHAKESPEARE_TRAIN, shakespeare_model

TINY = SHAKESPEARE_MODEL.replace(d_model=32, num_layers=2, d_ff=64)
FEW_STEPS = SHAKESPEARE_TRAIN.replace(num_steps=30, eval_every=0, batch_size=4)


def test_the_model_is_a_llama_at_nanogpts_size():
    c = SHAKESPEARE_MODEL
    assert (c.num_layers, c.num_heads, c.d_model, c.kv_heads) == (4, 4, 128, 2)
    assert (c.norm, c.ffn, c.position, c.bias, c.norm_first) == (
        "rms",
        "swiglu",
        "rope",
        False,
        True,
    )
    assert SHAKESPEARE_TRAIN.batch_size == 12 and SHAKESPEARE_TRAIN.lr == 1e-3


def test_trained_once_then_loaded(tmp_path):
    path = tmp_path / "lm.pt"
    model, data, history = shakespeare_model(
        path, config=TINY, train=FEW_STEPS, progress=False, device="cpu"
    )
    assert path.exists() and len(history["loss"]) == 30
    assert data.tokenizer.vocab_size == model.vocab_size  # the data carries its tokenizer
    again, _, history2 = shakespeare_model(
        path, config=TINY, train=FEW_STEPS, progress=False, device="cpu"
    )
    for a, b in zip(model.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    assert history2 == history
    # other configs: trained again (and said), not loaded
    other, *_ = shakespeare_model(
        path, config=TINY, train=FEW_STEPS.replace(num_steps=5), progress=False, device="cpu"
    )
    assert not torch.equal(other.embedding.weight, model.embedding.weight)
    assert torch.load(path, weights_only=True)["train_config"]["num_steps"] == 5


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A small trained model, its tokenizer, and both saved as one Hugging Face folder."""
    folder = tmp_path_factory.mktemp("hf")
    model, data, _ = shakespeare_model(
        None, config=TINY, train=FEW_STEPS.replace(num_steps=60), progress=False, device="cpu"
    )
    chars = data.tokenizer
    lm_to_hf(model).save_pretrained(folder)
    chars.to_hf().save_pretrained(folder)
    return model, data, chars, folder


def test_the_pipeline_writes_what_mhbook_generates(exported):
    from transformers import pipeline

    model, _, chars, folder = exported
    generator = pipeline("text-generation", model=str(folder), device="cpu")
    for prompt in ["ROMEO:\nBut soft", "KING RICHARD III:\n", "Be"]:
        ours = model.generate(torch.tensor([chars.encode(prompt)]), 60)  # greedy
        theirs = generator(prompt, max_new_tokens=60, do_sample=False, return_full_text=False)
        assert theirs[0]["generated_text"] == chars.decode(ours[0])


def test_the_perplexities_agree(exported):
    from transformers import AutoModelForCausalLM

    model, data, _, folder = exported
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    x, y = next(data.batches("valid", 8, shuffle=False))
    with torch.no_grad():
        ours = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        # Hugging Face shifts the labels itself: the window and its last next token, whose
        # next tokens from the second on are y
        window = torch.cat([x, y[:, -1:]], dim=1)
        theirs = hf(input_ids=window, labels=window).loss
    assert abs(math.exp(ours.item()) - math.exp(theirs.item())) < 1e-4 * math.exp(ours.item())


def test_a_random_model_is_not_the_trained_one(exported):
    """The pipeline test would pass for any two copies of one model: check it can fail."""
    from transformers import pipeline

    model, _, chars, folder = exported
    set_seed(1)
    other = DecoderOnlyLM(TINY, chars.vocab_size).eval()
    generator = pipeline("text-generation", model=str(folder), device="cpu")
    prompt = "ROMEO:\n"
    theirs = generator(prompt, max_new_tokens=30, do_sample=False, return_full_text=False)
    assert theirs[0]["generated_text"] != chars.decode(
        other.generate(torch.tensor([chars.encode(prompt)]), 30)[0]
    )
