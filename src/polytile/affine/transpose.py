"""An in-register transpose of a block of vw x vw floats (vw = the vector lanes, a power of two),
as IR statements: vw vector loads (the block's rows), log2(vw) stages of two-vector shuffles,
vw vector stores (its columns). Stage h pairs rows i and i + h (bit h of i clear) and swaps
their off-diagonal h x h sub-blocks: row i keeps the first half of each 2h-lane group of both,
row i + h the second halves (``interleave_lo``/``interleave_hi`` below); after the stage
with h = 1 the rows are the columns. 16 x 16 floats: 64 shuffles instead of 256 scalar
element copies, each reading a different cache line."""
from __future__ import annotations

from typing import Callable

from .ir import Expr, Let, Op, Stmt, Var


def interleave_mask(n: int, h: int, high: bool) -> list[int]:
    """Lane sources (0..n-1 from the first vector, n..2n-1 from the second) of
    ``interleave_lo{h}`` (``high`` False) or ``interleave_hi{h}`` on n-lane vectors."""
    out = []
    for k in range(n):
        g, w = divmod(k, 2 * h)
        base = g * 2 * h + (h if high else 0)
        out.append(base + w if w < h else n + base + w - h)
    return out


def transposed_block(vw: int, vt: str, load_row: Callable[[int], Expr],
                     store_col: Callable[[int, Expr], Stmt], prefix: str = "tb") -> list[Stmt]:
    """Statements that load rows ``load_row(k)`` (k < vw, vectors of vt) and store column k
    of that block with ``store_col(k, vector)``."""
    assert vw >= 2 and vw & (vw - 1) == 0
    stmts: list[Stmt] = [Let(f"{prefix}0_{k}", vt, load_row(k)) for k in range(vw)]
    names = [f"{prefix}0_{k}" for k in range(vw)]
    h, stage = vw // 2, 1
    while h >= 1:
        new = list(names)
        for i in range(vw):
            if (i // h) % 2 == 0:
                x, y = Var(names[i], vt), Var(names[i + h], vt)
                a, b = f"{prefix}{stage}_{i}", f"{prefix}{stage}_{i + h}"
                stmts.append(Let(a, vt, Op(f"interleave_lo{h}", (x, y), vt)))
                stmts.append(Let(b, vt, Op(f"interleave_hi{h}", (x, y), vt)))
                new[i], new[i + h] = a, b
        names, h, stage = new, h // 2, stage + 1
    stmts += [store_col(k, Var(names[k], vt)) for k in range(vw)]
    return stmts


def lane_sums(vw: int, vt: str, rows: list[Expr], prefix: str = "ls") -> tuple[list[Stmt], Expr]:
    """(statements, vector) whose lane k is the sum of the lanes of ``rows[k]`` (vw vectors of vt):
    log2(vw) stages, each pairing vector i with i + n/2 (n: the vectors left) and adding the two
    halves of every 2h-lane group of both (``interleave_lo``/``interleave_hi``), which halves the
    vectors: vw - 1 pairs of shuffles and adds, for vw dot products reduced at once."""
    assert vw >= 2 and vw & (vw - 1) == 0 and len(rows) == vw
    stmts: list[Stmt] = []
    cur: list[Expr] = list(rows)
    h, stage = vw // 2, 1
    while h >= 1:
        half = len(cur) // 2
        new: list[Expr] = []
        for i in range(half):
            x, y = cur[i], cur[i + half]
            name = f"{prefix}{stage}_{i}"
            stmts.append(Let(name, vt, Op("add", (Op(f"interleave_lo{h}", (x, y), vt),
                                                  Op(f"interleave_hi{h}", (x, y), vt)), vt)))
            new.append(Var(name, vt))
        cur, h, stage = new, h // 2, stage + 1
    return stmts, cur[0]
