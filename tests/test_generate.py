"""Text generation: Hugging Face ``generate()`` with the model's forward compiled by polytile
gives eager's tokens (greedy decoding: every step's argmax must agree). Each new length is a
new input shape: dynamo marks the sizes dynamic; the decoding step (its KV cache grows by one
key per token) compiles once with the length as a parameter, a prompt length gets its own
version of the prefill graph for the first ``Options.max_specializations`` lengths."""
from __future__ import annotations

import pytest
import torch

import polytile

transformers = pytest.importorskip("transformers")


def _greedy(model, ids, new_tokens):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)


def _check_generation(model_cls, cfg, prompt_shape, new_tokens):
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = model_cls(cfg).eval()
    ids = torch.randint(0, 256, prompt_shape)
    eager = model.forward
    ref = _greedy(model, ids, new_tokens)
    model.forward = torch.compile(eager, backend="polytile")
    out = _greedy(model, ids, new_tokens)
    assert out.shape == ref.shape and out.shape[1] >= new_tokens  # (T5 returns the decoder's tokens only)
    assert torch.equal(out, ref), (out, ref)
    st = polytile.stats()
    assert st["graphs_compiled"] >= 2 and st["ops_compiled"] > 0 and st["parametric_graphs"] >= 1, st
    # after warm-up, more new tokens compile nothing: the decoding step serves every length
    out = _greedy(model, ids, 3 * new_tokens)
    assert polytile.stats()["graphs_compiled"] == st["graphs_compiled"]
    # another prompt length: one more prefill version at most, decoding compiles nothing
    ids2 = torch.randint(0, 256, (prompt_shape[0], prompt_shape[1] + 3))
    out2 = _greedy(model, ids2, new_tokens)
    assert polytile.stats()["specialized_versions"] - st["specialized_versions"] <= 1
    assert polytile.stats()["eager_runs"] == st["eager_runs"]
    model.forward = eager
    assert torch.equal(out, _greedy(model, ids, 3 * new_tokens))
    assert torch.equal(out2, _greedy(model, ids2, new_tokens))


def test_gpt2_greedy_generation_matches_eager():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64)
    _check_generation(transformers.GPT2LMHeadModel, cfg, (2, 5), 6)


def test_llama_style_greedy_generation_matches_eager():
    """RoPE, RMSNorm, grouped-query attention (2 key/value heads for 4 query heads), SwiGLU."""
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=64)
    _check_generation(transformers.LlamaForCausalLM, cfg, (1, 6), 6)


def test_t5_greedy_generation_matches_eager():
    """Encoder-decoder: cross-attention over the encoder's states, self-attention over a growing cache."""
    cfg = transformers.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                decoder_start_token_id=0, pad_token_id=0)
    _check_generation(transformers.T5ForConditionalGeneration, cfg, (1, 7), 5)


def test_bench_generate_runs_and_reports(tmp_path, capsys):
    """``polytile bench generate`` end to end on a tiny GPT-2: a report with the same tokens as
    eager and no compile while decoding more tokens."""
    import json

    from polytile.cli import main

    rc = main(["bench", "generate", "--size", "tiny", "--only", "gpt2", "--batch", "1", "--rounds", "1",
               "--new-tokens", "4", "--no-inductor", "--out", str(tmp_path)])
    assert rc == 0
    (row,) = json.loads((tmp_path / "results.json").read_text())
    assert row["polytile_same_tokens"] and row["polytile_decode_recompiles"] == 0
    assert row["polytile_parametric_graphs"] >= 1 and row["polytile_fallbacks"] == 0
    assert row["polytile_tok_s"] > 0 and row["eager_tok_s"] > 0
    assert "| gpt2" in (tmp_path / "report.md").read_text()


def test_llama_with_hugging_face_static_cache_matches_eager():
    """HF's static cache (a fixed-size cache written in place at each step): eager's tokens for
    two prompt lengths, a bounded number of per-size versions."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(cfg).eval()
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation="static")
    prompts = [torch.randint(1, 256, (1, n)) for n in (6, 9, 6)]
    with torch.no_grad():
        refs = [model.generate(p, **kw) for p in prompts]
        model.forward = torch.compile(model.forward, backend="polytile")
        st0 = polytile.stats()
        outs = [model.generate(p, **kw) for p in prompts]
    for out, ref in zip(outs, refs):
        assert torch.equal(out, ref), (out, ref)
    st = polytile.stats()
    assert st["specialized_versions"] - st0["specialized_versions"] <= polytile.Options().max_specializations
    assert st["eager_runs"] == st0["eager_runs"]
