"""Affine program -> Triton: one ``@triton.jit`` function per kernel, and its launch grid.

Two forms, chosen per kernel by the GPU backend's plan (``backends.gpu.plan.KernelPlan``):

- ``lanes``: the kernel's outer band of parallel loops is flattened into one index space;
  each program instance runs ``block`` consecutive iterations of it as the lanes of its
  tensors, and everything inside the band (inner loops, accumulators, conditions) runs on
  those lanes in lock step. An inner loop whose bounds differ between lanes runs over the
  union of the lanes' ranges with a mask; an ``If`` becomes a mask (stores and assignments
  under it are predicated); a kernel-local array (``Alloc``) lives in a scratch buffer with
  one slice per lane.
- ``dot``: a contraction nest (parallel rows ``m``, columns ``n`` and batch loops, one
  reduction loop folding ``a[m, k] * b[k, n]`` into an accumulator) becomes a block tile of
  ``bm x bn`` outputs per program with a loop over ``bk``-wide slices of the reduction, each
  one ``tl.dot`` (tensor cores); the statements after the reduction (the fused epilogue:
  bias, activation, residual) run on the ``bm x bn`` accumulator before its store.

Index arithmetic is int64. Every access is masked by the lanes (or tile elements) that exist.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..affine.ir import (INDEX, Alloc, Assign, Const, Expr, Fail, For, If, Kernel, Let, Load, Op, Prefetch,
                         Program, Store, Var, is_affine, local_arrays, walk_exprs, walk_stmts)
from ..dtypes import Unsupported
from .triton_ops import PRELUDE, TL_DTYPE, render_op
from .triton_rows import loop_kind, reduction, register_arrays

HEADER = "import triton\nimport triton.language as tl\n"


@dataclass(frozen=True)
class KernelPlan:
    """How one kernel maps onto the GPU (filled by the GPU cost model)."""

    kind: str               # "lanes" | "rows" | "dot"
    block: int = 128        # lanes per program ("lanes"), rows per program ("rows")
    cols: int = 0           # columns of a row tile ("rows"): the inner loops' iterations
    bm: int = 64            # output tile rows, columns and reduction step ("dot")
    bn: int = 64
    bk: int = 32
    group_m: int = 8        # row tiles that consecutive programs walk together (L2 reuse of b)
    warps: int = 4
    stages: int = 2
    precision: str = "ieee"  # tl.dot input_precision for fp32 operands: "ieee" | "tf32"


@dataclass
class RenderedKernel:
    name: str
    source: str
    buffers: list[str]          # program buffers, in argument order
    scratch: dict[str, tuple[int, str]]  # kernel-local array -> (elements in all: one slice per lane, dtype)
    grid: int                   # program instances
    plan: KernelPlan
    signature: dict[str, str] = field(default_factory=dict)  # pointer argument -> Triton type (AOT compiles)
    constexprs: dict[str, int] = field(default_factory=dict)  # block sizes
    uses_fail: bool = False     # takes the error flag ``err`` (an index out of range)


def dot_shape(k: Kernel):
    """The contraction ``k`` is, as (band, m, n, acc Let, reduction For, a Load, b Load, rest),
    or None when it is not one ``dot`` can run: the outer band holds the row and column loops
    (constant bounds), the body is ``acc = init; for r: acc = acc + a * b; ...`` with a's index
    free of the column loop and b's free of the row loop."""
    band, inner = outer_band(k.body)
    if len(band) < 2 or len(inner) < 3:
        return None
    let, red = inner[0], inner[1]
    if not (isinstance(let, Let) and isinstance(red, For) and len(red.body) == 1
            and isinstance(red.body[0], Assign) and red.body[0].name == let.name
            and isinstance(red.lo, Const) and isinstance(red.hi, Const)
            and let.dtype == "float32" and isinstance(let.value, Const) and let.value.value == 0):
        return None
    v = red.body[0].value
    if not (isinstance(v, Op) and v.fn == "add" and isinstance(v.args[0], Var) and v.args[0].name == let.name):
        return None
    prod = v.args[1]
    if not (isinstance(prod, Op) and prod.fn == "mul"):
        return None
    loads = [_operand(x) for x in prod.args]
    if any(x is None for x in loads):
        return None
    names = [f.var for f in band]
    if not all(is_affine(x.index, set(names) | {red.var}) for x in loads):
        return None
    uses = [_vars(x.index) for x in loads]
    if any(red.var not in u for u in uses):
        return None
    # the row loop: read by the first operand only; the column loop: by the second only
    rows = [n for n in names if n in uses[0] and n not in uses[1]]
    cols = [n for n in names if n in uses[1] and n not in uses[0]]
    if len(rows) != 1 or len(cols) != 1:
        return None
    a, b = loads
    return band, rows[0], cols[0], let, red, a, b, inner[2:]


def _operand(e: Expr):
    if isinstance(e, Load) and e.dtype == "float32":
        return e
    return None


def _vars(e: Expr) -> set[str]:
    return {x.name for x in walk_exprs(e) if isinstance(x, Var)}


def outer_band(body: tuple) -> tuple[list[For], tuple]:
    """The perfectly nested parallel loops with constant bounds at the top of ``body``, and what
    they enclose."""
    band: list[For] = []
    while len(body) == 1 and isinstance(body[0], For) and body[0].parallel \
            and isinstance(body[0].lo, Const) and isinstance(body[0].hi, Const):
        band.append(body[0])
        body = body[0].body
    return band, body


class _Renderer:
    """Statements and expressions of one kernel as Triton source lines. ``names`` maps loop
    variables to the Triton expressions that hold them; ``lane_vars`` are those that differ
    between lanes (tensors), the others are scalars shared by the program."""

    def __init__(self, prog: Program, kernel: Kernel, shape: str, zero: str, lane_id: str):
        self.prog = prog
        self.local = local_arrays(kernel.body)
        self.shape, self.zero, self.lane_id = shape, zero, lane_id
        self.names: dict[str, str] = {}
        self.lane_vars: set[str] = set()
        self.lets: dict[str, str] = {}
        self.lines: list[str] = []
        self._n = 0
        self.uses_fail = False
        self.cse: dict = {}  # (expression, mask) -> temporary, within one statement
        self.pad = "    "
        self.cols = 0  # > 0: the rows form, with inner loops of up to this many iterations across columns
        self.regs: dict[str, str] = {}  # kernel-local arrays kept in registers (triton_rows)

    def fresh(self, base: str) -> str:
        self._n += 1
        return f"{base}{self._n}"

    # ------------------------------------------------------------ expressions
    def ex(self, e: Expr, mask: str) -> str:
        """``e`` as a Triton expression. Index arithmetic is rendered inline; every load and
        every value op becomes a named temporary (one per distinct expression and mask within a
        statement), so that the source reads as three-address code."""
        if isinstance(e, Const):
            return _const(e)
        if isinstance(e, Var):
            if e.name in self.names:
                return self.names[e.name]
            raise Unsupported(f"Triton renderer: unbound variable {e.name}")
        if isinstance(e, Op) and e.dtype == INDEX and e.fn in ("add", "sub", "mul", "floordiv", "remainder"):
            return render_op(e.fn, [self.ex(a, mask) for a in e.args], e.dtype, e.args[0].dtype)
        if isinstance(e, Load) and e.buf in self.regs:
            return f"r_{e.buf}"
        key = (e, mask)
        if key in self.cse:
            return self.cse[key]
        if isinstance(e, Load):
            text = f"tl.load({self.addr(e.buf, e.index, mask)}, mask={mask}, other=0)"
        elif e.fn == "cast":
            x = self.ex(e.args[0], mask)
            text = f"{x} != 0" if e.dtype == "bool" else f"{x}.to({TL_DTYPE[e.dtype]})"
        elif e.fn in ("in_register", "broadcast"):
            return self.ex(e.args[0], mask)
        elif e.fn == "where":
            # each branch reads memory only in the lanes that take it (a guarded index may be
            # out of range in the others, as the C renderer's ternary never evaluates it)
            c = self.ex(e.args[0], mask)
            mt, mf = self.temp(f"{mask} & ({c} != 0)", "m"), self.temp(f"{mask} & ({c} == 0)", "m")
            text = f"tl.where({c} != 0, {self.ex(e.args[1], mt)}, {self.ex(e.args[2], mf)})"
        else:
            text = render_op(e.fn, [self.ex(a, mask) for a in e.args], e.dtype, e.args[0].dtype)
        name = self.cse[key] = self.temp(text, "x")
        return name

    def temp(self, text: str, base: str) -> str:
        name = self.fresh(base)
        self.lines.append(f"{self.pad}{name} = {text}")
        return name

    def addr(self, buf: str, index: Expr, mask: str) -> str:
        idx = self.ex(index, mask)
        if buf in self.local:
            return f"s_{buf} + {self.lane_id} * {self.local[buf].size} + ({idx}) + {self.zero}"
        return f"b_{buf} + ({idx}) + {self.zero}"

    def uniform(self, e: Expr) -> bool:
        return not any(isinstance(x, Load) or isinstance(x, Var) and (x.name in self.lane_vars or x.name in self.lets)
                       for x in walk_exprs(e))

    # ------------------------------------------------------------ statements
    def stmts(self, body, mask: str, pad: str) -> None:
        for s in body:
            self.stmt(s, mask, pad)

    def stmt(self, s, mask: str, pad: str) -> None:
        out = self.lines
        self.pad, self.cse = pad, {}
        if isinstance(s, Store) and s.buf in self.regs:
            dt = TL_DTYPE[self.local[s.buf].dtype]
            out.append(f"{pad}r_{s.buf} = tl.where({mask}, {self.ex(s.value, mask)}, 0).to({dt})")
        elif isinstance(s, Store):
            out.append(f"{pad}tl.store({self.addr(s.buf, s.index, mask)}, {self.ex(s.value, mask)}, mask={mask})")
        elif isinstance(s, Let):
            name = f"v_{s.name}"
            self.names[s.name] = name
            self.lets[s.name] = s.dtype
            out.append(f"{pad}{name} = (tl.zeros({self.shape}, {TL_DTYPE[s.dtype]}) + ({self.ex(s.value, mask)}))"
                       f".to({TL_DTYPE[s.dtype]})")
        elif isinstance(s, Assign):
            name = self.names[s.name]
            out.append(f"{pad}{name} = tl.where({mask}, {self.ex(s.value, mask)}, {name})"
                       f".to({TL_DTYPE[self.lets[s.name]]})")
        elif isinstance(s, For):
            self.loop(s, mask, pad)
        elif isinstance(s, If):
            c = self.temp(f"{self.ex(s.cond, mask)} != 0", "c")
            if s.then:
                m = self.fresh("m")
                out.append(f"{pad}{m} = {mask} & {c}")
                self.stmts(s.then, m, pad)
            if s.orelse:
                m = self.fresh("m")
                out.append(f"{pad}{m} = {mask} & ~{c}")
                self.stmts(s.orelse, m, pad)
        elif isinstance(s, Fail):
            self.uses_fail = True
            out.append(f"{pad}tl.store(err + {self.zero}, {s.code}, mask={mask})")
        elif isinstance(s, (Alloc, Prefetch)):
            pass  # arrays live in the scratch buffers; prefetch hints have no GPU meaning here
        else:
            raise Unsupported(f"Triton renderer: statement {type(s).__name__}")

    def loop(self, f: For, mask: str, pad: str) -> None:
        v = f"v_{f.var}"
        self.names[f.var] = v
        self.pad, self.cse = pad, {}
        kind = loop_kind(f, self.cols) if self.cols else None
        if kind == "once":
            self.names[f.var] = str(f.lo.value)
            self.stmts(f.body, mask, pad)
            return
        if kind in ("map", "reduce"):
            self.lines.append(f"{pad}{v} = {f.lo.value} + cols")
            m = self.temp(f"{mask} & ({v} < {f.hi.value})", "m")
            row_zero, self.zero = self.zero, "z2"
            if kind == "map":
                self.stmts(f.body, m, pad)
            else:
                acc, fn, value = reduction(f)
                e = self.ex(value, m)
                isf = value.dtype in ("float32", "float64")
                ident, comb = {"add": ("0", "pt_add"), "maximum": ("-INF", "pt_maximum_f"),
                               "minimum": ("INF", "pt_minimum_f")}[fn]
                red = self.temp(f"tl.reduce(tl.where({m}, {e}, {ident}), 1, {comb}, keep_dims=True)", "x")
                name = self.names[acc]
                new = render_op(fn, [name, red], value.dtype, value.dtype)
                assert isf or fn == "add"
                self.lines.append(f"{pad}{name} = tl.where({mask}, {new}, {name}).to({TL_DTYPE[self.lets[acc]]})")
            self.zero = row_zero
            return
        lo, hi = self.ex(f.lo, mask), self.ex(f.hi, mask)
        if self.uniform(f.lo) and self.uniform(f.hi):
            self.lines.append(f"{pad}for {v} in range({lo}, {hi}):")
            inner_mask = mask
            body_pad = pad + "    "
        else:  # bounds that differ between lanes: the union of their ranges, masked
            lo_n, hi_n = self.fresh("lo"), self.fresh("hi")
            self.lines.append(f"{pad}{lo_n} = tl.min(tl.where({mask}, {lo} + {self.zero}, 2**62), axis=None)")
            self.lines.append(f"{pad}{hi_n} = tl.max(tl.where({mask}, {hi} + {self.zero}, -2**62), axis=None)")
            self.lines.append(f"{pad}for {v} in range({lo_n}, {hi_n}):")
            body_pad = pad + "    "
            inner_mask = self.fresh("m")
            self.lines.append(f"{body_pad}{inner_mask} = {mask} & ({v} >= {lo}) & ({v} < {hi})")
        n = len(self.lines)
        self.stmts(f.body, inner_mask, body_pad)
        if len(self.lines) == n:
            self.lines.append(f"{body_pad}pass")


def _const(e: Const) -> str:
    v = e.value
    if e.dtype == "bool":
        return "True" if v else "False"
    if e.dtype in ("float32", "float64", "float16", "bfloat16"):
        v = float(v)
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INF" if v > 0 else "(-INF)"
        return repr(v)
    return str(int(v))


def _signature(prog: Program, buffers: list[str], scratch: dict[str, int], local, fail: bool) -> dict[str, str]:
    tl_name = {"float32": "fp32", "float64": "fp64", "float16": "fp16", "bfloat16": "bf16", "int64": "i64",
               "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}
    sig = {f"b_{b}": "*" + tl_name[prog.buffer(b).dtype] for b in buffers}
    sig.update({f"s_{s}": "*" + tl_name[local[s].dtype] for s in scratch})
    if fail:
        sig["err"] = "*i32"
    return sig


def render_lanes(prog: Program, k: Kernel, plan: KernelPlan) -> RenderedKernel:
    band, inner = outer_band(k.body)
    extents = [f.hi.value - f.lo.value for f in band]
    total = math.prod(extents)
    r = _Renderer(prog, k, "[BLOCK]", "zi", "f")
    lines = [
        "    f = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)",
        f"    m0 = f < {total}",
        "    zi = tl.zeros([BLOCK], tl.int64)",
    ]
    stride = total
    for fl, n in zip(band, extents):
        stride //= n
        name = f"v_{fl.var}"
        r.names[fl.var] = name
        r.lane_vars.add(fl.var)
        lines.append(f"    {name} = {fl.lo.value} + (f // {stride}) % {n}")
    r.lines = lines
    r.stmts(inner, "m0", "    ")
    local = r.local
    block = plan.block
    grid = max(1, -(-total // block))
    scratch = {a: (grid * block * local[a].size, local[a].dtype) for a in local}
    return _finish(prog, k, r, plan, grid, scratch, ["BLOCK: tl.constexpr"], {"BLOCK": block})


def render_rows(prog: Program, k: Kernel, plan: KernelPlan) -> RenderedKernel:
    band, inner = outer_band(k.body)
    extents = [f.hi.value - f.lo.value for f in band]
    total = math.prod(extents)
    r = _Renderer(prog, k, "[ROWS, 1]", "zi", "f")
    r.cols = plan.cols
    r.regs = register_arrays(inner, r.local, plan.cols)
    lines = [
        "    f = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)[:, None]",
        f"    m0 = f < {total}",
        "    zi = tl.zeros([ROWS, 1], tl.int64)",
        "    z2 = tl.zeros([ROWS, COLS], tl.int64)",
        "    cols = tl.arange(0, COLS).to(tl.int64)[None, :]",
    ]
    stride = total
    for fl, n in zip(band, extents):
        stride //= n
        r.names[fl.var] = f"v_{fl.var}"
        r.lane_vars.add(fl.var)
        lines.append(f"    v_{fl.var} = {fl.lo.value} + (f // {stride}) % {n}")
    r.lines = lines
    r.stmts(inner, "m0", "    ")
    grid = max(1, -(-total // plan.block))
    scratch = {a: (grid * plan.block * r.local[a].size, r.local[a].dtype) for a in r.local if a not in r.regs}
    return _finish(prog, k, r, plan, grid, scratch, ["ROWS: tl.constexpr", "COLS: tl.constexpr"],
                   {"ROWS": plan.block, "COLS": plan.cols})


def render_dot(prog: Program, k: Kernel, plan: KernelPlan) -> RenderedKernel:
    shape = dot_shape(k)
    if shape is None:
        raise Unsupported(f"{k.name} is not a dot contraction")
    band, mv, nv, let, red, a, b, rest = shape
    if local_arrays(k.body):
        raise Unsupported(f"{k.name}: a dot kernel with local arrays")
    bm, bn, bk = plan.bm, plan.bn, plan.bk
    fm = next(f for f in band if f.var == mv)
    fn = next(f for f in band if f.var == nv)
    batch = [f for f in band if f.var not in (mv, nv)]
    m_ext, n_ext = fm.hi.value - fm.lo.value, fn.hi.value - fn.lo.value
    tm, tn = -(-m_ext // bm), -(-n_ext // bn)
    nb = math.prod(f.hi.value - f.lo.value for f in batch)
    K0, K1 = red.lo.value, red.hi.value
    r = _Renderer(prog, k, "[BM, BN]", "z2", "0")
    lines = [
        "    pid = tl.program_id(0).to(tl.int64)",
        f"    per_batch = {tm * tn}",
        "    pb = pid // per_batch",
        "    t = pid % per_batch",
        # consecutive programs walk group_m row tiles down one column of tiles (the b tile stays in L2)
        "    width = GROUP_M * " + str(tn),
        "    g = t // width",
        f"    gm = tl.minimum({tm} - g * GROUP_M, GROUP_M)",
        "    pm = g * GROUP_M + (t % width) % gm",
        "    pn = (t % width) // gm",
    ]
    stride = nb
    for f in batch:
        n = f.hi.value - f.lo.value
        stride //= n
        r.names[f.var] = f"v_{f.var}"
        lines.append(f"    v_{f.var} = {f.lo.value} + (pb // {stride}) % {n}")
    lines += [
        f"    v_{mv} = {fm.lo.value} + pm * BM + tl.arange(0, BM).to(tl.int64)[:, None]",
        f"    v_{nv} = {fn.lo.value} + pn * BN + tl.arange(0, BN).to(tl.int64)[None, :]",
        f"    mm = v_{mv} < {fm.hi.value}",
        f"    mn = v_{nv} < {fn.hi.value}",
        "    z2 = tl.zeros([BM, BN], tl.int64)",
        "    acc = tl.zeros([BM, BN], tl.float32)",
        f"    for k0 in range({K0}, {K1}, BK):",
        "        ka = k0 + tl.arange(0, BK).to(tl.int64)[None, :]",
        "        kb = k0 + tl.arange(0, BK).to(tl.int64)[:, None]",
    ]
    r.lane_vars |= {mv, nv}
    r.lines, r.pad = lines, "        "
    # the a tile [BM, BK] and the b tile [BK, BN]
    r.names.update({mv: f"v_{mv}", nv: f"v_{nv}", red.var: "ka"})
    ia = r.ex(a.index, "mm")
    r.names[red.var] = "kb"
    ib = r.ex(b.index, "mn")
    lines += [
        f"        ta = tl.load(b_{a.buf} + ({ia}), mask=mm & (ka < {K1}), other=0.0)",
        f"        tb = tl.load(b_{b.buf} + ({ib}), mask=(kb < {K1}) & mn, other=0.0)",
        f"        acc = tl.dot(ta, tb, acc, input_precision=\"{plan.precision}\")",
    ]
    del r.names[red.var]
    r.names[let.name] = "acc"
    r.lets[let.name] = "float32"
    lines.append("    mo = mm & mn")
    r.stmts(tuple(rest), "mo", "    ")
    grid = max(1, nb * tm * tn)
    consts = {"BM": bm, "BN": bn, "BK": bk, "GROUP_M": plan.group_m}
    params = [f"{c}: tl.constexpr" for c in consts]
    return _finish(prog, k, r, plan, grid, {}, params, consts)


def _finish(prog, k, r: _Renderer, plan, grid, scratch, params, consts) -> RenderedKernel:
    reads = {x.buf for s in walk_stmts(k.body) for e in _exprs(s) for x in walk_exprs(e) if isinstance(x, Load)}
    writes = {s.buf for s in walk_stmts(k.body) if isinstance(s, Store)}
    buffers = sorted((reads | writes) - set(r.local))
    args = [f"b_{b}" for b in buffers] + [f"s_{s}" for s in scratch] + (["err"] if r.uses_fail else [])
    head = [f"@triton.jit", f"def {k.name}({', '.join(args + params)}):"]
    if k.origin:
        head.insert(0, f"# {k.origin[:200]}")
    src = "\n".join(head + r.lines) + "\n"
    return RenderedKernel(k.name, src, buffers, scratch, grid, plan,
                          _signature(prog, buffers, scratch, r.local, r.uses_fail), consts, r.uses_fail)


def _exprs(s):
    from ..affine.ir import stmt_exprs

    return stmt_exprs(s)


def render_module(prog: Program, plans: dict[str, KernelPlan]) -> tuple[str, list[RenderedKernel]]:
    """The Python source of a module defining every kernel of ``prog``, and what launching each needs."""
    kernels = []
    for k in prog.kernels:
        plan = plans[k.name]
        render = {"dot": render_dot, "rows": render_rows, "lanes": render_lanes}[plan.kind]
        kernels.append(render(prog, k, plan))
    src = HEADER + PRELUDE + "\n\n" + "\n\n".join(rk.source for rk in kernels)
    return src, kernels
