"""Linear forms of index expressions: sum(coef * var) + const, for analyses and rewrites."""
from __future__ import annotations

from .ir import INDEX, Const, Expr, Op, Var, add, c, mul

LinearForm = tuple[dict[str, int], int]


def linear_form(e: Expr) -> LinearForm | None:
    """{var: coef}, const for an index expression built from +, -, * by constants; else None."""
    if isinstance(e, Const):
        return ({}, int(e.value)) if e.dtype == INDEX else None
    if isinstance(e, Var):
        return ({e.name: 1}, 0) if e.dtype == INDEX else None
    if not isinstance(e, Op) or e.dtype != INDEX:
        return None
    if e.fn in ("add", "sub"):
        a, b = linear_form(e.args[0]), linear_form(e.args[1])
        if a is None or b is None:
            return None
        sign = 1 if e.fn == "add" else -1
        coefs = dict(a[0])
        for v, k in b[0].items():
            coefs[v] = coefs.get(v, 0) + sign * k
        return {v: k for v, k in coefs.items() if k}, a[1] + sign * b[1]
    if e.fn == "mul":
        a, b = linear_form(e.args[0]), linear_form(e.args[1])
        if a is None or b is None:
            return None
        if not a[0]:
            a, b = b, a
        if b[0]:
            return None  # product of two variables
        k = b[1]
        return ({v: x * k for v, x in a[0].items() if x * k}, a[1] * k)
    return None


def to_expr(coefs: dict[str, int], const: int) -> Expr:
    e: Expr = c(const)
    for v in sorted(coefs):
        k = coefs[v]
        if k:
            e = add(e, mul(Var(v), c(k)))
    return e


def uses_var(e: Expr, name: str) -> bool:
    from .ir import walk_exprs

    return any(isinstance(x, Var) and x.name == name for x in walk_exprs(e))
