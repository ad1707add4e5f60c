"""The dot form of a contraction with few columns (N < NR: matrix-vector products).

When X is contiguous along the reduction, vectorizing the columns would leave most lanes
empty; the reduction is vectorized instead. Y is packed transposed, Yt[bl][J][R]; MD x ND
vector accumulators run over R (rows of X and columns of Yt streamed once, VW lanes of the
reduction at a time); the lanes are summed and the R % VW tail added at the store.

A reduction too long for the tile's rows and Yt to stay in the L2 (K = 500000: each row tile
would re-read Yt from memory, each column tile the rows) runs in blocks of KC: per block the tiles
sweep rows and columns that stay in cache, and their vector accumulators wait in a temp
buffer between blocks.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..affine.ir import (Alloc, Assign, Const, Expr, For, Kernel, Let, Load, Op, Stmt, Store, Var, add, as_vector,
                         c, mul, vector_type)
from ..affine.linear import linear_form, to_expr
from .contraction_nest import Nest, batch_index, decompose, epilogue_store, in_group, strides
from .contraction_plan import KBlock
from .fusion_util import map_expr, subst_vars
from .tile_util import new_temp, reduction_blocks
from .tile_util import when as _when

if TYPE_CHECKING:
    from ..backends.cpu.machine import CPUMachine


@dataclass(frozen=True)
class DotPlan:
    """The dot form of nest ``n``: its N columns and K reductions, vectors of ``vw`` lanes
    along the reduction, Y packed transposed into ``packed`` (Yt[bl][N][K])."""
    n: Nest
    N: int
    K: int
    vw: int
    packed: str
    bl: Expr


@dataclass(frozen=True)
class Span:
    """``count`` tiles of ``size`` (rows or columns) from ``start``."""
    start: int
    size: int
    count: int


def dot_form(k: Kernel, n: Nest, M: int, N: int, K: int, buffers: list, machine: CPUMachine) -> list[Kernel]:
    """Few columns: vectorize the reduction instead of the columns (see the module doc)."""
    vw, regs, l1_bytes, l2_bytes = machine.lanes(4), machine.vector_registers, machine.l1d_bytes, machine.l2_bytes
    i = n.iloop.var
    jn, rn = [f.var for f in n.jloops], [f.var for f in n.rloops]
    fy = linear_form(n.y.index)[0]
    bdeps = [f for f in n.batch if fy.get(f.var, 0) != 0]
    nbatch, bl = batch_index(bdeps)
    pk = new_temp(buffers, nbatch * N * K)
    rflat = to_expr({v: s for v, s in zip(rn, strides(n.rloops))}, 0)
    jdec = decompose(jn, n.jloops, Var("jt"))
    pbody: Stmt = Store(pk, add(mul(add(mul(bl, c(N)), Var("jt")), c(K)), rflat), subst_vars(n.yv, {**jdec, i: c(0)}))
    for f in reversed(n.rloops):
        pbody = replace(f, body=(pbody,))
    pnest: Stmt = For("jt", c(0), c(N), (pbody,), parallel=True)
    for f in reversed(bdeps):
        pnest = replace(f, body=(pnest,))
    pack = Kernel(f"{k.name}_pack", (pnest,), f"pack {n.y.buf} transposed for {k.origin}"[:160])
    nd = min(N, 4)
    md = max(1, min(8, (regs - nd - 1) // nd, M))
    # the reduction in blocks of kcv vectors when a tile's rows or Yt outgrow the L2: a block of
    # the tile's rows stays in L1 for its column tiles, a block of Yt in L2 for the row tiles
    kv = K // vw
    kcv = max(1, min(l2_bytes // 4 // (N * 4), l1_bytes // 2 // (md * 4)) // vw)
    kblocked = not n.batch and (md + N) * K * 4 > l2_bytes // 2 and kv > kcv
    if kblocked:
        acc = new_temp(buffers, M * N * vw)
        blocks = reduction_blocks(kv, kcv)
    else:
        blocks = [(c(0), kv, 0, False, True)]
    roots = []
    plan = DotPlan(n, N, K, vw, pk, bl)
    for rows in (Span(0, md, M // md), Span((M // md) * md, M % md, 1)):
        if rows.size == 0:
            continue
        for cols in (Span(0, nd, N // nd), Span((N // nd) * nd, N % nd, 1)):
            if not cols.size:
                continue
            for v0, nv, loop, reload, final in blocks:
                kblock = KBlock(v0, nv, reload, final, acc, N) if kblocked else None
                root = _dot_nest(plan, rows, cols, kblock)
                roots.append(For("kb", c(0), c(loop), (root,)) if loop else root)
    return [pack, replace(k, body=tuple(roots))]


def _dot_nest(plan: DotPlan, rows: Span, cols: Span, kblock: KBlock | None = None) -> Stmt:
    """for p..., io < mi, jo < nj: rows i0 + io*md + [0, md) times columns j0 + jo*nd + [0, nd).
    ``kblock``: reduction vectors r0 + [0, kc) only, the accumulators loaded from ``acc`` when
    ``reload`` holds and stored there unless ``final`` holds (then the lanes are summed and the
    epilogue runs)."""
    n, N, K, vw, pk, bl = plan.n, plan.N, plan.K, plan.vw, plan.packed, plan.bl
    vt = vector_type("float32", vw)
    i0, md, mi, j0, nd, nj = rows.start, rows.size, rows.count, cols.start, cols.size, cols.count
    i = n.iloop.var
    rn = [f.var for f in n.rloops]
    io, jo, ii, jj, R, rr = "io", "jo", "ii", "jj", "rv", "rr"
    row0 = add(c(i0), mul(Var(io), c(md)))
    col0 = add(c(j0), mul(Var(jo), c(nd)))
    accs = [[f"acc{x}_{y}" for y in range(nd)] for x in range(md)]
    kv = K // vw
    v0, nvec = (c(0), kv) if kblock is None else (kblock.r0, kblock.kc)
    Rg = add(v0, Var(R)) if kblock is not None else Var(R)  # the vector index in the whole of K
    inner: list[Stmt] = []
    for y in range(nd):
        yi = add(mul(add(mul(bl, c(N)), add(col0, c(y))), c(K)), mul(Rg, c(vw)))
        inner.append(Let(f"yv{y}", vt, Load(pk, yi, vt)))
    xr = in_group(n.xv, rn, n.rloops, mul(Rg, c(vw)))
    for x in range(md):
        xl = subst_vars(xr, {i: add(row0, c(x))})
        inner.append(Let(f"xv{x}", vt, as_vector(xl, vw)))
        for y in range(nd):
            prod = Op("mul", (Var(f"xv{x}", vt), Var(f"yv{y}", vt)), vt)
            inner.append(Assign(accs[x][y], Op("add", (Var(accs[x][y], vt), prod), vt)))
    tile = "ctile"
    body: list[Stmt] = [Alloc(tile, "float32", md * nd * vw)]
    body += [Let(accs[x][y], vt, Op("broadcast", (Const(0.0, "float32"),), vt)) for x in range(md) for y in range(nd)]
    if kblock is not None:
        reload, final, acc = kblock.reload, kblock.final, kblock.acc

        def at(x: int, y: int) -> Expr:
            return mul(add(mul(add(row0, c(x)), c(N)), add(col0, c(y))), c(vw))

        body += _when(reload, [Assign(accs[x][y], Load(acc, at(x, y), vt)) for x in range(md) for y in range(nd)])
    body.append(For(R, c(0), c(nvec), tuple(inner)))
    done: list[Stmt] = [Store(tile, c((x * nd + y) * vw), Var(accs[x][y], vt)) for x in range(md) for y in range(nd)]
    ivar, jvar = add(row0, Var(ii)), add(col0, Var(jj))
    s = Var("dsum", "float32")
    lane = Var("ln")
    xs = subst_vars(in_group(n.xv, rn, n.rloops, Var(rr)), {i: ivar})
    ys = Load(pk, add(mul(add(mul(bl, c(N)), jvar), c(K)), Var(rr)), "float32")
    finish: list[Stmt] = [
        Let(s.name, "float32", Const(0.0, "float32")),
        For(lane.name, c(0), c(vw), (Assign(s.name, Op("add", (s, Load(tile, add(mul(add(mul(Var(ii), c(nd)), Var(jj)),
                                                                                        c(vw)), lane), "float32")),
                                                          "float32")),)),
    ]
    if K % vw:
        finish.append(For(rr, c(kv * vw), c(K), (Assign(s.name, Op("add", (s, Op("mul", (xs, ys), "float32")),
                                                                        "float32")),)))
    value = map_expr(n.store.value, lambda e: s if isinstance(e, Var) and e.name == n.acc else e)
    epi = epilogue_store(n, value, ivar, jvar)
    finish.append(epi)
    done.append(For(ii, c(0), c(md), (For(jj, c(0), c(nd), tuple(finish)),)))
    if kblock is not None:
        keep = [Store(acc, at(x, y), Var(accs[x][y], vt)) for x in range(md) for y in range(nd)]
        done = _when(final, done, keep)
    body += done
    main: Stmt = For(io, c(0), c(mi), (For(jo, c(0), c(nj), tuple(body)),), parallel=True)
    for f in reversed(n.batch):
        main = replace(f, body=(main,))
    return main
