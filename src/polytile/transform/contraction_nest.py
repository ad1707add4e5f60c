"""Contraction nests found from their accesses, and the index helpers the tiled forms share.

A contraction nest (matmul, bmm, linear, convolution as implicit GEMM) is

    for p... (parallel), for i (parallel), for j1..jq (parallel):
      acc = 0
      for r1..rs:  [if cond:]  acc = acc + X * Y
      C[f(p, i, j)] = epilogue(acc, loads at (p, i, j))

where X does not depend on the j loops and Y not on i. The j loops are handled as one
coalesced column index J and the r loops as one reduction index R.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..affine.ir import (Assign, Const, Expr, For, If, Kernel, Let, Load, Op, Stmt, Store, Var, add, c, load_of, mul,
                         trip_count, walk_exprs, widened)
from ..affine.linear import linear_form, to_expr
from .fusion_util import map_expr, subst_vars


STATIC_Y_MIN_K = 256  # reduction from which a parameter weight stays the column operand (``orient``)
SWAP_MAX_ROWS = 128  # rows of x @ w.T up to which the weight is not the transposed operand (``orient``)


@dataclass
class Nest:
    batch: list[For]
    iloop: For
    jloops: list[For]
    rloops: list[For]
    acc: str
    cond: Expr | None
    x: Load  # invariant in the j loops (packed too unless contiguous over the r loops)
    y: Load  # invariant in i
    store: Store
    # the operands' values where they are not the loads as float32 (``bf16_pairs``)
    xval: Expr | None = None
    yval: Expr | None = None
    pairs: bool = False  # the reduction runs over groups of elements (pairs or quads), multiplied by ``dot``
    dot: str = "dot2"  # bfloat16 pairs (``bf16_pairs``), or int8 quads into int32 lanes (``int8_quads``)

    # the operands' values: the loads, or their float32 conversions where the operands are
    # stored in a half type (a bfloat16 matmul reads them as they are, no float32 copies)
    @property
    def xv(self) -> Expr:
        return self.xval if self.xval is not None else widened(self.x)

    @property
    def yv(self) -> Expr:
        return self.yval if self.yval is not None else widened(self.y)


def _operand(e: Expr) -> Load | None:
    """The load a product's factor reads (through a widening conversion or not), if affine."""
    e = load_of(e)
    return e if isinstance(e, Load) and linear_form(e.index) is not None else None


def _uses(e: Expr, names) -> bool:
    return any(isinstance(v, Var) and v.name in names for v in walk_exprs(e))


def match(k: Kernel) -> Nest | None:
    if not k.contraction or len(k.body) != 1 or not isinstance(k.body[0], For):
        return None
    loops = [k.body[0]]
    while len(loops[-1].body) == 1 and isinstance(loops[-1].body[0], For):
        loops.append(loops[-1].body[0])
    if len(loops) < 2 or not all(f.parallel and trip_count(f) and f.lo == c(0) for f in loops):
        return None
    body = loops[-1].body
    if len(body) != 3:
        return None
    let, red, st = body
    if not (isinstance(let, Let) and let.dtype == "float32" and let.value == Const(0, "float32")
            and isinstance(red, For) and isinstance(st, Store)):
        return None
    rloops = [red]
    while len(rloops[-1].body) == 1 and isinstance(rloops[-1].body[0], For):
        rloops.append(rloops[-1].body[0])
    if not all(trip_count(f) and f.lo == c(0) and not f.parallel for f in rloops):
        return None
    inner = rloops[-1].body
    cond = None
    if len(inner) == 1 and isinstance(inner[0], If) and not inner[0].orelse:
        cond, inner = inner[0].cond, inner[0].then
    if len(inner) != 1 or not isinstance(inner[0], Assign) or inner[0].name != let.name:
        return None
    v = inner[0].value
    if not (isinstance(v, Op) and v.fn == "add" and v.args[0] == Var(let.name, "float32")
            and isinstance(v.args[1], Op) and v.args[1].fn == "mul"):
        return None
    ops = tuple(_operand(o) for o in v.args[1].args)
    if not all(ops):
        return None
    for x, y in (ops, ops[::-1]):
        fx, fy = linear_form(x.index)[0], linear_form(y.index)[0]
        # j loops: the trailing band loops X does not depend on; i: the loop before them
        q = 0
        while q < len(loops) - 1 and fx.get(loops[-1 - q].var, 0) == 0:
            q += 1
        if q == 0:
            continue
        iloop, jloops = loops[-1 - q], loops[len(loops) - q:]
        if fy.get(iloop.var, 0) != 0 or fx.get(iloop.var, 0) == 0:
            continue
        if cond is not None and _uses(cond, {iloop.var}):
            continue
        if _uses(st.index, {let.name}):
            return None
        return Nest(loops[:len(loops) - q - 1], iloop, jloops, rloops, let.name, cond, x, y, st)
    return None


def batch_into_columns(k: Kernel, n: Nest, nr: int, vw: int) -> tuple[Kernel, Nest]:
    """Batch loops the row operand does not depend on (a convolution's images: the weights are
    the same for all of them) moved inside the row loop, as the leading column loops, when one
    batch iteration's columns leave more than 1/8 of the computed columns empty: a 7 x 7 image
    has 49 pixels, two panels of 32 compute 64 columns per image. With the images' pixels as
    the columns, a panel spans images and only the last one is partial. Not with larger
    images, whose panels are mostly full anyway: there the move makes the nest slower.
    The loops are parallel and perfectly nested, so any order is legal."""
    fx = linear_form(n.x.index)[0]
    moved = [f for f in n.batch if fx.get(f.var, 0) == 0]
    if not moved:
        return k, n
    P = 1
    for f in n.jloops:
        P *= trip_count(f)
    computed = P // nr * nr + -(-(P % nr) // vw) * vw
    if 8 * (computed - P) <= P:
        return k, n
    kept = [f for f in n.batch if f not in moved]
    body = n.jloops[-1].body
    for f in reversed([*kept, n.iloop, *moved, *n.jloops]):
        body = (replace(f, body=body),)
    k2 = replace(k, body=body)
    n2 = match(k2)
    return (k2, n2) if n2 is not None and n2.iloop.var == n.iloop.var else (k, n)


def orient(k: Kernel, n: Nest, nr: int, static: set[str] | frozenset[str] = frozenset()) -> tuple[Kernel, Nest]:
    """Swap the row and column loops (both parallel, perfectly nested) when the row operand is
    strided along the reduction and the swap makes the operand to pack along rows smaller or
    contiguous (a transposed A: vectors then run along A's contiguous rows instead), and x @ w.T
    with both operands contiguous along the reduction when x has fewer rows than w (see below)."""
    if len(n.jloops) != 1:
        return k, n
    rn = [f.var for f in n.rloops]
    M, N = trip_count(n.iloop), trip_count(n.jloops[0])
    fy = linear_form(n.y.index)[0]
    y_rows = contiguous(fy, rn, n.rloops)
    if contiguous(linear_form(n.x.index)[0], rn, n.rloops):
        # both operands contiguous along the reduction (x @ w.T, a linear layer's weight): the
        # column operand is packed through a transpose; make it the few rows of x instead of the
        # weight. The output then runs along the tile rows and is written in pieces of mr: up to
        # SWAP_MAX_ROWS rows that costs less than transposing the weight, beyond it more.
        # Up to 3/4 of a panel's rows (a linear on a few tokens) it is swapped as well: the
        # weight's rows become the rows and the tokens the few columns, which the dot form (or
        # one-vector panels) takes - the reduction vectorized, the weight streamed once and not
        # packed (with nearly a panel's rows of tokens the swap no longer pays).
        # A weight that is a parameter (``static``) with rows enough for full tiles stays the
        # column operand: its transposing pack is cached (``cache_static``), the tiles read its
        # panels in place and the output is written along the columns; not over a short
        # reduction, where the output's stores dominate and the swapped form prefetches them
        if not (y_rows and fy.get(n.jloops[0].var, 0) != 1 and M <= SWAP_MAX_ROWS and M < N
                and len(rn) == 1 and (M >= nr or 4 * M <= 3 * nr)) \
                or (n.y.buf in static and M >= nr and trip_count(n.rloops[0]) >= STATIC_Y_MIN_K):
            return k, n
    elif M < nr or not (y_rows or N < M):
        return k, n
    i, j = n.iloop, n.jloops[0]
    inner: Stmt = replace(j, body=(replace(i, body=j.body),))
    for f in reversed(n.batch):
        inner = replace(f, body=(inner,))
    k2 = replace(k, body=(inner,))
    n2 = match(k2)
    return (k2, n2) if n2 is not None else (k, n)


def contiguous(coefs: dict[str, int], names: list[str], loops: list[For]) -> bool:
    """Whether a linear form walks the loops ``names`` (outermost first) as one contiguous range
    (a loop of one iteration, e.g. a batch of 1, walks nothing whatever its coefficient)."""
    stride = 1
    for v, f in reversed(list(zip(names, loops))):
        if trip_count(f) == 1:
            continue
        if coefs.get(v, 0) != stride:
            return False
        stride *= trip_count(f)
    return True


def decompose(names: list[str], loops: list[For], flat: Expr) -> dict[str, Expr]:
    """Each loop variable of a coalesced group as a function of the group's flat index."""
    out, stride = {}, 1
    for v, f in reversed(list(zip(names, loops))):
        n = trip_count(f)
        e = Op("floordiv", (flat, c(stride)), "int64") if stride > 1 else flat
        out[v] = Op("remainder", (e, c(n)), "int64") if f is not loops[0] else e
        stride *= n
    return out


def in_group(e: Expr, names: list[str], loops: list[For], flat: Expr) -> Expr:
    """``e`` with the group's variables replaced by the flat index: loads that walk the group
    contiguously (times a scale) get ``scale * flat``; anything else gets div/mod."""
    decomp = decompose(names, loops, flat)

    def fix(x):
        if isinstance(x, Load):
            lf = linear_form(x.index)
            if lf is not None:
                ks = {v: lf[0].get(v, 0) for v, f in zip(names, loops) if trip_count(f) > 1}
                last = list(ks.values())[-1] if ks else 0
                rest = {v: k for v, k in lf[0].items() if v not in names}
                if last and contiguous({v: k // last for v, k in ks.items() if k % last == 0}, names, loops) \
                        and all(k % last == 0 for k in ks.values()):
                    return replace(x, index=add(to_expr(rest, lf[1]), mul(flat, c(last))))
            return replace(x, index=subst_vars(x.index, decomp))
        return x

    e = map_expr(e, fix)
    return subst_vars(e, decomp)


def strides(loops: list[For]) -> list[int]:
    out, s = [], 1
    for f in reversed(loops):
        out.append(s)
        s *= trip_count(f)
    return out[::-1]


def batch_index(loops: list[For]) -> tuple[int, Expr]:
    """How many iterations ``loops`` make together, and the flat index of the current one."""
    count, idx = 1, c(0)
    for f in loops:
        idx = add(mul(idx, c(trip_count(f))), Var(f.var))
        count *= trip_count(f)
    return count, idx


def epilogue_store(n: Nest, value: Expr, ivar: Expr, jvar: Expr) -> Store:
    """The nest's store at row ``ivar`` and flat column ``jvar``, writing ``value`` (the store's
    value with the accumulator already replaced)."""
    i, jn = n.iloop.var, [f.var for f in n.jloops]
    return Store(n.store.buf, subst_vars(in_group(Load("_", n.store.index, "float32"), jn, n.jloops, jvar).index,
                                         {i: ivar}),
                 subst_vars(in_group(value, jn, n.jloops, jvar), {i: ivar}))
