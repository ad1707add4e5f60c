"""Text generation (issue 30): Hugging Face ``generate()`` with greedy decoding, eager vs Inductor
(``dynamic=True``) vs polytile, with the model's forward compiled and a KV cache that grows by
one key per token.

Per model and batch: time to first token cold (the first ``generate`` of a freshly compiled
forward: compiles included) and warm, decoding tokens per second (new tokens after the first,
from two generate lengths), native compiles (dynamo graphs for Inductor; polytile's compiled
graphs, its parametric graphs and per-size versions), and whether the tokens equal eager's.
Medians over rounds; the systems run one after the other (dynamo keeps one compiled-code cache
per code object, so their calls cannot alternate). Models are built from configs with random
weights.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from .. import counters
from ..benchmarking import format_table

VOCAB = 4096  # random-weight models: a smaller vocabulary keeps the comparison about the layers


def configs(size: str) -> dict:
    import transformers as tf

    if size == "tiny":  # for tests: seconds
        return {
            "gpt2": (tf.GPT2LMHeadModel, tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=256)),
            "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                                          max_position_embeddings=256)),
            "t5": (tf.T5ForConditionalGeneration, tf.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                              num_heads=4, decoder_start_token_id=0, pad_token_id=0)),
        }
    return {  # GPT-2 small's layers; a Llama-style model of about the same size; T5-small
        "gpt2": (tf.GPT2LMHeadModel, tf.GPT2Config(vocab_size=VOCAB)),
        "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                                                      num_attention_heads=12, num_key_value_heads=4, vocab_size=VOCAB,
                                                      max_position_embeddings=2048)),
        "t5": (tf.T5ForConditionalGeneration, tf.T5Config(vocab_size=VOCAB, decoder_start_token_id=0, pad_token_id=0)),
    }


def _generate(model, ids, n):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)


def _timed(model, ids, n) -> tuple[float, torch.Tensor]:
    t = time.perf_counter()
    out = _generate(model, ids, n)
    return time.perf_counter() - t, out


def _compiles(system: str) -> int:
    if system == "polytile":
        return counters.stats()["graphs_compiled"]
    from torch._dynamo.utils import counters as dyn

    return int(dyn["stats"]["unique_graphs"])


def run_one(name: str, model_cls, cfg, batch: int, prompt: int, new: int, rounds: int, inductor: bool) -> dict:
    torch.manual_seed(0)
    model = model_cls(cfg).eval()
    ids = torch.randint(1, cfg.vocab_size, (batch, prompt))
    other = torch.randint(1, cfg.vocab_size, (batch, prompt + 7))
    eager_fwd = model.forward
    row: dict = {"model": name, "batch": batch, "prompt": prompt, "new_tokens": new}
    ref = _generate(model, ids, new)
    for s in ["eager"] + (["inductor"] if inductor else []) + ["polytile"]:
        torch._dynamo.reset()  # (dynamo keeps compiled code per code object: one system at a time)
        counters.reset_stats()
        c0 = _compiles(s)
        if s != "eager":
            # cold: both compilers start from empty on-disk caches (polytile's shared objects;
            # Inductor's FX graph and compiled-code caches)
            fresh = tempfile.mkdtemp(prefix=f"generate-{s}-")
            if s == "polytile":
                model.forward = torch.compile(eager_fwd, backend="polytile", options={"cache_dir": fresh})
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh
                model.forward = torch.compile(eager_fwd, dynamic=True)
            row[f"{s}_ttft_cold_s"], _ = _timed(model, ids, 1)
            out = _generate(model, ids, new)  # warm-up of the decoding graphs
            row[f"{s}_same_tokens"] = bool(torch.equal(out, ref))
            warm = _compiles(s)
            _generate(model, ids, 2 * new)  # more tokens: must compile nothing
            row[f"{s}_decode_recompiles"] = _compiles(s) - warm
            _generate(model, other, new)  # another prompt length
            row[f"{s}_compiles"] = _compiles(s) - c0
            _generate(model, ids, new)  # (the prefill graph turned dynamic: a version for this prompt)
        firsts, totals = [], []
        for _ in range(rounds):
            firsts.append(_timed(model, ids, 1)[0])
            totals.append(_timed(model, ids, new)[0])
        first, total = statistics.median(firsts), statistics.median(totals)
        row[f"{s}_ttft_s"] = first
        row[f"{s}_tok_s"] = batch * (new - 1) / max(total - first, 1e-9)
        if s == "polytile":
            st = counters.stats()
            row["polytile_parametric_graphs"] = st["parametric_graphs"]
            row["polytile_versions"] = st["specialized_versions"]
            row["polytile_fallbacks"] = sum(st["ops_fallen_back"].values())
            row["polytile_eager_runs"] = st["eager_runs"]
        model.forward = eager_fwd
    return row


def report(rows: list[dict], inductor: bool, command: str, host: str) -> str:
    heads = ["model", "batch", "eager tok/s", "polytile tok/s", "x eager"]
    if inductor:
        heads += ["Inductor tok/s", "x Inductor"]
    heads += ["TTFT warm ms (eager / pt)", "TTFT cold s (pt" + (" / Ind" if inductor else "") + ")",
              "compiles (pt" + (" / Ind" if inductor else "") + ")", "decode recompiles", "same tokens"]
    table = []
    for r in rows:
        line = [r["model"], r["batch"], f"{r['eager_tok_s']:.1f}", f"{r['polytile_tok_s']:.1f}",
                f"{r['polytile_tok_s'] / r['eager_tok_s']:.2f}"]
        if inductor:
            line += [f"{r['inductor_tok_s']:.1f}", f"{r['polytile_tok_s'] / r['inductor_tok_s']:.2f}"]
        line += [f"{1e3 * r['eager_ttft_s']:.0f} / {1e3 * r['polytile_ttft_s']:.0f}",
                 f"{r['polytile_ttft_cold_s']:.1f}" + (f" / {r['inductor_ttft_cold_s']:.1f}" if inductor else ""),
                 f"{r['polytile_compiles']}" + (f" / {r['inductor_compiles']}" if inductor else ""),
                 f"{r['polytile_decode_recompiles']}" + (f" / {r['inductor_decode_recompiles']}" if inductor else ""),
                 "yes" if r["polytile_same_tokens"] and (not inductor or r["inductor_same_tokens"]) else "NO"]
        table.append(line)
    return "\n".join([
        "# Text generation: greedy generate(), eager vs Inductor (dynamic=True) vs polytile", "",
        f"Command: `{command}`", f"Host: {host}", "",
        "tok/s: new tokens after the first per second (batch x tokens); TTFT: generate() of one token; cold: "
        "the first call of a freshly compiled forward, compiles included, both compilers with empty on-disk caches. compiles: native compiles over a "
        "first generate, one with twice the tokens and one with a prompt 7 tokens longer (polytile: compiled "
        "graphs, one per static or parametric segment; Inductor: dynamo graphs); decode recompiles: during "
        "the generate with twice the tokens.", "",
        format_table(heads, table), ""])


def main(size: str = "small", batches=(1, 4), prompt: int = 32, new: int = 32, rounds: int = 3,
         inductor: bool = True, only=(), threads: int = 2, out: str | None = None, command: str = "") -> int:
    from ..backends.cpu.machine import resolve
    from .suite import environment

    torch.set_num_threads(threads)
    rows = []
    env = environment()
    m = resolve(None)
    host = (f"{env.get('cpu', env['machine'])} ({m.vector_bytes * 8}-bit vectors), {threads} threads; "
            f"torch {env['torch']}, transformers {env.get('transformers', '?')}")
    for name, (cls, cfg) in configs(size).items():
        if only and name not in only:
            continue
        for b in batches:
            rows.append(run_one(name, cls, cfg, b, prompt, new, rounds, inductor))
            text = report(rows, inductor, command, host)
            if out:
                Path(out).mkdir(parents=True, exist_ok=True)
                Path(out, "report.md").write_text(text)
                Path(out, "results.json").write_text(json.dumps(rows, indent=1))
    print(report(rows, inductor, command, host))
    return 0 if all(r["polytile_same_tokens"] for r in rows) else 1
