"""Values computed from parameters alone, kept between calls.

A model's parameters and buffers (``TensorSpec.static``) rarely change between calls, so the
kernels that read nothing else (a weight's panels packed for the register tiles, see
``tile_contractions``; a transposed copy of a weight) compute the same values every call.
``cache_static_kernels`` marks them ``cached`` and the temps they write ``cache``: the
generated code runs them from a second entry point (``pt_refresh``) into memory the compiled
graph keeps, and the runtime calls it only when the storage or version counter of one of the
parameters they read has changed since the last time (``NativeGraph``)."""
from __future__ import annotations

from dataclasses import replace

from ..affine.ir import Program, buffers_used


def mark_static_inputs(p: Program, positions: set[int] | frozenset[int]) -> Program:
    """The input buffers at ``positions`` flagged ``static`` (parameters and buffers)."""
    return replace(p, buffers=tuple(replace(b, static=True) if b.kind == "input" and b.index in positions else b
                                    for b in p.buffers))


def cache_static_kernels(p: Program) -> Program:
    """Kernels whose reads are static inputs and temps written only by such kernels, and whose
    writes are temps, marked ``cached``; those temps become ``cache`` buffers. Their order
    among themselves is kept: each reads only what earlier cached kernels wrote."""
    kinds = {b.name: b.kind for b in p.buffers}
    static = {b.name for b in p.buffers if b.kind == "input" and b.static}
    if not static:
        return p
    used = [buffers_used(k) for k in p.kernels]
    writers: dict[str, set[int]] = {}
    for k, (_, w) in enumerate(used):
        for b in w:
            writers.setdefault(b, set()).add(k)
    chosen: set[int] = set()
    made: set[str] = set()  # temps the chosen kernels write
    for k, (r, w) in enumerate(used):
        if w and all(kinds[b] == "temp" for b in w) and (r - w) <= static | made and r & (static | made):
            chosen.add(k)
            made |= w
    while True:  # a temp some other kernel writes too is not a cached value: drop its writers, then their readers
        keep = {k for k in chosen if all(writers[b] <= chosen for b in used[k][1])
                and (used[k][0] - used[k][1]) <= static | made}
        made = {b for k in keep for b in used[k][1]}
        if keep == chosen:
            break
        chosen = keep
    if not chosen:
        return p
    return replace(p, kernels=tuple(replace(k, cached=True) if i in chosen else k for i, k in enumerate(p.kernels)),
                   buffers=tuple(replace(b, kind="cache") if b.name in made else b for b in p.buffers))
