"""Loop-invariant divisors hoisted as reciprocals.

    for j:  out[j] = a[j] / s         ==>     r = 1 / s
                                              for j:  out[j] = a[j] * r

``s`` must not change inside the loop: no variable bound in the loop and no buffer (or local
array) stored in it. A vector divide costs about ten multiplies, and softmax's normalization,
means and variances divide every element of a row by one value. x * (1/s) differs from x / s
by at most an ulp or so. A divisor found only under an ``If`` inside the loop stays where it
is (the reciprocal would be computed where the original never ran), and so do divisors of
loops that may run zero times.
"""
from __future__ import annotations

from dataclasses import replace

from ..affine.ir import (Assign, Const, Expr, For, If, Let, Load, Op, Program, Stmt, Store, Var,
                         lanes, local_arrays, stmt_exprs, trip_count, walk_exprs, walk_stmts)
from .fusion_util import declared_names, map_stmt_exprs

FLOATS = ("float32", "float64")


def _divisors(body: tuple[Stmt, ...]) -> list[Expr]:
    """Float scalar divisors under body, outside any If."""
    out: list[Expr] = []
    for s in body:
        if isinstance(s, For):
            out += _divisors(s.body)
        elif not isinstance(s, If):
            for e in stmt_exprs(s):
                for x in walk_exprs(e):
                    if isinstance(x, Op) and x.fn == "div" and x.dtype in FLOATS and lanes(x.dtype) == 1 \
                            and x.args[1].dtype == x.dtype and not isinstance(x.args[1], Const) \
                            and x.args[1] not in out:
                        out.append(x.args[1])
    return out


def _invariant_divisors(f: For) -> list[Expr]:
    """Divisors under f that read no variable bound in f and no buffer or local array stored in it."""
    names = declared_names((f,)) | {s.name for s in walk_stmts((f,)) if isinstance(s, Assign)}
    stored = {s.buf for s in walk_stmts((f,)) if isinstance(s, Store)} | set(local_arrays((f,)))
    return [d for d in _divisors(f.body)
            if not any(isinstance(x, Var) and x.name in names or isinstance(x, Load) and x.buf in stored
                       for x in walk_exprs(d))]


def _hoist(body: tuple[Stmt, ...], counter: list[int]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, For):
            if (trip_count(s) or 0) >= 1:
                table: dict[Expr, str] = {}
                for d in _invariant_divisors(s):
                    table[d] = f"pt_rcp{counter[0]}"
                    counter[0] += 1
                    out.append(Let(table[d], d.dtype, Op("div", (Const(1.0, d.dtype), d), d.dtype)))
                if table:
                    def to_mul(e: Expr, table=table) -> Expr:
                        if isinstance(e, Op) and e.fn == "div" and e.args[1] in table:
                            return Op("mul", (e.args[0], Var(table[e.args[1]], e.dtype)), e.dtype)
                        return e

                    s = replace(s, body=map_stmt_exprs(s.body, to_mul))
            s = replace(s, body=_hoist(s.body, counter))
        elif isinstance(s, If):
            s = replace(s, then=_hoist(s.then, counter), orelse=_hoist(s.orelse, counter))
        out.append(s)
    return tuple(out)


def hoist_divisors(p: Program) -> Program:
    return replace(p, kernels=tuple(replace(k, body=_hoist(k.body, [0])) for k in p.kernels))
