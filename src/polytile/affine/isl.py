"""The only islpy glue: affine expressions, iteration domains and access relations as isl objects."""
from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from .ir import INDEX, Alloc, Const, Expr, For, If, Load, Op, Stmt, Store, Var, stmt_exprs, walk_exprs

_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "="}


def aff(e: Expr) -> str | None:
    """isl syntax for an affine index expression, or None when it is not affine."""
    if isinstance(e, Const):
        return str(int(e.value)) if e.dtype == INDEX else None
    if isinstance(e, Var):
        return e.name if e.dtype == INDEX else None
    if isinstance(e, Load) or e.dtype != INDEX:
        return None
    args = [aff(a) for a in e.args]
    if any(a is None for a in args):
        return None
    if e.fn in ("add", "sub"):
        return f"({args[0]} {'+' if e.fn == 'add' else '-'} {args[1]})"
    if e.fn == "mul" and (isinstance(e.args[0], Const) or isinstance(e.args[1], Const)):
        return f"({args[0]} * {args[1]})"
    if e.fn in ("floordiv", "remainder") and isinstance(e.args[1], Const) and e.args[1].value > 0:
        return f"floor({args[0]}/{args[1]})" if e.fn == "floordiv" else f"({args[0]} mod {args[1]})"
    return None


def cond(e: Expr) -> list[str]:
    """Affine constraints implied by a condition (a conjunction); non-affine parts are dropped."""
    if isinstance(e, Op) and e.fn == "logical_and":
        return cond(e.args[0]) + cond(e.args[1])
    if isinstance(e, Op) and e.fn in _CMP:
        a, b = aff(e.args[0]), aff(e.args[1])
        if a is not None and b is not None:
            return [f"{a} {_CMP[e.fn]} {b}"]
    return []


@dataclass(frozen=True)
class Access:
    buf: str
    write: bool
    ivs: tuple[str, ...]  # enclosing loop variables, outermost first
    loops: tuple[int, ...]  # id() of the enclosing For statements
    constraints: tuple[str, ...]  # the statement's domain
    index: str | None  # affine index, or None (indirect: any element)
    size: int
    private_below: int = -1  # local array declared inside this many loops (-1: a program buffer)


def accesses(body: tuple[Stmt, ...], sizes: dict[str, int]) -> list[Access]:
    """Every load and store under ``body`` with its iteration domain."""
    out: list[Access] = []
    sizes = dict(sizes)
    depth_of: dict[str, int] = {}

    def visit(stmts, ivs, cons, loops=()):
        for s in stmts:
            if isinstance(s, Alloc):
                sizes[s.name] = s.size
                depth_of[s.name] = len(loops)
                continue
            if isinstance(s, For):
                c2 = list(cons)
                lo, hi = aff(s.lo), aff(s.hi)
                if lo is not None:
                    c2.append(f"{s.var} >= {lo}")
                if hi is not None:
                    c2.append(f"{s.var} < {hi}")
                visit(s.body, ivs + (s.var,), tuple(c2), loops + (id(s),))
                continue
            for e in stmt_exprs(s):
                for x in walk_exprs(e):
                    if isinstance(x, Load):
                        out.append(Access(x.buf, False, ivs, loops, cons, aff(x.index), sizes[x.buf],
                                          depth_of.get(x.buf, -1)))
            if isinstance(s, Store):
                out.append(Access(s.buf, True, ivs, loops, cons, aff(s.index), sizes[s.buf],
                                  depth_of.get(s.buf, -1)))
            if isinstance(s, If):
                visit(s.then, ivs, cons + tuple(cond(s.cond)), loops)
                visit(s.orelse, ivs, cons, loops)

    visit(body, (), ())
    return out


def relation(a: Access, keep: int) -> isl.Map:
    """{ [first `keep` ivs] -> [element] } touched by access ``a`` (inner ivs projected out)."""
    outer, inner = a.ivs[:keep], a.ivs[keep:]
    cons = list(a.constraints) + [f"0 <= o < {max(a.size, 1)}"]
    if a.index is not None:
        cons.append(f"o = {a.index}")
    body = " and ".join(cons)
    if inner:
        body = f"exists ({', '.join(inner)} : {body})"
    return isl.Map(f"{{ [{', '.join(outer)}] -> [o] : {body} }}")


def carried_dependence(accs: list[Access], depth: int) -> bool:
    """Whether two different iterations of loop ``depth`` (same outer iterations) touch the same
    element where at least one of them writes it."""
    keep = depth + 1
    names_a = [f"a{k}" for k in range(keep)]
    names_b = [f"b{k}" for k in range(keep)]
    same_outer = [f"{x} = {y}" for x, y in zip(names_a[:-1], names_b[:-1])]
    differ = f"({names_a[-1]} < {names_b[-1]} or {names_a[-1]} > {names_b[-1]})"
    pairs = isl.Map(f"{{ [{', '.join(names_a)}] -> [{', '.join(names_b)}] : "
                    f"{' and '.join(same_outer + [differ])} }}")
    accs = [a for a in accs if a.private_below <= depth]  # arrays declared inside are private
    bufs = {a.buf for a in accs if a.write}
    for buf in bufs:
        writes = [relation(a, keep) for a in accs if a.buf == buf and a.write]
        every = [relation(a, keep) for a in accs if a.buf == buf]
        for w in writes:
            for x in every:
                if not w.apply_range(x.reverse()).intersect(pairs).is_empty():
                    return True
    return False


def footprint(accs: list[Access], write: bool) -> dict[str, isl.Set]:
    """Per buffer, the set of elements read (or written) by these accesses."""
    out: dict[str, isl.Set] = {}
    for a in accs:
        if a.write != write:
            continue
        s = relation(a, 0).range()
        out[a.buf] = out[a.buf].union(s) if a.buf in out else s
    return out
