"""The benchmark's two extra models (benchmarks/bench_flat.py) are what table (e) says they are:
the flat model is mhbook's Transformer to the last bit, in training too, and the wrapped
torch.nn.Transformer masks the source's padding as mhbook does; table (a)'s floor
(benchmarks.bench.kernels_only_attention) is mhbook's attention layer written out."""

from __future__ import annotations

from functools import partial

import pytest
import torch

import mhbook
from benchmarks.bench import D2L_CONFIG, random_translation_batch
from benchmarks.bench_flat import FlatTransformer, TorchTransformer
from mhbook.training.trainer import train_step

CONFIG = D2L_CONFIG.model  # d_model 32, 4 heads, 2 + 2 layers, d_ff 64, dropout 0.1


def _batches(n=3, batch=8, vocab=50):
    generator = torch.Generator().manual_seed(0)
    return [
        random_translation_batch(batch, 10, vocab, torch.device("cpu"), generator) for _ in range(n)
    ]


def _pair():
    torch.manual_seed(0)
    ours = mhbook.Transformer(CONFIG, 50, 50)
    flat = FlatTransformer(CONFIG, 50, 50)
    flat.load_state_dict(ours.state_dict())  # strict: the same parameters, the same names
    return ours, flat


def test_flat_model_computes_mhbooks_logits():
    ours, flat = _pair()
    b = _batches(1)[0]
    ours.eval(), flat.eval()
    with torch.no_grad():
        assert torch.equal(
            flat(b.src, b.tgt_in, b.src_valid_lens), ours(b.src, b.tgt_in, b.src_valid_lens)
        )


def test_flat_model_trains_to_the_same_bits():
    """fit's step from the same weights and seed: the same losses and weights, bit for bit
    (the same dropout draws in the same order, gradients added up in the same order)."""
    losses = {}
    models = dict(zip(("mhbook", "flat"), _pair()))
    loss_fn = partial(mhbook.translation_loss, pad_id=0)
    for name, model in models.items():
        model.train()
        optimizer = mhbook.make_optimizer(model, D2L_CONFIG.train)
        scheduler = mhbook.make_scheduler(optimizer, D2L_CONFIG.train)
        torch.manual_seed(1)
        losses[name] = [
            train_step(model, b, loss_fn, optimizer, scheduler, 1.0)[0].item()
            for b in _batches() * 2
        ]
    assert losses["flat"] == losses["mhbook"]
    for (key, theirs), ours in zip(
        models["flat"].state_dict().items(), models["mhbook"].state_dict().values()
    ):
        assert torch.equal(theirs, ours), key


def test_flat_model_takes_only_what_it_implements():
    with pytest.raises(NotImplementedError, match="post-norm"):
        FlatTransformer(mhbook.ModelConfig(d_model=32, num_heads=4, norm_first=True), 50, 50)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # its eval fast path
def test_torch_transformer_ignores_the_sources_padding():
    """PyTorch's key_padding_mask is True at padding: changing padded source tokens must
    not change the logits (it would if the mask were the book's, True = may attend)."""
    torch.manual_seed(0)
    model = TorchTransformer(CONFIG, 50, 50).eval()
    b = _batches(1)[0]
    other_src = b.src.clone()
    padded = torch.arange(10) >= b.src_valid_lens[:, None]
    assert padded.any()
    other_src[padded] = 7
    with torch.no_grad():
        logits = model(b.src, b.tgt_in, b.src_valid_lens)
        assert logits.shape == (8, 10, 50)
        torch.testing.assert_close(model(other_src, b.tgt_in, b.src_valid_lens), logits)
        assert not torch.allclose(model(b.src, b.tgt_in, b.src_valid_lens.clamp(max=4)), logits)


def test_kernels_only_attention_is_the_layers_forward_and_backward():
    """Table (a)'s floor computes what mhbook's layer computes, gradients included: it
    differs only in what runs around the same PyTorch calls."""
    from benchmarks.bench import kernels_only_attention

    torch.manual_seed(0)
    layer = mhbook.MultiHeadAttention(32, 4)
    x = torch.randn(2, 16, 32, requires_grad=True)
    ours = layer(x)[0]
    (grad_ours,) = torch.autograd.grad(ours.square().sum(), x)
    floor = kernels_only_attention(layer, x)
    (grad_floor,) = torch.autograd.grad(floor.square().sum(), x)
    torch.testing.assert_close(floor, ours, rtol=0, atol=1e-6)
    torch.testing.assert_close(grad_floor, grad_ours, rtol=0, atol=1e-5)
