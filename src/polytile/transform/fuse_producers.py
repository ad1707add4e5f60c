"""Producer-consumer fusion by recomputation (slice = one point).

A producer that is a perfect nest storing one value per element (elementwise ops, casts,
broadcasts, copies through views) is fused into each consumer at the innermost depth: isl
computes, for every consumer iteration, the producer iteration that wrote the element it
reads (``isl.point_slice``), and the load is replaced by the producer's expression at that
iteration. When every consumer takes it and the cost model agrees (``fusion_cost.inline_pays``)
the producer's nest and its buffer disappear. This also fuses a reduction with its
elementwise producers (they are recomputed inside the reduction loop, read once each).
"""
from __future__ import annotations

from dataclasses import replace

from ..affine.ir import Expr, Kernel, Load, Program, lanes, walk_exprs
from ..dtypes import ITEMSIZE
from ..graph.symbols import at_least
from . import fusion_cost
from .fusion_util import Context, Uses, finish, join_origin, loads_of, perfect_store, rewrite_loads, subst_vars
from ..affine import isl as pisl


class _NoSlice(Exception):
    pass


def _tiled(k: Kernel, value: Expr) -> bool:
    """Whether ``k`` reads ``value`` into register tiles, where recomputing it would run in the
    innermost loops once per tile that reads it: a matmul or convolution nest, and the fused
    attention's score and value products (K and V, whose producers, e.g. a linear layer's bias
    or a quantized product's scale terms, then fuse into their own matmuls) except for a
    boolean mask's conversion, which the attention reads where it forms a score (a byte read
    instead of a float copy)."""
    if k.contraction:
        return True
    return k.name.endswith("_attention") and not any(
        isinstance(x, Load) and x.dtype == "bool" for x in walk_exprs(value))


def fuse_producers(p: Program) -> Program:
    sizes = {b.name: b.size for b in p.buffers}
    kinds = {b.name: b.kind for b in p.buffers}
    large = {b.name for b in p.buffers
             if b.kind == "temp" and at_least(b.size * ITEMSIZE[b.dtype], fusion_cost.LARGE_BYTES)}
    kernels: list[Kernel | None] = list(p.kernels)
    uses = Uses(kernels)
    # weighted operations per element each kernel already recomputes (``fusion_cost.recomputed``):
    # a chain collapses one producer at a time, and the budget is for the whole chain
    spent: dict[int, float] = {}
    for ki in range(len(kernels) - 1, -1, -1):  # last producer first: chains collapse into their end
        k = kernels[ki]
        ps = perfect_store(k)
        if ps is None:
            continue
        loops, st = ps
        t = st.buf
        if kinds.get(t) != "temp" or uses.writers.get(t) != {ki} or t in loads_of(st.value) | loads_of(st.index):
            continue
        consumers = sorted(uses.readers.get(t, set()) - {ki})
        if not consumers or consumers[0] < ki:
            continue
        # what the producer reads must already be final where it runs (no later writer)
        if any(w >= ki for b in loads_of(st.value) for w in uses.writers.get(b, ())):
            continue
        wctx = Context()
        for f in loops:
            wctx = wctx.enter_loop(f)
        write = wctx.access(t, st.index, sizes[t], True)
        if write.index is None:
            continue
        pvars = [f.var for f in loops]
        new: dict[int, Kernel] = {}
        reads = 0
        try:
            for ci in consumers:
                count = [0]

                def inline(ld: Load, ctx: Context, count=count) -> object:
                    if lanes(ld.dtype) > 1:  # a vector load (attention's V rows) is not one point
                        raise _NoSlice
                    h = pisl.point_slice(ctx.access(t, ld.index, sizes[t], False), write)
                    if h is None:
                        raise _NoSlice
                    count[0] += ctx.executions()
                    return subst_vars(st.value, dict(zip(pvars, h)))

                ck = kernels[ci]
                new[ci] = replace(ck, body=rewrite_loads(ck.body, t, inline), origin=join_origin(k.origin, ck.origin))
                reads += count[0]
        except _NoSlice:
            continue
        per_element = reads / max(1, sizes[t])
        extra = fusion_cost.recomputed(st.value, per_element, spent.get(ki, 0.0))
        if not fusion_cost.inline_pays(st.value, per_element,
                                       into_contraction=any(_tiled(kernels[ci], st.value) for ci in consumers),
                                       spent=max(spent.get(ci, 0.0) for ci in consumers) + extra):
            continue
        big_in = [max(uses.readers.get(b, {ki}) - {ki}, default=ki) for b in loads_of(st.value) & large]
        if big_in and fusion_cost.keeps_alive(big_in, ki, max(consumers),
                                              [w for b in large for w in uses.writers.get(b, ())]):
            continue
        for ci, nk in new.items():
            uses.set(ci, nk)
            spent[ci] = spent.get(ci, 0.0) + extra
        uses.set(ki, None)
    return finish(p, kernels)
