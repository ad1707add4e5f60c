"""Sink a parallel loop below a reduction (interchange + scalar expansion).

    for v (parallel):                     for vo (parallel):            # strip-mined by `tile`
      acc = init                            acc_v[tile] (local array)
      for r...: acc = f(acc, v, r)          for v in tile: acc_v[v-b] = init
      out[.., v] = g(acc)          ==>      for r...: for v in tile: acc_v[v-b] = f(acc_v[v-b], v, r)
                                            for v in tile: out[.., v] = g(acc_v[v-b])

Legal because v carries no dependence (``parallel`` was proven by isl); chosen when the
innermost loop then walks memory more contiguously than the innermost reduction loop did,
which makes it vectorizable (matmul with a row-major B, convolution along output width,
reductions over outer axes).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..affine.ir import (INDEX, Alloc, Assign, Const, Expr, For, If, Let, Load, Op, Program, Stmt,
                         Store, Var, c, stmt_exprs, trip_count, walk_exprs, walk_stmts)
from ..affine.linear import linear_form, uses_var
from .coalesce import merge_pair

_BAD_STRIDE = 4  # |coefficient| above which a load is not vector friendly along a loop


def _cost(body: tuple[Stmt, ...], var: str) -> int:
    """Loads under body that are strided (or indirect) along ``var``."""
    bad = 0
    for s in walk_stmts(body):
        for e in stmt_exprs(s):
            for x in walk_exprs(e):
                if isinstance(x, Load):
                    lf = linear_form(x.index)
                    if lf is None or abs(lf[0].get(var, 0)) > _BAD_STRIDE:
                        bad += 1
    return bad


def _chain(f: For) -> list[For]:
    """The perfectly nested loops starting at f."""
    out = [f]
    while len(out[-1].body) == 1 and isinstance(out[-1].body[0], For):
        out.append(out[-1].body[0])
    return out


def _subst(e: Expr, arrays: dict[str, str], idx: Expr) -> Expr:
    if isinstance(e, Var) and e.name in arrays:
        return Load(arrays[e.name], idx, e.dtype)
    if isinstance(e, Load):
        return replace(e, index=_subst(e.index, arrays, idx))
    if isinstance(e, Op):
        return replace(e, args=tuple(_subst(a, arrays, idx) for a in e.args))
    return e


def _subst_stmts(body, arrays, idx) -> tuple[Stmt, ...]:
    out = []
    for s in body:
        if isinstance(s, Assign) and s.name in arrays:
            out.append(Store(arrays[s.name], idx, _subst(s.value, arrays, idx)))
        elif isinstance(s, Assign):
            out.append(replace(s, value=_subst(s.value, arrays, idx)))
        elif isinstance(s, Let):
            out.append(replace(s, value=_subst(s.value, arrays, idx)))
        elif isinstance(s, Store):
            out.append(replace(s, index=_subst(s.index, arrays, idx), value=_subst(s.value, arrays, idx)))
        elif isinstance(s, If):
            out.append(replace(s, cond=_subst(s.cond, arrays, idx), then=_subst_stmts(s.then, arrays, idx),
                               orelse=_subst_stmts(s.orelse, arrays, idx)))
        elif isinstance(s, For):
            out.append(replace(s, lo=_subst(s.lo, arrays, idx), hi=_subst(s.hi, arrays, idx),
                               body=_subst_stmts(s.body, arrays, idx)))
        else:
            out.append(s)
    return tuple(out)


def _strip(n: int, tile: int, workers: int, lanes: int) -> int:
    """The strip length for ``n`` iterations: at most ``tile``, in a number of strips that the
    ``workers`` share evenly, a multiple of ``lanes`` (the strips run in parallel)."""
    strips = -(-n // tile)
    strips = -(-strips // workers) * workers
    return min(tile, -(-(-(-n // strips)) // lanes) * lanes)


def _sums_only(chain: list[For], lets: list[Let]) -> bool:
    """Whether the reduction chain only adds into the accumulators: ``acc = acc + e`` with
    ``acc`` nowhere else (the form an array reduction over the chain's loop keeps)."""
    names = {s.name for s in lets}
    for s in walk_stmts(chain[0].body):
        if isinstance(s, For):
            if any(uses_var(e, n) for e in (s.lo, s.hi) for n in names):
                return False
            continue
        if not isinstance(s, Assign) or s.name not in names:
            if isinstance(s, (Assign, Let)) and any(uses_var(s.value, n) for n in names):
                return False
            if not isinstance(s, (Assign, Let)):
                return False
            continue
        v = s.value
        if not (isinstance(v, Op) and v.fn == "add" and isinstance(v.args[0], Var) and v.args[0].name == s.name
                and not any(uses_var(v.args[1], n) for n in names)):
            return False
    return True


def _sink(f: For, tile: int, workers: int = 1, lanes: int = 1, split: "SplitRows | None" = None,
          rows: int = 1) -> For:
    if f.parallel and len(f.body) == 1 and isinstance(f.body[0], For) and f.body[0].parallel:
        # two parallel loops that walk memory as one range (the rows and columns of an NCHW
        # image reduced over its channels) become one before the strips are cut: full strips
        # of the whole image instead of a partial strip per row (56 = 32 + 24)
        merged = merge_pair(f)
        if merged is not f:
            sunk = _sink(merged, tile, workers, lanes, split, rows)
            if sunk != merged:
                return sunk
        n = trip_count(f)
        return replace(f, body=(_sink(f.body[0], tile, workers, lanes, split, rows * (n if n is not None else 2)),))
    n = trip_count(f)
    if not f.parallel or n is None or n < 8 or not (isinstance(f.lo, Const) and f.lo.value == 0):
        return f
    body = f.body
    lets = [s for s in body if isinstance(s, Let)]
    rest = [s for s in body if not isinstance(s, Let)]
    if not lets or body[:len(lets)] != tuple(lets) or len(rest) < 2 or not isinstance(rest[0], For) \
            or not all(isinstance(s, Store) for s in rest[1:]):
        return f
    red, stores = rest[0], rest[1:]
    chain = _chain(red)
    if any(uses_var(x.lo, f.var) or uses_var(x.hi, f.var) for x in walk_stmts((red,)) if isinstance(x, For)):
        return f
    inner = chain[-1]
    if _cost(inner.body, f.var) > _cost(inner.body, inner.var) or (
            _cost(inner.body, f.var) == _cost(inner.body, inner.var) and (trip_count(inner) or 0) >= n):
        return f
    # strips shared by the workers only where the loops outside give them too little to share
    t = min(tile, n) if workers <= 1 or rows >= 4 * workers else _strip(n, tile, workers, lanes)
    # one row (a matrix-vector product, x @ W with a row-major W): the threads would each read
    # short pieces of W's rows; they share the reduction instead, each over whole rows of W
    red_total = 1
    for x in chain:
        red_total *= trip_count(x) or 0
    split_k = (split is not None and workers > 1 and rows == 1 and n * 4 * len(lets) <= split.max_bytes
               and red_total >= split.min_reduction and _sums_only(chain, lets)
               and all(s.dtype.startswith("float") for s in lets))
    if split_k:
        t = n
    if n > t:
        vo = f.var + "o"
        base: Expr = Op("mul", (Var(vo), c(t)), INDEX)
        lo, hi = base, Op("minimum", (Op("add", (base, c(t)), INDEX), c(n)), INDEX)
        idx: Expr = Op("sub", (Var(f.var), base), INDEX)
    else:
        lo, hi, idx = c(0), c(n), Var(f.var)
    arrays = {s.name: f"{s.name}_{f.var}" for s in lets}

    def vloop(stmts):
        return For(f.var, lo, hi, tuple(stmts))

    new_body: list[Stmt] = [Alloc(arrays[s.name], s.dtype, t) for s in lets]
    new_body.append(vloop([Store(arrays[s.name], idx, _subst(s.value, arrays, idx)) for s in lets]))
    new_inner = replace(inner, body=(vloop(_subst_stmts(inner.body, arrays, idx)),))
    for outer in reversed(chain[:-1]):
        new_inner = replace(outer, body=(new_inner,))
    if split_k:
        new_inner = replace(new_inner, workers=1, reduce_arrays=tuple((a, t) for a in arrays.values()))
    new_body.append(new_inner)
    new_body.append(vloop(_subst_stmts(tuple(stores), arrays, idx)))
    if n > t:
        return For(f.var + "o", c(0), c(-(-n // t)), tuple(new_body), parallel=True)
    return _wrap_none(new_body, f)


def _wrap_none(stmts, f):
    # no strip-mining: the statements replace the loop (a one-trip "loop" keeps a single root)
    return For(f.var + "o", c(0), c(1), tuple(stmts), parallel=True)


@dataclass(frozen=True)
class SplitRows:
    """When a nest that sinks has a single row, its reduction is shared by the workers instead
    of its columns (``_sink``): for rows of at most ``max_bytes`` of accumulators and
    reductions of at least ``min_reduction`` iterations."""

    max_bytes: int
    min_reduction: int = 256


def sink_parallel_loops(p: Program, *, tile: int = 512, workers: int = 1, lanes: int = 1,
                        split: SplitRows | None = None) -> Program:
    """Sink parallel loops below reductions; strips of at most ``tile`` iterations, as many as
    a multiple of ``workers`` (the threads that share them), each a multiple of ``lanes``;
    with ``split``, single rows share their reduction instead."""
    kernels = []
    for k in p.kernels:
        body = tuple(_sink(s, tile, workers, lanes, split) if isinstance(s, For) else s for s in k.body)
        kernels.append(replace(k, body=body))
    return replace(p, kernels=tuple(kernels))


def would_sink(f: For, tile: int = 512) -> bool:
    """Whether ``sink_parallel_loops`` restructures the nest rooted at f (fusion leaves such
    nests alone: fused, they would no longer match)."""
    return _sink(f, tile) != f
