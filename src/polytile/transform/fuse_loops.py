"""Loop fusion at a depth: two nests share their outer loops, with the intermediate shrunk.

Producer-consumer (a nest writes what a later nest reads: softmax's max -> exp/sum ->
normalize, layer norm's mean -> variance -> normalize, any reduction chain over the same
rows) and sibling fusion (two nests reading the same data). The depth is the longest band
of outer loops with equal constant bounds, parallel in both; isl proves every dependence
between the nests joins equal iterations of that band (``isl.outer_deps_equal``), so the
fused band stays parallel. An intermediate that no other nest touches then shrinks to a
local array holding one band iteration's slice (a scalar when that slice is one element).

Contraction nests (matmul, convolution) are left to epilogue fusion and the contraction
passes; so are nests that ``sink_parallel_loops`` will restructure.
"""
from __future__ import annotations

from dataclasses import replace

from ..affine import isl as pisl
from ..affine.ir import Alloc, For, Kernel, Load, Program, Stmt, Store, trip_count
from ..affine.linear import linear_form
from ..dtypes import ITEMSIZE
from . import fusion_cost
from .fusion_util import (Uses, conflict, declared_names, finish, join_origin, map_expr, rename_locals,
                          root_chain, statements)
from .interchange import would_sink

WINDOW = 8  # how many earlier nests a nest tries to fuse with


def fuse_loops(p: Program, *, flow: bool = True, siblings: bool = True, threads: int = 1) -> Program:
    bufs = {b.name: b for b in p.buffers}
    kernels: list[Kernel | None] = list(p.kernels)
    uses = Uses(kernels)
    for ci in range(len(kernels)):
        tried = 0
        pi = ci - 1
        while pi >= 0 and tried < WINDOW and kernels[ci] is not None:
            if kernels[pi] is None:
                pi -= 1
                continue
            tried += 1
            done = _try(kernels, uses, bufs, pi, ci, flow, siblings, threads)
            if done is not None:
                at, gone, fk = done
                uses.set(gone, None)
                uses.set(at, fk)
                if at == pi:  # the fused nest now sits earlier: later nests find it from there
                    break
                pi = ci - 1
                continue
            pi -= 1
    return finish(p, kernels)


def _fusable(k: Kernel) -> list[For]:
    chain = root_chain(k)
    if k.contraction or not chain or would_sink(chain[0]):
        return []
    return chain


def _band_trips(chain: list[For]) -> int:
    n = 1
    for f in chain:
        if not f.parallel:
            break
        n *= trip_count(f) or 1
    return n


def _try(kernels, uses: Uses, bufs, pi: int, ci: int, flow: bool, siblings: bool, threads: int):
    pk, ck = kernels[pi], kernels[ci]
    (rp, wp), (rc, wc) = uses.touched(pi), uses.touched(ci)
    flows = wp & rc
    shared = (rp & rc) - flows
    if flows and not flow or not flows and (not siblings or not shared) or (wc & (rp | wp)):
        return None
    cp, cc = _fusable(pk), _fusable(ck)
    depth = 0
    for a, b in zip(cp, cc):
        if not (a.parallel and b.parallel and trip_count(a) is not None and a.lo == b.lo and a.hi == b.hi):
            break
        depth += 1
    if depth == 0:
        return None
    mids = uses.between(pi, ci)
    if not any(conflict(uses.touched(pi), uses.touched(j)) for j in mids):
        at, gone = ci, pi
    elif not any(conflict(uses.touched(j), uses.touched(ci)) for j in mids):
        at, gone = pi, ci
    else:
        return None
    sizes = {n: b.size for n, b in bufs.items()}
    accs_p, accs_c = pisl.accesses(pk.body, sizes), pisl.accesses(ck.body, sizes)
    while depth > 0 and not pisl.outer_deps_equal(accs_p, accs_c, depth):
        depth -= 1
    if depth == 0:
        return None
    fused = _fuse(pk, ck, cp, cc, depth)
    # cost: the data passed (or shared) per band iteration must stay small, parallelism kept
    outer = 1
    for f in cp[:depth]:
        outer *= trip_count(f)
    foot = 0
    for b in (flows or shared):
        lay = _layout(fused, b, depth)
        if lay is None:
            return None
        foot += lay[1] * ITEMSIZE[bufs[b].dtype]
    if not fusion_cost.loop_fusion_pays(outer, (_band_trips(cp), _band_trips(cc)), threads, foot):
        return None
    # intermediates now private to the fused nest shrink to local arrays
    others = [j for j in range(len(kernels)) if kernels[j] is not None and j not in (pi, ci)]
    for b in sorted(wp | wc):
        if bufs[b].kind != "temp" or any(b in uses.touched(j)[0] | uses.touched(j)[1] for j in others):
            continue
        lay = _layout(fused, b, depth)
        if lay is not None and lay[1] * ITEMSIZE[bufs[b].dtype] <= fusion_cost.LOCAL_BYTES:
            fused = _shrink(fused, b, bufs[b].dtype, depth, lay)
    return at, gone, fused


def _fuse(pk: Kernel, ck: Kernel, cp: list[For], cc: list[For], depth: int) -> Kernel:
    m = {b.var: a.var for a, b in zip(cp[:depth], cc[:depth])}
    inner_c = cc[depth - 1].body
    taken = declared_names(pk.body)
    for name in sorted(declared_names(inner_c)):
        if name in taken or name in m.values():
            k = 1
            while f"{name}_{k}" in taken or f"{name}_{k}" in declared_names(inner_c):
                k += 1
            m[name] = f"{name}_{k}"
    body: tuple[Stmt, ...] = cp[depth - 1].body + rename_locals(inner_c, m)
    for a, b in reversed(list(zip(cp[:depth], cc[:depth]))):
        body = (replace(a, body=body, parallel=a.parallel and b.parallel),)
    return replace(pk, body=body, origin=join_origin(pk.origin, ck.origin), contraction=False)


def _layout(k: Kernel, buf: str, depth: int):
    """(base, size) of the per-band-iteration slice of ``buf`` when every access is linear
    with the same coefficients on the band's variables and the rest spans a constant box;
    None otherwise."""
    outer = [f.var for f in root_chain(k)[:depth]]
    coefs = None
    lo_all, hi_all = None, None
    for s, ctx in statements(k.body):
        idxs = [s.index] if isinstance(s, Store) and s.buf == buf else []
        from ..affine.ir import stmt_exprs, walk_exprs

        for e in stmt_exprs(s):
            idxs += [x.index for x in walk_exprs(e) if isinstance(x, Load) and x.buf == buf]
        for idx in idxs:
            lf = linear_form(idx)
            if lf is None:
                return None
            oc = tuple(lf[0].get(v, 0) for v in outer)
            if coefs is None:
                coefs = oc
            elif coefs != oc:
                return None
            lo = hi = lf[1]
            bounds = {f.var: f for f in ctx.loops}
            for v, kf in lf[0].items():
                if v in outer:
                    continue
                f = bounds.get(v)
                n = trip_count(f) if f is not None else None
                if n is None or n == 0 or not hasattr(f.lo, "value"):
                    return None
                a, b = kf * f.lo.value, kf * (f.lo.value + n - 1)
                lo, hi = lo + min(a, b), hi + max(a, b)
            lo_all = lo if lo_all is None else min(lo_all, lo)
            hi_all = hi if hi_all is None else max(hi_all, hi)
    if coefs is None:
        return None
    return (coefs, lo_all), hi_all - lo_all + 1


def _shrink(k: Kernel, buf: str, dtype: str, depth: int, lay) -> Kernel:
    (coefs, base), size = lay
    outer = [f.var for f in root_chain(k)[:depth]]
    local = f"{buf}_l"

    def idx(e):
        lf = linear_form(e)
        from ..affine.linear import to_expr

        inner = {v: x for v, x in lf[0].items() if v not in outer}
        return to_expr(inner, lf[1] - base)

    def ex(e):
        return map_expr(e, lambda x: Load(local, idx(x.index), x.dtype) if isinstance(x, Load) and x.buf == buf else x)

    def stmts(body):
        out = []
        for s in body:
            if isinstance(s, Store):
                s = Store(local if s.buf == buf else s.buf, idx(s.index) if s.buf == buf else ex(s.index), ex(s.value))
            elif isinstance(s, For):
                s = replace(s, lo=ex(s.lo), hi=ex(s.hi), body=stmts(s.body))
            elif hasattr(s, "cond"):
                s = replace(s, cond=ex(s.cond), then=stmts(s.then), orelse=stmts(s.orelse))
            elif hasattr(s, "value"):
                s = replace(s, value=ex(s.value))
            out.append(s)
        return tuple(out)

    def place(body, level):
        f = body[0]
        if level == depth - 1:
            return (replace(f, body=(Alloc(local, dtype, size),) + stmts(f.body)),)
        return (replace(f, body=place(f.body, level + 1)),)

    return replace(k, body=place(k.body, 0))
