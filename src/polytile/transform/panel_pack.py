"""Packing one panel of the column operand Y of a tiled contraction into a contiguous buffer
(copy generation, the CPU form of scratchpad promotion) for ``tile_contractions``: the panel's
columns (coalesced; a convolution's output pixels) and its reduction rows, from any layout of Y
(a transposed weight, im2col of an image with its padding test), as vector copies where the
panel's columns are contiguous in Y, masked vector copies where they run over image rows
(``masked_rows``), per-lane offsets (``offset_lanes``), row scans (``scan_rows``) or the element
loop. ``panel_packer`` derives what every pack of one nest shares (the panel's pixel
coordinates, the packed value); ``PanelPacker.pack`` writes the statements of one panel."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..affine.ir import INDEX, Alloc, Const, Expr, For, If, Let, Load, Op, Stmt, Store, Var, add, as_vector, c, \
    load_of, mul, reread, trip_count, walk_exprs
from ..affine.linear import simplify_divmod, to_expr, uses_var
from .contraction_nest import Nest, decompose
from .contraction_sizes import chunk_start
from .fusion_util import subst_vars
from .contraction_plan import At, ContractionPlan
from .tile_nests import transposed_pack

MASKED_SEGMENTS = 3  # image rows a masked panel row loads separately at most (``masked_rows``)


@dataclass(frozen=True)
class PanelPacker:
    """What packing a panel of nest ``n`` needs: N columns (the last panel has ``tail`` of them
    when nonzero), K reduction rows, panels of ``nr`` = ``nv`` vectors of ``vw`` lanes (type
    ``vt``); ``fused``: the panels are packed inside the panel loop (a local buffer); ``sizes``:
    buffer sizes; ``fy``: Y's index as a linear form; ``jdec``: the panel's column loops as
    expressions of (jo, jj); ``look``: the same, or loads from per-panel tables (``pre`` fills
    them) where ``divmod_left``; ``pval``: the packed element."""
    n: Nest
    N: int
    K: int
    nr: int
    nv: int
    vw: int
    vt: str
    tail: int
    fused: bool
    sizes: dict
    fy: dict
    jdec: dict
    look: dict
    pval: Expr
    pre: tuple
    divmod_left: bool
    jo: str = "jo"
    jj: str = "jj"

    @property
    def i(self) -> str:
        return self.n.iloop.var

    @property
    def jn(self) -> list[str]:
        return [f.var for f in self.n.jloops]

    @property
    def rn(self) -> list[str]:
        return [f.var for f in self.n.rloops]

    def scan_rows(self, buf: str, idx: Expr, guard: bool) -> tuple[Stmt, ...]:
        """Panel jo's pixels (flat range [jo*nr, jo*nr + nr), an image of W columns) as the rows
        they lie on and a range of columns in each: (oh, ow) are loop variables, not div/mod
        of the flat index, so the padding test is affine in ow (conditions_to_bounds splits
        it into zero fills around a copy) and the copy walks the image contiguously."""
        n, N, nr, jn, i, jo, jj = self.n, self.N, self.nr, self.jn, self.i, self.jo, self.jj
        oh, ow = jn
        W = trip_count(n.jloops[1])
        p0 = mul(Var(jo), c(nr))
        p1: Expr = Op("minimum", (add(p0, c(nr)), c(N)), INDEX) if guard else add(p0, c(nr))
        val: Expr = subst_vars(n.yv, {i: c(0)})
        if n.cond is not None:
            val = Op("where", (subst_vars(n.cond, {i: c(0)}), val, Const(0.0, "float32")), "float32")
        row = mul(Var(oh), c(W))
        at = subst_vars(idx, {jj: add(add(row, Var(ow)), mul(p0, c(-1)))})
        cols = For(ow, Op("maximum", (c(0), add(p0, mul(row, c(-1)))), INDEX),
                   Op("minimum", (c(W), add(p1, mul(row, c(-1)))), INDEX), (Store(buf, at, val),))
        out: list[Stmt] = [For(oh, Op("floordiv", (p0, c(W)), INDEX),
                               add(Op("floordiv", (add(p1, c(-1)), c(W)), INDEX), c(1)), (cols,))]
        if guard:  # columns past N: zeros
            out.append(For(jj, Op("maximum", (c(0), add(c(N), mul(p0, c(-1)))), INDEX), c(nr),
                           (Store(buf, idx, Const(0.0, "float32")),)))
        return tuple(out)

    def masked_rows(self, y0s: list[Load], copy: tuple[Stmt, ...], outer: list[For], pbody: tuple[Stmt, ...],
                    chunk, step: int, vals_at) -> tuple[tuple[Stmt, ...], tuple[Stmt, ...]] | None:
        """A panel whose pixels run over image rows (oh), of a convolution of stride ``step``
        (1 or 2): lane jj of the pixels on output row oh_of[0] + k reads y0 + step * jj +
        k * D in every panel row, D = (Y's stride along oh) - step * (output width): 0 for a
        stride-1 convolution as wide as its input, where one run of loads serves every image
        row of the panel. Only the padding test and the segment k vary along the lanes, and
        neither reads an inner (channel) loop. So the test is evaluated once per (kh, kw)
        into a lane mask (``pmask``) and the segments into lane masks of their own
        (``pseg<k>``), and each panel row is the loads of each segment (``vals_at(k * D)``),
        each segment's lanes picked from its own (``pick_lanes``), kept where the padding
        mask is set (``keep_lanes``, bitwise: inf or NaN in the dropped lanes never reaches
        the zeros). These vector copies replace the element loop, with which the im2col pack
        is a large share of a convolution, most of all where output rows are narrower than a
        panel (28-pixel rows put most 32-column panels over two of them). The loads reach past
        the image rows, into the neighbouring rows and channels; panel rows whose loads would
        leave the tensor take the element loop. None where this does not apply: (mask
        statements, row statements)."""
        n, nr, vw, vt, fused, sizes, fy = self.n, self.nr, self.vw, self.vt, self.fused, self.sizes, self.fy
        jdec, look, jn, i, jj = self.jdec, self.look, self.jn, self.i, self.jj
        if not (fused and step in (1, 2) and len(jn) in (2, 3) and look is not jdec
                and n.y.buf in sizes):  # (a separate pack scans rows instead)
            return None
        W = trip_count(n.jloops[-1])
        D = fy.get(jn[-2], 0) - step * W
        period = W  # pixels per segment
        if len(jn) == 3:
            # (image, oh, ow), the batch folded into the pixels: with the rows of an image
            # contiguous in Y (D = 0, a stride-1 convolution as wide as its input) the
            # segments are images instead, D the step of Y from one image to the next past
            # an image's rows (7x7 maps: 32-pixel panels span two images)
            if D != 0:
                return None
            period = trip_count(n.jloops[1]) * W
            D = fy.get(jn[0], 0) - trip_count(n.jloops[1]) * fy.get(jn[1], 0)
        segments = 1 if D == 0 else -(-(nr - 1) // period) + 1
        if D < 0 or segments > MASKED_SEGMENTS:
            return None
        # (no condition: a convolution without padding, a 1x1 on a 7x7 map at batch 8, whose
        # panels cross images: the segments alone, no padding mask)
        tvars = {v.name for v in walk_exprs(n.cond) if isinstance(v, Var)} if n.cond is not None else set()
        if not tvars <= set(jn) | {f.var for f in outer} | {i}:
            return None
        cond = subst_vars(n.cond, {**look, i: c(0)}) if n.cond is not None else None

        def lane_mask(name: str, test: Expr) -> tuple[Stmt, ...]:
            return (Alloc(name, "float32", nr),
                    For(jj, c(0), c(nr), (Store(name, Var(jj), Op("where", (test, Const(1.0, "float32"),
                                                                              Const(0.0, "float32")), "float32")),)))
        mk = list(lane_mask("pmask", cond)) if cond is not None else []
        oh_of = Load(f"{jn[0]}_of", Var(jj), "int64")
        for k in range(1, segments):
            mk += lane_mask(f"pseg{k}", Op("eq", (oh_of, add(Load(f"{jn[0]}_of", c(0), "int64"), c(k))), "bool"))
        vals = vals_at(0)
        for k in range(1, segments):
            vals = [Op("pick_lanes", (Load(f"pseg{k}", c(y * vw), vt), v, prev), vt)
                    for y, (v, prev) in enumerate(zip(vals_at(k * D), vals))]
        kept = tuple(replace(st, value=Op("keep_lanes", (Load("pmask", c(y * vw), vt), vals[y]), vt)
                             if cond is not None else vals[y]) for y, st in enumerate(copy))
        reach = (segments - 1) * D + (nr - 1 if step == 1 else 2 * nr - 1)  # the last element loaded
        inside = _all([Op("logical_and", (Op("ge", (y0.index, c(0)), "bool"),
                                          Op("lt", (add(y0.index, c(reach)), c(sizes[n.y.buf])), "bool")), "bool")
                       for y0 in y0s])
        return tuple(mk), (If(inside, kept, pbody),)

    def offset_lanes(self, pv: Expr, inner: list[For], rloops: list[For], buf: str,
                     idx: Expr) -> tuple[Stmt, ...] | None:
        """The element loop of a panel whose pixels run over image rows (``look``: their
        coordinates from per-panel tables), when neither the padding test nor the pixel part
        of Y's index reads the inner reduction loops (input channels): per (kh, kw), each
        lane's offset in Y and whether it is inside the image, computed once (``poff``,
        ``pok``: out-of-image lanes get offset 0, an address inside Y), then every inner
        step is one load per lane at its offset plus the step's own, kept where ``pok`` is
        set: no div/mod, no test and no table lookups per element (where ``masked_rows``
        does not apply: input rows wider than the output's, more segments than it takes). None
        where that does not hold."""
        n, nr, sizes, fy, jdec, look, rn = self.n, self.nr, self.sizes, self.fy, self.jdec, self.look, self.rn
        jj = self.jj
        if look is jdec or n.cond is None or n.y.buf not in sizes or not inner:
            return None
        if not (isinstance(pv, Op) and pv.fn == "where" and isinstance(load_of(pv.args[1]), Load)
                and load_of(pv.args[1]).buf == n.y.buf and isinstance(pv.args[2], Const)):
            return None
        test_, yv = pv.args[0], pv.args[1]
        ld = load_of(yv)
        names = [f.var for f in inner]
        if any(uses_var(test_, v) for v in names):
            return None
        orig = {"rl": rn[0]} if rloops[0].var == "rl" else {}
        coefs = [fy.get(orig.get(v, v), 0) for v in names]
        if any(k < 0 for k in coefs) or \
                sum(k * (trip_count(f) - 1) for k, f in zip(coefs, inner)) >= sizes[n.y.buf]:
            return None
        base = subst_vars(ld.index, {v: c(0) for v in names})
        if any(uses_var(base, v) for v in names):
            return None
        step_off = to_expr(dict(zip(names, coefs)), 0)
        offs = (Alloc("poff", "int64", nr), Alloc("pok", "int64", nr),
                For(jj, c(0), c(nr), (Store("poff", Var(jj), Op("where", (test_, base, c(0)), INDEX)),
                                      Store("pok", Var(jj), Op("where", (test_, c(1), c(0)), INDEX)))))
        # the load unconditional (its address is inside Y on every lane), so that the lane
        # loop vectorizes to gathers and a select
        val = Op("where", (Op("ne", (Load("pok", Var(jj), "int64"), c(0)), "bool"), Var("pv", yv.dtype),
                           pv.args[2]), pv.dtype)
        body: tuple[Stmt, ...] = (For(jj, c(0), c(nr), (
            Let("pv", yv.dtype, reread(yv, replace(ld, index=add(Load("poff", Var(jj), "int64"), step_off)))),
            Store(buf, idx, val))),)
        for f in reversed(inner):
            body = (replace(f, body=body),)
        return offs + body

    def pack(self, buf: str, idx: Expr, guard: bool, chunk: tuple[Expr, int] | None = None) -> tuple[Stmt, ...]:
        """Panel jo of Y into ``buf`` at ``idx``; with ``guard``, zeros past column N; with
        ``chunk`` = (r0, kc), its rows r0 + [0, kc) at 0 + [0, kc) (a range of the outermost
        reduction loop, the inner ones whole: ``k_block``)."""
        n, N, K, nr, nv, vw, vt = self.n, self.N, self.K, self.nr, self.nv, self.vw, self.vt
        tail, fused, sizes, fy = self.tail, self.fused, self.sizes, self.fy
        jdec, look, pval = self.jdec, self.look, self.pval
        pre, divmod_left, jn, rn, i, jo, jj = self.pre, self.divmod_left, self.jn, self.rn, self.i, self.jo, self.jj
        pval_, rloops, Kp = pval, list(n.rloops), K
        if chunk is not None:
            per_step = K // trip_count(n.rloops[0])
            r0o = add(chunk_start(chunk[0], per_step), Var("rl"))  # the outermost loop's step
            pval_ = subst_vars(pval, {rn[0]: r0o})
            idx = subst_vars(idx, {rn[0]: Var("rl")})
            rloops, Kp = [For("rl", c(0), c(chunk[1] // per_step), ()), *n.rloops[1:]], chunk[1]
        rname = rloops[0].var
        st: Stmt = Store(buf, idx, pval_)
        if guard:  # columns past N: zeros, their sources never read
            jflat = add(mul(Var(jo), c(nr)), Var(jj))
            st = If(Op("lt", (jflat, c(N)), "bool"), (st,), (Store(buf, idx, Const(0.0, "float32")),))
        pbody: tuple[Stmt, ...] = (For(jj, c(0), c(nr), (st,)),)
        scanned = len(jn) == 2 and divmod_left and chunk is None and not fused
        if scanned:
            # (not in the per-panel pack of a fused kernel, where the row scan is slower than
            # the element loop)
            pbody = self.scan_rows(buf, idx, guard)
        step = fy.get(jn[-1], 0)
        if (n.cond is None and len(jn) == 1 and len(rn) == 1 and step != 1
                and fy.get(rn[0], 0) == 1 and Kp >= vw):  # (guard: the last panel, tail columns)
            return transposed_pack(At(buf, idx), pval_, (rname, jj), Kp, nr, vw, tail if guard else None)
        if not guard and (step == 1 or (step == 2 and n.y.buf in sizes and chunk is None)):
            # Y walks the panel's columns contiguously when they share their outer coordinates
            # (pixels of one image row); the condition (padding) is a conjunction of affine
            # inequalities, so it holds on the whole panel when it holds at both ends: then
            # the panel row is nv vector copies (stride 2: even lanes of 2*nv loads), else the
            # element loop above
            at = look
            y0v = subst_vars(subst_vars(n.yv, {**at, i: c(0)}), {jj: c(0)})
            if chunk is not None:
                y0v = subst_vars(y0v, {rn[0]: r0o})
            y0s = _loads(y0v)  # (two for a pair of rows: every range test covers both)

            def part(off: int) -> Expr:
                return as_vector(_shifted(y0v, off), vw)

            def vals_at(off: int) -> list[Expr]:
                if step == 1:
                    return [part(off + y * vw) for y in range(nv)]
                # stride 2 (strided convolutions): two loads, their even lanes
                return [Op("even_lanes", (part(off + 2 * y * vw), part(off + 2 * y * vw + vw)), vt)
                        for y in range(nv)]

            vals = vals_at(0)
            copy = tuple(Store(buf, subst_vars(idx, {jj: c(y * vw)}), v) for y, v in enumerate(vals))
            test: Expr | None = None
            if step == 2:  # the last load reaches one element past the last one used
                test = _all([Op("lt", (add(y.index, c(2 * nr - 1)), c(sizes[n.y.buf])), "bool") for y in y0s])
            for v in jn[:-1]:
                if look is jdec and not uses_var(jdec[v], jj):
                    continue  # the panel's pixels share this coordinate by construction
                a, b = (Load(f"{v}_of", c(e), "int64") for e in (0, nr - 1)) if look is not jdec else \
                    (subst_vars(jdec[v], {jj: c(e)}) for e in (0, nr - 1))
                t = Op("eq", (a, b), "bool")
                test = t if test is None else Op("logical_and", (test, t), "bool")
            if n.cond is not None:
                for e in (0, nr - 1):
                    t = subst_vars(subst_vars(n.cond, {**at, i: c(0)}), {jj: c(e)})
                    test = t if test is None else Op("logical_and", (test, t), "bool")
            if test is not None:
                # reduction loops the test does not read (input channels) go inside both
                # branches: the test runs once per (kh, kw) of the panel, not per element
                tvars = {v.name for v in walk_exprs(test) if isinstance(v, Var)}
                outer = [f for f in rloops if f.var in tvars]
                inner = [f for f in rloops if f.var not in tvars]

                def nest(body: tuple[Stmt, ...], loops: list[For]) -> tuple[Stmt, ...]:
                    for f in reversed(loops):
                        body = (replace(f, body=body),)
                    return body

                slow = nest(pbody, inner)
                masked = self.masked_rows(y0s, copy, outer, pbody, chunk, step, vals_at)
                if masked is not None:
                    pre_m, body_m = masked
                    slow = pre_m + nest(body_m, inner)
                elif not scanned:
                    slow = self.offset_lanes(pval_, inner, rloops, buf, idx) or slow
                return tuple(pre) + nest((If(test, nest(copy, inner), slow),), outer)
            stmts: tuple[Stmt, ...] = copy
        else:
            stmts = pbody
        for f in reversed(rloops):
            stmts = (replace(f, body=stmts),)
        return tuple(pre) + stmts


def _loads(v: Expr) -> list[Load]:
    """The loads of an operand's value (one, or a pair of rows' two)."""
    return [v] if isinstance(v, Load) else [a for a in v.args if isinstance(a, Load)]


def _all(tests: list[Expr]) -> Expr:
    out = tests[0]
    for t in tests[1:]:
        out = Op("logical_and", (out, t), "bool")
    return out


def _shifted(v: Expr, off: int) -> Expr:
    """An operand's value (its loads, converted or paired) ``off`` elements further on (the
    loads' own indices may read tables: those stay)."""
    if isinstance(v, Load):
        return replace(v, index=add(v.index, c(off)))
    assert isinstance(v, Op) and all(isinstance(a, Load) for a in v.args), v
    return Op(v.fn, tuple(_shifted(a, off) for a in v.args), v.dtype)


def panel_packer(plan: ContractionPlan, N: int, nv: int, fused: bool, sizes: dict, fy: dict) -> PanelPacker:
    """The packer of the panels of ``plan``'s nest: its pixel coordinates as div/mod of the
    flat column (jo * nr + jj) where they simplify, else from per-panel tables."""
    n, K, nr, vw, vt, NJt, tail = plan.n, plan.K, plan.nr, plan.vw, plan.vt, plan.panels.total, plan.panels.tail
    i, jn, jo, jj = n.iloop.var, [f.var for f in n.jloops], "jo", "jj"
    jdec = {v: simplify_divmod(e, {jo: (0, NJt), jj: (0, nr)})
            for v, e in decompose(jn, n.jloops, add(mul(Var(jo), c(nr)), Var(jj))).items()}
    divmod_left = any(isinstance(x, Op) and x.fn in ("floordiv", "remainder")
                      for e in jdec.values() for x in walk_exprs(e))
    pval: Expr = subst_vars(n.yv, {**jdec, i: c(0)})
    if n.cond is not None:
        pval = Op("where", (subst_vars(n.cond, {**jdec, i: c(0)}), pval, Const(0.0, "float32")), "float32")
    pre: list[Stmt] = []
    look = jdec
    if len(jn) > 1 and divmod_left:  # coalesced pixels: their (oh, ow, ...) computed once per panel, not per element
        pre = [Alloc(f"{v}_of", "int64", nr) for v in jn]
        pre.append(For(jj, c(0), c(nr), tuple(Store(f"{v}_of", Var(jj), jdec[v]) for v in jn)))
        look = {v: Load(f"{v}_of", Var(jj), "int64") for v in jn}
        pval = subst_vars(n.yv, {**look, i: c(0)})
        if n.cond is not None:
            pval = Op("where", (subst_vars(n.cond, {**look, i: c(0)}), pval, Const(0.0, "float32")), "float32")
    return PanelPacker(n, N, K, nr, nv, vw, vt, tail, fused, sizes, fy, jdec, look, pval, tuple(pre), divmod_left)
