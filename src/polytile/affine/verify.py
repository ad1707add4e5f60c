"""Verifier of the affine IR: run after every pass when ``Options.verify`` is set."""
from __future__ import annotations

from .ir import (GROUPS, INDEX, SIZE_PREFIX, element_type, Alloc, Assign, Const, Expr, Fail, For, If, Let, Load, Op, Prefetch, Program, Stmt,
                 Store, Var, stmt_exprs, walk_exprs)


class VerifyError(AssertionError):
    pass


def verify_program(p: Program) -> None:
    bufs = {b.name: b for b in p.buffers}
    if len(bufs) != len(p.buffers):
        raise VerifyError("duplicate buffer names")
    for k in p.kernels:
        _verify_body(k.body, dict(bufs), {}, set(), k.name, shared=frozenset())


def _verify_body(body, bufs, scalars: dict[str, str], ivs: set[str], where: str, shared: frozenset) -> None:
    """``shared``: scalars declared outside the innermost parallel loop (must not be assigned)."""
    scalars = dict(scalars)
    bufs = dict(bufs)
    for s in body:
        for e in stmt_exprs(s):
            _check_expr(e, bufs, scalars, ivs, where)
        if isinstance(s, For):
            if s.var in ivs or s.var in scalars:
                raise VerifyError(f"{where}: loop variable {s.var} shadows another")
            _verify_body(s.body, bufs, scalars, ivs | {s.var}, where, frozenset(scalars) if s.parallel else shared)
        elif isinstance(s, Store):
            b = bufs.get(s.buf)
            if b is None or getattr(b, "kind", "local") == "input":
                raise VerifyError(f"{where}: store to {'input' if b else 'unknown'} buffer {s.buf}")
            if element_type(s.value.dtype) != b.dtype:
                raise VerifyError(f"{where}: store of {s.value.dtype} into {b.dtype} buffer {s.buf}")
            if s.index.dtype != INDEX:
                raise VerifyError(f"{where}: store index of type {s.index.dtype}")
        elif isinstance(s, Let):
            if s.value.dtype != s.dtype:
                raise VerifyError(f"{where}: let {s.name}: {s.dtype} = {s.value.dtype}")
            scalars[s.name] = s.dtype
            shared = shared - {s.name}
        elif isinstance(s, Assign):
            if s.name not in scalars:
                raise VerifyError(f"{where}: assignment to undeclared {s.name}")
            if s.name in shared:
                raise VerifyError(f"{where}: {s.name} is assigned inside a parallel loop it is declared outside of")
            if s.value.dtype != scalars[s.name]:
                raise VerifyError(f"{where}: {s.name}: {scalars[s.name]} = {s.value.dtype}")
        elif isinstance(s, If):
            if s.cond.dtype != "bool":
                raise VerifyError(f"{where}: if condition of type {s.cond.dtype}")
            _verify_body(s.then, bufs, scalars, ivs, where, shared)
            _verify_body(s.orelse, bufs, scalars, ivs, where, shared)
        elif isinstance(s, Alloc):
            if s.name in bufs:
                raise VerifyError(f"{where}: local array {s.name} shadows a buffer")
            bufs[s.name] = s
        elif isinstance(s, Prefetch):
            b = bufs.get(s.buf)
            if b is None or (s.write and getattr(b, "kind", "local") == "input"):
                raise VerifyError(f"{where}: prefetch{' for writing' if s.write else ''} of "
                                  f"{'input' if b else 'unknown'} buffer {s.buf}")
            if s.index.dtype != INDEX or s.locality not in (0, 1, 2, 3):
                raise VerifyError(f"{where}: prefetch index of type {s.index.dtype}, locality {s.locality}")
        elif not isinstance(s, Fail):
            raise VerifyError(f"{where}: unknown statement {s!r}")


def _check_expr(e: Expr, bufs, scalars, ivs, where) -> None:
    for x in walk_exprs(e):
        if isinstance(x, Var):
            if x.name in ivs or x.name.startswith(SIZE_PREFIX):  # a loop variable or a size parameter
                if x.dtype != INDEX:
                    raise VerifyError(f"{where}: index variable {x.name} used as {x.dtype}")
            elif x.name not in scalars:
                raise VerifyError(f"{where}: unbound variable {x.name}")
            elif scalars[x.name] != x.dtype:
                raise VerifyError(f"{where}: {x.name} is {scalars[x.name]}, used as {x.dtype}")
        elif isinstance(x, Load):
            b = bufs.get(x.buf)
            if b is None:
                raise VerifyError(f"{where}: load from unknown buffer {x.buf}")
            if b.dtype != element_type(x.dtype) and GROUPS.get(element_type(x.dtype), ("",))[0] != b.dtype:
                raise VerifyError(f"{where}: load of {x.dtype} from {b.dtype} buffer {x.buf}")
            if x.index.dtype != INDEX:
                raise VerifyError(f"{where}: index of type {x.index.dtype}")
