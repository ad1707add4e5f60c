"""The core of the Triton renderer (``codegen.triton``): kernel plans, rendered kernels, and the
statement and expression renderer that the kernel forms share. Index arithmetic is int64;
every access is masked by the lanes (or tile elements) that exist."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..affine.ir import (INDEX, Alloc, Assign, Const, Expr, Fail, For, If, Kernel, Let, Load, Op, Prefetch,
                         Program, Store, Var, local_arrays, stmt_exprs, walk_exprs, walk_stmts)
from ..dtypes import Unsupported
from .triton_ops import TL_DTYPE, render_op
from .triton_rows import loop_kind, reduction

HEADER = "import triton\nimport triton.language as tl\n"


@dataclass(frozen=True)
class KernelPlan:
    """How one kernel maps onto the GPU (filled by the GPU cost model)."""

    kind: str               # "lanes" | "rows" | "dot" | "flash"
    block: int = 128        # lanes per program ("lanes"), rows per program ("rows")
    cols: int = 0           # columns of a row tile ("rows"): the inner loops' iterations
    bm: int = 64            # output tile rows, columns and reduction step ("dot"); query rows, keys ("flash")
    bn: int = 64
    bk: int = 32
    group_m: int = 8        # row tiles that consecutive programs walk together (L2 reuse of b)
    warps: int = 4
    stages: int = 2
    precision: str = "ieee"  # fp32 tile products: "ieee" | "tf32" | "fp16" | "bf16" (operands rounded first)


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


def outer_band(body: tuple) -> tuple[list[For], tuple]:
    """The perfectly nested parallel loops with constant bounds at the top of ``body``, and what
    they enclose."""
    band: list[For] = []
    while len(body) == 1 and isinstance(body[0], For) and body[0].parallel \
            and isinstance(body[0].lo, Const) and isinstance(body[0].hi, Const):
        band.append(body[0])
        body = body[0].body
    return band, body


def decompose(lines: list[str], pad: str, flat: str, loops, prefix: str) -> dict[str, str]:
    """Lines binding each loop's variable (named ``prefix`` + var) to its coordinate in the
    flattened index ``flat`` of ``loops`` (outermost first); returns var -> name."""
    names = {}
    stride = math.prod(f.hi.value - f.lo.value for f in loops)
    for f in loops:
        n = f.hi.value - f.lo.value
        stride //= n
        name = f"{prefix}{f.var}"
        q = flat if stride == 1 else f"({flat} // {stride})"
        lines.append(f"{pad}{name} = {f.lo.value} + {q}" + (f" % {n}" if stride * n < total(loops) else ""))
        names[f.var] = name
    return names


def total(loops) -> int:
    return math.prod(f.hi.value - f.lo.value for f in loops)


class Renderer:
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
        elif e.fn in ("cast", "narrow"):
            x = self.ex(e.args[0], mask)
            text = f"{x} != 0" if e.dtype == "bool" else f"{x}.to({TL_DTYPE[e.dtype]})"
        elif e.fn in ("in_register", "broadcast"):
            return self.ex(e.args[0], mask)
        elif e.fn == "where":
            # each branch reads memory only in the lanes that take it (a guarded index may be
            # out of range in the others, as the C renderer's ternary never evaluates it)
            c = self.ex(e.args[0], mask)
            mt = self.temp(f"{mask} & ({c} != 0)", "m") if self._reads(e.args[1]) else mask
            mf = self.temp(f"{mask} & ({c} == 0)", "m") if self._reads(e.args[2]) else mask
            text = f"tl.where({c} != 0, {self.ex(e.args[1], mt)}, {self.ex(e.args[2], mf)})"
        else:
            text = render_op(e.fn, [self.ex(a, mask) for a in e.args], e.dtype, e.args[0].dtype)
        name = self.cse[key] = self.temp(text, "x")
        return name

    def _reads(self, e: Expr) -> bool:
        return any(isinstance(x, Load) and x.buf not in self.regs for x in walk_exprs(e))

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


def _signature(prog: Program, buffers: list[str], scratch: dict, local, fail: bool) -> dict[str, str]:
    tl_name = {"float32": "fp32", "float64": "fp64", "float16": "fp16", "bfloat16": "bf16", "int64": "i64",
               "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}
    sig = {f"b_{b}": "*" + tl_name[prog.buffer(b).dtype] for b in buffers}
    sig.update({f"s_{s}": "*" + tl_name[local[s].dtype] for s in scratch})
    if fail:
        sig["err"] = "*i32"
    return sig


def finish(prog, k, r: Renderer, plan, grid, scratch, params, consts) -> RenderedKernel:
    reads = {x.buf for s in walk_stmts(k.body) for e in stmt_exprs(s) for x in walk_exprs(e) if isinstance(x, Load)}
    writes = {s.buf for s in walk_stmts(k.body) if isinstance(s, Store)}
    buffers = sorted((reads | writes) - set(r.local))
    args = [f"b_{b}" for b in buffers] + [f"s_{s}" for s in scratch] + (["err"] if r.uses_fail else [])
    head = [f"@triton.jit", f"def {k.name}({', '.join(args + params)}):"]
    if k.origin:
        head.insert(0, f"# {k.origin[:200]}")
    src = "\n".join(head + r.lines) + "\n"
    return RenderedKernel(k.name, src, buffers, scratch, grid, plan,
                          _signature(prog, buffers, scratch, r.local, r.uses_fail), consts, r.uses_fail)
