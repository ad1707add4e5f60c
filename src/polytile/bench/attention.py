"""Attention over shared/bench/attention_configs.csv, timed side by side (issue 6).

Each config runs ``F.scaled_dot_product_attention`` in eager PyTorch (its CPU flash kernel),
under Inductor (torch.compile's default) and under polytile, alternating calls, medians.
The table gives GFLOP/s (4 * B * H * L * S * D; causal counted whole), the largest error
against eager, and memory: polytile's intermediates (the arena of the compiled graph) next
to the size of the score matrix it never stores.
"""
from __future__ import annotations

import csv
import math

import torch
import torch.nn.functional as F

from .. import counters
from ..benchmarking import format_table, time_side_by_side


def read_configs(path: str) -> list[dict]:
    with open(path) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return [{"batch": int(r["batch"]), "heads": int(r["heads"]), "kv_heads": int(r["kv_heads"]),
             "seq_q": int(r["seq_q"]), "seq_k": int(r["seq_k"]), "head_dim": int(r["head_dim"]),
             "causal": r["causal"].strip().lower() == "true"} for r in rows]


def label(c: dict) -> str:
    s = f"{c['batch']}x{c['heads']}"
    if c["kv_heads"] != c["heads"]:
        s += f"(kv {c['kv_heads']})"
    s += f" L{c['seq_q']}" + (f" S{c['seq_k']}" if c["seq_k"] != c["seq_q"] else "") + f" D{c['head_dim']}"
    return s + (" causal" if c["causal"] else "")


def _fn(c: dict):
    gqa = c["kv_heads"] != c["heads"]

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=c["causal"], enable_gqa=gqa)
    return f


def run(configs: list[dict], threads: int = 2, rounds: int = 10, inductor: bool = True) -> tuple[str, list[dict]]:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    rows, results = [], []
    for c in configs:
        B, H, KH, L, S, D = (c[k] for k in ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim"))
        args = (torch.randn(B, H, L, D), torch.randn(B, KH, S, D), torch.randn(B, KH, S, D))
        fn = _fn(c)
        with torch.no_grad():
            ref = fn(*args)
            torch._dynamo.reset()
            counters.reset_stats()
            pt = torch.compile(fn, backend="polytile", options={"threads": threads})
            err = (pt(*args) - ref).abs().max().item()
            st = counters.stats()
            fns = {"eager": lambda: fn(*args), "polytile": lambda: pt(*args)}
            if inductor:
                ind = torch.compile(fn)
                ind(*args)
                fns["inductor"] = lambda: ind(*args)
            t = time_side_by_side(fns, warmup=2, rounds=rounds)
        flops = 4 * B * H * L * S * D
        r = {"kind": "attention", "shape": label(c), **c, **{f"{k}_ms": v * 1e3 for k, v in t.items()},
             "polytile_gflops": flops / t["polytile"] / 1e9, "max_abs_err": err,
             "fused": st.get("attention_fused", 0), "arena_mb": st["arena_bytes"] / 1e6,
             "score_matrix_mb": B * H * L * S * 4 / 1e6}
        results.append(r)
        ind_ms = r.get("inductor_ms")
        rows.append([r["shape"], f"{r['eager_ms']:.3f}", f"{ind_ms:.3f}" if ind_ms else "-", f"{r['polytile_ms']:.3f}",
                     f"{r['polytile_gflops']:.0f}", f"{r['eager_ms'] / r['polytile_ms']:.2f}x",
                     f"{ind_ms / r['polytile_ms']:.2f}x" if ind_ms else "-", "yes" if r["fused"] else "NO",
                     f"{r['arena_mb']:.1f}", f"{r['score_matrix_mb']:.1f}", f"{err:.1e}"])
    table = format_table(["config (B x H, L, S, D)", "eager ms", "Inductor ms", "polytile ms", "polytile GFLOP/s",
                          "vs eager", "vs Inductor", "fused", "polytile intermediates MB", "score matrix MB",
                          "max abs err"], rows)
    ge = _geo([r["eager_ms"] / r["polytile_ms"] for r in results])
    head = f"threads={threads}; median of {rounds} alternating rounds. Geomean vs eager SDPA {ge:.2f}x"
    if inductor and results:
        head += f", vs Inductor {_geo([r['inductor_ms'] / r['polytile_ms'] for r in results]):.2f}x"
    head += f"; slowest row vs eager {min(r['eager_ms'] / r['polytile_ms'] for r in results):.2f}x" if results else ""
    return head + "\n\n" + table, results


def _geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")
