"""Everything runs on the ``meta`` device (shapes only, no data).

A tensor created without ``device=`` lands on the CPU, and mixing it with meta tensors
raises, so these tests catch code that forgets to create tensors on the inputs' device.
"""

from __future__ import annotations

import pytest
import torch

import mhbook

META = torch.device("meta")
SRC_VOCAB, TGT_VOCAB, D_MODEL, NUM_HEADS = 11, 13, 16, 4


def _meta_model(norm_first: bool) -> mhbook.Transformer:
    with META:
        return mhbook.Transformer(
            mhbook.ModelConfig(D_MODEL, NUM_HEADS, 2, 32, dropout=0.1, norm_first=norm_first),
            SRC_VOCAB,
            TGT_VOCAB,
        )


def _meta_batch(batch=2, src_len=5, tgt_len=4):
    src = torch.randint(0, SRC_VOCAB, (batch, src_len), device=META)
    tgt_in = torch.randint(0, TGT_VOCAB, (batch, tgt_len), device=META)
    valid_lens = torch.full((batch,), src_len, device=META)
    return src, tgt_in, valid_lens


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_transformer_forward_backward_on_meta(norm_first):
    model = _meta_model(norm_first).train()
    assert all(p.device.type == "meta" for p in model.parameters())
    src, tgt_in, valid_lens = _meta_batch()
    logits = model(src, tgt_in, valid_lens)
    assert logits.device.type == "meta" and logits.shape == (2, 4, TGT_VOCAB)
    logits.sum().backward()
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in model.parameters())


def test_model_moved_to_meta():
    torch.manual_seed(0)
    model = mhbook.Transformer(mhbook.ModelConfig(D_MODEL, NUM_HEADS, 1, 32), SRC_VOCAB, TGT_VOCAB)
    model = model.to(META).eval()
    src, tgt_in, valid_lens = _meta_batch()
    with mhbook.record_attention(model) as weights:
        logits = model(src, tgt_in, valid_lens)
    assert logits.shape == (2, 4, TGT_VOCAB)
    assert all(w.device.type == "meta" for w in weights().values())


def test_cached_decoding_steps_on_meta():
    """What greedy generate does at each step, with the KV cache, minus the data-dependent stop."""
    model = _meta_model(False).eval()
    src, _, valid_lens = _meta_batch()
    with torch.no_grad():
        memory = model.encoder(src, valid_lens)
        memory_mask = mhbook.padding_mask(valid_lens, src.size(1))
        cache = model.decoder.new_cache()
        token = torch.zeros(2, 1, dtype=torch.long, device=META)
        for step in range(3):
            logits = model.decoder(token, memory, memory_mask, cache)
            token = logits[:, -1].argmax(dim=-1, keepdim=True)
            assert token.device.type == "meta" and token.shape == (2, 1)
            assert cache.length == step + 1
            assert cache.layers[0].keys.shape == (2, NUM_HEADS, step + 1, D_MODEL // NUM_HEADS)


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_greedy_generate_on_meta(use_cache):
    """Without values there is no early stop: it decodes max_new_tokens tokens."""
    model = _meta_model(False)
    src, _, valid_lens = _meta_batch()
    out = model.generate(src, valid_lens, 3, bos_id=1, eos_id=2, use_cache=use_cache)
    assert out.device.type == "meta" and out.shape == (2, 3)


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
def test_multihead_attention_on_meta(need_weights):
    with META:
        mha = mhbook.MultiHeadAttention(D_MODEL, NUM_HEADS)
    mha.head_mask = torch.ones(NUM_HEADS, device=META, requires_grad=True)
    query = torch.randn(2, 3, D_MODEL, device=META, requires_grad=True)
    memory = torch.randn(2, 5, D_MODEL, device=META)
    mask = mhbook.padding_mask(torch.full((2,), 5, device=META), 5) & mhbook.causal_mask(3, 5, META)
    out, weights = mha(query, memory, memory, mask, need_weights=need_weights)
    assert (weights is not None) == need_weights
    assert out.device.type == "meta" and out.shape == (2, 3, D_MODEL)
    out.sum().backward()
    assert query.grad.device.type == "meta" and mha.head_mask.grad.shape == (NUM_HEADS,)


def test_scaled_dot_product_attention_on_meta():
    q = torch.randn(2, 4, 3, 8, device=META, requires_grad=True)
    k = torch.randn(2, 4, 6, 8, device=META)
    mask = mhbook.causal_mask(3, 6, device=META)
    out, weights = mhbook.scaled_dot_product_attention(q, k, k, mask)
    assert out.shape == (2, 4, 3, 8) and weights.shape == (2, 4, 3, 6)
    out.sum().backward()
    assert q.grad.device.type == "meta"


def test_blocks_from_torch_on_meta():
    with META:
        encoder_layer = torch.nn.TransformerEncoderLayer(D_MODEL, NUM_HEADS, 32, batch_first=True)
        decoder_layer = torch.nn.TransformerDecoderLayer(D_MODEL, NUM_HEADS, 32, batch_first=True)
    encoder_block = mhbook.encoder_block_from_torch(encoder_layer)
    decoder_block = mhbook.decoder_block_from_torch(decoder_layer)
    x = torch.randn(2, 5, D_MODEL, device=META)
    memory = encoder_block(x, mhbook.padding_mask(torch.full((2,), 5, device=META), 5))
    out = decoder_block(x[:, :3], memory, mhbook.causal_mask(3, device=META))
    assert out.device.type == "meta" and out.shape == (2, 3, D_MODEL)
