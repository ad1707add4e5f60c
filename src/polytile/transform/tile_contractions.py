"""Register tiling with packing for contraction nests (the BLIS structure, derived on the
affine IR).

It applies to any nest of this form, whatever op it came from, found from its accesses:

    for p... (parallel), for i (parallel), for j (parallel):
      acc = 0
      for r: acc = acc + X * Y      # X invariant in j, Y invariant in i (affine loads)
      C[f(p, i, j)] = epilogue(acc, loads at (p, i, j))

and rewrites it as

    pack:  Yp[jo][r][NR] = Y(p, r, jo*NR + jj)       copy generation: any layout of Y
                                                    (a transposed weight) becomes contiguous
    main:  for p..., jo, io (parallel, OpenMP):
             MR x NV vector accumulators (scalar replacement; the i loop unrolled and jammed)
             for r: NV vector loads of Yp, MR scalar loads of X, MR*NV broadcast FMAs
             tile -> local array; epilogue loop over the tile (vectorized by the C compiler)
    rest:  the original nest over the rows (i >= MI*MR) and columns (j >= NJ*NR) that do not
           fill a register tile (partial tiles, no padding copies)

MR, NR come from the Target: NR = 2 vectors, MR = what the remaining vector registers
hold. The nest is left alone when it is too small to fill a tile.
"""
from __future__ import annotations

from dataclasses import replace

from ..affine.ir import (Alloc, Assign, Buffer, Const, Expr, For, Kernel, Let, Load, Op, Program, Stmt, Store,
                         Var, add, c, lanes as _lanes, mul, trip_count, vector_type, walk_exprs)
from ..affine.linear import linear_form
from ..target import Target
from .fusion_util import subst_vars

MIN_WORK = 32 * 32 * 32  # multiply-adds below which tiling is not worth a packing pass


def tile_sizes(t: Target) -> tuple[int, int, int]:
    """(MR, NV, VW): rows of the register tile, vectors per row, lanes per vector."""
    vw = t.lanes(4)
    nv = 2
    mr = max(1, min(8 if t.vector_registers <= 16 else 14, (t.vector_registers - nv - 1) // nv))
    return mr, nv, vw


def _match(k: Kernel):
    if not k.contraction or len(k.body) != 1 or not isinstance(k.body[0], For):
        return None
    loops = [k.body[0]]
    while len(loops[-1].body) == 1 and isinstance(loops[-1].body[0], For):
        loops.append(loops[-1].body[0])
    if len(loops) < 2 or not all(f.parallel and trip_count(f) and f.lo == c(0) for f in loops):
        return None
    body = loops[-1].body
    if len(body) != 3:
        return None
    let, red, st = body
    if not (isinstance(let, Let) and let.dtype == "float32" and let.value == Const(0, "float32")
            and isinstance(red, For) and trip_count(red) and red.lo == c(0) and isinstance(st, Store)):
        return None
    if len(red.body) != 1 or not isinstance(red.body[0], Assign) or red.body[0].name != let.name:
        return None
    v = red.body[0].value
    if not (isinstance(v, Op) and v.fn == "add" and v.args[0] == Var(let.name, "float32")
            and isinstance(v.args[1], Op) and v.args[1].fn == "mul"):
        return None
    x, y = v.args[1].args
    if not (isinstance(x, Load) and isinstance(y, Load)):
        return None
    i, j = loops[-2].var, loops[-1].var
    fx, fy = linear_form(x.index), linear_form(y.index)
    if fx is None or fy is None:
        return None
    if fx[0].get(j, 0) == 0 and fy[0].get(i, 0) == 0:
        a, b = x, y
    elif fy[0].get(j, 0) == 0 and fx[0].get(i, 0) == 0:
        a, b = y, x
    else:
        return None
    if any(isinstance(e, Var) and e.name == let.name for e in walk_exprs(st.index)):
        return None
    return loops, let, red, st, a, b


def tile_contractions(p: Program, target: Target) -> Program:
    mr, nv, vw = tile_sizes(target)
    nr = nv * vw
    vt = vector_type("float32", vw)
    kernels: list[Kernel] = []
    buffers = list(p.buffers)
    for k in p.kernels:
        m = _match(k)
        if m is None:
            kernels.append(k)
            continue
        loops, let, red, st, a, b = m
        iloop, jloop = loops[-2], loops[-1]
        M, N, K = trip_count(iloop), trip_count(jloop), trip_count(red)
        batch = loops[:-2]
        if M < mr or N < nr or M * N * K < MIN_WORK:
            kernels.append(k)
            continue
        MI, NJ = M // mr, N // nr
        i, j, r = iloop.var, jloop.var, red.var
        # ---- pack Y into Yp[bl][jo][r][nr] (per batch iteration only if Y depends on it)
        fb = linear_form(b.index)[0]
        bdeps = [f for f in batch if fb.get(f.var, 0) != 0]
        nbatch = 1
        for f in bdeps:
            nbatch *= trip_count(f)
        pk = f"pk{sum(1 for x in buffers if x.name.startswith('pk'))}"  # the packed panels (a temp in the arena)
        buffers.append(Buffer(pk, "float32", nbatch * NJ * K * nr, "temp"))
        bl: Expr = c(0)
        for f in bdeps:
            bl = add(mul(bl, c(trip_count(f))), Var(f.var))
        jo, io, jj, ii = "jo", "io", "jj", "ii"
        pidx = add(mul(add(mul(add(mul(bl, c(NJ)), Var(jo)), c(K)), Var(r)), c(nr)), Var(jj))
        pval = subst_vars(b, {j: add(mul(Var(jo), c(nr)), Var(jj)), i: c(0)})
        pnest: Stmt = For(jo, c(0), c(NJ), (For(r, c(0), c(K), (For(jj, c(0), c(nr), (Store(pk, pidx, pval),)),)),),
                          parallel=True)
        for f in reversed(bdeps):
            pnest = replace(f, body=(pnest,))
        kernels.append(Kernel(f"{k.name}_pack", (pnest,), f"pack {b.buf} for {k.origin}"[:160]))
        # ---- main nest over full tiles
        ivar = add(mul(Var(io), c(mr)), Var(ii))
        accs = [[f"acc{x}_{y}" for y in range(nv)] for x in range(mr)]  # (C names b<n> are buffers)
        inner: list[Stmt] = []
        panel = mul(add(mul(add(mul(bl, c(NJ)), Var(jo)), c(K)), Var(r)), c(nr))  # Yp[bl][jo][r][0]
        for y in range(nv):
            inner.append(Let(f"yv{y}", vt, Load(pk, add(panel, c(y * vw)), vt)))
        for x in range(mr):
            inner.append(Let(f"xs{x}", "float32", subst_vars(a, {i: add(mul(Var(io), c(mr)), c(x)), j: c(0)})))
            for y in range(nv):
                prod = Op("mul", (Op("broadcast", (Var(f"xs{x}", "float32"),), vt), Var(f"yv{y}", vt)), vt)
                inner.append(Assign(accs[x][y], Op("add", (Var(accs[x][y], vt), prod), vt)))
        tile = "ctile"
        body: list[Stmt] = [Alloc(tile, "float32", mr * nr)]
        body += [Let(accs[x][y], vt, Op("broadcast", (Const(0.0, "float32"),), vt)) for x in range(mr) for y in range(nv)]
        body.append(For(r, c(0), c(K), tuple(inner)))
        body += [Store(tile, c(x * nr + y * vw), Var(accs[x][y], vt)) for x in range(mr) for y in range(nv)]
        jvar = add(mul(Var(jo), c(nr)), Var(jj))
        tval = Load(tile, add(mul(Var(ii), c(nr)), Var(jj)), "float32")
        epi_val = subst_vars(_replace_var(st.value, let.name, tval), {i: ivar, j: jvar})
        epi = Store(st.buf, subst_vars(st.index, {i: ivar, j: jvar}), epi_val)
        body.append(For(ii, c(0), c(mr), (For(jj, c(0), c(nr), (epi,)),)))
        main: Stmt = For(jo, c(0), c(NJ), (For(io, c(0), c(MI), tuple(body), parallel=True),), parallel=True)
        for f in reversed(batch):
            main = replace(f, body=(main,))
        roots = [main]
        # ---- partial tiles: the original nest on the rows and columns left over
        if M % mr:
            roots.append(_restrict(k.body[0], iloop, c(MI * mr), iloop.hi, None))
        if N % nr:
            roots.append(_restrict(k.body[0], iloop, c(0), c(MI * mr), (jloop, c(NJ * nr), jloop.hi)))
        kernels.append(replace(k, body=tuple(roots)))
    return replace(p, kernels=tuple(kernels), buffers=tuple(buffers))


def _replace_var(e: Expr, name: str, by: Expr) -> Expr:
    from .fusion_util import map_expr

    return map_expr(e, lambda x: by if isinstance(x, Var) and x.name == name else x)


def _restrict(root: For, iloop: For, lo: Expr, hi: Expr, jrange) -> For:
    def go(f: For) -> For:
        if f.var == iloop.var:
            f = replace(f, lo=lo, hi=hi)
        if jrange is not None and f.var == jrange[0].var:
            f = replace(f, lo=jrange[1], hi=jrange[2])
        if len(f.body) == 1 and isinstance(f.body[0], For):
            return replace(f, body=(go(f.body[0]),))
        return f
    return go(root)
