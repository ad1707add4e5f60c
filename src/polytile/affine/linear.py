"""Linear forms of index expressions: sum(coef * var) + const, for analyses and rewrites."""
from __future__ import annotations

from .ir import INDEX, Const, Expr, Op, Var, add, c, mul

LinearForm = tuple[dict[str, int], int]


def linear_form(e: Expr) -> LinearForm | None:
    """{var: coef}, const for an index expression built from +, -, * by constants; else None.
    A sum whose quotient and remainder of one division cancel into the dividend,
    ``(x // a) * (a s) + (x % a) * s = x s`` (a flat row index split into the coordinates of
    a tensor of more dims and flattened again: a view of a fused producer), is linear too."""
    lf = _linear(e)
    if lf is None and isinstance(e, Op) and e.fn in ("add", "sub", "mul"):
        return _folded(e)
    return lf


def _linear(e: Expr) -> LinearForm | None:
    if isinstance(e, Const):
        return ({}, int(e.value)) if e.dtype == INDEX else None
    if isinstance(e, Var):
        return ({e.name: 1}, 0) if e.dtype == INDEX else None
    if not isinstance(e, Op) or e.dtype != INDEX:
        return None
    if e.fn in ("add", "sub"):
        a, b = _linear(e.args[0]), _linear(e.args[1])
        if a is None or b is None:
            return None
        sign = 1 if e.fn == "add" else -1
        coefs = dict(a[0])
        for v, k in b[0].items():
            coefs[v] = coefs.get(v, 0) + sign * k
        return {v: k for v, k in coefs.items() if k}, a[1] + sign * b[1]
    if e.fn == "mul":
        a, b = _linear(e.args[0]), _linear(e.args[1])
        if a is None or b is None:
            return None
        if not a[0]:
            a, b = b, a
        if b[0]:
            return None  # product of two variables
        k = b[1]
        return ({v: x * k for v, x in a[0].items() if x * k}, a[1] * k)
    return None


def _quasi(e: Expr) -> tuple[dict, int] | None:
    """Like ``_linear``, with a quotient or remainder by a constant as a term of its own
    (keyed ("floordiv" | "remainder", dividend, divisor))."""
    if isinstance(e, Op) and e.fn in ("floordiv", "remainder") and e.dtype == INDEX \
            and isinstance(e.args[1], Const) and int(e.args[1].value) > 0:
        return {(e.fn, e.args[0], int(e.args[1].value)): 1}, 0
    if isinstance(e, Op) and e.fn in ("add", "sub", "mul") and e.dtype == INDEX:
        a, b = _quasi(e.args[0]), _quasi(e.args[1])
        if a is None or b is None:
            return None
        if e.fn == "mul":
            if not a[0]:
                a, b = b, a
            if b[0]:
                return None
            return {v: x * b[1] for v, x in a[0].items() if x * b[1]}, a[1] * b[1]
        sign = 1 if e.fn == "add" else -1
        coefs = dict(a[0])
        for v, k in b[0].items():
            coefs[v] = coefs.get(v, 0) + sign * k
        return {v: k for v, k in coefs.items() if k}, a[1] + sign * b[1]
    return _linear(e)


def _folded(e: Expr) -> LinearForm | None:
    q = _quasi(e)
    if q is None:
        return None
    coefs, const = dict(q[0]), q[1]
    for key in [k for k in coefs if isinstance(k, tuple) and k[0] == "remainder"]:
        _, x, a = key
        s = coefs.get(key, 0)
        if coefs.get(("floordiv", x, a), 0) != s * a or (lx := linear_form(x)) is None:
            return None
        del coefs[key], coefs[("floordiv", x, a)]
        for v, k in lx[0].items():
            coefs[v] = coefs.get(v, 0) + s * k
        const += s * lx[1]
    if any(isinstance(k, tuple) for k in coefs):
        return None
    return {v: k for v, k in coefs.items() if k}, const


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


def simplify_divmod(e: Expr, ranges: dict[str, tuple[int, int]]) -> Expr:
    """``e`` with floordiv / remainder by a positive constant removed where the variables'
    ranges (``{var: (lo, hi)}``, hi exclusive) prove the quotient's fractional part stays in
    one step: floordiv(32*jo + jj, 32) is jo and remainder(32*jo + jj, 32) is jj when jj is in
    [0, 32). Anything else is left as it is."""
    from dataclasses import replace as _replace

    from .ir import Load, walk_exprs

    def split(x: Expr, k: int):
        lf = linear_form(x)
        if lf is None:
            return None
        q = {v: a // k for v, a in lf[0].items() if a % k == 0}
        r = {v: a for v, a in lf[0].items() if a % k}
        lo = hi = lf[1] % k
        for v, a in r.items():
            if v not in ranges:
                return None
            vlo, vhi = ranges[v][0], ranges[v][1] - 1
            lo += min(a * vlo, a * vhi)
            hi += max(a * vlo, a * vhi)
        if lo // k != hi // k:
            return None
        t = lo // k
        return to_expr(q, lf[1] // k + t), to_expr(r, lf[1] % k - t * k)

    def go(x: Expr) -> Expr:
        if isinstance(x, Load):
            return _replace(x, index=go(x.index))
        if not isinstance(x, Op):
            return x
        x = _replace(x, args=tuple(go(a) for a in x.args))
        if x.fn in ("floordiv", "remainder") and x.dtype == INDEX and isinstance(x.args[1], Const) \
                and x.args[1].value > 0:
            s = split(x.args[0], int(x.args[1].value))
            if s is not None:
                return s[0] if x.fn == "floordiv" else s[1]
        return x

    return go(e) if any(isinstance(x, Op) and x.fn in ("floordiv", "remainder") for x in walk_exprs(e)) else e
