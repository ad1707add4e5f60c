"""Kernels over a symbolic number of rows, run as static blocks of rows with the static
pipeline's schedule (full tiles), the rows left over as one zero-padded block (the partial
tile): index-set splitting of the rows loop, with the block sizes chosen at run time.

A kernel is *row-separable* when its root loop (below loops of one iteration) is a parallel
loop over a symbolic extent R (the rows: tokens of a prompt, of a batch) and that loop's
variable v appears only as a term ``v * stride`` of buffer indices (a static stride per
buffer), nothing else in the kernel being symbolic. Each of its buffers is then either
*windowed* (stride > 0: row v reads or writes only its own ``stride`` elements, as any
in-bounds access for every R implies) or static-sized and only read (a weight). A run of
consecutive row-separable kernels over the same R, with one stride per buffer, computes every
row from the same row of what it reads: any block of rows can be computed alone, in any order.

For each block size B of ``RowBlocks.sizes`` such a run becomes a static program over B rows
(windowed buffers of B rows; temps only the run uses become temps of B rows), scheduled by the
backend's static pipeline (``static``: fusion, register tiles, packing, parallel loops,
cached packed weights). The largest size runs in a loop over the full blocks with every
windowed access shifted by the block's first row; the rows those leave run once in the
smallest size that holds them, their rows copied into temps padded with zeros and the
results copied out. Kernels that read no row (a weight's panels packed for the largest size)
run once per call before the blocks. Runs without a contraction are not blocked (their plain
nests, scheduled by ``rest`` with every other kernel, are already as good: elementwise loops
over rows)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable

from ..affine.ir import (SIZE_PREFIX, Alloc, Assign, Buffer, Const, Expr, For, If, Kernel, Let, Load, Op, Prefetch,
                         Program, Stmt, Store, Var, add, buffers_used, c, mul, rename_buffers, stmt_exprs, trip_count,
                         walk_stmts, INDEX)
from ..affine.linear import linear_form, to_expr, uses_var
from ..dtypes import Unsupported
from ..graph.symbols import Sym
from .cache_static import cache_static_kernels, mark_static_inputs
from .fusion_util import declared_names, map_expr, rename_locals, subst_vars

log = logging.getLogger("polytile")


@dataclass(frozen=True)
class RowBlocks:
    """Rows per block, level by level, largest first (a backend's cost model picks them: a
    multiple of its register tile's rows); empty: no blocking."""

    sizes: tuple[int, ...]


@dataclass
class _Run:
    start: int            # position of the first kernel in the program
    kernels: list[Kernel]
    rows: Expr            # the symbolic extent R
    strides: dict         # buffer -> row stride (0: a static-sized buffer, only read)


def block_rows(p: Program, plan: RowBlocks, *, static: Callable[[Program], Program],
               rest: Callable[[Program], Program]) -> Program:
    """``p`` with its row-separable runs of kernels blocked (see the module's docstring);
    ``static`` schedules a program with static sizes, ``rest`` one with symbolic sizes."""
    if not plan.sizes or not p.symbols:
        return rest(p)
    runs = [r for r in _runs(p) if any(k.contraction for k in r.kernels)]
    blocked: dict[int, tuple[_Run, list[Kernel], list[Buffer]]] = {}  # run start -> (run, its kernels, new buffers)
    for n, r in enumerate(runs):
        try:
            blocked[r.start] = (r, *_block(p, r, plan.sizes, static, tag=f"r{n}"))
        except (Unsupported, RuntimeError, AssertionError) as e:  # the run keeps its plain nests (a verifier
            # error or a pass's failure on the block program included: blocking is an optimization)
            log.debug("polytile: rows of %s not blocked: %s", r.kernels[0].origin, e)
    if not blocked:
        return rest(p)
    rests: list[Kernel] = []
    extra: list[Buffer] = []
    slots: list[Kernel | int] = []  # a blocked run's kernel, or the position of a kernel in ``rests``
    i = 0
    while i < len(p.kernels):
        if i not in blocked:
            slots.append(len(rests))
            rests.append(p.kernels[i])
            i += 1
            continue
        r, kernels, bufs = blocked[i]
        extra += bufs
        slots += kernels
        i += len(r.kernels)
    q = rest(replace(p, kernels=tuple(rests), buffers=p.buffers + tuple(extra)))
    if len(q.kernels) != len(rests):
        raise RuntimeError("block_rows: the parametric schedule changed the number of kernels")
    return replace(q, kernels=tuple(q.kernels[x] if isinstance(x, int) else x for x in slots))


# ------------------------------------------------------------------ finding runs
def _runs(p: Program) -> list[_Run]:
    sizes = {b.name: b.size for b in p.buffers}
    out: list[_Run] = []
    cur: _Run | None = None
    for i, k in enumerate(p.kernels):
        k = _unit_loops_zero(k)
        got = _separable(k, sizes)
        if got is None:
            cur = None
            continue
        rows, strides = got
        if cur is not None and _sym(cur.rows) == _sym(rows) and \
                all(cur.strides.get(b, s) == s for b, s in strides.items()):
            cur.kernels.append(k)
            cur.strides.update(strides)
            continue
        cur = _Run(i, [k], rows, dict(strides))
        out.append(cur)
    return out


def _separable(k: Kernel, sizes: dict) -> tuple[Expr, dict] | None:
    f = _unit_chain(k)[1]
    if f is None:
        return None
    rows = _sym(f.hi)
    if not f.parallel or f.lo != c(0) or f.workers or not isinstance(rows, Sym):
        return None
    v = f.var
    strides: dict[str, int] = {}

    def access(buf: str, index: Expr) -> bool:
        lf = linear_form(index)
        if lf is None:  # an indirect or non-affine index: v may not appear in it
            return not uses_var(index, v) and scan(index)
        coefs, _ = lf
        if any(x.startswith(SIZE_PREFIX) for x in coefs):
            return False
        s = coefs.get(v, 0)
        if strides.setdefault(buf, s) != s or s < 0:
            return False
        return True

    def scan(e: Expr) -> bool:
        if isinstance(e, Load):
            return access(e.buf, e.index)
        if isinstance(e, Var):
            return e.name != v and not e.name.startswith(SIZE_PREFIX)
        if isinstance(e, Op):
            return all(scan(a) for a in e.args)
        return True

    locals_ = {s.name for s in walk_stmts(f.body) if isinstance(s, Alloc)}
    for s in walk_stmts(f.body):
        if isinstance(s, (Store, Prefetch)) and s.buf not in locals_:
            if not access(s.buf, s.index):
                return None
            if isinstance(s, Store) and not scan(s.value):
                return None
        elif isinstance(s, Store):  # a local array: its index may not use v
            if uses_var(s.index, v) or not scan(s.index) or not scan(s.value):
                return None
        elif isinstance(s, Prefetch):
            continue
        elif not all(scan(e) for e in stmt_exprs(s)):
            return None
    strides = {b: s for b, s in strides.items() if b not in locals_}
    for b, s in strides.items():
        size = sizes.get(b)
        if size is None:
            return None
        if s == 0:
            if isinstance(size, Sym):  # a symbolic buffer read at no row of its own
                return None
        elif not isinstance(size, Sym) or size != rows * s:
            return None
    written = {s.buf for s in walk_stmts(f.body) if isinstance(s, Store) and s.buf not in locals_}
    if any(strides[b] == 0 for b in written):
        return None
    return f.hi, strides


def _unit_chain(k: Kernel) -> tuple[list[For], For | None]:
    """(the loops of one iteration from the kernel's root loop down, the first loop below them:
    its rows loop, or None) of a perfect chain (a tensor [1, s, d] has a loop of one iteration
    around its rows)."""
    if k.cached or len(k.body) != 1 or not isinstance(k.body[0], For):
        return [], None
    units, f = [], k.body[0]
    while trip_count(f) == 1 and f.lo == c(0) and len(f.body) == 1 and isinstance(f.body[0], For):
        units.append(f)
        f = f.body[0]
    return units, f


def _unit_loops_zero(k: Kernel) -> Kernel:
    """``k`` with the variables of the one-iteration loops around its rows loop replaced by 0 in
    the indices, which are then rebuilt from their linear forms (``i0 * (768 * s)`` with i0
    always 0 drops out, and with it the size parameter)."""
    zero = {f.var: c(0) for f in _unit_chain(k)[0]}
    if not zero:
        return k

    def norm(_: str, e: Expr) -> Expr:
        lf = linear_form(subst_vars(e, zero))
        return to_expr(*lf) if lf is not None else subst_vars(e, zero)

    return replace(k, body=_map_indices(k.body, norm))


def _with_rows(k: Kernel, hi: Expr) -> Kernel:
    """``k`` with its rows loop (``_unit_chain``) running to ``hi``."""
    def go(f: For) -> For:
        if trip_count(f) == 1 and f.lo == c(0) and len(f.body) == 1 and isinstance(f.body[0], For):
            return replace(f, body=(go(f.body[0]),))
        return replace(f, hi=hi)
    return replace(k, body=(go(k.body[0]),))


def _sym(e: Expr):
    """An index expression of size parameters, constants, + and * as a ``Sym`` (or an int);
    None for anything else."""
    if isinstance(e, Const):
        return int(e.value) if e.dtype == INDEX else None
    if isinstance(e, Var):
        return Sym.symbol(e.name[len(SIZE_PREFIX):]) if e.name.startswith(SIZE_PREFIX) else None
    if isinstance(e, Op) and e.fn in ("add", "sub", "mul") and len(e.args) == 2:
        a, b = _sym(e.args[0]), _sym(e.args[1])
        if a is None or b is None:
            return None
        return a + b if e.fn == "add" else a - b if e.fn == "sub" else a * b
    return None


# ------------------------------------------------------------------ blocking one run
def _block(p: Program, r: _Run, sizes: tuple[int, ...], static: Callable[[Program], Program],
           tag: str) -> tuple[list[Kernel], list[Buffer]]:
    """(the kernels that replace run ``r``: row-invariant ones, the blocks of the largest size,
    then one padded block of the smallest size that holds the rows left; the new buffers)."""
    bufs = {b.name: b for b in p.buffers}
    written = {b for k in r.kernels for b in buffers_used(k)[1]}
    users_outside, written_outside = set(), set()
    for i, k in enumerate(p.kernels):
        if not r.start <= i < r.start + len(r.kernels):
            rd, wr = buffers_used(k)
            users_outside |= rd | wr
            written_outside |= wr
    local = {b for b in r.strides if bufs[b].kind == "temp" and b not in users_outside and r.strides[b] > 0}
    # what the padded block copies in: what the run reads, and what other kernels write part of
    # (the other columns of a concatenation: the copy out writes whole rows back)
    read = {b for k in r.kernels for b in buffers_used(k)[0]} | written_outside
    sizes = tuple(sorted(set(sizes), reverse=True))
    fixed: list[Kernel] = []
    new_bufs: list[Buffer] = []
    shared: dict = {}  # a row-invariant kernel's body (its output renamed) -> what an earlier size made
    full = Op("floordiv", (r.rows, c(sizes[0])), INDEX)  # blocks of the largest size
    start = mul(full, c(sizes[0]))
    left = Op("sub", (r.rows, start), INDEX)
    first_k = r.kernels[0]
    pads: list[tuple[int, tuple[Stmt, ...]]] = []
    for level, B in enumerate(sizes):
        sub = _sub_program(r, bufs, local, written, B, invariant_static=level == 0)
        q = static(sub)
        q = replace(q, kernels=tuple(replace(k, cached=False) for k in q.kernels),
                    buffers=tuple(replace(b, kind="temp") if b.kind == "cache" else b for b in q.buffers))
        # kernels that read no row of the block (a weight's panels packed) run once, before the
        # blocks, found as ``cache_static`` finds the kernels of parameters alone; kept between
        # calls where the outer program's inputs they read are parameters it may cache
        invariant = {k.name for k in cache_static_kernels(q).kernels if k.cached}
        params = {b.index for b in q.buffers if b.kind == "input" and bufs[b.name].static}
        kept = {k.name for k in cache_static_kernels(mark_static_inputs(
            replace(q, buffers=tuple(replace(b, static=False) for b in q.buffers)), params)).kernels if k.cached}
        # the largest size runs when there is a full block or more rows left than the next size
        # holds; a smaller one, at most as the padded block (made per call only then)
        used = Op("gt", (r.rows, c(sizes[1])), "bool") if level == 0 and len(sizes) > 1 else \
            Op("gt", (left, c(sizes[level + 1] if level + 1 < len(sizes) else 0)), "bool")
        names = {b.name: b for b in q.buffers}
        ren: dict[str, str] = {}
        made: dict[str, Buffer] = {}
        for b in q.buffers:
            if b.kind == "temp":
                ren[b.name] = f"{b.name}_{tag}b{B}"
                made[b.name] = replace(b, name=ren[b.name], index=-1, static=False)
        raw: list[Stmt] = []
        for j, k in enumerate(q.kernels):
            if k.name in invariant:
                (out,) = buffers_used(k)[1]
                key = (rename_buffers(k.body, {out: "_"}), names[out].size, k.name in kept)
                if key in shared:  # the same panels as another size's: made whenever either runs
                    ren[out], at, plain = shared[key]
                    fixed[at] = plain
                    del made[out]
                    continue
                if k.name in kept:
                    made[out] = replace(made[out], kind="cache")
                plain = replace(k, name=f"{k.name}_{tag}b{B}", body=rename_buffers(k.body, ren), cached=k.name in kept)
                shared[key] = (ren[out], len(fixed), plain)
                fixed.append(plain if k.name in kept else replace(plain, body=(If(used, plain.body),)))
                continue
            kb = rename_buffers(k.body, ren)
            raw += rename_locals(kb, _local_names(kb, j))
        new_bufs += made.values()
        windows = {b: (names[b], r.strides[b], b in read) for b, st in r.strides.items()
                   if st > 0 and b not in local and b in names and names[b].kind in ("input", "output")}
        if level == 0:
            mb = f"pt_rows{B}"  # (the same in every run: runs of one shape share one C function)
            offs = {b: mul(mul(Var(mb), c(B)), c(st)) for b, (_, st, _) in windows.items()}
            fixed.append(Kernel(f"{first_k.name}_rows{B}", (For(mb, c(0), full, _map_indices(tuple(raw), lambda b, i: add(i, offs[b]) if b in offs else i)),),
                                origin=f"{B}-row blocks of " + first_k.origin, contraction=True))
        run, pad_bufs = _padded_block(tuple(raw), windows, left, start, B, f"{tag}pad{B}")
        new_bufs += pad_bufs
        pads.append((B, run))
    # the rows left (fewer than the largest size): the smallest size that holds them, padded
    chain: tuple[Stmt, ...] = ()
    for B, run in pads[:0:-1]:
        chain = (If(Op("le", (left, c(B)), "bool"), run, chain or pads[0][1]),)
    chain = chain or pads[0][1]
    fixed.append(Kernel(f"{first_k.name}_rows_left", (If(Op("gt", (left, c(0)), "bool"), chain),),
                        origin="rows left of " + first_k.origin, contraction=True))
    return fixed, new_bufs


def _padded_block(body: tuple[Stmt, ...], windows: dict, left: Expr, start: Expr, B: int,
                  tag: str) -> tuple[tuple[Stmt, ...], list[Buffer]]:
    """The block program ``body`` run once on the ``left`` rows from row ``start`` (at most B):
    each windowed buffer the run reads (``windows``: name -> (its buffer in the block program,
    row stride, read)) copied into a temp of B rows whose rows past them are zeros (any value
    computed from them is finite or harmless, and an index read there is in range), each one
    it writes copied out of its temp."""
    temps = {b: f"{b}_{tag}" for b in windows}
    bufs = [Buffer(temps[b], sb.dtype, B * st, "temp") for b, (sb, st, _) in windows.items()]
    copy_in: list[Stmt] = []
    copy_out: list[Stmt] = []
    e = Var("pt_e")
    for b, (sb, st, read) in windows.items():
        n = mul(left, c(st))
        if read:
            copy_in += [For("pt_e", c(0), n, (Store(temps[b], e, Load(b, add(mul(start, c(st)), e), sb.dtype)),)),
                        For("pt_e", n, c(B * st), (Store(temps[b], e, Const(0, sb.dtype)),))]
        if sb.kind == "output":
            copy_out.append(For("pt_e", c(0), n, (Store(b, add(mul(start, c(st)), e), Load(temps[b], e, sb.dtype)),)))
    return tuple(copy_in) + rename_buffers(body, temps) + tuple(copy_out), bufs


def _local_names(body: tuple[Stmt, ...], j: int) -> dict[str, str]:
    """New names for the locals of the ``j``-th kernel of a block program, which shares one C
    function with its sibling kernels: each name suffixed with ``j``, and local arrays numbered
    in order (fusion names them after the temps they replace, which differ between the runs
    of two identical layers: numbered, the two runs' blocks render as one C function)."""
    arrays = [s.name for s in walk_stmts(body) if isinstance(s, Alloc)]
    m = {x: f"{x}_k{j}" for x in declared_names(body)}
    m.update({a: f"a{n}_k{j}" for n, a in enumerate(dict.fromkeys(arrays))})
    return m


def _sub_program(r: _Run, bufs: dict, local: set, written: set, B: int, invariant_static: bool) -> Program:
    """The run over B rows. ``invariant_static`` (the largest size): the static-sized buffers it
    reads count as parameters, so that the static pipeline packs a weight's panels in a kernel
    of their own, run once per call for all the blocks (and read in place: faster than packing
    each panel in each block); else only the outer program's parameters do (the panels packed
    inside the one padded block, as they are used)."""
    out: list[Buffer] = []
    n_in = n_out = 0
    for name in sorted(r.strides):
        b, s = bufs[name], r.strides[name]
        if s == 0:
            out.append(Buffer(name, b.dtype, b.size, "input", n_in,
                              static=invariant_static or (b.static and b.kind == "input")))
            n_in += 1
        elif name in local:
            out.append(Buffer(name, b.dtype, B * s, "temp"))
        elif name in written:
            out.append(Buffer(name, b.dtype, B * s, "output", n_out))
            n_out += 1
        else:
            out.append(Buffer(name, b.dtype, B * s, "input", n_in))
            n_in += 1
    kernels = tuple(_with_rows(k, c(B)) for k in r.kernels)
    return Program(tuple(out), kernels)


def _map_indices(body: tuple[Stmt, ...], fn: Callable[[str, Expr], Expr]) -> tuple[Stmt, ...]:
    """``body`` with the index of every access (load, store, prefetch) mapped by ``fn(buffer,
    index)``, inner accesses first."""
    def ex(e: Expr) -> Expr:
        return map_expr(e, lambda x: Load(x.buf, fn(x.buf, x.index), x.dtype) if isinstance(x, Load) else x)

    out: list[Stmt] = []
    for s in body:
        if isinstance(s, For):
            s = replace(s, lo=ex(s.lo), hi=ex(s.hi), body=_map_indices(s.body, fn))
        elif isinstance(s, Store):
            s = Store(s.buf, fn(s.buf, ex(s.index)), ex(s.value))
        elif isinstance(s, (Let, Assign)):
            s = replace(s, value=ex(s.value))
        elif isinstance(s, If):
            s = If(ex(s.cond), _map_indices(s.then, fn), _map_indices(s.orelse, fn))
        elif isinstance(s, Prefetch):
            s = replace(s, index=fn(s.buf, ex(s.index)))
        out.append(s)
    return tuple(out)
