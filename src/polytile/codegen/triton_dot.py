"""The ``dot`` form of the Triton renderer: a contraction nest as block tiles with ``tl.dot``.

The nest's outer parallel band holds the loops of the output; the loops that only the first
operand reads are the tile's rows (one for a matmul; batch, height and width for a
convolution: an implicit GEMM), those that only the second reads are its columns, those both
read index the batch of tiles. The body is ``acc = 0; for r...: [if cond:] acc = acc + a * b;
epilogue``: the reduction loops are flattened into one reduction index walked ``bk`` at a time,
a condition on the reduction (a convolution's padding) masks the first operand's tile. The
epilogue (bias, activation, residual) runs on the ``bm x bn`` accumulator before its store.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..affine.ir import Assign, Const, Expr, For, If, Kernel, Let, Load, Op, Program, Var, is_affine, local_arrays, walk_exprs
from ..dtypes import Unsupported
from .triton_kernel import KernelPlan, Renderer, RenderedKernel, decompose, finish, outer_band, total


@dataclass(frozen=True)
class DotShape:
    rows: tuple[For, ...]      # band loops of the tile's rows (read by a only)
    cols: tuple[For, ...]      # ... of its columns (read by b only)
    batch: tuple[For, ...]     # ... read by both: one tile grid each
    acc: Let
    reduce: tuple[For, ...]    # the perfectly nested reduction loops
    cond: Expr | None          # the condition guarding the update
    a: Load
    b: Load
    rest: tuple                # the epilogue statements


def _const_loop(f) -> bool:
    return isinstance(f, For) and isinstance(f.lo, Const) and isinstance(f.hi, Const)


def _vars(e: Expr) -> set[str]:
    return {x.name for x in walk_exprs(e) if isinstance(x, Var)}


def dot_shape(k: Kernel) -> DotShape | None:
    """``k`` as a contraction ``dot`` can run, or None."""
    band, inner = outer_band(k.body)
    if len(band) < 2 or len(inner) < 3 or local_arrays(k.body):
        return None
    let, red = inner[0], inner[1]
    if not (isinstance(let, Let) and let.dtype == "float32" and isinstance(let.value, Const)
            and let.value.value == 0 and _const_loop(red)):
        return None
    reds = [red]
    while len(reds[-1].body) == 1 and _const_loop(reds[-1].body[0]):
        reds.append(reds[-1].body[0])
    body = reds[-1].body
    cond = None
    if len(body) == 1 and isinstance(body[0], If) and not body[0].orelse and len(body[0].then) == 1:
        cond, body = body[0].cond, body[0].then
    if not (len(body) == 1 and isinstance(body[0], Assign) and body[0].name == let.name):
        return None
    v = body[0].value
    if not (isinstance(v, Op) and v.fn == "add" and isinstance(v.args[0], Var) and v.args[0].name == let.name):
        return None
    prod = v.args[1]
    if not (isinstance(prod, Op) and prod.fn == "mul"
            and all(isinstance(x, Load) and x.dtype == "float32" for x in prod.args)):
        return None
    a, b = prod.args
    names = {f.var for f in band}
    rvars = {f.var for f in reds}
    if not all(is_affine(x.index, names | rvars) for x in (a, b)):
        return None
    ua, ub = _vars(a.index), _vars(b.index)
    if not rvars <= (ua | ub):
        return None
    rows = tuple(f for f in band if f.var in ua and f.var not in ub)
    cols = tuple(f for f in band if f.var in ub and f.var not in ua)
    batch = tuple(f for f in band if f not in rows and f not in cols)
    if not rows or not cols:
        return None
    if cond is not None and (_vars(cond) & {f.var for f in cols} or any(isinstance(x, Load) for x in walk_exprs(cond))):
        return None  # the condition must be a mask of a's tile
    if any(let.name in _vars(x.index) for x in (a, b)):
        return None
    return DotShape(rows, cols, batch, let, tuple(reds), cond, a, b, tuple(inner[2:]))


def _dot_line(precision: str) -> str:
    """The tile product: fp32 operands in IEEE fp32 or TF32 (``input_precision``), or rounded to
    fp16 / bf16 first (the mixed-precision mode), always accumulated in fp32."""
    if precision in ("fp16", "bf16"):
        t = {"fp16": "tl.float16", "bf16": "tl.bfloat16"}[precision]
        return f"        acc = tl.dot(ta.to({t}), tb.to({t}), acc)"
    return f"        acc = tl.dot(ta, tb, acc, input_precision=\"{precision}\")"


def render_dot(prog: Program, k: Kernel, plan: KernelPlan) -> RenderedKernel:
    d = dot_shape(k)
    if d is None:
        raise Unsupported(f"{k.name} is not a dot contraction")
    M, N, KT = total(d.rows), total(d.cols), total(d.reduce)
    tm, tn = -(-M // plan.bm), -(-N // plan.bn)
    nb = total(d.batch)
    r = Renderer(prog, k, "[BM, BN]", "z2", "0")
    lines = [
        "    pid = tl.program_id(0).to(tl.int64)",
        f"    pb = pid // {tm * tn}",
        f"    t = pid % {tm * tn}",
        # consecutive programs walk group_m row tiles down one column of tiles (b's tile stays in L2)
        f"    width = GROUP_M * {tn}",
        "    g = t // width",
        f"    gm = tl.minimum({tm} - g * GROUP_M, GROUP_M)",
        "    pm = g * GROUP_M + (t % width) % gm",
        "    pn = (t % width) // gm",
        "    om = pm * BM + tl.arange(0, BM).to(tl.int64)[:, None]",
        "    on = pn * BN + tl.arange(0, BN).to(tl.int64)[None, :]",
        f"    mm = om < {M}",
        f"    mn = on < {N}",
        "    z2 = tl.zeros([BM, BN], tl.int64)",
    ]
    r.lines = lines
    for names in (decompose(lines, "    ", "pb", d.batch, "v_"), decompose(lines, "    ", "om", d.rows, "v_"),
                  decompose(lines, "    ", "on", d.cols, "v_")):
        r.names.update(names)
    r.lane_vars |= {f.var for f in d.rows + d.cols}
    lines += ["    acc = tl.zeros([BM, BN], tl.float32)",
              f"    for k0 in range(0, {KT}, BK):",
              "        ka = k0 + tl.arange(0, BK).to(tl.int64)[None, :]",
              "        kb = k0 + tl.arange(0, BK).to(tl.int64)[:, None]"]
    r.pad = "        "
    # a's tile [BM, BK] (masked by the update's condition), b's tile [BK, BN]
    r.names.update(decompose(lines, "        ", "ka", d.reduce, "ra_"))
    ia = r.ex(d.a.index, "mm")
    mask_a = f"mm & (ka < {KT})"
    if d.cond is not None:
        mask_a = f"{mask_a} & ({r.ex(d.cond, 'mm')} != 0)"
    r.names.update(decompose(lines, "        ", "kb", d.reduce, "rb_"))
    ib = r.ex(d.b.index, "mn")
    lines += [
        f"        ta = tl.load(b_{d.a.buf} + ({ia}), mask={mask_a}, other=0.0)",
        f"        tb = tl.load(b_{d.b.buf} + ({ib}), mask=(kb < {KT}) & mn, other=0.0)",
        _dot_line(plan.precision),
    ]
    for f in d.reduce:
        del r.names[f.var]
    r.names[d.acc.name] = "acc"
    r.lets[d.acc.name] = "float32"
    lines.append("    mo = mm & mn")
    r.pad = "    "
    r.stmts(d.rest, "mo", "    ")
    consts = {"BM": plan.bm, "BN": plan.bn, "BK": plan.bk, "GROUP_M": plan.group_m}
    return finish(prog, k, r, plan, max(1, nb * tm * tn), {}, [f"{c}: tl.constexpr" for c in consts], consts)
