"""Dead kernels: a kernel that writes only temps no later kernel reads is dropped (repeatedly,
from the end). The attention lowering reads K in place of a graph's scaled copy of it, which
leaves the kernel computing that copy without a reader."""
from __future__ import annotations

from dataclasses import replace

from ..affine.ir import Program, buffers_used


def drop_dead_kernels(p: Program) -> Program:
    temps = {b.name for b in p.buffers if b.kind == "temp"}
    kept, live = [], set()
    for k in reversed(p.kernels):
        reads, writes = buffers_used(k)
        if writes and writes <= temps and not writes & live:
            continue
        kept.append(k)
        live |= reads
    if len(kept) == len(p.kernels):
        return p
    used = set().union(*(set().union(*buffers_used(k)) for k in kept)) if kept else set()
    return replace(p, kernels=tuple(reversed(kept)),
                   buffers=tuple(b for b in p.buffers if b.kind != "temp" or b.name in used))
