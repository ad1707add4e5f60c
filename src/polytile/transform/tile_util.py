"""Small statement builders shared by the contraction tilings."""
from __future__ import annotations

from ..affine.ir import Expr, If, Stmt


def when(cond: Expr | bool, then: list[Stmt], orelse: list[Stmt] | None = None) -> list[Stmt]:
    """``then`` if ``cond`` (a constant or a runtime test), else ``orelse``."""
    if cond is True:
        return then
    if cond is False:
        return list(orelse or [])
    return [If(cond, tuple(then), tuple(orelse or ()))]
