"""Small statement builders shared by the contraction tilings."""
from __future__ import annotations

from dataclasses import replace

from ..affine.ir import Buffer, Expr, For, If, Op, Prefetch, Stmt, Var, c, mul


def when(cond: Expr | bool, then: list[Stmt], orelse: list[Stmt] | None = None) -> list[Stmt]:
    """``then`` if ``cond`` (a constant or a runtime test), else ``orelse``."""
    if cond is True:
        return then
    if cond is False:
        return list(orelse or [])
    return [If(cond, tuple(then), tuple(orelse or ()))]


def reduction_blocks(total: int, size: int) -> list[tuple]:
    """The blocks of a reduction of ``total`` in pieces of ``size``: [(start, length, loop trip
    count or 0, reload, final)]. Full blocks run in a loop over ``kb``, the rest (if any) as one
    more block; ``reload`` (accumulators carried in from a previous block) and ``final`` (the
    epilogue runs) are constants or runtime tests on ``kb``."""
    nkb, rem = total // size, total % size
    kb = Var("kb")
    blocks: list[tuple] = [(mul(kb, c(size)), size, nkb, Op("lt", (c(0), kb), "bool"),
                            False if rem else Op("eq", (kb, c(nkb - 1)), "bool"))]
    if rem:
        blocks.append((c(nkb * size), rem, 0, True, True))
    return blocks


def new_temp(buffers: list, size: int) -> str:
    """Append a new float32 temp of ``size`` elements (in the arena) to ``buffers``; its name."""
    name = f"pk{sum(1 for x in buffers if x.name.startswith('pk'))}"
    buffers.append(Buffer(name, "float32", size, "temp"))
    return name


def drop_prefetches(body: tuple[Stmt, ...], which=lambda s: True) -> tuple[Stmt, ...]:
    """``body`` without the Prefetch statements ``which`` selects (and Ifs left empty by them)."""
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Prefetch) and which(s):
            continue
        if isinstance(s, For):
            s = replace(s, body=drop_prefetches(s.body, which))
        elif isinstance(s, If):
            s = replace(s, then=drop_prefetches(s.then, which), orelse=drop_prefetches(s.orelse, which))
            if not s.then and not s.orelse:
                continue
        out.append(s)
    return tuple(out)
