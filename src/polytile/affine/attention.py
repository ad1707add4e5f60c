"""Target-neutral pieces of the attention op's lowering (each backend builds its own nest)."""
from __future__ import annotations

import math

from ..graph.ir import Node
from .ir import Const, Expr, Op, Var, add, c

F32 = "float32"
NEG_INF = Const(-math.inf, F32)


def _f(fn: str, *args: Expr, dtype: str = F32) -> Op:
    return Op(fn, tuple(args), dtype)


def score_step(b, step: tuple, s: Expr, masks: list[Node], bvars: list[Var], row: Expr, key: Expr) -> Expr:
    """One step of the chain from q.k to the softmax input (see graph.attention)."""
    fn = step[0]
    if fn == "causal":
        return _f("where", Op("le", (key, add(row, c(step[2]))), "bool"), s, NEG_INF)
    if fn in ("keep", "drop"):
        m = masks[step[1]]
        cond = b.read(m, b.bcast(m.shape, bvars + [row, key]))
        fillc = Const(step[2], F32)
        return _f("where", cond, s, fillc) if fn == "keep" else _f("where", cond, fillc, s)
    if step[1] == "c":
        other: Expr = Const(step[2], F32)
    else:
        m = masks[step[2]]
        other = b.read(m, b.bcast(m.shape, bvars + [row, key]))
    return _f(fn, s, other)
