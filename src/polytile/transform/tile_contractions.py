"""Register tiling with packing for contraction nests (the BLIS structure, derived on the
affine IR), for any nest ``contraction_nest.match`` finds (matmul, batched matmul, linear,
and convolution: i = output channel, j = output pixels (oh, ow), r = (ci, kh, kw), the
padding test as ``cond``), whatever op it came from. With J the coalesced columns and R the
coalesced reduction, it becomes

    pack:  Yp[p][J/NR][R][NR] = cond ? Y : 0      copy generation: any layout of Y (a
                                                  transposed weight, im2col of an image)
                                                  becomes contiguous; per panel inside the
                                                  panel loop when a panel fits in L2; a
                                                  kernel of its own, cached between calls,
                                                  when Y is a parameter (``cache_static``)
    main:  for p..., jo, io (parallel, OpenMP):
             MR x NV vector accumulators (scalar replacement; i unrolled and jammed)
             for R: NV vector loads of Yp, MR scalar loads of X, MR*NV broadcast FMAs
             tile -> local array; epilogue loop over the tile (vectorized by the C compiler)
    edges: rows left over (M % MR) get a narrower tile on the same panels; the last panel,
           when N % NR != 0, is packed with zeros past N and its tile stores only the columns
           that exist (partial tiles, no padding copies of the tensors)

Few columns (N < NR) go to the dot form (``dot_form``) instead. MR, NR come from the CPUMachine:
NR = 2 vectors, MR = what the remaining vector registers hold.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..affine.ir import (Expr, For, If, Kernel, Load, Op, Program, Stmt, Store, Var, add, c, mul, trip_count,
                         vector_type, walk_exprs)
from ..affine.linear import linear_form, to_expr
from .contraction_nest import batch_into_columns, batch_index, contiguous, in_group, match, orient, strides
from .contraction_plan import At, ContractionPlan, KBlock, Panels, RowMajor, XPack
from .contraction_sizes import k_block, reduction_block, tile_sizes, wide_tile
from ..dtypes import LOW
from .bf16_pairs import paired
from .int8_quads import quads
from .dot_form import dot_form
from .fusion_util import subst_vars
from .panel_pack import panel_packer
from .tile_nests import (aliased_rows, few_panels_block, out_kernel, output_along_rows, packed_at, panel_body,
                         row_groups, row_split, rows_over_panels, split_rows, tile_nest, wrap)
from .tile_util import drop_prefetches, new_temp, reduction_blocks

MIN_WORK = 32 * 32 * 32  # multiply-adds below which tiling is not worth a packing pass
MIN_ROWS = 4  # rows a blocked long reduction, an implicit GEMM or a large product needs to be tiled
FEW_ROWS_MIN_WORK = 1 << 22  # multiply-adds from which a product with fewer rows than a tile is tiled
OUT_ROWS_ALIAS = 2048  # bytes: output rows this far apart (or a multiple) share few L1 sets
FUSED_PACK_MIN_PANELS = 8  # panels packed inside the panel loop only when there are this many to share
# (counting the panels of all batch iterations; a plain GEMM with fewer is faster with a separate pack)
FUSED_PACK_MIN_PANELS_IM2COL = 2  # ... for an implicit GEMM (a convolution), whose separate im2col pack
# costs more, so packing inside the panel loop pays even with few panels
FUSED_PACK_MIN_K = 64  # ... and the reduction is at least this long
ALIASED_PACK_MIN_PANELS = 16  # panels from which an aliased X is packed once per call (see ``aliased``)

if TYPE_CHECKING:  # a scheduling pass of the CPU backend, sized by its machine description
    from ..backends.cpu.machine import CPUMachine


def tile_contractions(p: Program, target: CPUMachine, prefetch: bool = True) -> Program:
    """Every matmul-like nest in its tiled form (or the dot form); ``prefetch``: keep the software
    prefetches of the register tiles (``Options.prefetch``)."""
    mr0, nv0, vw = tile_sizes(target)
    nr0 = nv0 * vw
    vt = vector_type("float32", vw)
    kernels: list[Kernel] = []
    buffers = list(p.buffers)
    sizes = {b.name: b.size for b in p.buffers}
    static = {b.name for b in p.buffers if b.kind == "input" and b.static}
    for k in p.kernels:
        n = match(k)
        if n is not None:
            k, n = orient(k, n, nr0, static)
            k, n = batch_into_columns(k, n, nr0, vw)
        M = trip_count(n.iloop) if n else 0
        N = K = 1
        if n:
            for f in n.jloops:
                N *= trip_count(f)
            for f in n.rloops:
                K *= trip_count(f)
        # one-vector panels (N = vw): the tiled form with MR x 1 tiles streams X once where the
        # dot form reads it once per column tile; not with a partial panel, whose last vector
        # is mostly empty lanes (N = 20: 4 of the 16 lanes of its second panel used)
        narrow = n is not None and vw <= N < nr0 and N % vw == 0
        if n is not None and N < nr0 and not narrow and n.cond is None and K >= 2 * vw \
                and M * N * K >= MIN_WORK // 8 \
                and contiguous(linear_form(n.x.index)[0], [f.var for f in n.rloops], n.rloops):
            kernels.extend(dot_form(k, n, M, N, K, buffers, target))
            continue
        if n is not None and (pn := paired(n, target)) is not None:  # bfloat16 pairs (``bf16_pairs``)
            n, K = pn, K // 2
        elif n is not None and (pn := quads(n, target)) is not None:  # int8 quads (``int8_quads``)
            n, K = pn, K // 4
        # a reduction too long for a packed panel in L2 runs in blocks of KC (see ``k_block``)
        kc = k_block(n, K, nr0, target) if n is not None else 0
        # fewer rows than a register tile: one row tile meets each packed panel, worth it for an
        # implicit GEMM (its im2col panels are needed anyway, e.g. a grouped convolution of 8
        # channels per group) and for products large enough to pay for the packing
        # (FEW_ROWS_MIN_WORK multiply-adds; smaller ones run faster untiled)
        few_rows_ok = n is not None and (kc or len(n.jloops) > 1 or n.cond is not None
                                         or M * N * K >= FEW_ROWS_MIN_WORK)
        if n is None or M < (MIN_ROWS if few_rows_ok else mr0) or N < (vw if narrow else nr0) \
                or M * N * K * batch_index(n.batch)[0] < MIN_WORK:
            kernels.append(k)
            continue
        mr, nv = wide_tile(target, mr0, nv0, vw, N, K) if len(n.jloops) == 1 else (mr0, nv0)
        if N < nv * vw:
            nv = N // vw
            mr = min(max(mr, mr0), (target.vector_registers - nv - 1) // nv)
        mr = min(mr, M)
        nr = nv * vw
        kc, all_panels = reduction_block(n, M, N, K, nr, target)
        MI, NJ = M // mr, N // nr
        tail = N % nr  # the last panel is partial: packed with zeros past N, stored up to N
        NJt = NJ + (1 if tail else 0)
        i = n.iloop.var
        jn, rn = [f.var for f in n.jloops], [f.var for f in n.rloops]
        R = Var("rflat")
        # ---- pack Y (and the condition) into Yp[bl][jo][R][nr]
        fy = linear_form(n.y.index)[0]
        cond_vars = {v.name for v in walk_exprs(n.cond) if isinstance(v, Var)} if n.cond is not None else set()
        bdeps = [f for f in n.batch if fy.get(f.var, 0) != 0 or f.var in cond_vars]
        nbatch, bl = batch_index(bdeps)
        # each panel packed inside the panel loop, into a local buffer that stays in L2 for all the
        # row tiles that use it (no round trip of the packed copy through memory), when it fits,
        # there are panels enough (over the batch loops too) to share among the cores, no batch
        # loop would repack it and the reduction is long enough (with a short one, e.g. a 1x1
        # convolution over 32 channels, a separate pack pass streams better)
        fused = (K * nr * 4 <= target.l2_bytes // 2
                 and NJt * nbatch >= (FUSED_PACK_MIN_PANELS_IM2COL if len(jn) > 1 or n.cond is not None
                                      else FUSED_PACK_MIN_PANELS)
                 and len(bdeps) == len(n.batch) and K >= FUSED_PACK_MIN_K) or bool(kc)
        # too few panels to share in a reduction block: parallel over row tiles instead
        few = bool(kc) and (NJt < 4 * target.cores or all_panels)
        # Y a parameter (a weight): its panels packed by a kernel of their own, which
        # ``cache_static`` runs only when the weight changes, and read in place by the nest a
        # fused pack would have had (no per-call copy of a weight whose rows lie pages apart)
        inplace = fused and not few and n.y.buf in static and not (
            n.cond is not None and any(isinstance(x, Load) for x in walk_exprs(n.cond)))
        if inplace:
            fused = False
        per_panel = fused or inplace  # the panels one at a time in the panel loop, the row tiles inside
        pk = "" if fused else new_temp(buffers, nbatch * NJt * K * nr)  # all the packed panels
        jo, jj, ii = "jo", "jj", "ii"
        # a panel that lies within one row of pixels (nr divides the output width) needs no
        # div/mod: (oh, ow) = (jo * nr // W, jo * nr % W + jj)
        plan = ContractionPlan(n, K, R, vw, nr, Panels(NJ, NJt, tail), pk, bl, None, target)
        pp = panel_packer(plan, N, nv, fused, sizes, fy)
        pack, divmod_left = pp.pack, pp.divmod_left
        rflat = to_expr({v: s for v, s in zip(rn, strides(n.rloops))}, 0)
        pidx = add(packed_at(bl, NJt, Var(jo), K, rflat, nr), Var(jj))

        def panel_pack(guard: bool, chunk: tuple[Expr, int] | None = None) -> tuple[Stmt, ...] | None:
            """Panel jo (or its block ``chunk``) packed into the local ``ypanel`` at the top of each
            panel-loop iteration; None where the panels come packed (``pk``, cached or not)."""
            return pack("ypanel", add(mul(rflat, c(nr)), Var(jj)), guard, chunk) if fused else None

        if not fused:
            pnests = []
            for jlo, jhi, guard in ((0, NJ, False), (NJ, NJt, True)):
                if jhi == jlo:
                    continue
                pnest: Stmt = For(jo, c(jlo), c(jhi), pack(pk, pidx, guard), parallel=not guard)
                for f in reversed(bdeps):
                    pnest = replace(f, body=(pnest,))
                pnests.append(pnest)
            kernels.append(Kernel(f"{k.name}_pack", tuple(pnests), f"pack {n.y.buf} for {k.origin}"[:160]))
        # the source of panel jo + 1's row R (lane 0), for the row tiles of panel jo to prefetch
        # when a fused pack reads rows a page or more apart (``row_tiles``), and the panel and
        # the next one's lines fit in half the L2 (else the prefetched lines evict the panel
        # and X, and the prefetch costs more than it saves)
        ahead = None
        if fused and not kc and n.cond is None and not n.pairs and len(jn) == 1 and len(rn) == 1 and not divmod_left \
                and fy.get(jn[0], 0) == 1 and fy.get(rn[0], 0) * 4 >= target.page_bytes \
                and 2 * K * nr * 4 <= target.l2_bytes // 2:
            ahead = At(n.y.buf, subst_vars(n.y, {jn[0]: mul(add(Var(jo), c(1)), c(nr)), rn[0]: R, i: c(0)}).index)

        def next_cached_panel(r0: Expr, kcb: int) -> At | None:
            # cached panels (``inplace``) of weights too large to stay in the L3 between calls (a
            # model's layers one after another) come from memory, a panel's block at a time: the
            # row tiles of panel jo fetch panel jo + 1's block (rows r0 + R) to the L2 meanwhile,
            # when both fit in half of it. Not for whole panels of a quarter of the L2 or less,
            # which the prefetch does not help
            if not inplace or 2 * kcb * nr * 4 > target.l2_bytes // 2 \
                    or (not kc and kcb * nr * 4 <= target.l2_bytes // 4):
                return None
            return At(pk, packed_at(bl, NJt, add(Var(jo), c(1)), K, add(r0, R), nr))

        if ahead is None:
            ahead = next_cached_panel(c(0), K)
        # ---- main nest over full tiles; the rows left over get a narrower tile on the same panels
        xpack = None
        fx = linear_form(n.x.index)[0]
        # X read in place by 2-vector tiles whose rows share L1 sets (``aliased_rows``, K = 512,
        # 1024, 2048, ...) would be copied apart by every row tile for every panel (``xrows``):
        # with the panels one at a time in the panel loop, X is packed once per call instead.
        # Not for 3-vector tiles, which read X in place without a copy and would only lose by
        # the pack; nor with fewer than ALIASED_PACK_MIN_PANELS panels, whose copies cost less
        # than the (transposing) pack of X
        aliased = per_panel and not kc and nv == 2 and NJt >= ALIASED_PACK_MIN_PANELS and not n.batch \
            and aliased_rows(in_group(n.xv, rn, n.rloops, R), i, R, mr, target)
        if not contiguous(fx, rn, n.rloops) or aliased:
            # the row operand is strided along the reduction (a transposed A) or aliased: pack
            # it into Xp[bx][tile][R][mr] too, rows past M left out (the tail tile reads only
            # its rows)
            xdeps = [f for f in n.batch if fx.get(f.var, 0) != 0]
            nbx, xbl = batch_index(xdeps)
            mt = MI + (1 if M % mr else 0)
            xb = new_temp(buffers, nbx * mt * K * mr)
            row = add(mul(Var("it"), c(mr)), Var(ii))
            xidx = add(mul(add(mul(add(mul(xbl, c(mt)), Var("it")), c(K)), rflat), c(mr)), Var(ii))
            xbody: Stmt = If(Op("lt", (row, c(M)), "bool"), (Store(xb, xidx, subst_vars(n.xv, {i: row})),))
            xbody = For(ii, c(0), c(mr), (xbody,))
            for f in reversed(n.rloops):
                xbody = replace(f, body=(xbody,))
            xnest: Stmt = For("it", c(0), c(mt), (xbody,), parallel=True)
            for f in reversed(xdeps):
                xnest = replace(f, body=(xnest,))
            kernels.append(Kernel(f"{k.name}_packx", (xnest,), f"pack {n.x.buf} for {k.origin}"[:160]))
            xpack = XPack(xb, xbl, mt, mr)
            plan = replace(plan, xpack=xpack)
        # row blocks: when the rows of X do not fit in a quarter of the L3, the panel loop runs
        # once per block of MC rows, so each panel meets a block that stays in cache instead of
        # streaming all of X from memory per panel (the panels are packed once per block)
        mc = (target.l3_bytes // 4 // (K * 4)) // mr * mr
        nb = M // mc if (not n.batch and not kc and M * K * 4 > target.l3_bytes // 2 and mc >= 4 * mr) else 0
        groups = row_groups(M, mr, mc, nb)  # (row tiles, row-block loop)
        # the partial last panel computes only the vectors it has columns for (a 48-column tile
        # on a 16-column tail did 3x the work); with vectors to spare its row tiles grow taller
        # (not with row blocks or a packed X, whose row tiles are fixed)
        nvt = -(-tail // vw) if tail else nv
        mrt = mr if (nb or xpack is not None) else min(max(mr, mr0), (target.vector_registers - nvt - 1) // nvt)
        tgroups = row_groups(M, mrt, mc, nb) if mrt != mr else groups
        roots = []
        # panels too few (or too uneven) to share among the cores: the row tiles are split among
        # them instead, each core packing every panel itself (``row_split``)
        S = 1
        if per_panel and not kc and len(groups) == 1 and groups[0][1] is None:
            S = row_split([nr] * NJ + ([nvt * vw] if tail else []), batch_index(n.batch)[0], target.cores, M,
                          groups[0][0][0].count)

        def by_parts(rows: list, trows: list | None, jlo: int, jhi: int, body_of) -> list[Stmt]:
            # the panel loop jo in [jlo, jhi), inside the parallel loop over the S parts of the rows
            # when S > 1; ``body_of(rows, trows)`` gives the statements for one panel
            whole = jlo
            if S > 1 and batch_index(n.batch)[0] == 1:
                # as many panels as share evenly among the cores run whole, only the rest of them
                # with their rows split (each part packs those panels itself), e.g. 6 panels of 32
                # columns whole and the last of 4 split (full panels only: a partial last one
                # shares unevenly)
                whole = jlo + max(0, min(jhi, NJ) - jlo) // S * S
            out: list[Stmt] = []
            if S == 1 or whole > jlo:
                out.append(For("jo", c(jlo), c(jhi if S == 1 else whole), tuple(body_of(rows, trows)), parallel=True))
            if S > 1 and whole < jhi:
                part = body_of(split_rows(rows, S), split_rows(trows, S) if trows else None)
                out.append(For("ih", c(0), c(S), (For("jo", c(whole), c(jhi), tuple(part)),), parallel=True))
            return out
        if kc:
            # the reduction in blocks of kc (the BLIS pc loop): per block, each panel's kc rows
            # are packed where they stay in L2 and every row tile runs over them; the tiles
            # accumulate in ``cacc`` between blocks, the last block applies the epilogue
            cacc = new_temp(buffers, M * NJt * nr)
            blocks = reduction_blocks(K, kc)
            # too few panels to share: parallel over row tiles instead
            yblk = new_temp(buffers, NJt * kc * nr) if few else ""
            for r0, kcb, loop, reload, final in blocks:
                kblock = KBlock(r0, kcb, reload, final, cacc, NJt * nr)
                if few:
                    # the block of every panel packed first (parallel over panels), then the row
                    # tiles in parallel, each meeting every panel
                    root = few_panels_block(plan, pack, yblk, groups[0][0], (nv, nvt), rflat, kblock)
                    roots.extend([For("kb", c(0), c(loop), root)] if loop else root)
                    continue
                local = panel_pack(False, (r0, kcb))
                body = panel_body(plan, groups[0][0], nv, nr, local, kblock, ahead=next_cached_panel(r0, kcb))
                if tail:
                    local = panel_pack(True, (r0, kcb))
                    bt = panel_body(plan, tgroups[0][0], nvt, tail, local, kblock)
                    body = [If(Op("lt", (Var("jo"), c(NJ)), "bool"), tuple(body), tuple(bt))]
                root: Stmt = For("jo", c(0), c(NJt), tuple(body), parallel=True)
                roots.append(For("kb", c(0), c(loop), (root,)) if loop else root)
            # batch loops of one step (a convolution's single group) around it, sequential: the
            # parallel loops are the ones inside
            for f in reversed(n.batch):
                roots = [replace(f, body=tuple(roots), parallel=False)]
        elif per_panel and tail:
            # one parallel loop over all NJt panels, the partial last one behind a test: run as a
            # nest of its own it would take one thread while the others wait
            lf, lt = panel_pack(False), panel_pack(True)
            def both(rows: list, trows: list) -> list[Stmt]:
                bf = panel_body(plan, rows, nv, nr, lf, ahead=ahead)
                bt = panel_body(plan, trows, nvt, tail, lt)
                return [If(Op("lt", (Var("jo"), c(NJ)), "bool"), tuple(bf), tuple(bt))]
            for (rows, block), (trows, _) in zip(groups, tgroups):
                roots += [wrap(n, f, block) for f in by_parts(rows, trows, 0, NJt, both)]
        # all the packed panels fit in the L2 together: the row tiles outside, each meeting every
        # panel in turn while its rows of X stay in L1 (X read once instead of once per panel)
        rows_outer = not per_panel and not kc and NJt * K * nr * 4 <= target.l2_bytes // 2
        tout = None
        if rows_outer and not n.batch and output_along_rows(n) and (M * 4) % OUT_ROWS_ALIAS == 0 \
                and n.store.value.dtype in ("float32", *LOW) \
                and M * N * 4 <= 2 * target.l2_bytes:
            # the output runs along the tile rows and its rows lie a multiple of 2 KB apart (at
            # most two L1 sets for all of them): raw tiles to a row-major temp, the epilogue
            # then writes the output row by row (``out_kernel``); rows 3 KB apart do not share
            # sets enough for the temp to pay. Only while the temp is at most twice the L2: a
            # larger one makes a round trip through memory that costs what the temp saves
            tout = RowMajor(new_temp(buffers, M * N), N)
        if rows_outer:
            panel = packed_at(bl, NJt, Var("jo"), K, R, nr)  # Yp[bl][jo][R][0]
            for rows, block in groups:
                roots += [wrap(n, f, block) for f in rows_over_panels(plan, rows, (nv, nvt), At(pk, panel), None, tout)]
        for jlo, jhi, width in ((0, NJ, nr), (NJ, NJt, tail)) if not (per_panel and tail or kc or rows_outer) else ():
            if jhi == jlo:
                continue
            vecs, gs = (nv, groups) if width == nr else (nvt, tgroups)
            local = panel_pack(width < nr)
            for rows, block in gs:
                if per_panel:  # one nest: full row tiles and rows left over share the packed panel
                    roots += [wrap(n, f, block) for f in by_parts(
                        rows, None, jlo, jhi, lambda rr, _, vecs=vecs, width=width, local=local:
                        panel_body(plan, rr, vecs, width, local, ahead=ahead if width == nr else None))]
                    continue
                for r in rows:  # rows left over: a narrower tile on the same panels
                    roots.append(tile_nest(plan, [r], vecs, (jlo, jhi, width), None, block))
        body = tuple(roots)
        if not prefetch:
            body = drop_prefetches(body)
        elif M * K * 4 <= target.l2_bytes // 2:  # X stays in the L2 across the panels: no row prefetches
            body = drop_prefetches(body, lambda s: not s.write and s.buf == n.x.buf)
        kernels.append(replace(k, body=body))
        if tout is not None:
            kernels.append(out_kernel(k, n, tout.buf, M, N, vw, plan.line))
    return replace(p, kernels=tuple(kernels), buffers=tuple(buffers))
