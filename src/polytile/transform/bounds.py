"""Conditions to loop bounds: an ``If`` that is the whole body of a loop and whose condition
is a conjunction of affine comparisons is split into parts that do not depend on the loop
variable (hoisted above the loop) and parts linear in it (folded into the loop bounds).
This removes the padding checks of convolution and pooling from their innermost loops.

A loop whose body is one store of ``where(cond, a, b)`` is split the same way (index-set
splitting): the range of the loop variable where the affine conjuncts of ``cond`` hold stores
``a``, the ranges before and after it store ``b``. An im2col pack of a padded image becomes
zero fills around a copy the C compiler vectorizes."""
from __future__ import annotations

from dataclasses import replace

from ..affine.ir import INDEX, Expr, For, If, Load, Op, Program, Stmt, Store, c
from ..affine.linear import linear_form, to_expr

_CMP = ("lt", "le", "gt", "ge")


def _conjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, Op) and e.fn == "logical_and":
        return _conjuncts(e.args[0]) + _conjuncts(e.args[1])
    return [e]


def _and(cs: list[Expr]) -> Expr:
    e = cs[0]
    for x in cs[1:]:
        e = Op("logical_and", (e, x), "bool")
    return e


def _ceildiv(a: Expr, k: int) -> Expr:
    return Op("floordiv", (Op("add", (a, c(k - 1)), INDEX), c(k)), INDEX) if k != 1 else a


def _floordiv(a: Expr, k: int) -> Expr:
    return Op("floordiv", (a, c(k)), INDEX) if k != 1 else a


def _bound(cmp: Expr, var: str):
    """('lo' | 'hi', expr) with cmp <=> var >= expr (or var < expr); None if not of that form."""
    if not (isinstance(cmp, Op) and cmp.fn in _CMP):
        return None
    la, lb = linear_form(cmp.args[0]), linear_form(cmp.args[1])
    if la is None or lb is None:
        return None
    coefs = dict(la[0])  # normalize to  k*var + R  OP  0
    for v, k in lb[0].items():
        coefs[v] = coefs.get(v, 0) - k
    const = la[1] - lb[1]
    k = coefs.pop(var, 0)
    fn = cmp.fn
    if k == 0:
        return None
    if k < 0:  # multiply by -1: the comparison flips
        k, coefs, const = -k, {v: -x for v, x in coefs.items()}, -const
        fn = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}[fn]
    neg = to_expr({v: -x for v, x in coefs.items() if x}, -const)  # k*var OP -R
    if fn in ("ge", "gt"):  # var >= ceil((-R [+1]) / k)
        return "lo", _ceildiv(neg if fn == "ge" else Op("add", (neg, c(1)), INDEX), k)
    # var <= floor((-R [-1]) / k)  <=>  var < floor(...) + 1
    return "hi", Op("add", (_floordiv(neg if fn == "le" else Op("add", (neg, c(-1)), INDEX), k), c(1)), INDEX)


def _vars(e: Expr) -> set[str]:
    from ..affine.ir import Var, walk_exprs

    return {x.name for x in walk_exprs(e) if isinstance(x, Var)}


def _tighten(f: For, ivs: frozenset[str]) -> list[Stmt]:
    """``ivs``: loop variables enclosing f (conditions on anything else stay where they are)."""
    if len(f.body) != 1 or not isinstance(f.body[0], If) or f.body[0].orelse:
        return [f]
    cond = f.body[0]
    hoisted, lo, hi, keep = [], [f.lo], [f.hi], []
    for cj in _conjuncts(cond.cond):
        vs = _vars(cj)
        if not vs <= ivs | {f.var}:
            keep.append(cj)
            continue
        if f.var not in vs:
            hoisted.append(cj)
            continue
        b = _bound(cj, f.var)
        if b is None:
            keep.append(cj)
        elif b[0] == "lo":
            lo.append(b[1])
        else:
            hi.append(b[1])
    if len(lo) == 1 and len(hi) == 1 and not hoisted:
        return [f]
    new_lo = lo[0]
    for e in lo[1:]:
        new_lo = Op("maximum", (new_lo, e), INDEX)
    new_hi = hi[0]
    for e in hi[1:]:
        new_hi = Op("minimum", (new_hi, e), INDEX)
    body = (If(_and(keep), cond.then),) if keep else cond.then
    loop = replace(f, lo=new_lo, hi=new_hi, body=body)
    return [If(_and(hoisted), (loop,))] if hoisted else [loop]


def _split_select(f: For, ivs: frozenset[str]) -> list[Stmt]:
    if len(f.body) != 1 or not isinstance(f.body[0], Store):
        return [f]
    st = f.body[0]
    v = st.value
    if not (isinstance(v, Op) and v.fn == "where"):
        return [f]
    lo, hi, keep = [], [], []
    for cj in _conjuncts(v.args[0]):
        vs = _vars(cj)
        b = _bound(cj, f.var) if f.var in vs and vs <= ivs | {f.var} else None
        if b is None:
            keep.append(cj)
        else:
            (lo if b[0] == "lo" else hi).append(b[1])
    if not lo and not hi:
        return [f]
    mlo, mhi = f.lo, f.hi
    for e in lo:
        mlo = Op("maximum", (mlo, e), INDEX)
    for e in hi:
        mhi = Op("minimum", (mhi, e), INDEX)
    # [f.lo, mlo) stores b, [mlo, mhi) the selected value, [max(mlo, mhi), f.hi) b again: the
    # pieces cover the loop's range once, in order, also when the middle one is empty; each
    # bound is a maximum of lower or a minimum of upper bounds, which isl reads as constraints
    # conjuncts on enclosing loops only choose between two middle loops (one test per range)
    outer = [cj for cj in keep if _vars(cj) <= ivs]
    keep = [cj for cj in keep if not _vars(cj) <= ivs]
    mid = Op("where", (_and(keep), v.args[1], v.args[2]), v.dtype) if keep else v.args[1]
    other = replace(st, value=v.args[2])
    out: list[Stmt] = []
    if lo:
        out.append(replace(f, hi=Op("minimum", (f.hi, mlo), INDEX), body=(other,)))
    if not (isinstance(mid, Load) and mid.buf == st.buf and mid.index == st.index):  # else a no-op copy
        middle: Stmt = replace(f, lo=mlo, hi=mhi, body=(replace(st, value=mid),))
        if outer:
            middle = If(_and(outer), (middle,), (replace(f, lo=mlo, hi=mhi, body=(other,)),))
        out.append(middle)
    if hi:
        out.append(replace(f, lo=Op("maximum", (mlo, mhi), INDEX), body=(other,)))
    return out


def _rewrite(body: tuple[Stmt, ...], ivs: frozenset[str] = frozenset()) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, For):
            s = replace(s, body=_rewrite(s.body, ivs | {s.var}))
            for t in _tighten(s, ivs):
                out += _split_select(t, ivs) if isinstance(t, For) else [t]
        elif isinstance(s, If):
            out.append(replace(s, then=_rewrite(s.then, ivs), orelse=_rewrite(s.orelse, ivs)))
        else:
            out.append(s)
    return tuple(out)


def conditions_to_bounds(p: Program) -> Program:
    return replace(p, kernels=tuple(replace(k, body=_rewrite(k.body)) for k in p.kernels))
