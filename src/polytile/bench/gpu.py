"""The GPU benchmark (``polytile bench gpu``): on a machine with an NVIDIA GPU, polytile's GPU
backend against eager (cuBLAS, cuDNN, SDPA's FlashAttention), Inductor's default and Inductor
with ``mode="max-autotune"``, side by side, each result checked against eager first.

Sections: GEMM over ``gemm_shapes.csv`` (fp32 and fp16), conv over ``conv_shapes.csv`` (fp32,
fp16), attention over ``attention_configs.csv`` (fp16 against SDPA; polytile compiles the
written-out ``softmax(q k^T s) v``, the form it fuses), and a few models of ``models.csv`` at
batch 1 and 8 (fp16 and fp32). A case polytile runs through ATen in part is reported as
``fallback`` with its count, never timed as polytile's. The whole run keeps to ``budget_s``
(default 420 s: one H100/H200 command of the device tool), each kind of case to a share of
it, Inductor's max-autotune to the first cases of each kind: what does not fit is listed as
skipped. Timing: CUDA events around enough back-to-back calls to fill about 2 ms, systems
alternating, median of the rounds.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from .. import counters
from ..accuracy import check_accuracy, fp64_reference
from ..benchmarking import format_table, time_side_by_side
from .attention import label as attention_label
from .attention import read_configs
from .contractions import conv_cases, gemm_cases

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
MODELS = [("huggingface", "BertForMaskedLM"), ("timm", "resnet50"), ("huggingface", "GPT2ForSequenceClassification")]


def _gpu_time(fns: dict[str, Callable], rounds: int) -> dict[str, float]:
    """Median seconds per call of each function, alternating, CUDA events around a batch of calls
    (on the CPU, in the tests: the wall clock)."""
    if not torch.cuda.is_available():
        return time_side_by_side(fns, warmup=1, rounds=rounds)
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    reps = {}
    for k, f in fns.items():
        t0 = time.perf_counter()
        f()
        torch.cuda.synchronize()
        reps[k] = max(1, min(200, int(2e-3 / max(time.perf_counter() - t0, 1e-6))))
    samples = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps[k]):
                f()
            b.record()
            b.synchronize()
            samples[k].append(a.elapsed_time(b) / 1e3 / reps[k])
    return {k: statistics.median(v) for k, v in samples.items()}


# each kind of case gets this share of what is left of the budget when its first case starts
SHARES = {"gemm": 0.25, "conv": 0.33, "attention": 0.25, "model": 1.0}
AUTOTUNED = 3  # cases of each section that Inductor's max-autotune compiles (minutes each otherwise)


class _Run:
    def __init__(self, budget_s: float, rounds: int, autotune: bool):
        self.deadline = time.monotonic() + budget_s
        self.rounds, self.autotune = rounds, autotune
        self.results: list[dict] = []
        self.kind, self.kind_deadline, self.kind_cases = None, self.deadline, 0
        self.env: dict | None = None  # the machine and versions, for the report

    def left(self) -> float:
        return min(self.deadline, self.kind_deadline) - time.monotonic()

    def _enter(self, section: str) -> None:
        kind = section.split()[0]
        if kind != self.kind:
            now = time.monotonic()
            self.kind, self.kind_cases = kind, 0
            self.kind_deadline = now + SHARES.get(kind, 1.0) * max(0.0, self.deadline - now)
        self.kind_cases += 1

    def case(self, section: str, label: str, flops: float, fn: Callable, args: tuple, tol: float,
             baseline: Callable | None = None) -> None:
        """``fn`` compiled by polytile and by Inductor, timed against eager's ``baseline`` (default:
        ``fn`` itself), after polytile's result is checked against it."""
        res = {"section": section, "case": label, "flops": flops}
        self.results.append(res)
        self._enter(section)
        if self.left() < 5:
            res["status"] = "skipped (time budget)"
            return
        try:
            base = baseline or fn
            with torch.no_grad():
                ref = base(*args)
                torch._dynamo.reset()
                counters.reset_stats()
                pt = torch.compile(fn, backend="polytile", options={"target": "gpu", "compile_budget_s": 120})
                out = pt(*args)
                pt(*args)
                again = pt(*args)  # the third call replays the captured CUDA graph
                st = counters.stats()
                fallbacks = sum(st["ops_fallen_back"].values()) + st["graphs_failed"]
                fp64 = lambda: fp64_reference(base, args)  # noqa: E731
                ok, details = check_accuracy(out, ref, fp64, tol)
                ok2, details2 = check_accuracy(again, ref, fp64, tol)
                ok, details = ok and ok2, details + [f"third call: {d}" for d in details2]
                res["cuda_graphs"] = st.get("cuda_graphs", 0)
                res["accuracy"] = "pass" if ok else "FAIL: " + "; ".join(details)[:200]
                res["fallbacks"] = fallbacks
                res["status"] = "fallback" if fallbacks else ("pass" if ok else "wrong")
                fns = {"eager": lambda: base(*args)}
                if not fallbacks and ok:
                    fns["polytile"] = lambda: pt(*args)
                ind = torch.compile(fn)
                ind(*args)
                fns["inductor"] = lambda: ind(*args)
                if self.autotune and self.kind_cases <= AUTOTUNED and self.left() > 60:
                    tuned = torch.compile(fn, mode="max-autotune")
                    tuned(*args)
                    fns["inductor_max_autotune"] = lambda: tuned(*args)
                t = _gpu_time(fns, self.rounds)
            res.update({f"{k}_ms": v * 1e3 for k, v in t.items()})
        except Exception as e:  # one case's failure is reported, the run goes on
            res["status"] = f"error: {type(e).__name__}: {str(e)[:160]}"


def _sections(shapes_dir: str, quick: bool):
    lim = 6 if quick else None
    for dt in ("fp16", "fp32"):
        for c in gemm_cases(os.path.join(shapes_dir, "gemm_shapes.csv"))[:lim]:
            yield "gemm " + dt, c.label, c.flops, c.make, DTYPES[dt]
    for dt in ("fp16", "fp32"):
        for c in conv_cases(os.path.join(shapes_dir, "conv_shapes.csv"))[:lim]:
            yield "conv " + dt, c.label, c.flops, c.make, DTYPES[dt]
    for c in read_configs(os.path.join(shapes_dir, "attention_configs.csv"))[:lim]:
        yield "attention fp16", attention_label(c), _attention_flops(c), _attention_make(c), torch.float16


def _attention_flops(c: dict) -> float:
    f = 4.0 * c["batch"] * c["heads"] * c["seq_q"] * c["seq_k"] * c["head_dim"]
    return f / 2 if c["causal"] else f


def _attention_make(c: dict):
    def make():
        B, H, KH, L, S, D = (c[k] for k in ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim"))
        rep = H // KH

        def fn(q, k, v):
            if rep > 1:
                k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            s = (q @ k.transpose(-1, -2)) * (D ** -0.5)
            if c["causal"]:  # SDPA's is_causal: the top-left-aligned lower triangle
                s = s.masked_fill(torch.ones(L, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
            return torch.softmax(s.float(), -1).to(q.dtype) @ v
        fn.sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=c["causal"], enable_gqa=rep > 1)
        return fn, (torch.randn(B, H, L, D), torch.randn(B, KH, S, D), torch.randn(B, KH, S, D))
    return make


def _to(args, dtype, device):
    return tuple(a.to(device=device, dtype=dtype if a.is_floating_point() else a.dtype) for a in args)


def run(shapes_dir: str, out_dir: str, budget_s: float = 420.0, rounds: int = 10, quick: bool = False,
        autotune: bool = True, models: bool = True, device: str = "cuda") -> str:
    """The benchmark on ``device`` ("cpu" only runs it through Triton's interpreter: a test of
    this script, not a measurement)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("polytile bench gpu: no CUDA device (this benchmark needs an NVIDIA GPU)")
    torch.manual_seed(0)
    r = _Run(budget_s, rounds, autotune)
    for section, label, flops, make, dtype in _sections(shapes_dir, quick):
        fn, args = make()
        r.case(section, label, flops, fn, _to(args, dtype, device), 2e-2 if dtype == torch.float16 else 1e-3,
               getattr(fn, "sdpa", None))
        _report(r, out_dir, budget_s)  # after every case: a run cut short still leaves its report
    if models:
        _models(r, shapes_dir, device)
    return _report(r, out_dir, budget_s)


def _models(r: _Run, shapes_dir: str, device: str) -> None:
    from . import zoo

    specs = {(s.suite, s.name): s for s in zoo.read_models(os.path.join(shapes_dir, "models.csv"))}
    for key in MODELS:
        spec = specs.get(key)
        if spec is None:
            continue
        for batch in (1, 8):
            for dt in ("fp16", "fp32"):
                try:
                    w = zoo.build(spec, batch=batch)
                except Exception as e:
                    r.results.append({"section": f"model {dt}", "case": f"{spec.name} b{batch}",
                                      "status": f"unbuildable: {e}"[:160]})
                    continue
                model = w.model.to(device=device, dtype=DTYPES[dt])
                kwargs = {k: v.to(device) for k, v in w.kwargs.items()}
                args = _to(w.args, DTYPES[dt], device)
                fn = (lambda *a, model=model, kwargs=kwargs: model(*a, **kwargs))
                r.case(f"model {dt}", f"{spec.name} b{batch}", 0.0, fn, args, 2e-2 if dt == "fp16" else 1e-3)


def _geo(xs):
    xs = [x for x in xs if x and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def _environment() -> dict:
    from .suite import environment

    try:
        env = environment()
    except Exception as e:  # (no C compiler on a GPU image: its version is then unknown)
        env = {"torch": torch.__version__, "environment": f"incomplete: {e}"}
    env.update(triton=_version("triton"), cuda=torch.version.cuda)
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count)
    else:
        env.update(gpu="none: Triton's interpreter on the CPU (a test run, not a measurement)")
    return env


def _report(r: _Run, out_dir: str, budget_s: float) -> str:
    os.makedirs(out_dir, exist_ok=True)
    if r.env is None:
        r.env = _environment()
    env = r.env
    rows, summary = [], []
    sections = list(dict.fromkeys(x["section"] for x in r.results))
    for sec in sections:
        rs = [x for x in r.results if x["section"] == sec]
        timed = [x for x in rs if "polytile_ms" in x]
        if timed:
            summary.append(f"{sec}: {len(timed)}/{len(rs)} timed; geomean {_geo([x['eager_ms'] / x['polytile_ms'] for x in timed]):.2f}x "
                           f"vs eager, {_geo([x['inductor_ms'] / x['polytile_ms'] for x in timed]):.2f}x vs Inductor")
        else:
            summary.append(f"{sec}: 0/{len(rs)} timed")
        for x in rs:
            f = lambda k: f"{x[k]:.3f}" if k in x else "-"  # noqa: E731
            tf = (f"{x['flops'] / x['polytile_ms'] / 1e9:.1f}" if x.get("flops") and "polytile_ms" in x else "-")
            rows.append([sec, x["case"], x.get("status", "-"), f("eager_ms"), f("inductor_ms"),
                         f("inductor_max_autotune_ms"), f("polytile_ms"), tf,
                         f"{x['eager_ms'] / x['polytile_ms']:.2f}x" if "polytile_ms" in x else "-",
                         f"{x['inductor_ms'] / x['polytile_ms']:.2f}x" if "polytile_ms" in x else "-"])
    table = format_table(["section", "case", "status", "eager ms", "Inductor ms", "Inductor max-autotune ms",
                          "polytile ms", "polytile TFLOP/s", "vs eager", "vs Inductor"], rows)
    text = ("# polytile GPU benchmark\n\nEnvironment: " + json.dumps(env) + "\n\n"
            + f"Budget {budget_s:.0f} s; median of {r.rounds} alternating rounds (CUDA events).\n\n"
            + "\n".join(f"- {s}" for s in summary) + "\n\n" + table + "\n")
    with open(os.path.join(out_dir, "report.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(out_dir, "results.json"), "w") as fh:
        json.dump({"environment": env, "results": r.results}, fh, indent=1, default=str)
    return text


def _version(mod: str) -> str:
    try:
        return __import__(mod).__version__
    except Exception:
        return "absent"
