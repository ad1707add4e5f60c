"""Which inner loops of a kernel run across the columns of a row tile (the ``rows`` form of
``codegen.triton``), and which kernel-local arrays then live in registers.

In the ``rows`` form each program holds ``rows x cols`` tensors: one row per iteration of the
kernel's outer parallel band, and the columns for the iterations of its inner loops:

- ``map``: a parallel loop with constant bounds whose body only stores (a fused elementwise
  step of a softmax or a layer norm) runs all its iterations at once, one per column;
- ``reduce``: a loop that only folds a value into an accumulator with ``add``, ``maximum`` or
  ``minimum`` becomes a reduction across the columns (``tl.reduce``);
- ``once``: a parallel loop of one iteration is its body, with the variable bound to its start.

A kernel-local array (``Alloc``) is kept in registers when every access to it is at the
column of a map or reduce loop starting at 0 (a ``rows x cols`` tensor) or, for an array of
one element, at index 0 outside such loops (a ``rows x 1`` tensor), and no access lies in a
loop that runs one iteration after another. The others stay in scratch memory.
"""
from __future__ import annotations

from ..affine.ir import Alloc, Assign, Const, Expr, For, If, Let, Load, Op, Store, Var, walk_exprs

REDUCERS = ("add", "maximum", "minimum")


def _const_bounds(f: For) -> bool:
    return isinstance(f.lo, Const) and isinstance(f.hi, Const)


def reduction(f: For):
    """(accumulator, op, value) when ``f`` only folds ``value`` into ``accumulator``."""
    if len(f.body) != 1 or not isinstance(f.body[0], Assign):
        return None
    a = f.body[0]
    v = a.value
    if not (isinstance(v, Op) and v.fn in REDUCERS and isinstance(v.args[0], Var) and v.args[0].name == a.name):
        return None
    if any(isinstance(x, Var) and x.name == a.name for x in walk_exprs(v.args[1])):
        return None
    dt = v.dtype
    if not (dt in ("float32", "float64") or (v.fn == "add" and dt in ("int64", "int32"))):
        return None  # a max/min without an identity element of its type stays sequential
    return a.name, v.fn, v.args[1]


def loop_kind(f: For, max_cols: int) -> str | None:
    if not _const_bounds(f):
        return None
    n = f.hi.value - f.lo.value
    if f.parallel and n == 1:
        return "once"
    if n > max_cols or n < 1:
        return None
    if f.parallel and all(isinstance(s, Store) for s in f.body):
        return "map"
    if reduction(f) is not None:
        return "reduce"
    return None


def vector_extent(body: tuple, max_cols: int) -> int:
    """The largest trip count of a map or reduce loop in ``body`` (0: none)."""
    best = 0
    for s in body:
        if isinstance(s, For):
            k = loop_kind(s, max_cols)
            if k in ("map", "reduce"):
                best = max(best, s.hi.value - s.lo.value)
            elif k == "once" or k is None:
                best = max(best, vector_extent(s.body, max_cols))
        elif isinstance(s, If):
            best = max(best, vector_extent(s.then, max_cols), vector_extent(s.orelse, max_cols))
    return best


def register_arrays(body: tuple, local: dict[str, Alloc], max_cols: int) -> dict[str, str]:
    """Kernel-local array -> "cols" (a rows x cols register tensor) or "row" (rows x 1)."""
    ok = {name: "cols" if a.size > 1 else "row" for name, a in local.items() if a.size <= max_cols}

    def index_kind(e: Expr, vec: dict[str, For], once: dict[str, int]) -> str | None:
        if isinstance(e, Const) and e.value == 0:
            return "zero"
        if isinstance(e, Var):
            if e.name in once and once[e.name] == 0:
                return "zero"
            f = vec.get(e.name)
            if f is not None and f.lo.value == 0:
                return "col"
        return None

    def access(buf: str, index: Expr, vec, once, seq: bool, store: bool) -> None:
        if buf not in ok:
            return
        k = index_kind(index, vec, once)
        want = ok[buf]
        if seq or (want == "cols" and k != "col") or (want == "row" and (k != "zero" or (store and vec))):
            del ok[buf]

    def exprs(e: Expr, vec, once, seq) -> None:
        for x in walk_exprs(e):
            if isinstance(x, Load):
                access(x.buf, x.index, vec, once, seq, False)

    def walk(b: tuple, vec: dict, once: dict, seq: bool) -> None:
        for s in b:
            if isinstance(s, For):
                k = loop_kind(s, max_cols)
                for e in (s.lo, s.hi):
                    exprs(e, vec, once, seq)
                if k == "once":
                    walk(s.body, vec, {**once, s.var: s.lo.value}, seq)
                elif k in ("map", "reduce"):
                    walk(s.body, {**vec, s.var: s}, once, seq)
                else:
                    walk(s.body, vec, once, True)
            elif isinstance(s, Store):
                exprs(s.index, vec, once, seq)
                exprs(s.value, vec, once, seq)
                access(s.buf, s.index, vec, once, seq, True)
            elif isinstance(s, (Let, Assign)):
                exprs(s.value, vec, once, seq)
            elif isinstance(s, If):
                exprs(s.cond, vec, once, seq)
                walk(s.then, vec, once, seq)
                walk(s.orelse, vec, once, seq)

    walk(body, {}, {}, False)
    return ok
