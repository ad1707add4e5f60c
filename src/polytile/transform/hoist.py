"""Loop-invariant divisors hoisted as reciprocals.

    for j:  out[j] = a[j] / s         ==>     r = 1 / s
                                              for j:  out[j] = a[j] * r

``s`` must not change inside the loop: no variable bound in the loop and no buffer (or local
array) stored in it. A vector divide costs about ten multiplies, and softmax's normalization,
means and variances divide every element of a row by one value. x * (1/s) differs from x / s
by at most an ulp or so. Divisors under an ``If`` inside the loop stay where they are (the
reciprocal would be computed where the original never ran), and so do loops that may run
zero times.
"""
from __future__ import annotations

from dataclasses import replace

from ..affine.ir import (Assign, Const, Expr, For, If, Kernel, Let, Load, Op, Program, Stmt, Store, Var,
                         lanes, stmt_exprs, trip_count, walk_exprs)

FLOATS = ("float32", "float64")


def _bound(body: tuple[Stmt, ...]) -> tuple[set[str], set[str]]:
    """Names bound and buffers stored anywhere under ``body``."""
    names: set[str] = set()
    stored: set[str] = set()

    def go(stmts):
        for s in stmts:
            if isinstance(s, For):
                names.add(s.var)
                go(s.body)
            elif isinstance(s, If):
                go(s.then)
                go(s.orelse)
            elif isinstance(s, (Let, Assign)):
                names.add(s.name)
            elif isinstance(s, Store):
                stored.add(s.buf)
            name = getattr(s, "name", None)
            if name is not None and not isinstance(s, (Let, Assign)):
                stored.add(name)  # local arrays (Alloc)

    go(body)
    return names, stored


def _divisors(body: tuple[Stmt, ...]) -> list[Expr]:
    """Float scalar divisors under body, outside any If."""
    out: list[Expr] = []
    for s in body:
        if isinstance(s, For):
            out += _divisors(s.body)
        elif isinstance(s, If):
            continue
        else:
            for e in stmt_exprs(s):
                for x in walk_exprs(e):
                    if isinstance(x, Op) and x.fn == "div" and x.dtype in FLOATS and lanes(x.dtype) == 1 \
                            and x.args[1].dtype == x.dtype and not isinstance(x.args[1], Const) \
                            and x.args[1] not in out:
                        out.append(x.args[1])
    return out


def _invariant(e: Expr, names: set[str], stored: set[str]) -> bool:
    for x in walk_exprs(e):
        if isinstance(x, Var) and x.name in names:
            return False
        if isinstance(x, Load) and x.buf in stored:
            return False
    return True


def _replace(e: Expr, table: dict[Expr, str]) -> Expr:
    if isinstance(e, Op):
        args = tuple(_replace(a, table) for a in e.args)
        if e.fn == "div" and args[1] in table:
            return Op("mul", (args[0], Var(table[args[1]], e.dtype)), e.dtype)
        return replace(e, args=args)
    if isinstance(e, Load):
        return replace(e, index=_replace(e.index, table))
    return e


def _rewrite(stmts: tuple[Stmt, ...], table: dict[Expr, str]) -> tuple[Stmt, ...]:
    out = []
    for s in stmts:
        if isinstance(s, For):
            out.append(replace(s, body=_rewrite(s.body, table)))
        elif isinstance(s, If):
            out.append(s)
        elif isinstance(s, (Let, Assign)):
            out.append(replace(s, value=_replace(s.value, table)))
        elif isinstance(s, Store):
            out.append(replace(s, index=_replace(s.index, table), value=_replace(s.value, table)))
        else:
            out.append(s)
    return tuple(out)


def _hoist(body: tuple[Stmt, ...], counter: list[int]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, For) and (trip_count(s) or 0) >= 1:
            names, stored = _bound((s,))
            table: dict[Expr, str] = {}
            for d in _divisors(s.body):
                if _invariant(d, names, stored):
                    table[d] = f"pt_rcp{counter[0]}"
                    counter[0] += 1
                    out.append(Let(table[d], d.dtype, Op("div", (Const(1.0, d.dtype), d), d.dtype)))
            if table:
                s = replace(s, body=_rewrite(s.body, table))
            out.append(replace(s, body=_hoist(s.body, counter)))
        elif isinstance(s, For):
            out.append(replace(s, body=_hoist(s.body, counter)))
        elif isinstance(s, If):
            out.append(replace(s, then=_hoist(s.then, counter), orelse=_hoist(s.orelse, counter)))
        else:
            out.append(s)
    return tuple(out)


def hoist_divisors(p: Program) -> Program:
    kernels: list[Kernel] = []
    for k in p.kernels:
        kernels.append(replace(k, body=_hoist(k.body, [0])))
    return replace(p, kernels=tuple(kernels))
