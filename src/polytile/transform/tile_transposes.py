"""Tile transposing copies for locality (rectangular tiling of a permutable band).

A nest that stores along its innermost loop v (unit stride) while reading along v with a
large stride touches a new cache line (often a new page) for every element it reads (a
1024 x 1024 transpose of XLNet's projection weights, for one). With a loop u outside it along
which the read is contiguous, both are tiled by B (one cache line of floats):

    for u, ..., v:  out[.. + v] = f(in[u + .. + S*v])
  ==>
    for ub, ..., vb:  for ui < B, vi < B:  (u = ub*B + ui, v = vb*B + vi)

so each B x B block reads B lines and writes B lines, all used whole (the last block of a
loop whose trip count B does not divide is shorter). Legal for any nest
whose single statement stores a buffer it does not read, at an index that uses every loop
(distinct iterations write distinct elements, so their order does not matter).
"""
from __future__ import annotations

from dataclasses import replace

from ..affine.ir import (INDEX, Const, Expr, For, If, Load, Op, Program, Stmt, Store, Var, add, c, lanes, mul,
                        trip_count, vector_type, walk_exprs)
from ..affine.linear import linear_form
from ..affine.transpose import transposed_block
from .fusion_util import map_stmt_exprs, subst_vars

B = 16  # floats per 64-byte cache line


def tile_transposes(p: Program, vw: int = 0) -> Program:
    """Every transposing copy nest tiled; with ``vw`` (vector lanes, a power of two) the whole
    blocks of pure copies are transposed in registers (``affine.transpose``)."""
    kernels = []
    for k in p.kernels:
        body = tuple(tile_transpose(s, vw) if isinstance(s, For) else s for s in k.body)
        kernels.append(k if body == k.body else replace(k, body=body))
    return replace(p, kernels=tuple(kernels))


def _chain(f: For) -> list[For]:
    out = [f]
    while len(out[-1].body) == 1 and isinstance(out[-1].body[0], For):
        out.append(out[-1].body[0])
    return out


def tile_transpose(f: For, vw: int = 0) -> For:
    """The nest rooted at ``f`` tiled as above, or ``f`` when it is not such a copy."""
    chain = _chain(f)
    st = chain[-1].body[0] if len(chain[-1].body) == 1 else None
    if not isinstance(st, Store) or lanes(st.value.dtype) > 1:
        return f
    loads = [x for x in walk_exprs(st.value) if isinstance(x, Load)]
    if any(x.buf == st.buf for x in loads):
        return f
    trips = {}
    for loop in chain:
        n = trip_count(loop)
        if n is None or loop.lo != Const(0, loop.lo.dtype):
            return f
        trips[loop.var] = n
    sf = linear_form(st.index)
    real = [loop for loop in chain if trips[loop.var] > 1]
    if sf is None or len(real) < 2 or any(sf[0].get(loop.var, 0) == 0 for loop in real):
        return f
    v = real[-1]
    if sf[0].get(v.var) != 1 or trips[v.var] < B:
        return f
    u = None
    for x in loads:
        lf = linear_form(x.index)
        if lf is None or abs(lf[0].get(v.var, 0)) < B:
            continue
        cands = [loop for loop in real[:-1]
                 if lf[0].get(loop.var, 0) == 1 and trips[loop.var] >= B and abs(sf[0][loop.var]) >= B]
        if cands:
            u = cands[-1]
            break
    if u is None:
        return f
    ub, ui, vb, vi = (f"{u.var}_b", f"{u.var}_t", f"{v.var}_b", f"{v.var}_t")
    sub = {u.var: add(mul(Var(ub), c(B)), Var(ui)), v.var: add(mul(Var(vb), c(B)), Var(vi))}
    body: tuple[Stmt, ...] = map_stmt_exprs((st,), lambda e: sub.get(e.name, e) if isinstance(e, Var) else e)
    at = chain.index(v)

    def inside_v(b: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        for loop in reversed(chain[at + 1:]):  # one-trip loops inside v
            b = (replace(loop, body=b),)
        return b
    body = (For(ui, c(0), _block(ub, trips[u.var]), (For(vi, c(0), _block(vb, trips[v.var]), inside_v(body)),)),)
    if vw and isinstance(st.value, Load) and st.value.dtype == "float32" and B % vw == 0:
        # a pure copy: whole blocks transposed in registers, vw x vw at a time (the last,
        # shorter blocks of loops B does not divide keep the element loops)
        src = st.value
        vt = vector_type("float32", vw)

        def at_uv(e: Expr, du: Expr, dv: Expr) -> Expr:
            m = {u.var: add(mul(Var(ub), c(B)), du), v.var: add(mul(Var(vb), c(B)), dv)}
            return subst_vars(e, m)
        reg = tuple(transposed_block(
            vw, vt,
            lambda k: Load(src.buf, at_uv(src.index, mul(Var(ui), c(vw)), add(mul(Var(vi), c(vw)), c(k))), vt),
            lambda k, val: Store(st.buf, at_uv(st.index, add(mul(Var(ui), c(vw)), c(k)), mul(Var(vi), c(vw))), val)))
        reg = (For(ui, c(0), c(B // vw), (For(vi, c(0), c(B // vw), inside_v(reg)),)),)
        whole = [Op("le", (add(mul(Var(x), c(B)), c(B)), c(trips[y])), "bool")
                 for x, y in ((ub, u.var), (vb, v.var)) if trips[y] % B]
        if not whole:
            body = reg
        else:
            test = whole[0] if len(whole) == 1 else Op("logical_and", tuple(whole), "bool")
            body = (If(test, reg, body),)
    body = (replace(v, var=vb, hi=c(-(-trips[v.var] // B)), body=body),)
    for loop in reversed(chain[:at]):
        if loop is u:
            loop = replace(loop, var=ub, hi=c(-(-trips[u.var] // B)))
        body = (replace(loop, body=body),)
    return body[0]


def _block(var: str, n: int) -> Expr:
    """The extent of block ``var`` of a loop of n: B, or what is left in the last block."""
    if n % B == 0:
        return c(B)
    return Op("minimum", (c(B), add(c(n), mul(Var(var), c(-B)))), INDEX)
