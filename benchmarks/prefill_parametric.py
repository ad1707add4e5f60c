"""A prefill at prompt lengths past the per-size versions: GPT-2 small's layers (random
weights, vocabulary 4096) compiled with dynamic=True, eager vs polytile's parametric graph
(max_specializations=0) vs a per-size version of the same length, each timed alone
(median of --rounds calls after a warm-up), logits compared with eager's.

    python benchmarks/prefill_parametric.py --lengths 32 100 200 --out benchmarks/results/prefill-zen4
    (add --cache-weights for polytile's cache_weights option in both modes)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
import transformers

import polytile


def timed(fn, ids, rounds):
    fn(input_ids=ids)
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn(input_ids=ids)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 100, 200])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="")
    ap.add_argument("--cache-weights", action="store_true", help="polytile's cache_weights option (both modes)")
    a = ap.parse_args()
    torch.manual_seed(0)
    m = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=4096, n_positions=1024)).eval()
    rows = []
    with torch.no_grad():
        for mode, opts in (("parametric", {"max_specializations": 0}), ("per-size", {"dynamic": "specialize"})):
            torch._dynamo.reset()
            f = torch.compile(m, backend="polytile", dynamic=True, options=dict(opts, cache_weights=a.cache_weights))
            for n in a.lengths:
                ids = torch.randint(0, 4096, (1, n))
                t0 = time.perf_counter()
                err = (f(input_ids=ids).logits - m(input_ids=ids).logits).abs().max().item()
                first = time.perf_counter() - t0
                rows.append({"mode": mode, "tokens": n, "eager_ms": timed(m, ids, a.rounds),
                             "polytile_ms": timed(f, ids, a.rounds), "first_call_s": first, "max_abs_err": err})
                r = rows[-1]
                print(f"{mode:10s} {n:5d} tokens: eager {r['eager_ms']:.1f} ms, polytile {r['polytile_ms']:.1f} ms "
                      f"({r['eager_ms'] / r['polytile_ms']:.2f}x eager), first call {first:.1f} s, err {err:.1e}",
                      flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        host = {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                "torch": torch.__version__, "polytile_stats": {k: polytile.stats()[k] for k in
                                                                ("parametric_graphs", "specialized_versions")}}
        name = "prefill-cache-weights.json" if a.cache_weights else "prefill.json"
        with open(os.path.join(a.out, name), "w") as fh:
            json.dump({"host": host, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
