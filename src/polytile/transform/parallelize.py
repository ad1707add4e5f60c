"""Parallelization: prove loops parallel with isl, then choose which loops run under OpenMP."""
from __future__ import annotations

from dataclasses import replace

from ..affine import isl as pisl
from ..affine.ir import (INDEX, SIZE_PREFIX, Const, Expr, For, If, Kernel, Load, Op, Prefetch, Program, Stmt, Store,
                         Var, add, c, local_arrays, mul, stmt_exprs, structure_key, trip_count, walk_exprs,
                         walk_stmts)
from ..affine.linear import linear_form
from ..graph.symbols import Sym, SymbolicSize

# structure key of a kernel body + its buffers' sizes -> the parallel flags of its loops after
# the check, in walk order (identical layers are checked once)
_checked: dict = {}


def check_parallel(p: Program) -> Program:
    """Keep a ``parallel`` mark only where isl finds no loop-carried dependence."""
    sizes = {b.name: b.size for b in p.buffers}
    symbolic = any(not isinstance(n, int) for n in sizes.values())

    def fix(body: tuple[Stmt, ...], depth: int, accs, outer: frozenset = frozenset()) -> tuple[Stmt, ...]:
        out = []
        for s in body:
            if isinstance(s, For):
                mine = [a for a in accs if len(a.loops) > depth and a.loops[depth] == id(s)]
                par = s.parallel and not pisl.carried_dependence(mine, depth)
                if s.parallel and not par and symbolic:  # indices isl cannot state (size x loop variable)
                    par = separated_writes(s, outer)
                out.append(replace(s, body=fix(s.body, depth + 1, mine, outer | {s.var}), parallel=par))
            elif isinstance(s, If):
                out.append(replace(s, then=fix(s.then, depth, accs, outer), orelse=fix(s.orelse, depth, accs, outer)))
            else:
                out.append(s)
        return tuple(out)

    kernels = []
    for k in p.kernels:
        loops = [s for s in walk_stmts(k.body) if isinstance(s, For)]
        if not any(f.parallel for f in loops):  # nothing claimed: nothing to check
            kernels.append(k)
            continue
        key, order = structure_key(k.body)
        key = (key, tuple(sizes[n] for n in order))
        try:
            flags = _checked.get(key)
        except TypeError:  # unhashable constant: no memo
            flags, key = None, None
        if flags is None:
            checked = fix(k.body, 0, pisl.accesses(k.body, sizes))
            flags = tuple(s.parallel for s in walk_stmts(checked) if isinstance(s, For))
            if key is not None:
                if len(_checked) > 4096:
                    _checked.clear()
                _checked[key] = flags
        if flags == tuple(f.parallel for f in loops):
            kernels.append(k)
        else:
            kernels.append(replace(k, body=_with_flags(k.body, iter(flags))))
    return replace(p, kernels=tuple(kernels))


def _poly(e: Expr) -> dict | None:
    """An index expression as a polynomial {sorted names: coefficient} over loop variables and
    size parameters; None when it is not one (a load, a division)."""
    if isinstance(e, Const):
        return {(): e.value} if e.dtype == INDEX and isinstance(e.value, int) else None
    if isinstance(e, Var):
        return {(e.name,): 1} if e.dtype == INDEX else None
    if not isinstance(e, Op) or e.fn not in ("add", "sub", "mul"):
        return None
    a, b = (_poly(x) for x in e.args)
    if a is None or b is None:
        return None
    out: dict = {}
    if e.fn == "mul":
        for ma, ka in a.items():
            for mb, kb in b.items():
                m = tuple(sorted(ma + mb))
                out[m] = out.get(m, 0) + ka * kb
    else:
        out = dict(a)
        for m, k in b.items():
            out[m] = out.get(m, 0) + (k if e.fn == "add" else -k)
    return {m: k for m, k in out.items() if k}


def _coefficient(poly: dict, var: str, ivs: set[str]):
    """The coefficient of ``var`` (a polynomial in the size parameters, as a Sym or int) when
    ``poly`` is linear in it and no other loop variable multiplies it; else None."""
    terms = {}
    for m, k in poly.items():
        if var in m:
            rest = list(m)
            rest.remove(var)
            if var in rest or any(x in ivs for x in rest):
                return None
            terms[tuple(x[len(SIZE_PREFIX):] for x in rest)] = k
    return Sym.make(terms, {})


def separated_writes(loop: For, outer: frozenset = frozenset()) -> bool:
    """Whether different iterations of ``loop`` touch different elements of every buffer it
    writes, proved from the index polynomials where isl cannot state them (a loop variable
    times a size parameter): every access to a written buffer uses one index, whose
    coefficient of ``loop.var`` exceeds the span of the loops inside that enclose the access
    (sum of coefficient x (trip count - 1), each decided for every size by ``Sym`` bounds);
    the index's other variables are ``outer`` loop variables (fixed) and size parameters.
    Arrays and scalars declared inside the loop are private. Sound, not complete."""
    local = set(local_arrays(loop.body))
    found: dict[str, list] = {}  # buffer -> [(index, enclosing inner loops, write)]

    def visit(body, inner):
        for st in body:
            if isinstance(st, For):
                visit(st.body, inner + [st])
                continue
            if isinstance(st, If):
                visit(st.then, inner)
                visit(st.orelse, inner)
            for e in stmt_exprs(st) if not isinstance(st, Prefetch) else ():
                for x in walk_exprs(e):
                    if isinstance(x, Load) and x.buf not in local:
                        found.setdefault(x.buf, []).append((x.index, inner, False))
            if isinstance(st, Store) and st.buf not in local:
                found.setdefault(st.buf, []).append((st.index, inner, True))

    visit(loop.body, [])
    for buf, accs in found.items():
        if not any(w for _, _, w in accs):
            continue
        if any(idx != accs[0][0] for idx, _, _ in accs):
            return False
        poly = _poly(accs[0][0])
        if poly is None:
            return False
        for _, inner, _ in accs:
            ivs = {loop.var} | {f.var for f in inner}
            if any(x not in ivs and x not in outer and not x.startswith(SIZE_PREFIX) for m in poly for x in m):
                return False  # a scalar computed in the loop (an indirect index)
            step = _coefficient(poly, loop.var, ivs)
            if step is None:
                return False
            span = 0
            for f in inner:
                k = _coefficient(poly, f.var, ivs)
                hi = _poly(f.hi)
                if k is None or hi is None or not (isinstance(f.lo, Const) and f.lo.value == 0) \
                        or any(not x.startswith(SIZE_PREFIX) for m in hi for x in m):
                    return False
                trips = Sym.make({tuple(x[len(SIZE_PREFIX):] for x in m): v for m, v in hi.items()}, {})
                try:
                    if not k >= 0:
                        return False
                except SymbolicSize:
                    return False
                span = span + k * (trips - 1)
            try:
                if not step - span - 1 >= 0:
                    return False
            except SymbolicSize:
                return False
    return True


def _with_flags(body: tuple[Stmt, ...], flags) -> tuple[Stmt, ...]:
    """``body`` with the ``parallel`` marks of its loops taken from ``flags`` (walk order)."""
    out = []
    for s in body:
        if isinstance(s, For):
            par = next(flags)
            s = replace(s, parallel=par, body=_with_flags(s.body, flags))
        elif isinstance(s, If):
            s = replace(s, then=_with_flags(s.then, flags), orelse=_with_flags(s.orelse, flags))
        out.append(s)
    return tuple(out)


def _trips_at_most(f: For) -> int:
    """A loop's trip count, or for a strip-mined loop (``lo = b``, ``hi = min(b + t, n)``) its
    strip length ``t``; 1 when neither is known (a lower bound for the work estimate)."""
    n = trip_count(f)
    if n is not None:
        return n
    lo = linear_form(f.lo)
    his = f.hi.args if isinstance(f.hi, Op) and f.hi.fn == "minimum" else (f.hi,)
    spans = [h[1] - lo[1] for h in map(linear_form, his) if lo is not None and h is not None and h[0] == lo[0]]
    return max(1, min(spans)) if spans else 1


def _work(body: tuple[Stmt, ...]) -> int:
    """Scalar iterations of a body (a loop's trip count as ``_trips_at_most``)."""
    total = 0
    for s in body:
        if isinstance(s, For):
            total += _trips_at_most(s) * max(1, _work(s.body))
        elif isinstance(s, If):
            total += max(_work(s.then), _work(s.orelse), 1)
        else:
            total += 1
    return total


def _trips(f: For) -> Expr:
    return f.hi if isinstance(f.lo, Const) and f.lo.value == 0 else Op("sub", (f.hi, f.lo), INDEX)


def _work_expr(body: tuple[Stmt, ...]) -> Expr:
    """Scalar iterations of a body as an expression of the size parameters (symbolic bounds)."""
    total: Expr = c(0)
    for s in body:
        if isinstance(s, For):
            n = trip_count(s)
            # (bounds that use an enclosing loop's variable, a strip: its length, as ``_work``)
            trips = c(n) if n is not None else _trips(s) if _size_bound(s) else c(_trips_at_most(s))
            total = add(total, mul(trips, _work_expr(s.body) if s.body else c(1)))
        elif isinstance(s, If):
            total = add(total, c(max(_work(s.then), _work(s.orelse), 1)))
        else:
            total = add(total, c(1))
    return total


def _size_bound(f: For) -> bool:
    """Bounds that depend on size parameters only (no loop variable, no load): a band loop
    whose trip count is known when the kernel starts."""
    return all(isinstance(x, Const) or (isinstance(x, Var) and x.name.startswith(SIZE_PREFIX)) or
               (isinstance(x, Op) and x.fn in ("add", "sub", "mul", "floordiv", "minimum"))
               for e in (f.lo, f.hi) for x in walk_exprs(e))


def assign_omp(p: Program, *, threads: int, min_work: int) -> Program:
    """Put OpenMP on the outermost band of parallel loops of each kernel whose work is large
    enough (below sequential loops that hold nothing else); collapse just enough loops of the
    band to give every thread several iterations. Where the work depends on symbolic sizes,
    the band runs in parallel when the sizes of the call make it large enough (``workers_if``)."""
    if threads <= 1:
        return p

    def choose(s: For) -> For:
        if any(isinstance(x, For) and x.workers for x in walk_stmts((s,))):
            return s  # shared already (an array reduction set by a scheduling pass)
        if not s.parallel and s.body and all(isinstance(b, For) for b in s.body) and trip_count(s) is not None \
                and _work((s,)) >= min_work:
            # a sequential loop around parallel bands (row or reduction blocks of a tiled
            # contraction): each band inside runs under OpenMP once per iteration
            inner = tuple(choose(b) for b in s.body)
            return replace(s, body=inner) if any(x is not b for x, b in zip(inner, s.body)) else s
        band, f = [], s
        while isinstance(f, For) and f.parallel and (trip_count(f) is not None or _size_bound(f)):
            band.append(f)
            f = f.body[0] if len(f.body) == 1 else None
        if not band:
            return s
        when = None
        if _work((s,)) < min_work:
            work = _work_expr((s,))
            if not any(isinstance(x, Var) and x.name.startswith(SIZE_PREFIX) for x in walk_exprs(work)):
                return s
            when = Op("ge", (work, c(min_work)), "bool")
        iters, k = 1, 0
        for b in band:
            n = trip_count(b)
            k += 1
            if n is None:  # a symbolic trip count: assumed enough
                break
            iters *= n
            if iters >= 4 * threads:
                break
        return replace(s, workers=k, workers_if=when)

    kernels = tuple(replace(k, body=tuple(choose(s) if isinstance(s, For) else s for s in k.body))
                    for k in p.kernels)
    return replace(p, kernels=kernels)
