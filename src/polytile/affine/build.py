"""Lower the graph IR to affine loop nests: one kernel (or a few) per materialized graph node.

Views, scalar constants and iotas produce no kernel: they become index maps or expressions
at the point where they are read.
"""
from __future__ import annotations

import math

from typing import Callable, Mapping, Sequence

from ..dtypes import Unsupported
from ..graph.builder import contiguous_strides
from ..graph.ir import Graph, Node
from ..graph.ops import conv_padding
from ..graph.symbols import Sym, symbols_of
from .ir import (INDEX, Assign, Buffer, Const, Expr, Fail, For, If, Kernel, Let, Load, Op, Program,
                 Stmt, Store, Var, add, c, linear, mul, size_expr)

NO_BUFFER = ("full", "iota", "view")
CONTRACTIONS = ("matmul", "conv2d")  # kernels tagged for the contraction passes (loop fusion skips them)

# identity element and combine function of each reduction
_NEG_INF, _POS_INF = float("-inf"), float("inf")


def _lowest(dtype: str):
    return {"float32": _NEG_INF, "float64": _NEG_INF, "bool": False, "uint8": 0, "int8": -128,
            "int16": -32768, "int32": -(2**31), "int64": -(2**63)}[dtype]


def _highest(dtype: str):
    return {"float32": _POS_INF, "float64": _POS_INF, "bool": True, "uint8": 255, "int8": 127,
            "int16": 32767, "int32": 2**31 - 1, "int64": 2**63 - 1}[dtype]


def _o(fn: str, *args: Expr, dtype: str | None = None) -> Op:
    return Op(fn, tuple(args), dtype or args[0].dtype)


def _lt(a, b):
    return Op("lt", (a, b), "bool")


def _and(*cs):
    e = cs[0]
    for x in cs[1:]:
        e = Op("logical_and", (e, x), "bool")
    return e


def _in_range(e: Expr, n: int) -> Expr:
    return _and(Op("ge", (e, c(0)), "bool"), _lt(e, c(n)))


class _Builder:
    def __init__(self, graph: Graph):
        self.g = graph
        self.bufs: dict[int, Buffer] = {}
        self.kernels: list[Kernel] = []
        self._ntemps = 0
        for n in graph.inputs:
            self.bufs[n.id] = Buffer(f"in{n.attr('index')}", n.dtype, n.numel, "input", n.attr("index"))
        for k, n in enumerate(graph.outputs):
            if n.op in NO_BUFFER or n.op == "input":
                raise Unsupported(f"graph output {n!r} must be materialized by the frontend")
            if n.id not in self.bufs:
                self.bufs[n.id] = Buffer(f"out{k}", n.dtype, n.numel, "output", k)

    # -- buffers and reads -----------------------------------------------------------------
    def buf(self, n: Node) -> str:
        if n.id not in self.bufs:
            self.temp(n.dtype, n.numel, key=n.id)
        return self.bufs[n.id].name

    def temp(self, dtype: str, size: int, key=None) -> str:
        """A new temp buffer (numbered per program, so equal graphs give equal programs)."""
        name = f"t{self._ntemps}"
        self._ntemps += 1
        self.bufs[name if key is None else key] = Buffer(name, dtype, size, "temp")
        return name

    def read(self, n: Node, idx: Sequence[Expr]) -> Expr:
        if n.op == "full":
            v = n.attr("value")
            if isinstance(v, Sym):  # a symbolic size: its value at run time
                e = size_expr(v)
                return e if n.dtype == INDEX else Op("cast", (e,), n.dtype)
            return Const(v, n.dtype)
        if n.op == "iota":
            e = add(mul(idx[0], c(n.attr("step"))), c(n.attr("start")))
            return e if n.dtype == INDEX else Op("cast", (e,), n.dtype)
        if n.op == "view":
            base = n.inputs[0]
            lin = linear(list(zip(idx, n.attr("strides"))), n.attr("offset"))
            if base.op == "iota":
                return self.read(base, [lin])
            return Load(self.buf(base), lin, n.dtype)
        return Load(self.buf(n), linear(list(zip(idx, contiguous_strides(n.shape)))), n.dtype)

    def store(self, n: Node, idx: Sequence[Expr], value: Expr) -> Store:
        return Store(self.buf(n), linear(list(zip(idx, contiguous_strides(n.shape)))), value)

    @staticmethod
    def bcast(src: Sequence[int], out_idx: Sequence[Expr]) -> list[Expr]:
        lead = len(out_idx) - len(src)
        return [c(0) if s == 1 else out_idx[lead + k] for k, s in enumerate(src)]

    # -- nests -------------------------------------------------------------------------------
    def loops(self, shape: Sequence[int], prefix: str, body: Callable[[list[Expr]], list[Stmt]],
              parallel: bool) -> list[Stmt]:
        names = [f"{prefix}{k}" for k in range(len(shape))]
        stmts = body([Var(v) for v in names])
        for v, s in reversed(list(zip(names, shape))):
            stmts = [For(v, c(0), c(s), tuple(stmts), parallel=parallel)]
        return stmts

    def emit(self, n: Node, body: list[Stmt], origin: str | None = None) -> None:
        # the origin names no node id: equal graphs must give byte-equal sources (cache keys)
        self.kernels.append(Kernel(f"k{len(self.kernels)}_{n.op}", tuple(body),
                                   origin or f"{n.op}{list(n.shape)}:{n.dtype}",
                                   contraction=n.op in CONTRACTIONS))

    # -- per-kind lowering -------------------------------------------------------------------
    def elementwise(self, n: Node) -> None:
        def body(idx):
            args = [self.read(i, self.bcast(i.shape, idx)) for i in n.inputs]
            if n.op == "cast":  # (a rounding that widen inserted: "narrow", see transform.half_rounding)
                v = Op("narrow" if dict(n.attrs).get("opmath") else "cast", tuple(args), n.dtype)
            elif n.op == "identity":
                v = args[0]
            else:
                v = Op(n.op, tuple(args), n.dtype)
            return [self.store(n, idx, v)]

        self.emit(n, self.loops(n.shape, "i", body, True))

    def reduce(self, n: Node) -> None:
        (x,) = n.inputs
        axes, keep = n.attr("axes"), n.attr("keepdim")
        kept = [k for k in range(len(x.shape)) if k not in axes]
        rshape = [x.shape[k] for k in axes]
        op = n.op
        acc, best = "acc", "arg"

        def body(oidx):
            # output index -> index of the kept dims of x
            kidx = [oidx[k] for k in kept] if keep else list(oidx)

            def inner(ridx):
                full = [None] * len(x.shape)
                for k, e in zip(kept, kidx):
                    full[k] = e
                for k, e in zip(axes, ridx):
                    full[k] = e
                v = self.read(x, full)
                a = Var(acc, x.dtype)
                if op == "reduce_sum":
                    return [Assign(acc, _o("add", a, v))]
                if op == "reduce_prod":
                    return [Assign(acc, _o("mul", a, v))]
                if op == "reduce_max":
                    return [Assign(acc, _o("maximum", a, v))]
                if op == "reduce_min":
                    return [Assign(acc, _o("minimum", a, v))]
                # argmax / argmin: first index of the extreme value; NaN wins (as in PyTorch)
                flat = linear(list(zip(ridx, contiguous_strides(rshape))))
                better = Op("gt" if op == "argmax" else "lt", (v, a), "bool")
                if x.dtype.startswith("float"):
                    isnan_v = Op("isnan", (v,), "bool")
                    not_nan_a = Op("logical_not", (Op("isnan", (a,), "bool"),), "bool")
                    better = Op("logical_or", (better, _and(isnan_v, not_nan_a)), "bool")
                return [If(better, (Assign(acc, v), Assign(best, flat)))]

            init = {"reduce_sum": 0, "reduce_prod": 1}.get(op)
            if op in ("reduce_max", "argmax"):
                init = _lowest(x.dtype)
            elif op in ("reduce_min", "argmin"):
                init = _highest(x.dtype)
            stmts: list[Stmt] = [Let(acc, x.dtype, Const(init, x.dtype))]
            if op.startswith("arg"):
                stmts.append(Let(best, INDEX, c(0)))
            stmts += self.loops(rshape, "r", inner, False)
            stmts.append(self.store(n, oidx, Var(best if op.startswith("arg") else acc,
                                                 INDEX if op.startswith("arg") else x.dtype)))
            return stmts

        self.emit(n, self.loops(n.shape, "i", body, True))

    def scan(self, n: Node) -> None:
        """An inclusive scan: every line along ``axis`` (lines in parallel) folds its elements in
        order, storing each prefix; NaN and infinities propagate as in eager's sequential scan."""
        from ..graph.ops import SCAN

        (x,) = n.inputs
        axis, dt = n.attr("axis"), n.dtype
        outer = [s for k, s in enumerate(x.shape) if k != axis]
        init = {"scan_add": 0, "scan_mul": 1, "scan_max": _lowest(dt), "scan_min": _highest(dt)}[n.op]

        def body(oidx):
            def inner(r):
                idx = list(oidx[:axis]) + [r[0]] + list(oidx[axis:])
                return [Assign("acc", _o(SCAN[n.op], Var("acc", dt), self.read(x, idx))),
                        self.store(n, idx, Var("acc", dt))]

            return [Let("acc", dt, Const(init, dt)), *self.loops([x.shape[axis]], "r", inner, False)]

        self.emit(n, self.loops(outer, "i", body, True))

    def matmul(self, n: Node) -> None:
        a, b = n.inputs
        K = a.shape[-1]
        dt = n.dtype

        def body(idx):
            batch, m, nn = idx[:-2], idx[-2], idx[-1]

            def inner(r):
                ai = self.bcast(a.shape[:-2], batch) + [m, r[0]]
                bi = self.bcast(b.shape[:-2], batch) + [r[0], nn]
                return [Assign("acc", _o("add", Var("acc", dt), _o("mul", self.read(a, ai), self.read(b, bi))))]

            return [Let("acc", dt, Const(0, dt)), *self.loops([K], "r", inner, False),
                    self.store(n, idx, Var("acc", dt))]

        self.emit(n, self.loops(n.shape, "i", body, True))

    def conv2d(self, n: Node) -> None:
        x, w = n.inputs
        N, C, H, W = x.shape
        K, Cg, R, S = w.shape
        G = n.attr("groups")
        Kg = K // G
        (sh, sw), (dh, dw) = n.attr("stride"), n.attr("dilation")
        ph, qh, pw, qw = conv_padding(dict(n.attrs))
        dt = n.dtype
        _, _, OH, OW = n.shape

        def body(idx):
            b, g, kk, oh, ow = idx
            k = add(mul(g, c(Kg)), kk)

            def inner(r):
                ci, rr, ss = r
                ih = add(add(mul(oh, c(sh)), mul(rr, c(dh))), c(-ph))
                iw = add(add(mul(ow, c(sw)), mul(ss, c(dw))), c(-pw))
                prod = _o("mul", self.read(x, [b, add(mul(g, c(Cg)), ci), ih, iw]), self.read(w, [k, ci, rr, ss]))
                upd = Assign("acc", _o("add", Var("acc", dt), prod))
                conds = ([_in_range(ih, H)] if ph or (OH - 1) * sh + (R - 1) * dh - ph >= H else []) + \
                        ([_in_range(iw, W)] if pw or (OW - 1) * sw + (S - 1) * dw - pw >= W else [])
                return [If(_and(*conds), (upd,))] if conds else [upd]

            return [Let("acc", dt, Const(0, dt)), *self.loops([Cg, R, S], "r", inner, False),
                    self.store(n, [b, k, oh, ow], Var("acc", dt))]

        self.emit(n, self.loops([N, G, Kg, OH, OW], "i", body, True))

    def pool2d(self, n: Node) -> None:
        (x,) = n.inputs
        N, C, H, W = x.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (n.attr("kernel"), n.attr("stride"), n.attr("padding"),
                                                  n.attr("dilation"))
        mode = n.attr("mode")
        dt = x.dtype

        def body(idx):
            b, ch, oh, ow = idx
            hs = add(mul(oh, c(sh)), c(-ph))
            ws = add(mul(ow, c(sw)), c(-pw))

            def inner(r):
                ih, iw = add(hs, mul(r[0], c(dh))), add(ws, mul(r[1], c(dw)))
                v = self.read(x, [b, ch, ih, iw])
                a = Var("acc", dt)
                if mode == "max":
                    upd = [Assign("acc", _o("maximum", a, v))]
                elif mode == "argmax":  # the first in-bounds element always counts (as in PyTorch)
                    better = Op("logical_or", (Op("gt", (v, a), "bool"), Op("isnan", (v,), "bool")), "bool")
                    better = Op("logical_or", (_lt(Var("arg"), c(0)), better), "bool")
                    upd = [If(better, (Assign("acc", v), Assign("arg", add(mul(ih, c(W)), iw))))]
                else:
                    upd = [Assign("acc", _o("add", a, v)), Assign("cnt", add(Var("cnt"), c(1)))]
                return [If(_and(_in_range(ih, H), _in_range(iw, W)), tuple(upd))]

            init = 0 if mode == "avg" else _lowest(dt)
            stmts: list[Stmt] = [Let("acc", dt, Const(init, dt))]
            if mode == "argmax":
                stmts.append(Let("arg", INDEX, c(-1)))
            if mode == "avg":
                stmts.append(Let("cnt", INDEX, c(0)))
            stmts += self.loops([kh, kw], "r", inner, False)
            if mode == "avg":
                div = n.attr("divisor")
                if div:
                    d: Expr = c(div)
                elif n.attr("count_include_pad"):
                    he = _o("minimum", add(hs, c(kh)), c(H + ph))
                    we = _o("minimum", add(ws, c(kw)), c(W + pw))
                    d = mul(_o("sub", he, hs), _o("sub", we, ws))
                else:
                    d = Var("cnt")
                stmts.append(self.store(n, idx, _o("div", Var("acc", dt), Op("cast", (d,), dt))))
            else:
                stmts.append(self.store(n, idx, Var("arg" if mode == "argmax" else "acc", n.dtype)))
            return stmts

        self.emit(n, self.loops(n.shape, "i", body, True))

    def adaptive_avg_pool2d(self, n: Node) -> None:
        (x,) = n.inputs
        H, W = x.shape[-2:]
        OH, OW = n.attr("out")
        dt = x.dtype

        def body(idx):
            *lead, oh, ow = idx
            h0 = _o("floordiv", mul(oh, c(H)), c(OH))
            h1 = _o("floordiv", add(mul(oh, c(H)), c(H + OH - 1)), c(OH))
            w0 = _o("floordiv", mul(ow, c(W)), c(OW))
            w1 = _o("floordiv", add(mul(ow, c(W)), c(W + OW - 1)), c(OW))
            v = self.read(x, list(lead) + [Var("rh"), Var("rw")])
            loop = For("rh", h0, h1, (For("rw", w0, w1, (Assign("acc", _o("add", Var("acc", dt), v)),)),))
            cnt = mul(_o("sub", h1, h0), _o("sub", w1, w0))
            return [Let("acc", dt, Const(0, dt)), loop,
                    self.store(n, idx, _o("div", Var("acc", dt), Op("cast", (cnt,), dt)))]

        self.emit(n, self.loops(n.shape, "i", body, True))

    def _checked_index(self, e: Expr, size: int, wrap: bool, name: str = "ix") -> tuple[list[Stmt], Expr]:
        """Load of an index: wrap negatives (if ``wrap``: Python-style indexing), then fail
        (code 1) when out of range, reading element 0 instead of out of bounds."""
        iv = Var(name)
        stmts: list[Stmt] = [Let(name, INDEX, Op("cast", (e,), INDEX) if e.dtype != INDEX else e)]
        if wrap:
            stmts.append(If(_lt(iv, c(0)), (Assign(name, add(iv, c(size))),)))
        stmts.append(If(Op("logical_not", (_in_range(iv, size),), "bool"), (Fail(1), Assign(name, c(0)))))
        return stmts, iv

    def _index_region(self, x: Node, inds, dims, wrap: bool, idx) -> tuple[list[Stmt], list[Expr]]:
        """For an index ``idx`` of the region x[i0, i1, ...] selects (advanced indexing over
        ``dims`` with broadcast index tensors ``inds``): the checked index loads and the index
        of x it reads."""
        from ..graph.ops import broadcast_shapes

        nb = len(broadcast_shapes(*(i.shape for i in inds)))
        rest = [d for d in range(len(x.shape)) if d not in dims]
        if list(dims) == list(range(dims[0], dims[0] + len(dims))):  # adjacent: in their place
            mid = idx[dims[0]:dims[0] + nb]
            other = list(idx[:dims[0]]) + list(idx[dims[0] + nb:])
        else:
            mid, other = idx[:nb], list(idx[nb:])
        stmts: list[Stmt] = []
        xi: list = [None] * len(x.shape)
        for j, (d, ind) in enumerate(zip(dims, inds)):
            st, iv = self._checked_index(self.read(ind, self.bcast(ind.shape, mid)), x.shape[d], wrap, f"ix{j}")
            stmts += st
            xi[d] = iv
        for d, e in zip(rest, other):
            xi[d] = e
        return stmts, xi

    def index_nd(self, n: Node) -> None:
        """x[i0, i1, ...] on the dims ``dims`` with broadcast index tensors (advanced indexing)."""
        x, *inds = n.inputs

        def body(idx):
            stmts, xi = self._index_region(x, inds, n.attr("dims"), n.attr("wrap", False), idx)
            return stmts + [self.store(n, idx, self.read(x, xi))]

        self.emit(n, self.loops(n.shape, "i", body, True))

    def index_put(self, n: Node) -> None:
        """A copy of the base, then the indexed elements set (or increased) one after another:
        the second nest runs in order (repeated indices accumulate as in eager)."""
        from ..graph.ops import _index_nd_shape

        base, vals, *inds = n.inputs
        dims = n.attr("dims")
        self.emit(n, self.loops(n.shape, "i", lambda idx: [self.store(n, idx, self.read(base, idx))], True),
                  f"copy{list(n.shape)} for index_put")
        region = _index_nd_shape([base, *inds], {"dims": dims})

        def body(idx):
            stmts, xi = self._index_region(base, inds, dims, n.attr("wrap", False), idx)
            v = self.read(vals, self.bcast(vals.shape, idx))
            if n.attr("accumulate"):
                v = _o("add", self.read(n, xi), v)
            return stmts + [self.store(n, xi, v)]

        if math.prod(region):
            self.emit(n, self.loops(region, "i", body, False), f"index_put{list(region)} into {list(n.shape)}")

    def gather(self, n: Node) -> None:
        x, ind = n.inputs
        ax = n.attr("axis")
        ir = len(ind.shape)

        def body(idx):
            pre, mid, post = idx[:ax], idx[ax:ax + ir], idx[ax + ir:]
            stmts, iv = self._checked_index(self.read(ind, mid), x.shape[ax], n.attr("wrap", False))
            return stmts + [self.store(n, idx, self.read(x, list(pre) + [iv] + list(post)))]

        self.emit(n, self.loops(n.shape, "i", body, True))

    def take_along(self, n: Node) -> None:
        x, ind = n.inputs
        ax = n.attr("axis")

        def body(idx):
            stmts, iv = self._checked_index(self.read(ind, idx), x.shape[ax], False)
            xi = list(idx)
            xi[ax] = iv
            return stmts + [self.store(n, idx, self.read(x, xi))]

        self.emit(n, self.loops(n.shape, "i", body, True))

    def concat(self, n: Node) -> None:
        ax = n.attr("axis")
        off = 0
        for i in n.inputs:
            def body(idx, i=i, off=off):
                oi = list(idx)
                oi[ax] = add(oi[ax], c(off))
                return [self.store(n, oi, self.read(i, idx))]

            if i.numel:
                self.emit(n, self.loops(i.shape, "i", body, True), f"concat{list(n.shape)} part at {off}")
            off += i.shape[ax]

    def pad(self, n: Node) -> None:
        """The interior (a plain copy, no conditions: it vectorizes, and producers fused into it
        see an affine slice) and, per padded dimension, the slabs before and after it filled
        with the value (corners written once per dimension: harmless)."""
        (x,) = n.inputs
        pads = n.attr("pads")
        val = Const(n.attr("value"), n.dtype)
        # output range of each dimension that reads the input (negative pads crop)
        inner = [(max(0, lo), min(o, lo + i)) for (lo, _), o, i in zip(pads, n.shape, x.shape)]
        nests: list[Stmt] = []
        if all(a < b for a, b in inner):
            def copy(idx):
                out = [add(e, c(a)) for e, (a, _) in zip(idx, inner)]
                src = [add(e, c(a - lo)) for e, (a, _), (lo, _) in zip(idx, inner, pads)]
                return [self.store(n, out, self.read(x, src))]

            nests += self.loops([b - a for a, b in inner], "i", copy, True)
        for d, (a, b) in enumerate(inner):
            for lo, hi in ((0, a), (max(a, b), n.shape[d])):
                if hi > lo:
                    def fill(idx, d=d, lo=lo):
                        return [self.store(n, [add(e, c(lo)) if k == d else e for k, e in enumerate(idx)], val)]

                    shape = [hi - lo if k == d else s for k, s in enumerate(n.shape)]
                    nests += self.loops(shape, f"p{d}_{lo}_", fill, True)
        self.emit(n, nests)

    def generator(self, n: Node) -> None:
        self.emit(n, self.loops(n.shape, "i", lambda idx: [self.store(n, idx, self.read(n, idx))], True))


_KIND = {
    "elementwise": _Builder.elementwise, "reduce": _Builder.reduce, "scan": _Builder.scan,
    "contraction": _Builder.matmul,
    "concat": _Builder.concat, "generator": _Builder.generator,
}
_OP = {
    "conv2d": _Builder.conv2d, "pool2d": _Builder.pool2d, "adaptive_avg_pool2d": _Builder.adaptive_avg_pool2d,
    "gather": _Builder.gather, "take_along": _Builder.take_along, "pad": _Builder.pad,
    "index_nd": _Builder.index_nd, "index_put": _Builder.index_put,
}


def build(graph: Graph, lowerings: Mapping[str, Callable] | None = None) -> Program:
    """Graph IR -> affine Program (one kernel per materialized node; views become index maps).
    ``lowerings`` (from the backend, ``Backend.op_lowerings``): graph op -> ``fn(builder,
    node)`` for ops whose nests the target builds itself (attention)."""
    from ..graph.ops import OPS

    b = _Builder(graph)
    lowerings = lowerings or {}
    for n in graph.nodes:
        if n.op in ("input", "view") or (n.op in ("full", "iota") and n not in graph.outputs):
            continue
        if n.numel == 0:
            b.buf(n)
            continue
        rule = lowerings.get(n.op) or _OP.get(n.op) or _KIND.get(OPS[n.op].kind)
        if rule is None:
            raise Unsupported(f"no affine lowering for graph op {n.op} on this target")
        rule(b, n)
    symbols = symbols_of(*(n.shape for n in graph.nodes), *(n.attr("value") for n in graph.nodes if n.op == "full"))
    return Program(tuple(sorted(b.bufs.values(), key=lambda x: (x.kind, x.index, x.name))), tuple(b.kernels),
                   tuple(sorted(symbols)))
