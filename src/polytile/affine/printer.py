"""Text form of the affine IR, in the style of MLIR's affine dialect (for reading and dumps)."""
from __future__ import annotations

from .ir import lanes, Alloc, Assign, Const, Expr, Fail, For, If, Kernel, Let, Load, Op, Prefetch, Program, Stmt, Store, Var

_INFIX = {"add": "+", "sub": "-", "mul": "*", "floordiv": "floordiv", "remainder": "mod"}


def expr(e: Expr) -> str:
    if isinstance(e, Const):
        return repr(e.value)
    if isinstance(e, Var):
        return "%" + e.name
    if isinstance(e, Load):
        if lanes(e.dtype) > 1:
            return f"affine.vector_load %{e.buf}[{expr(e.index)}] : {e.dtype}"
        return f"affine.load %{e.buf}[{expr(e.index)}]"
    if e.fn in _INFIX and e.dtype == "int64":
        return f"({expr(e.args[0])} {_INFIX[e.fn]} {expr(e.args[1])})"
    if e.fn in ("cast", "narrow"):
        return f"{e.fn}<{e.dtype}>({expr(e.args[0])})"
    return f"{e.fn}({', '.join(expr(a) for a in e.args)})"


def stmts(body: tuple[Stmt, ...], ind: int) -> list[str]:
    pad = "  " * ind
    out: list[str] = []
    for s in body:
        if isinstance(s, For):
            tag = "affine.parallel" if s.parallel else "affine.for"
            shared = f"  // workers collapse({s.workers})" if s.workers else ""
            out.append(f"{pad}{tag} %{s.var} = {expr(s.lo)} to {expr(s.hi)} {{{shared}")
            out += stmts(s.body, ind + 1)
            out.append(pad + "}")
        elif isinstance(s, Store):
            op = "affine.vector_store" if lanes(s.value.dtype) > 1 else "affine.store"
            out.append(f"{pad}{op} {expr(s.value)}, %{s.buf}[{expr(s.index)}]")
        elif isinstance(s, Let):
            out.append(f"{pad}%{s.name} : {s.dtype} = {expr(s.value)}")
        elif isinstance(s, Assign):
            out.append(f"{pad}%{s.name} = {expr(s.value)}")
        elif isinstance(s, If):
            out.append(f"{pad}affine.if {expr(s.cond)} {{")
            out += stmts(s.then, ind + 1)
            if s.orelse:
                out.append(pad + "} else {")
                out += stmts(s.orelse, ind + 1)
            out.append(pad + "}")
        elif isinstance(s, Fail):
            out.append(f"{pad}fail {s.code}")
        elif isinstance(s, Alloc):
            out.append(f"{pad}%{s.name} = memref.alloca() : {s.dtype}[{s.size}]")
        elif isinstance(s, Prefetch):
            out.append(f"{pad}affine.prefetch %{s.buf}[{expr(s.index)}], {'write' if s.write else 'read'}, "
                       f"locality<{s.locality}>")
        else:  # pragma: no cover
            raise TypeError(s)
    return out


def format_kernel(k: Kernel) -> str:
    cached = "  // cached: runs when the parameters it reads change" if k.cached else ""
    return "\n".join([f"func @{k.name}()  // {k.origin}{cached}  {{", *stmts(k.body, 1), "}"])


def format_program(p: Program) -> str:
    lines = [f"memref %{b.name} : {b.dtype}[{b.size}]  // {b.kind}{' (parameter)' if b.static else ''}"
             for b in p.buffers]
    return "\n".join(lines) + "\n\n" + "\n\n".join(format_kernel(k) for k in p.kernels) + "\n"
