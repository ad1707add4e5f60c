"""The statement builders of the tiled contraction form (``tile_contractions``): the panel
loops, the register tiles of one panel and their epilogues, the packing of a transposed
operand through a local tile. Names follow ``tile_contractions``: X the row operand, Y the
column operand packed into panels of nr columns, R the flat reduction index."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..affine.ir import (INDEX, WIDENS, Alloc, Assign, Const, Expr, For, If, Kernel, Let, Load, Op, Prefetch, Stmt,
                        Store, Var, add, as_vector, c, element_index, in_register, lanes, load_of, mul, vector_type,
                        walk_exprs, widened)
from ..affine.linear import linear_form
from ..affine.transpose import transposed_block
from .contraction_nest import Nest, epilogue_store, in_group
from ..dtypes import ITEMSIZE
from .contraction_plan import At, ContractionPlan, KBlock, RowGroup, RowMajor, static_schedule
from .fusion_util import map_expr, subst_vars
from .tile_util import when as _when

if TYPE_CHECKING:
    from ..backends.cpu.machine import CPUMachine


def few_panels_block(plan: ContractionPlan, pack, yblk: str, rows: list[RowGroup], nvs: tuple[int, int],
                     rflat: Expr, kblock: KBlock) -> tuple[Stmt, ...]:
    """One reduction block when there are few panels: the block of every panel packed into
    ``yblk`` [jo][kc][nr] (parallel over panels), then the row tiles in parallel, each
    running over the full panels and the partial last one."""
    NJ, NJt, tail = plan.panels.full, plan.panels.total, plan.panels.tail
    nr, r0, kcb = plan.nr, kblock.r0, kblock.kc
    idx = add(mul(add(mul(Var("jo"), c(kcb)), rflat), c(nr)), Var("jj"))
    packs: list[Stmt] = []
    if NJ and tail:  # one parallel loop, the partial last panel behind a test (no serial pack after it)
        packs.append(For("jo", c(0), c(NJt), (If(Op("lt", (Var("jo"), c(NJ)), "bool"), pack(yblk, idx, False, (r0, kcb)),
                                                pack(yblk, idx, True, (r0, kcb))),), parallel=True))
    elif NJ:
        packs.append(For("jo", c(0), c(NJ), pack(yblk, idx, False, (r0, kcb)), parallel=True))
    elif tail:
        packs.append(For("jo", c(NJ), c(NJt), pack(yblk, idx, True, (r0, kcb))))
    panel = mul(add(mul(Var("jo"), c(kcb)), plan.R), c(nr))
    return (*packs, *rows_over_panels(plan, rows, nvs, At(yblk, panel), kblock))


def rows_over_panels(plan: ContractionPlan, rows: list[RowGroup], nvs: tuple[int, int], src: At,
                     kblock: KBlock | None = None, tout: RowMajor | None = None) -> list[For]:
    """For each group of ``rows``: io < count (parallel), the row tile meets every packed panel
    in turn, the full ones (nvs[0] vectors) then the partial last one (nvs[1]); ``src`` is
    panel jo's row R."""
    NJ, NJt, tail = plan.panels.full, plan.panels.total, plan.panels.tail
    out = []
    for g in rows:
        # rows of X copied apart (``aliased_rows``) once per row tile for all the panels (with
        # a blocked reduction, the block's columns of them, once per row tile too)
        parts: list[Stmt] = copy_x_rows(plan, g, nvs[0], kblock)
        tiles = replace(g, x_copied=bool(parts))
        for jlo, jhi, width, vecs in ((0, NJ, plan.nr, nvs[0]), (NJ, NJt, tail, nvs[1])):
            if jhi > jlo:
                f = row_tiles(plan, tiles, vecs, src, width, kblock, tout)
                parts.append(For("jo", c(jlo), c(jhi), f.body))
        out.append(For("io", c(0), c(g.count), tuple(parts), parallel=True))
    return out


def copy_x_rows(plan: ContractionPlan, g: RowGroup, nv: int, kblock: KBlock | None = None) -> list[Stmt]:
    """For a row tile io of ``g`` that meets every panel in turn: its rows of X, when they share
    L1 sets (see ``row_tiles``), copied whole into ``xrows`` (rows K + a cache line apart) once
    for all the panels, or with ``kblock`` the block's columns (rows kc + a line apart); []
    when they are read in place."""
    n = plan.n
    xr = in_group(n.xv, [f.var for f in n.rloops], n.rloops, plan.R)
    if not copies_rows(plan, xr, g.mr, nv):
        return []
    lo, kc = (c(0), plan.K) if kblock is None else (kblock.r0, kblock.kc)
    xl = kc + plan.line
    return [Alloc("xrows", "float32", g.mr * xl),
            rows_copy(xr, n.iloop.var, plan.R, add(g.i0, mul(Var("io"), c(g.mr))), g.mr, xl, lo, add(lo, c(kc)))]


def split_rows(rows: list[RowGroup], S: int) -> list[RowGroup]:
    """``rows`` shared among S parts by the loop variable ``ih``: the first group's tiles in S
    runs of count // S, the last part taking what is left over and the narrower tiles after
    it, with the tile loop's bounds affine in ``ih`` (so that isl sees the parts write
    disjoint rows)."""
    g, rest = rows[0], rows[1:]
    q = g.count // S
    ih = Var("ih")
    last = ih if S == 2 else Op("floordiv", (ih, c(S - 1)), INDEX)  # 1 on the last part, else 0
    out = [replace(g, lo=mul(ih, c(q)), hi=add(mul(add(ih, c(1)), c(q)), mul(last, c(g.count - S * q))))]
    return out + [replace(r, lo=c(0), hi=mul(last, c(r.count))) for r in rest]


def row_split(panel_cols: list[int], tasks_before: int, cores: int, M: int, MI: int) -> int:
    """How many parts the row tiles are split into, each packing every panel itself: ``cores``
    when OpenMP's static schedule of the panel tasks (``tasks_before`` batch iterations of
    ``panel_cols``, the computed columns of each panel) would leave the busiest core over 1/10
    more columns than an even share and the rows are many enough to pay for packing each panel
    once per part (64 per part); else 1. For example, 7 panels of 32 columns (the last of 4)
    over two cores give one core 128 columns, the other 68."""
    cols = panel_cols * tasks_before
    if cores < 2 or M < 64 * cores or MI < 2 * cores:
        return 1
    return cores if 10 * static_schedule(cols, cores) * cores > 11 * sum(cols) else 1


def row_groups(M: int, mr: int, mc: int, nb: int) -> list[tuple[list[RowGroup], tuple[str, int] | None]]:
    """[(row tiles, row-block loop)]: ``nb`` blocks of ``mc`` rows (a sequential loop), then the
    rows after them in mr-row tiles and one narrower tile for the rows left over."""
    groups = []
    if nb:
        groups.append(([RowGroup(mr, mul(Var("ib"), c(mc)), mc // mr)], ("ib", nb)))
    lo = nb * mc
    rest = [RowGroup(mr, c(lo), (M - lo) // mr)] if (M - lo) // mr else []
    if (M - lo) % mr:
        rest.append(RowGroup((M - lo) % mr, c(lo + (M - lo) // mr * mr), 1))
    if rest:
        groups.append((rest, None))
    return groups


def tile_nest(plan: ContractionPlan, rows: list[RowGroup], nv: int, cols: tuple[int, int, int], local=None,
              block: tuple[str, int] | None = None) -> Stmt:
    """for p..., jo in [lo, hi) (``cols`` = (lo, hi, columns stored of each panel)): for each
    group of ``rows``, io < count: an mr x (nv*vw) tile on panel jo. Panels come from the
    packed panels of ``plan`` or, with ``local`` (the statements that pack panel jo into
    ``ypanel``), are packed at the top of each jo iteration. ``block`` = (variable, count): a
    sequential loop of row blocks around the panel loop."""
    jlo, jhi, width = cols
    loops = panel_body(plan, rows, nv, width, local)
    return wrap(plan.n, For("jo", c(jlo), c(jhi), tuple(loops), parallel=True), block)


def packed_at(bl: Expr, NJ: int, jo: Expr, K: int, r: Expr, nr: int) -> Expr:
    """The flat index of Yp[bl][jo][r][0]: row r of packed panel jo (NJ panels of K rows of nr)."""
    return mul(add(mul(add(mul(bl, c(NJ)), jo), c(K)), r), c(nr))


def panel_body(plan: ContractionPlan, rows: list[RowGroup], nv: int, width: int, local,
               kblock: KBlock | None = None, ahead: At | None = None) -> list[Stmt]:
    """The statements for one panel jo (see ``tile_nest``): nv vectors of each packed row of nr,
    the epilogue on ``width`` columns. ``ahead``: where panel jo + 1's row R starts, for the
    row tiles to prefetch it (``row_tiles``)."""
    if local is None:  # Yp[bl][jo][R][0] (R from the reduction block's start r0)
        Rg = plan.R if kblock is None else add(kblock.r0, plan.R)
        src = At(plan.packed, packed_at(plan.bl, plan.panels.total, Var("jo"), plan.K, Rg, plan.nr))
    else:
        src = At("ypanel", mul(plan.R, c(plan.nr)))
    loops: list[Stmt] = []
    for g in rows:
        f = row_tiles(plan, g, nv, src, width, kblock, ahead=ahead)
        loops.append(replace(f, lo=g.lo, hi=g.hi) if g.lo is not None else f)
    if local is not None:
        size = plan.K if kblock is None else kblock.kc
        loops = [Alloc("ypanel", "float32", size * plan.nr), *local, *[replace(f, parallel=False) for f in loops]]
    return loops


def wrap(n: Nest, main: Stmt, block: tuple[str, int] | None) -> Stmt:
    """The panel loop inside the row-block loop (if any) inside the batch loops."""
    if block is not None:
        main = For(block[0], c(0), c(block[1]), (main,), parallel=False)
    for f in reversed(n.batch):
        main = replace(f, body=(main,))
    return main


def row_tiles(plan: ContractionPlan, g: RowGroup, nv: int, src: At, width: int, kblock: KBlock | None = None,
              tout: RowMajor | None = None, ahead: At | None = None) -> For:
    """io < count: the mr x (nv*vw) register tile of rows i0 + io*mr + [0, mr) of ``g`` times
    panel jo (row R of it at ``src``, columns jo*nr + [0, nv*vw)), then its epilogue on the
    first ``width`` columns. ``kblock``: the reduction rows of one block only (the panel holds
    those), the tile reloaded and kept between blocks (see ``KBlock``). ``tout``: the raw tile
    stored there row-major instead (``out_kernel`` applies the epilogue). ``ahead``: the start
    of row R of the next panel (in Y, or in the cached packed panels), whose cache lines the
    first row tiles prefetch (one line per reduction step each)."""
    n, K, R, vw, vt, xpack, line = plan.n, plan.K, plan.R, plan.vw, plan.vt, plan.xpack, plan.line
    mr, i0, MI, step = g.mr, g.i0, g.count, plan.nr
    nr = nv * vw
    i = n.iloop.var
    rn = [f.var for f in n.rloops]
    jo, io, jj, ii = "jo", "io", "jj", "ii"
    r0, kc = (c(0), K) if kblock is None else (kblock.r0, kblock.kc)
    Rg = add(r0, R) if kblock is not None else R  # the reduction index in the whole of K
    accs = [[f"acc{x}_{y}" for y in range(nv)] for x in range(mr)]  # (C names b<n> are buffers)
    # each y vector meets mr broadcasts: pinned to a register (gcc folds the load into every
    # FMA otherwise, a 512-bit load per FMA; see codegen.c's PT_REG)
    pin = in_register if mr > 1 else (lambda e: e)
    inner: list[Stmt] = [Let(f"yv{y}", vt, pin(Load(src.buf, add(src.index, c(y * vw)), vt))) for y in range(nv)]
    xr = in_group(n.xv, rn, n.rloops, Rg)
    row0 = add(i0, mul(Var(io), c(mr)))
    # (int8 quads sum exactly in int32 lanes: no chunks, converted to float32 after the loop)
    ints = n.dot != "dot2"
    chunked = kblock is None and isinstance(kc, int) and kc > 2 * SUM_CHUNK and not ints
    # X read in place with rows that share L1 sets: the tile's rows are copied, a chunk of the
    # reduction at a time, into ``xrows`` whose rows lie one cache line further apart
    # (tiles of 2 vectors only: 9 x 3 reads X a third less often per FMA and loses more to the
    # copy than it gains; a 1-vector tile would copy as many floats as it multiplies)
    xhoisted = g.x_copied
    if xhoisted:  # (R runs over the block, xrows holds the block's columns from 0)
        xl = kc + line
    else:
        xl = (SUM_CHUNK if chunked else kc) + line if copies_rows(plan, xr, mr, nv) else 0
    xlo: Expr = mul(Var("rc"), c(SUM_CHUNK)) if chunked and not xhoisted else c(0)
    for x in range(mr):
        if xl:
            xval: Expr = Load("xrows", add(c(x * xl), add(R, mul(xlo, c(-1)))), "float32")
        elif xpack is not None:
            xb, xbl, mt, mrf = xpack.buf, xpack.bl, xpack.tiles, xpack.rows
            tidx = add(Op("floordiv", (i0, c(mrf)), "int64") if not isinstance(i0, Const) else c(i0.value // mrf),
                       Var(io))
            xval: Expr = Load(xb, add(mul(add(mul(add(mul(xbl, c(mt)), tidx), c(K)), Rg), c(mrf)), c(x)), "float32")
        else:
            xval = subst_vars(xr, {i: add(row0, c(x))})
        inner.append(Let(f"xs{x}", "float32", xval))
        for y in range(nv):
            if n.pairs:  # (bits of bfloat16 pairs or int8 quads: broadcast bitwise by the dot op itself)
                acc = Op(n.dot, (Var(accs[x][y], vt), Var(f"xs{x}", "float32"), Var(f"yv{y}", vt)), vt)
            else:
                acc = Op("add", (Var(accs[x][y], vt), Op("mul", (Op("broadcast", (Var(f"xs{x}", "float32"),), vt),
                                                                 Var(f"yv{y}", vt)), vt)), vt)
            inner.append(Assign(accs[x][y], acc))
    pf: list[Stmt] = []
    if MI > 1 and xpack is None:
        pf += next_rows_prefetch(xr, i, row0, mr, R, Rg)
    if MI > 1 and tout is None and output_along_rows(n):
        pf += next_output_prefetch(n, add(row0, c(mr)), mul(Var(jo), c(step)), width, kc, R, line)
    if pf:
        inner.append(If(Op("eq", (Op("remainder", (R, c(line)), "int64"), c(0)), "bool"), tuple(pf)))
    if ahead is not None and MI >= -(-step // line):
        # the next panel's rows lie a page or more apart: packed at the top of the next panel
        # they are misses the hardware prefetchers do not follow; tile io < (lines of a panel
        # row) fetches line io of each row to the L2 while it computes
        lines = -(-step // line)
        inner.append(If(Op("lt", (Var(io), c(lines)), "bool"),
                        (Prefetch(ahead.buf, add(ahead.index, mul(Var(io), c(line))), 2),)))
    tile = "ctile"
    body: list[Stmt] = [Alloc(tile, "float32", mr * nr)]
    body += [Let(accs[x][y], vt, Op("broadcast", (Const(0.0, "float32"),), vt)) for x in range(mr) for y in range(nv)]
    if kblock is not None:
        reload, final, cacc, ldc = kblock.reload, kblock.final, kblock.acc, kblock.ldc

        def at(x: int, y: int) -> Expr:
            return add(add(mul(add(row0, c(x)), c(ldc)), mul(Var(jo), c(step))), c(y * vw))

    def copy_rows(lo: Expr, hi: Expr) -> list[Stmt]:
        return [rows_copy(xr, i, R, row0, mr, xl, lo, hi)] if xl and not xhoisted else []

    if xl and not xhoisted:
        body.append(Alloc("xrows", "float32", mr * xl))
    if chunked:
        # the reduction in chunks whose partial sums join the tile's total in ``ctile`` after
        # each (two-level summation): one running float32 sum over K = 4000 has three times
        # eager's RMSE (see the README's accuracy note); one vector add per accumulator per chunk
        zero = Op("broadcast", (Const(0.0, "float32"),), vt)
        nck = -(-kc // SUM_CHUNK)
        lo = mul(Var("rc"), c(SUM_CHUNK))
        hi: Expr = add(lo, c(SUM_CHUNK)) if kc % SUM_CHUNK == 0 else \
            Op("minimum", (add(lo, c(SUM_CHUNK)), c(kc)), INDEX)
        body += [Store(tile, c(x * nr + y * vw), zero) for x in range(mr) for y in range(nv)]
        body.append(For("rc", c(0), c(nck), (
            *(Assign(accs[x][y], zero) for x in range(mr) for y in range(nv)),
            *copy_rows(lo, hi),
            For(R.name, lo, hi, tuple(inner)),
            *(Store(tile, c(x * nr + y * vw), Op("add", (Load(tile, c(x * nr + y * vw), vt), Var(accs[x][y], vt)),
                                                      vt)) for x in range(mr) for y in range(nv)))))
    else:
        body += copy_rows(c(0), c(kc))
        body.append(For(R.name, c(0), c(kc), tuple(inner)))
        if ints:
            body += [Assign(accs[x][y], Op("i32_float", (Var(accs[x][y], vt),), vt)) for x in range(mr) for y in range(nv)]
    if kblock is not None:
        # the block's partial sums start from zero and are added to the earlier blocks' total
        # after it (two-level summation: 128 x 16384 dot products come out with about half the
        # rounding error of one running sum), the same loads as reloading before the block
        body += _when(reload, [Assign(accs[x][y], Op("add", (Var(accs[x][y], vt), Load(cacc, at(x, y), vt)), vt))
                               for x in range(mr) for y in range(nv)])
    done: list[Stmt] = [] if chunked else \
        [Store(tile, c(x * nr + y * vw), Var(accs[x][y], vt)) for x in range(mr) for y in range(nv)]
    ivar = add(row0, Var(ii))
    jvar = add(mul(Var(jo), c(step)), Var(jj))
    tval = Load(tile, add(mul(Var(ii), c(nr)), Var(jj)), "float32")
    value = map_expr(n.store.value, lambda e: tval if isinstance(e, Var) and e.name == n.acc else e)
    epi = epilogue_store(n, value, ivar, jvar)
    if tout is not None:  # the finished values, row-major: ``out_kernel`` only moves them
        done.append(For(ii, c(0), c(mr), (For(jj, c(0), c(width), (
            Store(tout.buf, add(mul(ivar, c(tout.cols)), jvar), widened(epi.value)),)),)))
    elif output_along_rows(n):
        # the output runs along the tile's rows (a swapped orientation, see ``orient``): the
        # epilogue walks them innermost, a row segment of mr at a time
        if epi.value != tval and not any(isinstance(e, Load) and e.buf != tile and _strided(e.index, jj)
                                         for e in walk_exprs(epi.value)):
            # a value that reads nothing along the columns but the tile or contiguously (a bias,
            # GELU, a quantized product's per-row sums) is computed first along the tile's rows,
            # whole vectors at a time, the stores then only move it (computed in the epilogue, a
            # short run per output row, e.g. 14 elements, would make erf's vector calls partial)
            done.append(For(ii, c(0), c(mr), (For(jj, c(0), c(width), (
                Store(tile, add(mul(Var(ii), c(nr)), Var(jj)), widened(epi.value)),)),)))
            epi = replace(epi, value=narrowed(tval, epi.value.dtype))
        done.append(For(jj, c(0), c(width), (For(ii, c(0), c(mr), (epi,)),)))
    else:
        done.append(For(ii, c(0), c(mr), (For(jj, c(0), c(width), (epi,)),)))
    if kblock is not None:
        keep = [Store(cacc, at(x, y), Var(accs[x][y], vt)) for x in range(mr) for y in range(nv)]
        done = _when(final, done, keep)
    body += done
    return For(io, c(0), c(MI), tuple(body), parallel=True)


def _strided(index: Expr, v: str) -> bool:
    """Whether ``index`` moves by more than one element per step of ``v`` (or not affinely)."""
    lf = linear_form(index)
    return lf is None or lf[0].get(v, 0) not in (0, 1)


SUM_CHUNK = 128  # reductions per partial sum of a register tile (``row_tiles``)

ALIAS_ROWS = 4  # rows of a tile in one L1 set from which they evict each other's lines (8 ways)


def aliased_rows(xr: Expr, i: str, R: Var, mr: int, machine: CPUMachine) -> bool:
    """Whether X, read in place along the reduction, has rows so far apart (a multiple of the
    span of one L1 way, 4 KB for 32 KB 8-way and 48 KB 12-way caches: K = 1024, 2048, 3072
    floats) that more than ``ALIAS_ROWS`` of a tile's mr rows map to one L1 set: their lines,
    one per row at a time, then evict each other before their 16 floats are used."""
    xr = load_of(xr)
    if not isinstance(xr, Load):
        return False
    fs = linear_form(xr.index)
    if fs is None or fs[0].get(R.name, 0) != 1:
        return False
    s = fs[0].get(i, 0) * ITEMSIZE[xr.dtype]
    sets: dict[int, int] = {}
    for x in range(mr):
        k = (x * s) % machine.l1_way_bytes // machine.cache_line
        sets[k] = sets.get(k, 0) + 1
    return max(sets.values()) > ALIAS_ROWS


def copies_rows(plan: ContractionPlan, xr: Expr, mr: int, nv: int) -> bool:
    """Whether a tile of mr x nv vectors copies its rows of X (``xr``) into ``xrows`` (``row_tiles``)."""
    return plan.xpack is None and nv == 2 and aliased_rows(xr, plan.n.iloop.var, plan.R, mr, plan.machine)


def rows_copy(xr: Expr, i: str, R: Var, row0: Expr, mr: int, xl: int, lo: Expr, hi: Expr) -> For:
    """Reductions [lo, hi) of X's rows row0 + [0, mr) (``xr`` at row i, reduction R) into
    ``xrows``, row ``xrow`` at xrow * xl - lo."""
    val = subst_vars(xr, {i: add(row0, Var("xrow")), R.name: Var("xcol")})
    at = add(add(mul(Var("xrow"), c(xl)), Var("xcol")), mul(lo, c(-1)))
    return For("xrow", c(0), c(mr), (For("xcol", lo, hi, (Store("xrows", at, val),)),))


def next_rows_prefetch(xr: Expr, i: str, row0: Expr, mr: int, R: Var, Rg: Expr) -> list[Stmt]:
    """Prefetches (to the L2) of the next row tile's X rows at reduction Rg, for a loop that
    runs them once per cache line of reduction: X read in place streams mr rows at once from
    memory, which the hardware prefetchers follow poorly. Only where X is contiguous along the
    reduction."""
    xr = load_of(xr)
    if not isinstance(xr, Load):
        return []
    fs = linear_form(xr.index)
    if fs is None or fs[0].get(R.name, 0) != 1:
        return []
    return [Prefetch(xr.buf, subst_vars(element_index(xr), {i: add(row0, c(mr + x))})) for x in range(mr)]


def next_output_prefetch(n: Nest, inext: Expr, j0: Expr, width: int, kc: int, R: Var, line: int) -> list[Stmt]:
    """Prefetches for writing of the output lines the next row tile's epilogue stores into,
    spread over this tile's reduction (one slot per cache line of it, see above), for a tile
    whose output runs along its rows: it writes mr floats into each of ``width`` output rows
    (columns j0 + jj), rows usually far apart, and the store buffer would wait on their
    misses."""
    per = -(-width // max(1, kc // line))  # output rows per slot (``line``: floats per cache line)
    slot = Op("floordiv", (R, c(line)), "int64")
    out: list[Stmt] = []
    for t in range(per):
        jj = add(mul(slot, c(per)), c(t)) if per > 1 else slot
        st = epilogue_store(n, Const(0.0, "float32"), inext, add(j0, jj))
        out.append(If(Op("lt", (jj, c(width)), "bool"), (Prefetch(st.buf, st.index, write=True),)))
    return out


def out_kernel(k: Kernel, n: Nest, tbuf: str, M: int, N: int, vw: int, line: int) -> Kernel:
    """The output of a nest whose output runs along its rows, from the finished tiles in
    ``tbuf`` (M x N, row-major, epilogue applied by the tiles). Tile stores straight to the
    output put mr-element pieces into rows a multiple of 2 KB apart, all in one or two L1 sets.
    Here ``line`` output rows (as many columns j of the tiles, one cache line of each row of
    ``tbuf``) are written at a time, in order along them: ``line`` write streams, ``tbuf`` read
    once a line at a time (one output row at a time would read ``tbuf`` down its columns, one
    cache line per element)."""
    odt = n.store.value.dtype  # (a half type: its values are exact in the float32 temp)

    def move(j: Expr) -> Stmt:
        idx = epilogue_store(n, Const(0.0, "float32"), Var("i"), j).index
        return Store(n.store.buf, idx, narrowed(Load(tbuf, add(mul(Var("i"), c(N)), j), "float32"), odt))

    nb = N // line
    body: list[Stmt] = []
    oidx = epilogue_store(n, Const(0.0, "float32"), Var("i"), Var("j")).index
    lf = linear_form(oidx)
    if nb and vw and line % vw == 0 and M % vw == 0 and vw & (vw - 1) == 0 \
            and lf is not None and lf[0].get("i") == 1:
        # vw x vw blocks transposed in registers (affine.transpose): vector loads along the
        # temp's rows, vector stores along the output's, instead of one element at a time
        vt = vector_type("float32", vw)
        j0 = add(mul(Var("jb"), c(line)), mul(Var("tb"), c(vw)))
        reg = transposed_block(
            vw, vt,
            lambda k: Load(tbuf, add(mul(add(mul(Var("ib"), c(vw)), c(k)), c(N)), j0), vt),
            lambda k, val: Store(n.store.buf, subst_vars(oidx, {"i": mul(Var("ib"), c(vw)), "j": add(j0, c(k))}),
                                 narrowed(val, odt)))
        body.append(For("jb", c(0), c(nb), (For("ib", c(0), c(M // vw), (
            For("tb", c(0), c(line // vw), tuple(reg)),)),), parallel=True))
    elif nb:
        j = add(mul(Var("jb"), c(line)), Var("t"))
        body.append(For("jb", c(0), c(nb), (For("i", c(0), c(M), (For("t", c(0), c(line), (move(j),)),)),),
                        parallel=True))
    if N % line:
        body.append(For("j", c(nb * line), c(N), (For("i", c(0), c(M), (move(Var("j")),)),), parallel=True))
    return Kernel(f"{k.name}_out", tuple(body), f"epilogue of {k.origin}"[:160])


def narrowed(v: Expr, dtype: str) -> Expr:
    """A float32 value (scalar or vector) from a temp back in the type ``dtype`` it held (a half
    type, or an 8-bit integer: exact, the temp holds that integer's value)."""
    if dtype not in WIDENS:
        return v
    return Op("cast", (v,), vector_type(dtype, lanes(v.dtype)) if lanes(v.dtype) > 1 else dtype)


def output_along_rows(n: Nest) -> bool:
    """Whether the nest's output is contiguous along its rows and not its columns (the
    orientation was swapped, see ``orient``): C^T tiles."""
    fs = linear_form(epilogue_store(n, Const(0.0, "float32"), Var("ii"), Var("jj")).index)
    return fs is not None and fs[0].get("ii", 0) == 1 and fs[0].get("jj", 0) != 1


def transposed_pack(dst: At, pval: Expr, loops: tuple[str, str], K: int, nr: int, vw: int,
                    cols: int | None = None) -> tuple[Stmt, ...]:
    """A panel of a Y that is contiguous along the reduction and strided along the columns
    (the transposed weight of a linear layer): blocks of vw reductions x nr columns go through
    a local tile, read as nr vector loads along the reduction and written out a panel row at a
    time (a strided gather of single elements would cost a large share of the layer's time);
    when the columns are whole vectors, vw x vw blocks are transposed in registers instead,
    which is cheaper still. ``cols``: the columns that exist (a partial last panel), zeros
    after them. ``dst``: where element (r, jj) of the panel goes, ``loops`` = (r, jj): the names
    of the reduction and column variables in ``dst.index`` and ``pval``."""
    buf, idx = dst.buf, dst.index
    r, jj = loops
    vt = vector_type("float32", vw)
    rb, t = "rb", "t"
    kb = K // vw
    w = nr if cols is None else cols
    head = subst_vars(pval, {r: mul(Var(rb), c(vw))})
    load = as_vector(head, vw)
    out: list[Stmt]
    if w % vw == 0 and vw & (vw - 1) == 0:
        # whole vw x vw blocks transposed in registers (affine.transpose)
        jb = "jb"
        reg = transposed_block(
            vw, vt,
            lambda k: as_vector(subst_vars(head, {jj: add(mul(Var(jb), c(vw)), c(k))}), vw),
            lambda k, val: Store(buf, subst_vars(idx, {r: add(mul(Var(rb), c(vw)), c(k)),
                                                       jj: mul(Var(jb), c(vw))}), val))
        out = [For(rb, c(0), c(kb), (For(jb, c(0), c(w // vw), tuple(reg)),))]
    else:
        blk = (For(jj, c(0), c(w), (Store("tblk", mul(Var(jj), c(vw)), load),)),
               For(t, c(0), c(vw), (For(jj, c(0), c(w), (
                   Store(buf, subst_vars(idx, {r: add(mul(Var(rb), c(vw)), Var(t))}),
                         Load("tblk", add(mul(Var(jj), c(vw)), Var(t)), "float32")),)),)))
        out = [Alloc("tblk", "float32", w * vw), For(rb, c(0), c(kb), blk)]
    if K % vw:
        out.append(For(r, c(kb * vw), c(K), (For(jj, c(0), c(w), (Store(buf, idx, pval),)),)))
    if w < nr:
        out.append(For(r, c(0), c(K), (For(jj, c(w), c(nr), (Store(buf, idx, Const(0.0, "float32")),)),)))
    return tuple(out)
