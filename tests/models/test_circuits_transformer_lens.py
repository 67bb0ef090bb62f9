"""``mhbook.models.circuits`` against TransformerLens's own circuits and scores, on the same
weights: the model exported with ``lm_to_hf``, saved with ``save_pretrained`` to a temporary
folder and booted as a ``TransformerBridge`` in compatibility mode (which folds the norms'
gains into the weights and centres the unembedding, as ``circuits`` does)."""

from __future__ import annotations

import pytest
import torch

import mhbook
from mhbook.models import circuits

transformer_lens = pytest.importorskip("transformer_lens")

# The circuits need no feed-forward network; a Llama-shaped block lets lm_to_hf export it.
CONFIG = mhbook.ModelConfig(
    d_model=32, num_heads=4, num_layers=2, d_ff=64, norm_first=True, norm="rms",
    ffn="swiglu", bias=False, position="rope", scale_embeddings=False,
)  # fmt: skip
TEXT = "abcdefghijklmnopqrst"  # 20 characters: the vocabulary


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.manual_seed(0)
    lm = mhbook.DecoderOnlyLM(CONFIG, len(TEXT)).eval()
    with torch.no_grad():  # gains other than 1, so that folding them is tested
        for name, p in lm.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    hf = mhbook.lm_to_hf(lm)
    folder = tmp_path_factory.mktemp("hf")
    hf.save_pretrained(folder)
    tokenizer = mhbook.CharTokenizer(TEXT).to_hf()
    bridge = transformer_lens.TransformerBridge.boot_transformers(
        str(folder), hf_model=hf, tokenizer=tokenizer, device="cpu"
    )
    bridge.enable_compatibility_mode()
    return lm, bridge


def test_the_qk_and_ov_circuits_are_transformer_lens_s(models):
    lm, bridge = models
    for layer in range(2):
        for head in range(4):
            # TransformerLens multiplies row vectors (x @ W): its OV is ours transposed
            torch.testing.assert_close(
                bridge.OV[layer, head].AB, circuits.head_ov(lm, layer, head).T, atol=1e-6, rtol=0
            )
            torch.testing.assert_close(
                bridge.QK[layer, head].AB, circuits.head_qk(lm, layer, head), atol=1e-6, rtol=0
            )


def test_copying_scores_equal_transformer_lens_s_eigenvalues(models):
    lm, bridge = models
    full = bridge.W_E @ bridge.OV @ bridge.W_U  # (layers, heads, vocab, vocab), factored
    for layer in range(2):
        for head in range(4):
            eigenvalues = full[layer, head].eigenvalues
            theirs = (eigenvalues.sum().real / eigenvalues.abs().sum()).item()
            ours = circuits.copying_score(circuits.full_ov_circuit(lm, layer, head))
            assert ours == pytest.approx(theirs, abs=1e-5), (layer, head)


@pytest.mark.parametrize("mode", ["K", "Q", "V"])
def test_composition_scores_equal_transformer_lens_s(models, mode):
    lm, bridge = models
    theirs = bridge.all_composition_scores(mode)  # (layer, head, later layer, head)
    for h1 in range(4):
        for h2 in range(4):
            ov1 = circuits.head_ov(lm, 0, h1)
            reader = {"K": circuits.head_qk(lm, 1, h2), "Q": circuits.head_qk(lm, 1, h2).T,
                      "V": circuits.head_ov(lm, 1, h2)}[mode]  # fmt: skip
            ours = circuits.composition_score(ov1, reader)
            assert ours == pytest.approx(theirs[0, h1, 1, h2].item(), abs=1e-5), (mode, h1, h2)
