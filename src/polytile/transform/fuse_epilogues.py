"""Epilogue fusion at the store: an elementwise consumer moves into its producer.

The producer may be any nest that writes its result with one store (a reduction, a matmul,
a convolution, a pooling window); the consumer is a perfect elementwise nest reading that
result once per iteration. isl proves the producer's writes and the consumer's iterations
are in bijection (``isl.point_slice_map``) and gives the consumer iteration of each write;
the producer's store then writes the consumer's value (bias, activation, residual add,
a mean's division) straight to the consumer's buffer. The intermediate disappears.

Legal when the intermediate has no other reader, the consumer's other operands are final
before the producer runs, and nothing between the two touches the consumer's output.
"""
from __future__ import annotations

from dataclasses import replace

from ..affine import isl as pisl
from ..affine.ir import Kernel, Load, Program, Stmt, Store
from .fusion_util import (Context, Uses, finish, join_origin, loads_of, map_expr, perfect_store, statements,
                          subst_vars)


def fuse_epilogues(p: Program) -> Program:
    sizes = {b.name: b.size for b in p.buffers}
    kinds = {b.name: b.kind for b in p.buffers}
    kernels: list[Kernel | None] = list(p.kernels)
    uses = Uses(kernels)
    for ci in range(len(kernels)):
        c = kernels[ci]
        ps = perfect_store(c) if c is not None else None
        if ps is None:
            continue
        loops_c, st_c = ps
        out = st_c.buf
        if loads_of(st_c.index) or uses.writers.get(out) != {ci} or any(r <= ci for r in uses.readers.get(out, ())):
            continue
        for t in sorted(loads_of(st_c.value)):
            fused = _try(kernels, uses, sizes, kinds, ci, loops_c, st_c, t)
            if fused is not None:
                pi, pk = fused
                uses.set(ci, None)
                uses.set(pi, pk)
                break
    return finish(p, kernels)


def _try(kernels, uses: Uses, sizes, kinds, ci, loops_c, st_c: Store, t: str):
    if kinds.get(t) != "temp" or uses.readers.get(t) != {ci} or len(uses.writers.get(t, ())) != 1:
        return None
    (pi,) = uses.writers[t]
    if pi >= ci:
        return None
    pk: Kernel = kernels[pi]
    p_reads, p_writes = uses.touched(pi)
    if t in p_reads or st_c.buf in p_reads | p_writes:
        return None
    other = loads_of(st_c.value) - {t}
    if other & p_writes or any(w >= pi for b in other for w in uses.writers.get(b, ())):
        return None
    if any(st_c.buf in (uses.touched(j)[0] | uses.touched(j)[1]) for j in uses.between(pi, ci)):
        return None
    stores = [(s, ctx) for s, ctx in statements(pk.body) if isinstance(s, Store) and s.buf == t]
    if len(stores) != 1 or not stores[0][1].exact:
        return None
    st_p, wctx = stores[0]
    idx = {ld.index for ld in _loads(st_c.value, t)}
    if len(idx) != 1:
        return None
    rctx = Context()
    for f in loops_c:
        rctx = rctx.enter_loop(f)
    g = pisl.point_slice_map(wctx.access(t, st_p.index, sizes[t], True),
                             rctx.access(t, next(iter(idx)), sizes[t], False))
    if g is None:
        return None
    m = dict(zip((f.var for f in loops_c), g))
    # consumer variables -> producer iteration first; then its reads of t -> the stored value
    value = map_expr(subst_vars(st_c.value, m), lambda x: st_p.value if isinstance(x, Load) and x.buf == t else x)
    new_store = Store(st_c.buf, subst_vars(st_c.index, m), value)
    body = _replace_stmt(pk.body, st_p, new_store)
    return pi, replace(pk, body=body, origin=join_origin(pk.origin, kernels[ci].origin))


def _loads(e, buf):
    from ..affine.ir import walk_exprs

    return [x for x in walk_exprs(e) if isinstance(x, Load) and x.buf == buf]


def _replace_stmt(body: tuple[Stmt, ...], old: Stmt, new: Stmt) -> tuple[Stmt, ...]:
    from ..affine.ir import For, If

    out = []
    for s in body:
        if s is old:
            s = new
        elif isinstance(s, For):
            s = replace(s, body=_replace_stmt(s.body, old, new))
        elif isinstance(s, If):
            s = replace(s, then=_replace_stmt(s.then, old, new), orelse=_replace_stmt(s.orelse, old, new))
        out.append(s)
    return tuple(out)
