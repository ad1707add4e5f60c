"""What the fusion passes share: who reads and writes each buffer, rewriting expressions and
statements, the shape of a kernel's loop nest, renaming a nest's local names."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator

from ..affine import isl as pisl
from ..affine.ir import (Alloc, Assign, Expr, For, If, Kernel, Let, Load, Op, Prefetch, Program, Stmt, Store, Var,
                         buffers_used, stmt_exprs, trip_count, walk_exprs, walk_stmts)

MAX_ORIGIN = 160


def map_expr(e: Expr, fn: Callable[[Expr], Expr]) -> Expr:
    """Rewrite bottom-up: children first, then ``fn`` on the rebuilt node (the node itself where
    no child changed: most of a kernel's subexpressions come through a rewrite untouched)."""
    if isinstance(e, Load):
        index = map_expr(e.index, fn)
        if index is not e.index:
            e = Load(e.buf, index, e.dtype)
    elif isinstance(e, Op):
        args = tuple(map_expr(a, fn) for a in e.args)
        if any(x is not y for x, y in zip(args, e.args)):
            e = Op(e.fn, args, e.dtype)
    return fn(e)


def subst_vars(e: Expr, m: dict[str, Expr]) -> Expr:
    return map_expr(e, lambda x: m.get(x.name, x) if isinstance(x, Var) else x)


def map_stmt_exprs(body: tuple[Stmt, ...], fn: Callable[[Expr], Expr]) -> tuple[Stmt, ...]:
    """Every expression of every statement under ``body`` through ``map_expr(_, fn)``."""
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, For):
            s = replace(s, lo=map_expr(s.lo, fn), hi=map_expr(s.hi, fn), body=map_stmt_exprs(s.body, fn))
        elif isinstance(s, Store):
            s = replace(s, index=map_expr(s.index, fn), value=map_expr(s.value, fn))
        elif isinstance(s, (Let, Assign)):
            s = replace(s, value=map_expr(s.value, fn))
        elif isinstance(s, If):
            s = replace(s, cond=map_expr(s.cond, fn), then=map_stmt_exprs(s.then, fn),
                        orelse=map_stmt_exprs(s.orelse, fn))
        elif isinstance(s, Prefetch):
            s = replace(s, index=map_expr(s.index, fn))
        out.append(s)
    return tuple(out)


class Context:
    """Where a statement sits: its enclosing loops and the affine constraints of its domain."""

    def __init__(self, loops: tuple[For, ...] = (), cons: tuple[str, ...] = (), exact: bool = True):
        self.loops, self.cons, self.exact = loops, cons, exact

    @property
    def ivs(self) -> tuple[str, ...]:
        return tuple(f.var for f in self.loops)

    def enter_loop(self, f: For) -> "Context":
        return Context(self.loops + (f,), self.cons + pisl.loop_constraints(f),
                       self.exact and pisl.aff(f.lo) is not None and pisl.aff(f.hi) is not None)

    def enter_if(self, cond: Expr, branch: bool) -> "Context":
        cs = tuple(pisl.cond(cond, self.ivs)) if branch else ()
        exact = self.exact and branch and _fully_affine(cond, self.ivs)
        return Context(self.loops, self.cons + cs, exact)

    def access(self, buf: str, index: Expr, size: int, write: bool) -> pisl.Access:
        return pisl.Access(buf, write, self.ivs, (), self.cons, pisl.index_aff(index, self.ivs), size)

    def executions(self) -> int:
        """How many times a statement here runs (loops of unknown trip count count once)."""
        n = 1
        for f in self.loops:
            n *= trip_count(f) or 1
        return n


def _fully_affine(cond: Expr, ivs: tuple[str, ...]) -> bool:
    if isinstance(cond, Op) and cond.fn == "logical_and":
        return all(_fully_affine(a, ivs) for a in cond.args)
    return len(pisl.cond(cond, ivs)) == 1


def statements(body: tuple[Stmt, ...], ctx: Context | None = None) -> Iterator[tuple[Stmt, Context]]:
    """Every statement under ``body`` with its context."""
    ctx = ctx or Context()
    for s in body:
        yield s, ctx
        if isinstance(s, For):
            yield from statements(s.body, ctx.enter_loop(s))
        elif isinstance(s, If):
            yield from statements(s.then, ctx.enter_if(s.cond, True))
            yield from statements(s.orelse, ctx.enter_if(s.cond, False))


def rewrite_loads(body: tuple[Stmt, ...], buf: str, fn: Callable[[Load, Context], Expr],
                  ctx: Context | None = None) -> tuple[Stmt, ...]:
    """``body`` with every load of ``buf`` replaced by ``fn(load, its context)``."""
    ctx = ctx or Context()

    def ex(e: Expr, c: Context) -> Expr:
        return map_expr(e, lambda x: fn(x, c) if isinstance(x, Load) and x.buf == buf else x)

    out: list[Stmt] = []
    for s in body:
        if isinstance(s, For):
            inner = ctx.enter_loop(s)
            s = replace(s, lo=ex(s.lo, ctx), hi=ex(s.hi, ctx), body=rewrite_loads(s.body, buf, fn, inner))
        elif isinstance(s, Store):
            s = replace(s, index=ex(s.index, ctx), value=ex(s.value, ctx))
        elif isinstance(s, (Let, Assign)):
            s = replace(s, value=ex(s.value, ctx))
        elif isinstance(s, If):
            s = replace(s, cond=ex(s.cond, ctx), then=rewrite_loads(s.then, buf, fn, ctx.enter_if(s.cond, True)),
                        orelse=rewrite_loads(s.orelse, buf, fn, ctx.enter_if(s.cond, False)))
        elif isinstance(s, Prefetch):
            s = replace(s, index=ex(s.index, ctx))
        out.append(s)
    return tuple(out)


def loads_of(e: Expr) -> set[str]:
    return {x.buf for x in walk_exprs(e) if isinstance(x, Load)}


def perfect_store(k: Kernel) -> tuple[list[For], Store] | None:
    """(loops, store) when the kernel is a perfect nest of constant-bound loops around a single
    store (an elementwise-like nest), else None."""
    loops: list[For] = []
    body = k.body
    while len(body) == 1 and isinstance(body[0], For):
        f = body[0]
        if trip_count(f) is None:
            return None
        loops.append(f)
        body = f.body
    if len(body) != 1 or not isinstance(body[0], Store):
        return None
    st = body[0]
    ivs = {f.var for f in loops}
    if any(isinstance(x, Var) and x.name not in ivs for e in (st.index, st.value) for x in walk_exprs(e)):
        return None
    return loops, st


def root_chain(k: Kernel) -> list[For]:
    """The loops nested perfectly from the kernel's single root loop (the last may have any body)."""
    if len(k.body) != 1 or not isinstance(k.body[0], For):
        return []
    out = [k.body[0]]
    while len(out[-1].body) == 1 and isinstance(out[-1].body[0], For):
        out.append(out[-1].body[0])
    return out


class Uses:
    """Which kernels (by position) read and write each program buffer; positions are stable
    while a pass runs (fused-away kernels become None)."""

    def __init__(self, kernels: list[Kernel | None]):
        self.kernels = kernels
        self.readers: dict[str, set[int]] = {}
        self.writers: dict[str, set[int]] = {}
        for i, k in enumerate(kernels):
            if k is not None:
                self._add(i, k)

    def _add(self, i: int, k: Kernel) -> None:
        r, w = buffers_used(k)
        for b in r:
            self.readers.setdefault(b, set()).add(i)
        for b in w:
            self.writers.setdefault(b, set()).add(i)

    def _remove(self, i: int) -> None:
        for m in (self.readers, self.writers):
            for s in m.values():
                s.discard(i)

    def set(self, i: int, k: Kernel | None) -> None:
        self._remove(i)
        self.kernels[i] = k
        if k is not None:
            self._add(i, k)

    def touched(self, i: int) -> tuple[set[str], set[str]]:
        k = self.kernels[i]
        return buffers_used(k) if k is not None else (set(), set())

    def between(self, lo: int, hi: int) -> list[int]:
        return [j for j in range(lo + 1, hi) if self.kernels[j] is not None]


def conflict(a: tuple[set[str], set[str]], b: tuple[set[str], set[str]]) -> bool:
    """Whether two kernels' (reads, writes) share a buffer that one of them writes."""
    (ra, wa), (rb, wb) = a, b
    return bool(wa & (rb | wb) or wb & ra)


def finish(p: Program, kernels: list[Kernel | None]) -> Program:
    """The program with fused-away kernels removed and buffers nobody touches any more dropped."""
    ks = tuple(k for k in kernels if k is not None)
    used: set[str] = set()
    for k in ks:
        r, w = buffers_used(k)
        used |= r | w
    bufs = tuple(b for b in p.buffers if b.kind != "temp" or b.name in used)
    return replace(p, kernels=ks, buffers=bufs)


def join_origin(a: str, b: str) -> str:
    s = f"{a} + {b}"
    return s if len(s) <= MAX_ORIGIN else s[:MAX_ORIGIN - 3] + "..."


def declared_names(body: tuple[Stmt, ...]) -> set[str]:
    """Loop variables, scalars and local arrays declared under ``body``."""
    out = set()
    for s in walk_stmts(body):
        if isinstance(s, For):
            out.add(s.var)
        elif isinstance(s, (Let, Alloc)):
            out.add(s.name)
    return out


def rename_locals(body: tuple[Stmt, ...], m: dict[str, str]) -> tuple[Stmt, ...]:
    """Rename loop variables, scalars and local arrays (not program buffers) through ``m``."""
    def ex(e: Expr) -> Expr:
        def f(x):
            if isinstance(x, Var) and x.name in m:
                return replace(x, name=m[x.name])
            if isinstance(x, Load) and x.buf in m:
                return replace(x, buf=m[x.buf])
            return x
        return map_expr(e, f)

    out: list[Stmt] = []
    for s in body:
        if isinstance(s, For):
            s = replace(s, var=m.get(s.var, s.var), lo=ex(s.lo), hi=ex(s.hi), body=rename_locals(s.body, m),
                        reduce_arrays=tuple((m.get(a, a), n) for a, n in s.reduce_arrays))
        elif isinstance(s, Store):
            s = Store(m.get(s.buf, s.buf), ex(s.index), ex(s.value))
        elif isinstance(s, Let):
            s = Let(m.get(s.name, s.name), s.dtype, ex(s.value))
        elif isinstance(s, Assign):
            s = Assign(m.get(s.name, s.name), ex(s.value))
        elif isinstance(s, If):
            s = If(ex(s.cond), rename_locals(s.then, m), rename_locals(s.orelse, m))
        elif isinstance(s, Prefetch):
            s = replace(s, buf=m.get(s.buf, s.buf), index=ex(s.index))
        elif isinstance(s, Alloc):
            s = replace(s, name=m.get(s.name, s.name))
        out.append(s)
    return tuple(out)


def all_exprs(body: tuple[Stmt, ...]) -> Iterator[Expr]:
    for s in walk_stmts(body):
        for e in stmt_exprs(s):
            yield from walk_exprs(e)
