"""Parallelization: prove loops parallel with isl, then choose which loops run under OpenMP."""
from __future__ import annotations

from dataclasses import replace

from ..affine import isl as pisl
from ..affine.ir import For, If, Kernel, Program, Stmt, structure_key, trip_count, walk_stmts

# structure key of a kernel body + its buffers' sizes -> the parallel flags of its loops after
# the check, in walk order (identical layers are checked once)
_checked: dict = {}


def check_parallel(p: Program) -> Program:
    """Keep a ``parallel`` mark only where isl finds no loop-carried dependence."""
    sizes = {b.name: b.size for b in p.buffers}

    def fix(body: tuple[Stmt, ...], depth: int, accs) -> tuple[Stmt, ...]:
        out = []
        for s in body:
            if isinstance(s, For):
                mine = [a for a in accs if len(a.loops) > depth and a.loops[depth] == id(s)]
                par = s.parallel and not pisl.carried_dependence(mine, depth)
                out.append(replace(s, body=fix(s.body, depth + 1, mine), parallel=par))
            elif isinstance(s, If):
                out.append(replace(s, then=fix(s.then, depth, accs), orelse=fix(s.orelse, depth, accs)))
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


def _work(body: tuple[Stmt, ...]) -> int:
    """Scalar iterations of a body (non-constant trip counts count as 1: a lower bound)."""
    total = 0
    for s in body:
        if isinstance(s, For):
            total += (trip_count(s) or 1) * max(1, _work(s.body))
        elif isinstance(s, If):
            total += max(_work(s.then), _work(s.orelse), 1)
        else:
            total += 1
    return total


def assign_omp(p: Program, *, threads: int, min_work: int) -> Program:
    """Put OpenMP on the outermost band of parallel loops of each kernel whose work is large
    enough (below sequential loops that hold nothing else); collapse just enough loops of the
    band to give every thread several iterations."""
    if threads <= 1:
        return p

    def choose(s: For) -> For:
        if not s.parallel and s.body and all(isinstance(b, For) for b in s.body) and trip_count(s) is not None \
                and _work((s,)) >= min_work:
            # a sequential loop around parallel bands (row or reduction blocks of a tiled
            # contraction): each band inside runs under OpenMP once per iteration
            inner = tuple(choose(b) for b in s.body)
            return replace(s, body=inner) if any(x is not b for x, b in zip(inner, s.body)) else s
        band, f = [], s
        while isinstance(f, For) and f.parallel and trip_count(f) is not None:
            band.append(f)
            f = f.body[0] if len(f.body) == 1 else None
        if not band or _work((s,)) < min_work:
            return s
        iters, k = 1, 0
        for b in band:
            iters *= trip_count(b)
            k += 1
            if iters >= 4 * threads:
                break
        return replace(s, workers=k)

    kernels = tuple(replace(k, body=tuple(choose(s) if isinstance(s, For) else s for s in k.body))
                    for k in p.kernels)
    return replace(p, kernels=kernels)
