"""Text generation: Hugging Face ``generate()`` with the model's forward compiled by polytile
gives eager's tokens (greedy decoding: every step's argmax must agree). Each new length is a
new input shape: dynamo marks the sizes dynamic, and polytile compiles a static version per
length (graphs with size arithmetic on their tensors included)."""
from __future__ import annotations

import pytest
import torch

import polytile

transformers = pytest.importorskip("transformers")


def _generate_both(model, ids, new_tokens):
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        model.forward = torch.compile(model.forward, backend="polytile")
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return out, ref


def _check_generation(model_cls, cfg, prompt_shape, new_tokens):
    torch.manual_seed(0)
    model = model_cls(cfg).eval()
    ids = torch.randint(0, 256, prompt_shape)
    out, ref = _generate_both(model, ids, new_tokens)
    assert out.shape == ref.shape == (prompt_shape[0], prompt_shape[1] + new_tokens)
    assert torch.equal(out, ref), (out, ref)
    st = polytile.stats()
    assert st["graphs_compiled"] >= 2 and st["ops_compiled"] > 0, st


def test_gpt2_greedy_generation_matches_eager():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64)
    _check_generation(transformers.GPT2LMHeadModel, cfg, (2, 5), 6)


def test_llama_style_greedy_generation_matches_eager():
    """RoPE, RMSNorm, grouped-query attention (2 key/value heads for 4 query heads), SwiGLU."""
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=64)
    _check_generation(transformers.LlamaForCausalLM, cfg, (1, 6), 6)
