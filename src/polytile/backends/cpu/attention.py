"""Affine lowering of the ``attention`` graph node: the online-softmax (flash) nest.

For every batch index and tile of BR query rows (the parallel loops):

    qp[BR][D]  = the rows of Q                     (packed once; zeros past L)
    m, l, o    = -inf, 0, 0                        running max, sum and output per row
    for each tile of BC keys (causal: only tiles with a key j <= i + offset for some row):
        s[BR][BC]   = qp . K^T tile                register tiles of RQ rows x BC columns (the
                                                   K^T tiles [D][BC] and V rows [Dv'] are packed,
                                                   zeros past S, once per batch index by a first
                                                   nest)
        per row:    s = steps(s) (scale, masks, causal); mnew = max(m, max s)
                    s = exp(s - mnew); l = l * exp(m - mnew) + sum s; o *= exp(m - mnew)
        o += s . V tile                            register tiles of RV rows x Dv columns
    out = o / l                                    (rows with no key left: 0 or NaN, as the
                                                    graph asked)

From COLS_MIN_ROWS query rows the tile is held key-major instead, s[BC][BR] with the queries
along the vectors (Q packed transposed, K read in place and broadcast, V read in place when its
rows are contiguous: no pack nest then): the per-row max and sum become
vector max/add down the columns, exp(m_old - m_new) one vector exp per VW queries instead of
a scalar expf per row, and the o *= alpha pass moves into the load of the output register
tile.

The score matrix exists only as the BR x BC tile ``s``. Tile sizes come from the CPUMachine:
BC from the L1 size, the register rows from the vector registers, BR so that the row
state fits in a quarter of the L2 and there are at least two tasks per core. The row form
keeps plain row loops, which the C compiler vectorizes: summing each row through a vector
accumulator and its lanes, or taking the row max from the registers with the row update
vectorized over rows, is slower.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...graph.ir import Node
from .attention_sizes import COLS_MIN_ROWS, _pv_chunks, cols_tile_sizes, tile_sizes
from .machine import CPUMachine
from ...affine.transpose import lane_sums, transposed_block
from ...affine.ir import (INDEX, Alloc, Assign, Const, Expr, For, If, Let, Load, Op, Stmt, Store, Var, add, c, in_register,
                 mul, vector_type)
from ...affine.attention import score_step
from ...affine.linear import linear_form

F32 = "float32"
NEG_INF = Const(-math.inf, F32)
LOG2E = 1.4426950408889634


def _f(fn: str, *args: Expr, dtype: str = F32) -> Op:
    return Op(fn, tuple(args), dtype)


def _lt(a: Expr, b: Expr) -> Op:
    return Op("lt", (a, b), "bool")


def lower_attention(b, n: Node, target: CPUMachine, threads: int) -> tuple[list[Stmt], list[Stmt]]:
    """(pack, main) statements of the attention of node ``n`` (see the module docstring):
    ``pack`` writes K^T tiles into a new temp [batch][S/BC][D][BC] and V into another
    [batch][S'][Dv'] (zeros past S and Dv: as large as K and V, not the scores) once per batch
    index; ``main`` is the online softmax nest reading them. ``b`` is the affine builder."""
    q, kt, v, *masks = n.inputs
    bd = list(n.shape[:-2])
    L, Dv = n.shape[-2:]
    D, S = kt.shape[-2:]
    cols = L >= COLS_MIN_ROWS
    ts = (cols_tile_sizes if cols else tile_sizes)(target, L, S, D, Dv, math.prod(bd), threads)
    bvars = [Var(f"i{k}") for k in range(len(bd))]
    # K and V's batch indices: with grouped-query heads (kv_group G) query head h reads head h // G
    G = n.attr("kv_group", 1)
    kvvars = bvars if G == 1 else bvars[:-1] + [Op("floordiv", (bvars[-1], c(G)), INDEX)]
    dots = not cols and _dots_form(b, (_constant_factor(kt) or (kt, None))[0], bvars, L, D, ts["VW"])
    if dots:  # one tile of all the rows; output register tiles of rows that divide them
        ts = {**ts, "BR": L, "RV": min(ts["RV"], L & -L)}
    BR, BC, RQ, RV, VW, DVP = (ts[k] for k in ("BR", "BC", "RQ", "RV", "VW", "DVP"))
    vt = vector_type(F32, VW)
    it, r, d, j, x = Var("it"), Var("r"), Var("d"), Var("j"), Var("x")
    row0 = mul(it, c(BR))
    NT = -(-L // BR)
    steps = list(n.attr("steps"))
    # a constant scale first in the chain is applied to the Q tile as it is packed (q*c).k = c*(q.k)
    qscale = steps.pop(0)[:3:2] if steps and steps[0][0] in ("mul", "div") and steps[0][1] == "c" else None
    # so is a constant factor of K^T (SDPA's decomposition scales q and k by sqrt(scale) each):
    # K is then read as it is, without a scaled copy
    kfac = _constant_factor(kt)
    if kfac is not None:
        kt, f = kfac
        f = f if qscale is None else (f * qscale[1] if qscale[0] == "mul" else f / qscale[1])
        qscale = ("mul", f)
    # and a constant factor of Q itself (q * sqrt(scale)): Q is read where it is
    qfac = _constant_factor(q)
    if qfac is not None:
        q, g = qfac
        qscale = ("mul", g) if qscale is None else \
            (qscale[0], qscale[1] * g if qscale[0] == "mul" else qscale[1] / g)
    # the key-major form with no steps but causal ones works in base 2: log2(e) joins the Q
    # scale, so the scores and maxima are in units of log2 and every exp is an exp2, which
    # needs no Cody-Waite reduction; the probabilities, sums and output are the same
    base2 = cols and all(st[0] == "causal" for st in steps)
    if base2:
        qscale = ("mul", LOG2E) if qscale is None else \
            ("mul", qscale[1] * LOG2E if qscale[0] == "mul" else LOG2E / qscale[1])
    expf = "exp2" if base2 else "exp"
    SP = -(-S // BC) * BC
    bflat: Expr = c(0)
    for k, v_ in enumerate(bvars):
        bflat = add(mul(bflat, c(bd[k])), v_)
    # the key-major form reads K in place (its elements are broadcast: any layout, grouped-query
    # heads without a copy), the dot form too (rows of K along d); both read V in place when its
    # rows are contiguous and a whole number of vectors
    vdirect = False
    if (cols or dots) and Dv == DVP:
        probe = b.read(v, bvars + [Var("_key"), Var("_d")])
        lf = linear_form(probe.index) if isinstance(probe, Load) else None
        vdirect = lf is not None and lf[0].get("_d") == 1
    kbuf = "" if cols or dots else b.temp(F32, math.prod(bd) * SP * D)
    vbuf = "" if vdirect else b.temp(F32, math.prod(bd) * SP * DVP)

    def vrow(key: Expr, d0: int) -> Load:
        """VW elements of V's row ``key`` from column d0 (in place or from the packed copy)."""
        if vdirect:
            ld = b.read(v, kvvars + [key, c(d0)])
            return Load(ld.buf, ld.index, vt)
        return Load(vbuf, add(mul(add(mul(bflat, c(SP)), key), c(DVP)), c(d0)), vt)
    causal = [s[2] for s in steps if s[0] == "causal"]

    def guarded(cond: bool, test: Expr, st: Store, zero: Store) -> Stmt:
        return If(test, (st,), (zero,)) if cond else st

    # ---- Q tile, row state
    body: list[Stmt] = [Alloc("qp", F32, BR * D), Alloc("mrow", F32, BR), Alloc("lrow", F32, BR),
                        Alloc("o", F32, BR * DVP), Alloc("s", F32, BR * BC)]
    if cols:  # per-row state of one key tile: max, safe max, rescale factor, sum
        body += [Alloc(a, F32, BR) for a in ("mx", "ms", "al", "ps")]
    qrow = add(row0, r)
    qval: Expr = b.read(q, bvars + [qrow, d])
    if qscale is not None:
        qval = _f(qscale[0], qval, Const(qscale[1], F32))
    qidx = add(mul(d, c(BR)), r) if cols else add(mul(r, c(D)), d)  # key-major form: Q^T
    qpack: Stmt = For("r", c(0), c(BR), (For("d", c(0), c(D), (
        guarded(L % BR != 0, _lt(qrow, c(L)), Store("qp", qidx, qval), Store("qp", qidx, Const(0.0, F32))),)),))
    if cols and D % VW == 0 and BR % VW == 0 and VW & (VW - 1) == 0:
        # Q^T in registers, VW x VW blocks (when Q's rows are contiguous along d): the element
        # loop reads a new cache line per element
        qbase = q
        while qbase.op == "view":
            qbase = qbase.inputs[0]
        # only from a graph input: a computed Q's producer is fused into scalar loads, not these
        if qbase.op == "input" and _vector_of(b.read(q, bvars + [Var("_row"), Var("_d")]), vt, "_d") is not None:
            rb, db = Var("rb"), Var("db")

            def qrow_vec(k: int) -> Expr:
                e = _vector_of(b.read(q, bvars + [add(add(row0, mul(rb, c(VW))), c(k)), mul(db, c(VW))]), vt)
                return _f(qscale[0], e, Const(qscale[1], F32), dtype=vt) if qscale is not None else e

            blocks: Stmt = For("rb", c(0), c(BR // VW), (For("db", c(0), c(D // VW), tuple(transposed_block(
                VW, vt, qrow_vec,
                lambda k, val: Store("qp", add(mul(add(mul(db, c(VW)), c(k)), c(BR)), mul(rb, c(VW))), val),
                prefix="qt"))),))
            # a partial last query tile keeps the element loop (rows past L are zeros)
            qpack = blocks if L % BR == 0 else If(Op("le", (add(row0, c(BR)), c(L)), "bool"), (blocks,), (qpack,))
    body.append(qpack)
    body.append(For("r", c(0), c(BR), (
        Store("mrow", r, NEG_INF), Store("lrow", r, Const(0.0, F32)),
        For("d", c(0), c(DVP), (Store("o", add(mul(r, c(DVP)), d), Const(0.0, F32)),)))))

    full_tiles = S // BC
    tail = S % BC

    def key_tile(j0: Expr, width: int, steps: list) -> list[Stmt]:
        """Everything for the keys [j0, j0 + width) (width < BC only for the last tile), the
        score steps ``steps`` applied."""
        if cols:
            return cols_key_tile(j0, width, steps)
        key = add(j0, j)
        st: list[Stmt] = []
        # scores: s = qp . K^T tile in RQ x BC register tiles
        nq = -(-width // VW)  # the last, partial tile: only the vectors that hold keys
        kt0 = mul(add(mul(add(mul(bflat, c(SP // BC)), Op("floordiv", (j0, c(BC)), INDEX)), c(D)), d), c(BC))
        srow = [[add(mul(add(mul(x, c(RQ)), c(a)), c(BC)), c(y * VW)) for y in range(nq)] for a in range(RQ)]
        if dots:
            st.append(For("r", c(0), c(BR), tuple(dot_scores(j0, width))))
        else:
            st.append(For("x", c(0), c(BR // RQ), _register_tile(
                RegTile("s", RQ, nq, vt), For("d", c(0), c(D), ()),
                lambda a: Load("qp", add(mul(add(mul(x, c(RQ)), c(a)), c(D)), d), F32),
                lambda y: Load(kbuf, add(kt0, c(y * VW)), vt),
                lambda a, y: _f("broadcast", Const(0.0, F32), dtype=vt),
                lambda a, y, acc: Store("s", srow[a][y], acc))))
        # online softmax per row (rows past L hold zeros and are never stored)
        row = add(row0, r)
        sidx = add(mul(r, c(BC)), j)
        sval: Expr = Load("s", sidx, F32)
        for step in steps:
            sval = score_step(b, step, sval, masks, bvars, row, key)
        nvec = -(-width // VW)
        vidx = add(mul(r, c(BC)), mul(j, c(VW)))
        msafe_v = _f("broadcast", Var("msafe", F32), dtype=vt)
        rowwork: list[Stmt] = [
            *([For("j", c(0), c(width), (Store("s", sidx, sval),))] if steps else []),
            Let("mx", F32, NEG_INF),
            For("j", c(0), c(width), (Assign("mx", _f("maximum", Var("mx", F32), Load("s", sidx, F32))),)),
            Let("mold", F32, Load("mrow", r, F32)),
            Let("mnew", F32, _f("maximum", Var("mold", F32), Var("mx", F32))),
            Let("msafe", F32, _f("where", Op("eq", (Var("mnew", F32), NEG_INF), "bool"), Const(0.0, F32),
                                 Var("mnew", F32))),
            Let("alpha", F32, _f("exp", _f("sub", Var("mold", F32), Var("msafe", F32)))),
            # p = exp(s - m) a vector at a time (lanes past ``width`` are cleared below)
            For("j", c(0), c(nvec), (Store("s", vidx, _f("exp", _f("sub", Load("s", vidx, vt), msafe_v, dtype=vt),
                                                         dtype=vt)),)),
            Let("psum", F32, Const(0.0, F32)),
            For("j", c(0), c(width), (Assign("psum", _f("add", Var("psum", F32), Load("s", sidx, F32))),)),
            Store("lrow", r, _f("add", _f("mul", Load("lrow", r, F32), Var("alpha", F32)), Var("psum", F32))),
            Store("mrow", r, Var("mnew", F32)),
            For("d", c(0), c(DVP), (Store("o", add(mul(r, c(DVP)), d),
                                          _f("mul", Load("o", add(mul(r, c(DVP)), d), F32), Var("alpha", F32))),)),
        ]
        if width < BC:
            rowwork.append(For("j", c(width), c(BC), (Store("s", sidx, Const(0.0, F32)),)))
        st.append(For("r", c(0), c(BR), (If(_lt(row, c(L)), tuple(rowwork)),) if L % BR else tuple(rowwork)))
        # o += s . V tile in register tiles of rv rows x up to PV_CHUNK vectors (see _pv_chunks)
        for c0, nv, rv in _pv_chunks(DVP // VW, RV, BR, target.vector_registers):
            oidx = [[add(mul(add(mul(x, c(rv)), c(a)), c(DVP)), c((c0 + y) * VW)) for y in range(nv)]
                    for a in range(rv)]
            st.append(For("x", c(0), c(BR // rv), _register_tile(
                RegTile("o", rv, nv, vt), For("j", c(0), c(width), ()),
                lambda a, rv=rv: Load("s", add(mul(add(mul(x, c(rv)), c(a)), c(BC)), j), F32),
                lambda y, c0=c0: vrow(key, (c0 + y) * VW),
                lambda a, y, oidx=oidx: Load("o", oidx[a][y], vt),
                lambda a, y, acc, oidx=oidx: Store("o", oidx[a][y], acc))))
        return st

    def dot_scores(j0: Expr, width: int) -> list[Stmt]:
        """The dot form's scores of query row r against keys [j0, j0 + width): per VW keys, VW
        vector accumulators along d (K's rows read in place, Q's packed row), then their lane
        sums as one vector of VW scores (``lane_sums``). For a few query rows (decoding) a
        packed K^T would be written and read once per key for one use."""
        dv = Var("dv")
        zero = _f("broadcast", Const(0.0, F32), dtype=vt)
        out: list[Stmt] = []
        for y in range(-(-width // VW)):
            keys = min(VW, width - y * VW)  # the last vector of a partial tile: no reads past S
            accs = [f"sd{y}_{k}" for k in range(keys)]
            qv = Load("qp", add(mul(r, c(D)), mul(dv, c(VW))), vt)
            inner: list[Stmt] = [Let("qv", vt, qv)]
            for k, acc in enumerate(accs):
                ld = b.read(kt, kvvars + [mul(dv, c(VW)), add(j0, c(y * VW + k))])
                prod = _f("mul", Var("qv", vt), Load(ld.buf, ld.index, vt), dtype=vt)
                inner.append(Assign(acc, _f("add", Var(acc, vt), prod, dtype=vt)))
            sums, vec = lane_sums(VW, vt, [Var(a, vt) for a in accs] + [zero] * (VW - keys), prefix=f"ls{y}_")
            out += [*(Let(a, vt, zero) for a in accs), For("dv", c(0), c(D // VW), tuple(inner)), *sums,
                    Store("s", add(mul(r, c(BC)), c(y * VW)), vec)]
        return out

    def cols_key_tile(j0: Expr, width: int, steps: list) -> list[Stmt]:
        """The key-major form: s[j][r] (queries along the vectors), so that the per-query max,
        sum and rescale are vector operations down the columns instead of reductions along
        each row, and exp(m_old - m_new) is one vector exp per 16 queries."""
        key = add(j0, j)
        nq = BR // VW
        RK = ts["RK"]
        st: list[Stmt] = []

        def score_tile(rows: int, base: Expr) -> tuple[Stmt, ...]:
            # s[base + a][:] = K[j0 + base + a] . Q^T: rows x nq vectors, K broadcast from its rows
            return _register_tile(
                RegTile("s", rows, nq, vt), For("d", c(0), c(D), ()),
                lambda a: b.read(kt, kvvars + [d, add(j0, add(base, c(a)))]),
                lambda y: Load("qp", add(mul(d, c(BR)), c(y * VW)), vt),
                lambda a, y: _f("broadcast", Const(0.0, F32), dtype=vt),
                lambda a, y, acc: Store("s", add(mul(add(base, c(a)), c(BR)), c(y * VW)), acc))

        if width // RK:
            st.append(For("x", c(0), c(width // RK), score_tile(RK, mul(x, c(RK)))))
        if width % RK:
            st += score_tile(width % RK, c(width // RK * RK))
        row = add(row0, r)
        sidx = add(mul(j, c(BR)), r)
        real_rows = Op("minimum", (c(BR), add(c(L), mul(row0, c(-1)))), INDEX) if L % BR else c(BR)
        if steps:  # scale, masks, causal on the rows that exist (masks are read at [row, key])
            sval: Expr = Load("s", sidx, F32)
            for step in steps:
                sval = score_step(b, step, sval, masks, bvars, row, key)
            st.append(For("j", c(0), c(width), (For("r", c(0), real_rows, (Store("s", sidx, sval),)),)))
        ld = lambda a: Load(a, r, F32)  # noqa: E731
        vld = lambda a, i=None: Load(a, mul(Var("y"), c(VW)) if i is None else i, vt)  # noqa: E731
        yv = mul(Var("y"), c(VW))
        sv = add(mul(j, c(BR)), yv)
        mnew = _f("maximum", ld("mrow"), ld("mx"))
        st += [
            For("r", c(0), c(BR), (Store("mx", r, NEG_INF),)),
            For("j", c(0), c(width), (For("r", c(0), c(BR), (
                Store("mx", r, _f("maximum", ld("mx"), Load("s", sidx, F32))),)),)),
            # mx = max(m_old, tile max); ms = mx, or 0 where that is still -inf (no key seen)
            For("r", c(0), c(BR), (Store("mx", r, mnew),
                                   Store("ms", r, _f("where", Op("eq", (mnew, NEG_INF), "bool"), Const(0.0, F32),
                                                     mnew)))),
            For("y", c(0), c(nq), (Store("al", yv, _f(expf, _f("sub", vld("mrow"), vld("ms"), dtype=vt), dtype=vt)),)),
            # p = exp(s - ms), summed per query as it is stored
            For("r", c(0), c(BR), (Store("ps", r, Const(0.0, F32)),)),
            For("j", c(0), c(width), (For("y", c(0), c(nq), (
                Let("pv", vt, _f(expf, _f("sub", Load("s", sv, vt), vld("ms"), dtype=vt), dtype=vt)),
                Store("s", sv, Var("pv", vt)),
                Store("ps", yv, _f("add", vld("ps"), Var("pv", vt), dtype=vt)))),)),
            For("r", c(0), c(BR), (Store("lrow", r, _f("add", _f("mul", ld("lrow"), ld("al")), ld("ps"))),
                                   Store("mrow", r, ld("mx")))),
        ]
        # o = o * alpha + p . V tile in register tiles of rv rows x up to PV_CHUNK vectors, a
        # chunk of V's columns at a time (the rescale at the tile's load)
        for c0, nv, rv in _pv_chunks(DVP // VW, RV, BR, target.vector_registers):
            oidx = [[add(mul(add(mul(x, c(rv)), c(a)), c(DVP)), c((c0 + y) * VW)) for y in range(nv)]
                    for a in range(rv)]
            st.append(For("x", c(0), c(BR // rv), _register_tile(
                RegTile("o", rv, nv, vt), For("j", c(0), c(width), ()),
                lambda a, rv=rv: Load("s", add(mul(j, c(BR)), add(mul(x, c(rv)), c(a))), F32),
                lambda y, c0=c0: vrow(key, (c0 + y) * VW),
                lambda a, y, oidx=oidx, rv=rv: _f("mul", Load("o", oidx[a][y], vt),
                                                   _f("broadcast", Load("al", add(mul(x, c(rv)), c(a)), F32),
                                                      dtype=vt), dtype=vt),
                lambda a, y, acc, oidx=oidx: Store("o", oidx[a][y], acc))))
        return st

    jt = Var("jt")
    if full_tiles:
        hi: Expr = c(full_tiles)
        if causal:  # key tiles past the last row's diagonal are skipped entirely
            last = add(add(row0, c(BR - 1)), c(causal[0]))
            reach = add(Op("floordiv", (last, c(BC)), INDEX), c(1))
            hi = Op("minimum", (c(full_tiles), Op("maximum", (c(0), reach), INDEX)), INDEX)
            # tiles every row of the tile sees whole (keys <= the first row + offset): no mask
            first = add(row0, c(causal[0] - BC + 1))
            seen = Op("maximum", (c(0), add(Op("floordiv", (first, c(BC)), INDEX), c(1))), INDEX)
            lo: Expr = Op("minimum", (hi, Op("maximum", (c(0), seen), INDEX)), INDEX)
            open_steps = [st for st in steps if st[0] != "causal"]
            body.append(For("jt", c(0), lo, tuple(key_tile(mul(jt, c(BC)), BC, open_steps))))
            body.append(For("jt", lo, hi, tuple(key_tile(mul(jt, c(BC)), BC, steps))))
        else:
            body.append(For("jt", c(0), hi, tuple(key_tile(mul(jt, c(BC)), BC, steps))))
    if tail:
        last_tile = key_tile(c(full_tiles * BC), tail, steps)
        if causal:
            last_tile = [If(Op("ge", (add(add(row0, c(BR - 1)), c(causal[0])), c(full_tiles * BC)), "bool"),
                            tuple(last_tile))]
        body += last_tile
    # ---- out = o / l; rows whose keys were all masked: 0 (SDPA) or NaN (0/0 of a plain softmax)
    fill = Const(0.0 if n.attr("zero_empty") else math.nan, F32)
    lval = Load("lrow", r, F32)
    oval = _f("where", Op("eq", (lval, Const(0.0, F32)), "bool"), fill,
              _f("div", Load("o", add(mul(r, c(DVP)), d), F32), lval))
    ostore: Stmt = For("d", c(0), c(Dv), (b.store(n, bvars + [add(row0, r), d], oval),))
    body.append(For("r", c(0), c(BR), (If(_lt(add(row0, r), c(L)), (ostore,)),) if L % BR else (ostore,)))
    nest: list[Stmt] = [For("it", c(0), c(NT), tuple(body), parallel=True)]
    for k in reversed(range(len(bd))):
        nest = [For(bvars[k].name, c(0), c(bd[k]), tuple(nest), parallel=True)]
    # ---- pack: K^T tiles [batch][S/BC][D][BC] (row-major form) and V rows [batch][S'][Dv']
    # (unless read in place), zeros past S, Dv
    key = add(mul(jt, c(BC)), j)
    kidx = add(mul(add(mul(add(mul(bflat, c(SP // BC)), jt), c(D)), d), c(BC)), j)
    kst, kzero = Store(kbuf, kidx, b.read(kt, kvvars + [d, key])), Store(kbuf, kidx, Const(0.0, F32))
    kpack = [] if cols or dots else \
        [For("j", c(0), c(BC), (For("d", c(0), c(D), (guarded(S % BC != 0, _lt(key, c(S)), kst, kzero),)),))]
    vidx = add(mul(add(mul(bflat, c(SP)), key), c(DVP)), d)
    vpack: list[Stmt] = [For("d", c(0), c(Dv), (guarded(S % BC != 0, _lt(key, c(S)),
                                                       Store(vbuf, vidx, b.read(v, kvvars + [key, d])),
                                                       Store(vbuf, vidx, Const(0.0, F32))),))]
    if DVP > Dv:
        vpack.append(For("d", c(Dv), c(DVP), (Store(vbuf, vidx, Const(0.0, F32)),)))
    if vdirect:
        return [], nest
    pack: list[Stmt] = [For("jt", c(0), c(SP // BC), (*kpack, For("j", c(0), c(BC), tuple(vpack))), parallel=True)]
    for k in reversed(range(len(bd))):
        pack = [For(bvars[k].name, c(0), c(bd[k]), tuple(pack), parallel=True)]
    return pack, nest


DOTS_MAX_ROWS = 4  # query rows up to which the scores are dot products of K's rows (``dot_scores``)


def _dots_form(b, kt: Node, bvars: list[Var], L: int, D: int, vw: int) -> bool:
    """Whether the scores of ``L`` query rows are computed as dot products along d, reading K
    in place: few rows (a decoding step), d a whole number of vectors, K^T contiguous along d."""
    if L > DOTS_MAX_ROWS or D % vw or vw < 2 or vw & (vw - 1):
        return False
    probe = b.read(kt, bvars + [Var("_d"), Var("_key")])
    lf = linear_form(probe.index) if isinstance(probe, Load) else None
    return lf is not None and lf[0].get("_d") == 1


def _constant_factor(n: Node) -> tuple[Node, float] | None:
    """(X, c) when ``n`` is X * c with c a float32 scalar constant, else None."""
    if n.op != "mul" or n.dtype != F32 or len(n.inputs) != 2:
        return None
    for a, x in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
        if a.op == "full" and math.prod(a.shape) == 1 and x.shape == n.shape and x.dtype == F32:
            return x, float(a.attr("value"))
    return None


def _vector_of(e: Expr, vt: str, along: str | None = None) -> Expr | None:
    """``e`` (Q's element: a load, maybe scaled by constants) as VW consecutive elements along
    its last index: loads become vector loads, + - * / by constants stay (C broadcasts the
    scalar); None for anything else, or when ``along`` is given and a load is not contiguous
    along that variable."""
    if isinstance(e, Load):
        if along is not None:
            lf = linear_form(e.index)
            if lf is None or lf[0].get(along) != 1:
                return None
        return Load(e.buf, e.index, vt)
    if isinstance(e, Const):
        return e
    if isinstance(e, Op) and e.fn in ("add", "sub", "mul", "div") and len(e.args) == 2:
        args = [_vector_of(a, vt, along) for a in e.args]
        if any(a is None for a in args) or sum(isinstance(a, Const) for a in args) != 1:
            return None
        return Op(e.fn, tuple(args), vt)
    return None


@dataclass(frozen=True)
class RegTile:
    """A register tile of ``rows`` x ``nvec`` vectors of type ``vt``, its variables named
    after ``name``."""
    name: str
    rows: int
    nvec: int
    vt: str


def _register_tile(t: RegTile, loop: For, x_of, y_of, init, store) -> tuple[Stmt, ...]:
    """A rows x nvec-vector tile of accumulators ``name``<a>_<y> (scalar replacement): set by
    ``init(a, y)``, then over ``loop`` acc[a][y] += broadcast(x_of(a)) * y_of(y), then
    ``store(a, y, acc)``."""
    name, rows, nvec, vt = t.name, t.rows, t.nvec, t.vt
    acc = [[Var(f"{name}a{a}_{y}", vt) for y in range(nvec)] for a in range(rows)]
    # each y vector meets ``rows`` broadcasts: held in a register, not reloaded by every FMA
    # (reloaded, the kernel is bound by the 512-bit loads)
    pin = in_register if rows > 1 else (lambda e: e)
    inner: list[Stmt] = [Let(f"{name}y{y}", vt, pin(y_of(y))) for y in range(nvec)]
    for a in range(rows):
        inner.append(Let(f"{name}x{a}", F32, x_of(a)))
        for y in range(nvec):
            prod = _f("mul", _f("broadcast", Var(f"{name}x{a}", F32), dtype=vt), Var(f"{name}y{y}", vt), dtype=vt)
            inner.append(Assign(acc[a][y].name, _f("add", acc[a][y], prod, dtype=vt)))
    return (*(Let(acc[a][y].name, vt, init(a, y)) for a in range(rows) for y in range(nvec)),
            replace(loop, body=tuple(inner)),
            *(store(a, y, acc[a][y]) for a in range(rows) for y in range(nvec)))
