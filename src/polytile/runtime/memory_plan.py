"""Static memory plan: temporaries share one arena, by liveness over the kernel order."""
from __future__ import annotations

from dataclasses import dataclass

from ..affine.ir import Program, buffers_used
from ..dtypes import ITEMSIZE

ALIGN = 64


@dataclass(frozen=True)
class MemoryPlan:
    offsets: dict[str, int]  # temp buffer -> byte offset in the arena; cache buffer -> in the cache
    arena_bytes: int
    temp_bytes: int  # sum of temp sizes without reuse (for reporting)
    cache_bytes: int = 0  # the cache buffers (``cache_static``), kept between calls, one after another
    dynamic: tuple[str, ...] = ()  # temps sized by symbolic sizes: allocated per call, not in the arena


def plan_memory(p: Program) -> MemoryPlan:
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for k, kern in enumerate(p.kernels):
        r, w = buffers_used(kern)
        for name in r | w:
            first.setdefault(name, k)
            last[name] = k
    dynamic = tuple(b.name for b in p.buffers if b.kind == "temp" and not isinstance(b.size, int))
    temps = [b for b in p.buffers if b.kind == "temp" and b.name not in dynamic]
    size = {b.name: -(-b.size * ITEMSIZE[b.dtype] // ALIGN) * ALIGN for b in temps}
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    offsets: dict[str, int] = {}
    for b in sorted(temps, key=lambda b: (-size[b.name], b.name)):
        lo, hi = first.get(b.name, 0), last.get(b.name, 0)
        clashes = sorted((o, e) for o, e, f, l in placed if not (l < lo or hi < f))
        off = 0
        for o, e in clashes:  # first fit among the live intervals' gaps
            if off + size[b.name] <= o:
                break
            off = max(off, e)
        offsets[b.name] = off
        placed.append((off, off + size[b.name], lo, hi))
    arena = max((e for _, e, _, _ in placed), default=0)
    cache = 0
    for b in p.buffers:
        if b.kind == "cache":
            offsets[b.name] = cache
            cache += -(-b.size * ITEMSIZE[b.dtype] // ALIGN) * ALIGN
    return MemoryPlan(offsets, arena, sum(size.values()), cache, dynamic)
