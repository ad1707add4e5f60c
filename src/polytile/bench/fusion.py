"""Memory-bound workloads for the fusion passes (issue 4), timed side by side.

Each workload runs in eager PyTorch, under Inductor (torch.compile's default), and under
polytile with and without fusion, alternating calls, medians. For polytile the table also
gives kernels launched per call and bytes of intermediates per graph, and every time is set
against the traffic floor: the bytes the workload must read and write once, at the copy
bandwidth measured in the same run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .. import counters
from ..benchmarking import format_table, time_side_by_side


def _ln_residual(x, r, w, b):
    return F.layer_norm(x + r, (x.shape[-1],), w, b)


def _rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _gelu_mlp(x, w, b):
    return F.gelu(x @ w + b)


def _chain8(x):
    return ((((x * 2.0 + 1.0).relu() - 3.0).sigmoid() * 4.0).tanh() + 1.0) / 3.0


def _bn_relu(x, m, v, w, b):
    return F.relu(F.batch_norm(x, m, v, w, b, training=False))


def _block_tail(scores, mask, x, attn, w1, b1, u, ub, mlp, w2, b2):
    """A BERT layer's non-matmul parts: masked softmax of the scores, residual + layer norm,
    the MLP's bias + GELU, residual + layer norm."""
    p = torch.softmax(scores + mask, -1)
    h = F.layer_norm(x + attn, (x.shape[-1],), w1, b1)
    a = F.gelu(u + ub)
    y = F.layer_norm(h + mlp, (x.shape[-1],), w2, b2)
    return p, a, y


@dataclass(frozen=True)
class Workload:
    name: str
    fn: Callable
    make: Callable[[], tuple]
    memory_bound: bool = True


def workloads(scale: int = 1) -> list[Workload]:
    """Shapes of BERT-base at batch 8 x seq 128 (1024 tokens x 768) and ResNet-50's first
    stage, times ``scale`` in the row count."""
    t, h = 1024 * scale, 768
    r = torch.randn
    return [
        Workload("layernorm+residual", _ln_residual, lambda: (r(t, h), r(t, h), r(h), r(h))),
        Workload("softmax", lambda x: torch.softmax(x, -1), lambda: (r(8 * 12 * scale, 128, 128),)),
        Workload("rmsnorm", _rms_norm, lambda: (r(t, h), r(h))),
        Workload("gelu-mlp epilogue", _gelu_mlp, lambda: (r(256 * scale, h), r(h, 4 * h) * 0.05, r(4 * h)), False),
        Workload("elementwise chain (8 ops)", _chain8, lambda: (r(t, 4 * h),)),
        Workload("batchnorm+relu", _bn_relu, lambda: (r(8 * scale, 64, 56, 56), r(64), torch.rand(64) + 0.5,
                                                       r(64), r(64))),
        Workload("transformer block, non-matmul", _block_tail,
                 lambda: (r(8 * scale, 12, 128, 128), torch.zeros(8 * scale, 1, 1, 128), r(t, h), r(t, h), r(h), r(h),
                          r(t, 4 * h), r(4 * h), r(t, h), r(h), r(h))),
    ]


def _bytes(xs) -> int:
    return sum(x.numel() * x.element_size() for x in torch.utils._pytree.tree_leaves(xs) if isinstance(x, torch.Tensor))


def copy_bandwidth(nbytes: int = 256 << 20, rounds: int = 10) -> float:
    """Bytes per second moved by an eager tensor copy (read + write) of ``nbytes``."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    t = time_side_by_side({"copy": lambda: dst.copy_(src)}, warmup=2, rounds=rounds)["copy"]
    return 2 * nbytes / t


def _compile_polytile(fn, args, threads: int, fusion: bool):
    counters.reset_stats()
    c = torch.compile(fn, backend="polytile", options={"threads": threads, "fusion": fusion})
    c(*args)
    st = counters.stats()
    return c, st


def run(threads: int = 2, rounds: int = 20, scale: int = 1, inductor: bool = True,
        only: list[str] | None = None) -> tuple[str, list[dict]]:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    bw = copy_bandwidth()
    rows, results = [], []
    for w in workloads(scale):
        if only and w.name not in only:
            continue
        args = w.make()
        torch._dynamo.reset()
        ref = w.fn(*args)
        fused, st_on = _compile_polytile(w.fn, args, threads, True)
        torch._dynamo.reset()
        unfused, st_off = _compile_polytile(w.fn, args, threads, False)
        for c in (fused, unfused):
            torch.testing.assert_close(c(*args), ref, rtol=1e-3, atol=1e-3)
        fns = {"eager": lambda: w.fn(*args), "polytile": lambda: fused(*args), "unfused": lambda: unfused(*args)}
        if inductor:
            torch._dynamo.reset()
            ind = torch.compile(w.fn)
            ind(*args)
            fns["inductor"] = lambda: ind(*args)
        with torch.no_grad():
            t = time_side_by_side(fns, warmup=3, rounds=rounds)
        floor = (_bytes(args) + _bytes(ref)) / bw
        res = {"workload": w.name, "memory_bound": w.memory_bound, "floor_ms": floor * 1e3,
               **{f"{k}_ms": v * 1e3 for k, v in t.items()},
               "kernels_fused": st_on["kernels_generated"], "kernels_unfused": st_off["kernels_generated"],
               "intermediate_bytes_fused": st_on["intermediate_bytes"],
               "intermediate_bytes_unfused": st_off["intermediate_bytes"]}
        results.append(res)
        ind_ms = res.get("inductor_ms")
        rows.append([w.name, f"{res['eager_ms']:.3f}", f"{ind_ms:.3f}" if ind_ms else "-", f"{res['polytile_ms']:.3f}",
                     f"{res['unfused_ms']:.3f}", f"{res['eager_ms'] / res['polytile_ms']:.2f}x",
                     f"{ind_ms / res['polytile_ms']:.2f}x" if ind_ms else "-",
                     f"{res['polytile_ms'] / res['floor_ms']:.2f}" + ("" if w.memory_bound else " (compute)"),
                     f"{res['kernels_unfused']} -> {res['kernels_fused']}",
                     f"{_mb(res['intermediate_bytes_unfused'])} -> {_mb(res['intermediate_bytes_fused'])}"])
    table = format_table(["workload", "eager ms", "Inductor ms", "polytile ms", "polytile unfused ms",
                          "vs eager", "vs Inductor", "polytile / traffic floor", "kernels (unfused -> fused)",
                          "intermediates MB (unfused -> fused)"], rows)
    geo = _geo([r["eager_ms"] / r["polytile_ms"] for r in results])
    fus = _geo([r["unfused_ms"] / r["polytile_ms"] for r in results])
    head = (f"threads={threads}, copy bandwidth {bw / 1e9:.1f} GB/s (eager tensor copy, read+write), "
            f"median of {rounds} alternating rounds; geomean speedup vs eager {geo:.2f}x, fusion alone {fus:.2f}x")
    return head + "\n\n" + table, results


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


def _geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")
