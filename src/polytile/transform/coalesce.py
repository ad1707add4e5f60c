"""Coalesce perfectly nested loops that walk memory as one range.

    for r0 in [0, 8):                       for r1 in [0, 64):
      for r1 in [0, 8):            ==>        acc += f(x[base + r1])
        acc += f(x[base + 8*r0 + r1])

Legal for any pair (the merged loop visits the same iterations in the same order); done only
where every use of both variables is an index in which the outer one's coefficient is the
inner trip count times the inner one's, so the merged variable replaces both without div/mod.
Both loops must be sequential (reductions) or both parallel. Why: a reduction over a few
short contiguous rows (global average pooling over 8x8 pixels, a mean over (H, W) of an NCHW
tensor) is a loop nest the C compiler does not vectorize ("loop nest containing two or more
consecutive inner loops"); one loop of 64 it does.
"""
from __future__ import annotations

from dataclasses import replace

from ..affine.ir import Const, Expr, For, If, Load, Program, Stmt, Store, Var, stmt_exprs, trip_count, walk_exprs, \
    walk_stmts
from ..affine.linear import linear_form, to_expr
from .fusion_util import map_stmt_exprs


def _merged_index(e: Expr, outer: str, inner: str, n_inner: int, merged: str) -> Expr | None:
    """``e`` with outer*k*n_inner + inner*k written as merged*k, or None."""
    lf = linear_form(e)
    if lf is None:
        return None
    ko, ki = lf[0].get(outer, 0), lf[0].get(inner, 0)
    if ko != ki * n_inner:
        return None
    coefs = {v: k for v, k in lf[0].items() if v not in (outer, inner)}
    coefs[merged] = ki
    return to_expr(coefs, lf[1])


def _uses(body: tuple[Stmt, ...], names: set[str]) -> bool:
    return any(isinstance(x, Var) and x.name in names
               for s in walk_stmts(body) for e in stmt_exprs(s) for x in walk_exprs(e))


def _rewrite_stores(body: tuple[Stmt, ...], fix) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Store):
            s = replace(s, index=fix(s.index))
        elif isinstance(s, For):
            s = replace(s, body=_rewrite_stores(s.body, fix))
        elif isinstance(s, If):
            s = replace(s, then=_rewrite_stores(s.then, fix), orelse=_rewrite_stores(s.orelse, fix))
        out.append(s)
    return tuple(out)


def merge_pair(f: For) -> For:
    """``f`` and the loop it holds alone as one loop, where that needs no div/mod (else ``f``)."""
    if len(f.body) != 1 or not isinstance(f.body[0], For):
        return f
    g = f.body[0]
    if f.parallel != g.parallel or f.workers or g.workers:
        return f
    if not all(isinstance(x, Const) and x.value == 0 for x in (f.lo, g.lo)):
        return f
    nf, ng = trip_count(f), trip_count(g)
    if not nf or not ng:
        return f
    if any(isinstance(x, Var) and x.name in (f.var, g.var) for e in (g.lo, g.hi) for x in walk_exprs(e)):
        return f

    taken = {x.name for s in walk_stmts((f,)) for e in stmt_exprs(s) for x in walk_exprs(e) if isinstance(x, Var)}
    taken |= {s.var for s in walk_stmts((f,)) if isinstance(s, For)}
    merged = f"{f.var}{g.var}"
    while merged in taken:
        merged += "_"

    def fix(index: Expr) -> Expr:
        if not any(isinstance(x, Var) and x.name in (f.var, g.var) for x in walk_exprs(index)):
            return index
        m = _merged_index(index, f.var, g.var, ng, merged)
        return index if m is None else m

    body = map_stmt_exprs(g.body, lambda x: replace(x, index=fix(x.index)) if isinstance(x, Load) else x)
    body = _rewrite_stores(body, fix)
    if _uses(body, {f.var, g.var}):
        return f  # a use the merged variable cannot express without div/mod
    return replace(g, var=merged, hi=Const(nf * ng, g.hi.dtype), body=body)


def _coalesce(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, For):
            s = merge_pair(replace(s, body=_coalesce(s.body)))
        elif isinstance(s, If):
            s = replace(s, then=_coalesce(s.then), orelse=_coalesce(s.orelse))
        out.append(s)
    return tuple(out)


def coalesce_loops(p: Program) -> Program:
    return replace(p, kernels=tuple(replace(k, body=_coalesce(k.body)) for k in p.kernels))
