"""Command line: ``polytile demo`` (more commands come with the benchmark suites)."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="polytile", description="polytile compiler tools")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="compile resnet18 and BERT, check against eager, time vs eager and Inductor")
    d.add_argument("--threads", type=int, default=None)
    d.add_argument("--rounds", type=int, default=10)
    d.add_argument("--seq", type=int, default=128)
    d.add_argument("--no-inductor", action="store_true", help="skip torch.compile's default backend")
    b = sub.add_parser("bench", help="benchmark suites").add_subparsers(dest="what", required=True)
    m = b.add_parser("models", help="the model suite of shared/bench/models.csv: coverage, accuracy, speed")
    m.add_argument("--suite", choices=["timm", "huggingface", "all"], default="all")
    m.add_argument("--only", action="append", default=[], metavar="NAME", help="run only this model (repeatable)")
    m.add_argument("--batch", type=int, default=None, help="override the batch size of every model")
    m.add_argument("--threads", type=int, default=2)
    m.add_argument("--rounds", type=int, default=10, help="timed calls per system (fewer for slow models)")
    m.add_argument("--budget", type=float, default=60.0, help="seconds of timing per model, at most")
    m.add_argument("--no-inductor", action="store_true")
    m.add_argument("--models-csv", default=None, help="default: ../shared/bench/models.csv")
    m.add_argument("--out", default="bench-out", help="folder for report.md, results.json, speedup.png")
    m.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="the models' parameters and inputs in this type (every system runs them so)")
    m.add_argument("--quantize", choices=["int8"], default=None,
                   help="the models quantized by PyTorch 2 export quantization (x86 quantizer), every system the same")
    m.add_argument("--train", action="store_true",
                   help="training mode: gradients and SGD steps against eager, forward+backward step time")
    m.add_argument("--options", default=None, metavar="JSON",
                   help='extra polytile options, e.g. \'{"fusion": false}\' for an ablation')
    f = b.add_parser("fusion", help="memory-bound workloads: polytile with/without fusion vs eager and Inductor")
    f.add_argument("--threads", type=int, default=2)
    f.add_argument("--rounds", type=int, default=20)
    f.add_argument("--scale", type=int, default=1, help="multiply the row counts")
    f.add_argument("--only", action="append", default=[], metavar="NAME")
    f.add_argument("--no-inductor", action="store_true")
    f.add_argument("--out", default=None, help="also write report.md and results.json here")
    g = b.add_parser("contractions", help="GEMM and conv2d shapes: polytile vs eager and Inductor, GFLOP/s, FMA peak")
    g.add_argument("--threads", type=int, default=2)
    g.add_argument("--rounds", type=int, default=10)
    g.add_argument("--kind", action="append", choices=["gemm", "conv"], default=[])
    g.add_argument("--limit", type=int, default=None, help="first N shapes of each file")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="the operands in this type (the peak: vdpbf16ps's for bfloat16 where the CPU has it)")
    g.add_argument("--no-inductor", action="store_true")
    g.add_argument("--shapes-dir", default=None, help="default: ../shared/bench")
    g.add_argument("--out", default=None, help="also write report.md, results.json and speedup.png here")
    t = b.add_parser("attention", help="attention configs: polytile vs eager SDPA and Inductor, memory")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--rounds", type=int, default=10)
    t.add_argument("--limit", type=int, default=None, help="first N configs")
    t.add_argument("--no-inductor", action="store_true")
    t.add_argument("--long", action="store_true", help="add a 4096-token causal config (memory row)")
    t.add_argument("--configs", default=None, help="default: ../shared/bench/attention_configs.csv")
    t.add_argument("--out", default=None, help="also write report.md, results.json and speedup.png here")
    cv = b.add_parser("coverage", help="PyTorch 2's benchmark model lists (HF, TIMM, TorchBench): pass / fallback / "
                      "crash per model, each in its own process")
    from .bench.coverage import add_arguments as _coverage_arguments

    _coverage_arguments(cv)
    gp = b.add_parser("gpu", help="on an NVIDIA GPU: GEMM, conv, attention and models, polytile's GPU backend vs "
                      "eager, Inductor and Inductor max-autotune (see polytile/bench/gpu.py)")
    gp.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run (default 420)")
    gp.add_argument("--rounds", type=int, default=10)
    gp.add_argument("--quick", action="store_true", help="first 6 rows of each shape file")
    gp.add_argument("--no-autotune", action="store_true", help="skip Inductor's max-autotune column")
    gp.add_argument("--no-models", action="store_true")
    gp.add_argument("--shapes-dir", default=None, help="default: ../shared/bench")
    gp.add_argument("--out", default="bench-gpu", help="folder for report.md and results.json")
    gn = b.add_parser("generate", help="generate() of GPT-2, Llama-style and T5 configs: tokens/s, time to first "
                      "token and compile counts, eager vs Inductor (dynamic=True) vs polytile")
    gn.add_argument("--size", choices=["small", "tiny"], default="small")
    gn.add_argument("--batch", type=int, action="append", default=[], help="default: 1 and 4")
    gn.add_argument("--prompt", type=int, default=32)
    gn.add_argument("--new-tokens", type=int, default=32)
    gn.add_argument("--rounds", type=int, default=3)
    gn.add_argument("--threads", type=int, default=2)
    gn.add_argument("--only", action="append", choices=["gpt2", "llama", "t5"], default=[])
    gn.add_argument("--no-inductor", action="store_true")
    gn.add_argument("--out", default=None, help="also write report.md and results.json here")
    j = b.add_parser("jax", help="MLP, CNN and transformer block in JAX: polytile.jax.jit vs jax.jit (XLA)")
    j.add_argument("--threads", type=int, default=2)
    j.add_argument("--rounds", type=int, default=20)
    j.add_argument("--only", action="append", choices=["mlp", "cnn", "transformer"], default=[])
    j.add_argument("--out", default=None, help="also write report.md and results.json here")
    a = ap.parse_args(argv)
    if a.cmd == "bench" and a.what == "jax":
        from .bench import jaxmodels

        return jaxmodels.main(["--threads", str(a.threads), "--rounds", str(a.rounds)]
                              + [f"--only={m}" for m in a.only] + (["--out", a.out] if a.out else []),
                              command="polytile " + " ".join(argv if argv is not None else sys.argv[1:]))
    if a.cmd == "bench" and a.what == "generate":
        from .bench import generate

        return generate.main(a.size, tuple(a.batch) or (1, 4), a.prompt, a.new_tokens, a.rounds, not a.no_inductor,
                             a.only, a.threads, a.out,
                             command="polytile " + " ".join(argv if argv is not None else sys.argv[1:]))
    if a.cmd == "bench" and a.what == "coverage":
        return _bench_coverage(a, argv)
    if a.cmd == "bench" and a.what == "attention":
        return _bench_attention(a, argv)
    if a.cmd == "bench" and a.what == "gpu":
        return _bench_gpu(a)
    if a.cmd == "bench" and a.what == "contractions":
        return _bench_contractions(a, argv)
    if a.cmd == "bench" and a.what == "fusion":
        return _bench_fusion(a, argv)
    if a.cmd == "bench":
        return _bench_models(a, argv)
    if a.cmd == "demo":
        from .demo import run_demo

        print(run_demo(threads=a.threads, rounds=a.rounds, seq=a.seq, inductor=not a.no_inductor))
    return 0


def _bench_models(a, argv) -> int:
    from .bench import report, suite, zoo

    csv_path = a.models_csv or zoo.default_models_csv()
    if not csv_path:
        print("polytile: cannot find shared/bench/models.csv; pass --models-csv", file=sys.stderr)
        return 2
    specs = [s for s in zoo.read_models(csv_path) if a.suite in ("all", s.suite) and (not a.only or s.name in a.only)]
    if not specs:
        print("polytile: no model matches", file=sys.stderr)
        return 2
    command = "polytile " + " ".join(argv if argv is not None else sys.argv[1:])
    env = suite.environment()
    env["threads"] = a.threads
    from .bench.peak import fma_peak

    env[report.PEAK_KEY] = round(fma_peak(a.threads) / 1e9, 1)

    def save(results):  # rewrite the report after every model: a long run leaves partial results
        report.write_report(results, env, a.out, command)

    import json

    extra = json.loads(a.options) if a.options else None
    if extra:
        env["polytile options"] = extra
    if a.train:
        env["mode"] = "training"
    import torch

    dtype = None if a.dtype == "float32" else getattr(torch, a.dtype)
    if dtype is not None:
        env["dtype"] = a.dtype
    if a.quantize:
        env["quantized"] = f"{a.quantize} (PT2E, x86 quantizer)"
    results = suite.run_suite(specs, batch=a.batch, threads=a.threads, rounds=a.rounds, time_budget_s=a.budget,
                              inductor=not a.no_inductor, on_result=save, options=extra, train=a.train, dtype=dtype,
                              quantize=a.quantize)
    # again at the end, the larger kept (a reading taken while the host was busy is low)
    env[report.PEAK_KEY] = max(env[report.PEAK_KEY], round(fma_peak(a.threads) / 1e9, 1))
    paths = report.write_report(results, env, a.out, command)
    print(report.summary(results))
    for k, v in paths.items():
        print(f"{k}: {v}")
    return 0


def _bench_coverage(a, argv) -> int:
    from .bench import coverage

    return coverage.main_args(a, "polytile " + " ".join(argv if argv is not None else sys.argv[1:]))


def _bench_gpu(a) -> int:
    import os

    from .bench import gpu, zoo

    shapes = a.shapes_dir or (os.path.dirname(zoo.default_models_csv() or "") or None)
    if not shapes:
        print("polytile: cannot find shared/bench; pass --shapes-dir", file=sys.stderr)
        return 2
    print(gpu.run(shapes, a.out, budget_s=a.budget, rounds=a.rounds, quick=a.quick, autotune=not a.no_autotune,
                  models=not a.no_models))
    return 0


def _bench_contractions(a, argv) -> int:
    import os

    from .bench import contractions, zoo

    shapes = a.shapes_dir or (os.path.dirname(zoo.default_models_csv() or "") or None)
    if not shapes:
        print("polytile: cannot find shared/bench; pass --shapes-dir", file=sys.stderr)
        return 2
    import torch

    text, results = contractions.run(shapes, threads=a.threads, rounds=a.rounds, inductor=not a.no_inductor,
                                     kinds=tuple(a.kind or ("gemm", "conv")), limit=a.limit, dtype=getattr(torch, a.dtype))
    return _report("Contraction benchmark", text, results, a.out, argv, contractions.chart)


def _bench_attention(a, argv) -> int:
    import os

    from .bench import attention, contractions, zoo

    path = a.configs or os.path.join(os.path.dirname(zoo.default_models_csv() or ""), "attention_configs.csv")
    if not os.path.exists(path):
        print("polytile: cannot find attention_configs.csv; pass --configs", file=sys.stderr)
        return 2
    configs = attention.read_configs(path)[: a.limit]
    if a.long:
        configs.append({"batch": 1, "heads": 8, "kv_heads": 8, "seq_q": 4096, "seq_k": 4096, "head_dim": 64,
                        "causal": True})
    text, results = attention.run(configs, threads=a.threads, rounds=a.rounds, inductor=not a.no_inductor)
    return _report("Attention benchmark", text, results, a.out, argv, contractions.chart)


def _bench_fusion(a, argv) -> int:
    from .bench import fusion

    text, results = fusion.run(threads=a.threads, rounds=a.rounds, scale=a.scale, inductor=not a.no_inductor,
                               only=a.only or None)
    return _report("Fusion benchmark", text, results, a.out, argv)


def _report(title: str, text: str, results: list[dict], out_dir: str | None, argv, chart=None) -> int:
    """Print a benchmark's report; with ``out_dir``, also write report.md, results.json and
    (given ``chart``) speedup.png there."""
    import json
    import os

    from .bench import suite

    command = "polytile " + " ".join(argv if argv is not None else sys.argv[1:])
    env = suite.environment()
    out = f"# {title}\n\nCommand: `{command}`\n\nMachine: {env}\n\n{text}\n"
    print(out)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "report.md"), "w") as fh:
            fh.write(out)
        with open(os.path.join(out_dir, "results.json"), "w") as fh:
            json.dump({"environment": env, "command": command, "results": results}, fh, indent=1)
        if chart is not None:
            chart(results, os.path.join(out_dir, "speedup.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
