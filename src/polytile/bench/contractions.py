"""GEMM and conv2d benchmark over ../shared/bench/{gemm,conv}_shapes.csv: polytile vs eager vs
Inductor side by side, GFLOP/s and the fraction of the FMA peak measured in the same run."""
from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..benchmarking import format_table, time_side_by_side
from .peak import bf16_dot_peak, fma_peak


@dataclass(frozen=True)
class Case:
    kind: str  # gemm | conv
    label: str
    flops: float
    make: object  # () -> (fn, args)


def _rows(path: str) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def gemm_cases(path: str) -> list[Case]:
    out = []
    for r in _rows(path):
        M, N, K = int(r["M"]), int(r["N"]), int(r["K"])
        ta, tb = r["a_transposed"].strip() == "true", r["b_transposed"].strip() == "true"

        def make(M=M, N=N, K=K, ta=ta, tb=tb):
            a = torch.randn(K, M).t() if ta else torch.randn(M, K)
            b = torch.randn(N, K).t() if tb else torch.randn(K, N)
            return torch.mm, (a, b)
        out.append(Case("gemm", f"{M}x{N}x{K}{' aT' if ta else ''}{' bT' if tb else ''}", 2.0 * M * N * K, make))
    return out


def conv_cases(path: str) -> list[Case]:
    out = []
    for r in _rows(path):
        n, ci, h, w, k, kh, kw, s, p, d, g = (int(r[x]) for x in ("N", "C", "H", "W", "K", "R", "S", "stride", "pad",
                                                                  "dilation", "groups"))
        oh = (h + 2 * p - d * (kh - 1) - 1) // s + 1
        ow = (w + 2 * p - d * (kw - 1) - 1) // s + 1

        def make(n=n, ci=ci, h=h, w=w, k=k, kh=kh, kw=kw, s=s, p=p, d=d, g=g):
            x, wt = torch.randn(n, ci, h, w), torch.randn(k, ci // g, kh, kw)
            return (lambda x, wt: F.conv2d(x, wt, stride=s, padding=p, dilation=d, groups=g)), (x, wt)
        label = f"N{n} C{ci} {h}x{w} K{k} {kh}x{kw} s{s} p{p}" + (f" d{d}" if d > 1 else "") + (f" g{g}" if g > 1 else "")
        out.append(Case("conv", label, 2.0 * n * k * oh * ow * (ci // g) * kh * kw, make))
    return out


def _peak(threads: int, dtype: torch.dtype) -> tuple[float, str]:
    """(FLOP/s, what it is): the vdpbf16ps peak for bfloat16 where the machine has it, else the FMA peak."""
    if dtype == torch.bfloat16:
        p = bf16_dot_peak(threads)
        if p:
            return p, "vdpbf16ps"
    return fma_peak(threads), "FMA"


def run(shapes_dir: str, threads: int = 2, rounds: int = 10, inductor: bool = True, kinds=("gemm", "conv"),
        limit: int | None = None, dtype: torch.dtype = torch.float32) -> tuple[str, list[dict]]:
    """``dtype``: the operands in that type (every system the same)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    peak, peak_kind = _peak(threads, dtype)
    cases: list[Case] = []
    if "gemm" in kinds:
        cases += gemm_cases(os.path.join(shapes_dir, "gemm_shapes.csv"))[:limit]
    if "conv" in kinds:
        cases += conv_cases(os.path.join(shapes_dir, "conv_shapes.csv"))[:limit]
    results, rows = [], []
    for case in cases:
        fn, args = case.make()
        args = tuple(a.to(dtype) for a in args)
        torch._dynamo.reset()
        pt = torch.compile(fn, backend="polytile", options={"threads": threads})
        ref = fn(*args)
        err = (pt(*args).float() - ref.float()).abs().max().item() / max(1e-30, ref.float().abs().max().item())
        fns = {"eager": lambda: fn(*args), "polytile": lambda: pt(*args)}
        if inductor:
            ind = torch.compile(fn)
            ind(*args)
            fns["inductor"] = lambda: ind(*args)
        with torch.no_grad():
            t = time_side_by_side(fns, warmup=2, rounds=rounds)
        res = {"kind": case.kind, "shape": case.label, "rel_err": err,
               **{f"{k}_ms": v * 1e3 for k, v in t.items()},
               **{f"{k}_gflops": case.flops / v / 1e9 for k, v in t.items()}}
        results.append(res)
    # the peak again at the end, the larger kept: a measurement taken while something else
    # briefly held a core (a compile worker starting) gave half of it
    peak = max(peak, _peak(threads, dtype)[0])
    for res in results:
        res["peak_fraction"] = res["polytile_gflops"] * 1e9 / peak
        rows.append([res["kind"], res["shape"], f"{res['eager_ms']:.3f}", f"{res.get('inductor_ms', float('nan')):.3f}",
                     f"{res['polytile_ms']:.3f}", f"{res['polytile_gflops']:.1f}", f"{100 * res['peak_fraction']:.0f}%",
                     f"{res['eager_ms'] / res['polytile_ms']:.2f}x",
                     f"{res['inductor_ms'] / res['polytile_ms']:.2f}x" if inductor else "-", f"{res['rel_err']:.1e}"])
    table = format_table(["kind", "shape", "eager ms", "Inductor ms", "polytile ms", "polytile GFLOP/s",
                          f"of {peak_kind} peak", "vs eager", "vs Inductor", "max rel err"], rows)
    summ = []
    for kind in kinds:
        xs = [r["eager_ms"] / r["polytile_ms"] for r in results if r["kind"] == kind]
        if xs:
            summ.append(f"{kind}: geomean {math.exp(sum(map(math.log, xs)) / len(xs)):.2f}x vs eager, "
                        f"slowest row {min(xs):.2f}x")
    head = (f"threads={threads}; operands {str(dtype)[6:]}; measured {peak_kind} peak {peak / 1e9:.1f} GFLOP/s "
            f"(generated loop of independent {peak_kind} instructions); "
            f"median of {rounds} alternating rounds. " + "; ".join(summ))
    return head + "\n\n" + table, results


def chart(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, max(4, 0.28 * len(results))))
    labels = [f"{r['kind']} {r['shape']}" for r in results]
    y = range(len(results))
    ax.barh([v - 0.2 for v in y], [r["eager_ms"] / r["polytile_ms"] for r in results], 0.4, label="polytile vs eager")
    if all("inductor_ms" in r for r in results):
        ax.barh([v + 0.2 for v in y], [r["inductor_ms"] / r["polytile_ms"] for r in results], 0.4,
                label="polytile vs Inductor")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(list(y), labels, fontsize=7)
    ax.set_xlabel("speedup (higher is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
