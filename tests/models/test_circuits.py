"""``mhbook.models.circuits`` against a second implementation written differently: numpy,
the state dict's tensors by name, the norm gains applied to the inputs instead of folded
into the weights, and the eigenvalues and norms from numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mhbook
from mhbook.models import circuits

CONFIG = mhbook.ModelConfig(
    d_model=16, num_heads=4, num_kv_heads=2, num_layers=2, ffn="none", norm_first=True,
    norm="rms", bias=False, position="rope", scale_embeddings=False,
)  # fmt: skip
VOCAB, D_HEAD = 11, 4


def _model(seed=0):
    torch.manual_seed(seed)
    model = mhbook.DecoderOnlyLM(CONFIG, VOCAB)
    with torch.no_grad():  # gains other than 1, so that folding them is tested
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def _numpy(model):
    return {k: v.detach().double().numpy() for k, v in model.state_dict().items()}


def _second_qk_ov(w, layer, head):
    """Both circuits as what they do to residual vectors x: the score x_q . QK x_k and the
    output OV x, computed through the projections on the basis vectors."""
    p = f"blocks.{layer}.self_attn."
    g = w[f"blocks.{layer}.addnorm1.norm.weight"]
    kv = head * CONFIG.kv_heads // CONFIG.num_heads
    basis = np.eye(CONFIG.d_model) * g  # row i: the normed basis vector e_i (gain applied)
    q = basis @ w[p + "W_q.weight"].T[:, head * D_HEAD : (head + 1) * D_HEAD]
    k = basis @ w[p + "W_k.weight"].T[:, kv * D_HEAD : (kv + 1) * D_HEAD]
    v = basis @ w[p + "W_v.weight"].T[:, kv * D_HEAD : (kv + 1) * D_HEAD]
    out = v @ w[p + "W_o.weight"].T[head * D_HEAD : (head + 1) * D_HEAD]  # row i: OV e_i
    return np.einsum("id,jd->ij", q, k), out.T


@pytest.mark.parametrize("layer, head", [(0, 0), (0, 3), (1, 1), (1, 2)])
def test_the_circuits_equal_a_second_implementation(layer, head):
    model = _model()
    w = _numpy(model)
    qk, ov = _second_qk_ov(w, layer, head)
    np.testing.assert_allclose(
        circuits.head_qk(model, layer, head).detach().double(), qk, atol=1e-6
    )
    np.testing.assert_allclose(
        circuits.head_ov(model, layer, head).detach().double(), ov, atol=1e-6
    )
    unembed = w["output.weight"] * w["norm.weight"]
    full = (unembed - unembed.mean(0)) @ ov @ w["embedding.weight"].T
    ours = circuits.full_ov_circuit(model, layer, head)
    np.testing.assert_allclose(ours.detach().double(), full, atol=1e-6)
    eig = np.linalg.eigvals(full)
    assert circuits.copying_score(ours) == pytest.approx(
        eig.real.sum() / np.abs(eig).sum(), abs=1e-6
    )


def test_the_qk_circuit_gives_the_heads_scores():
    """x_q^T QK x_k is the head's score before RoPE and the 1/sqrt(d_head), on the normed x."""
    model = _model()
    attn, norm = model.blocks[1].self_attn, model.blocks[1].addnorm1.norm
    x = torch.randn(5, CONFIG.d_model)
    xn = x / x.pow(2).mean(-1, keepdim=True).add(norm.eps).sqrt()  # the gain is in QK
    q = attn.split_heads(attn.W_q(norm(x)[None]))[0, 2]  # head 2, (5, d_head)
    k = attn.split_heads(attn.W_k(norm(x)[None]), attn.num_kv_heads)[0, 1]  # its kv head 1
    torch.testing.assert_close(xn @ circuits.head_qk(model, 1, 2) @ xn.T, q @ k.T)


def test_copying_and_composition_scores_on_known_matrices():
    assert circuits.copying_score(torch.eye(6) * 3) == pytest.approx(1.0)
    assert circuits.copying_score(-torch.eye(6)) == pytest.approx(-1.0)
    rotation = torch.tensor([[0.0, -1.0], [1.0, 0.0]])  # eigenvalues +-i: copies nothing
    assert circuits.copying_score(rotation) == pytest.approx(0.0, abs=1e-12)
    a = torch.zeros(4, 4)
    a[0, 0] = 1.0
    b = torch.zeros(4, 4)
    b[1, 1] = 1.0
    assert circuits.composition_score(a, a) == pytest.approx(1.0)
    assert circuits.composition_score(a, b) == 0.0  # b reads nothing a writes
    with pytest.raises(ValueError, match="square"):
        circuits.copying_score(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"second \(n, m\) and first \(m, k\)"):
        circuits.composition_score(torch.zeros(3, 2), torch.zeros(4, 4))


def test_models_the_circuits_cannot_read_are_refused_by_name():
    with pytest.raises(ValueError, match="norm='layer'"):
        circuits.head_qk(mhbook.DecoderOnlyLM(CONFIG.replace(norm="layer"), VOCAB), 0, 0)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 1\], got 2"):
        circuits.head_ov(_model(), 2, 0)
    with pytest.raises(ValueError, match=r"head must be in \[0, 3\], got 4"):
        circuits.head_ov(_model(), 0, 4)
