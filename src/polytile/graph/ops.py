"""The closed set of graph ops: ONE table with arity, kind, shape rule and dtype rule per op."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..dtypes import Unsupported

Shape = tuple[int, ...]


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str  # input | elementwise | reduce | scan | contraction | window | view | index | concat | generator
    arity: int | None  # None: variadic
    shape: Callable[[Sequence[Any], dict], Shape]
    dtype: Callable[[Sequence[Any], dict], str]


def broadcast_shapes(*shapes: Shape) -> Shape:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        dims = {s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise Unsupported(f"shapes {shapes} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _bcast(ins, a):
    return broadcast_shapes(*(i.shape for i in ins))


def _first_dtype(ins, a):
    return ins[0].dtype


def _bool(ins, a):
    return "bool"


def _reduce_shape(ins, a):
    axes = set(a["axes"])
    return tuple(1 if k in axes else s for k, s in enumerate(ins[0].shape) if a["keepdim"] or k not in axes)


def _matmul_shape(ins, a):
    x, y = ins[0].shape, ins[1].shape
    if len(x) < 2 or len(y) < 2 or x[-1] != y[-2]:
        raise Unsupported(f"matmul shapes {x} @ {y}")
    return broadcast_shapes(x[:-2], y[:-2]) + (x[-2], y[-1])


def window_out(size: int, k: int, stride: int, pad: int, dil: int, ceil_mode: bool = False) -> int:
    span = dil * (k - 1) + 1
    num = size + 2 * pad - span
    if ceil_mode:
        out = -(-num // stride) + 1
        if (out - 1) * stride >= size + pad:  # last window must start inside the input or left pad
            out -= 1
    else:
        out = num // stride + 1
    return out


def conv_padding(a) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of a conv2d: ``padding`` before, ``padding_hi`` (default: the
    same) after; asymmetric padding is how JAX writes "SAME" for even strides."""
    (ph, pw) = a["padding"]
    (qh, qw) = a.get("padding_hi") or (ph, pw)
    return ph, qh, pw, qw


def _conv_shape(ins, a):
    n, c, h, w = ins[0].shape
    k, cg, r, s = ins[1].shape
    if cg * a["groups"] != c:
        raise Unsupported(f"conv2d channels {c} vs weight {ins[1].shape} groups {a['groups']}")
    (sh, sw), (dh, dw) = a["stride"], a["dilation"]
    ph, qh, pw, qw = conv_padding(a)
    # window_out pads both sides by its ``pad``: the two sides' sum is what sets the size
    return (n, k, window_out(h + ph + qh - 2 * ph, r, sh, ph, dh), window_out(w + pw + qw - 2 * pw, s, sw, pw, dw))


def _pool_shape(ins, a):
    n, c, h, w = ins[0].shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = a["kernel"], a["stride"], a["padding"], a["dilation"]
    cm = a["ceil_mode"]
    return (n, c, window_out(h, kh, sh, ph, dh, cm), window_out(w, kw, sw, pw, dw, cm))


def _pool_dtype(ins, a):
    return "int64" if a["mode"] == "argmax" else ins[0].dtype


def _adaptive_shape(ins, a):
    return tuple(ins[0].shape[:-2]) + tuple(a["out"])


def _attention_shape(ins, a):
    """q [..., H, L, D], kt [..., H / G, D, S], v [..., H / G, S, Dv]: G = ``kv_group`` query
    heads share each head of K and V (grouped-query attention; 1: every head its own)."""
    q, kt, v = (i.shape for i in ins[:3])
    g = a.get("kv_group", 1)
    kvb = tuple(q[:-2]) if g == 1 else tuple(q[:-3]) + (q[-3] // g,)
    if len(q) < 2 or (g > 1 and (len(q) < 3 or q[-3] % g)) or tuple(kt[:-2]) != kvb or tuple(v[:-2]) != kvb \
            or q[-1] != kt[-2] or kt[-1] != v[-2]:
        raise Unsupported(f"attention shapes q{q} kt{kt} v{v} (kv_group {g})")
    for m in ins[3:]:
        broadcast_shapes(m.shape, tuple(q[:-1]) + (kt[-1],))
    return tuple(q[:-1]) + (v[-1],)


def _attr_shape(ins, a):
    return tuple(a["shape"])


def _attr_dtype(ins, a):
    return a["dtype"]


def _gather_shape(ins, a):
    x, idx = ins[0].shape, ins[1].shape
    ax = a["axis"]
    return tuple(x[:ax]) + tuple(idx) + tuple(x[ax + 1:])


def _index_nd_shape(ins, a):
    x, inds = ins[0].shape, ins[1:]
    dims = list(a["dims"])
    if len(dims) != len(inds) or sorted(set(dims)) != dims:
        raise Unsupported("index_nd: one index tensor per indexed dim, dims sorted")
    b = broadcast_shapes(*(i.shape for i in inds))
    rest = [x[d] for d in range(len(x)) if d not in dims]
    if dims == list(range(dims[0], dims[0] + len(dims))):  # adjacent: result dims go in their place
        return tuple(x[:dims[0]]) + b + tuple(x[dims[-1] + 1:])
    return b + tuple(rest)


def _index_put_shape(ins, a):
    base, vals, inds = ins[0], ins[1], ins[2:]
    region = _index_nd_shape([base, *inds], a)
    broadcast_shapes(region, vals.shape)  # the values must broadcast to the indexed region
    if len(vals.shape) > len(region) or broadcast_shapes(region, vals.shape) != region:
        raise Unsupported(f"index_put: values {vals.shape} do not broadcast to {region}")
    if vals.dtype != base.dtype:
        raise Unsupported("index_put: values and destination of different dtypes (insert a cast)")
    return tuple(base.shape)


def _concat_shape(ins, a):
    ax = a["axis"]
    base = list(ins[0].shape)
    for i in ins[1:]:
        if len(i.shape) != len(base) or any(i.shape[k] != base[k] for k in range(len(base)) if k != ax):
            raise Unsupported("concat of mismatched shapes")
    base[ax] = sum(i.shape[ax] for i in ins)
    return tuple(base)


def _pad_shape(ins, a):
    return tuple(s + lo + hi for s, (lo, hi) in zip(ins[0].shape, a["pads"]))


# Scalar functions of elementwise ops: name -> arity. The C renderer has one template each.
UNARY = (
    "identity", "neg", "abs", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tan",
    "tanh", "sigmoid", "relu", "erf", "floor", "ceil", "round", "trunc", "sign", "reciprocal",
    "logical_not", "bitwise_not", "isnan", "asin", "acos", "atan", "sinh", "cosh", "exp2", "log2",
    "log10", "isinf", "erfinv",
)
BINARY = (
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "floordiv", "truncdiv", "remainder",
    "fmod", "atan2", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
    "bitwise_xor",
)
COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
REDUCE = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin")
# inclusive scans along one axis (attribute ``axis``), one scalar op each: out[i] = op(out[i-1], x[i])
SCAN = {"scan_add": "add", "scan_mul": "mul", "scan_max": "maximum", "scan_min": "minimum"}

OPS: dict[str, OpDef] = {}


def _def(name, kind, arity, shape, dtype):
    OPS[name] = OpDef(name, kind, arity, shape, dtype)


_def("input", "input", 0, _attr_shape, _attr_dtype)
for _n in UNARY:
    _def(_n, "elementwise", 1, _bcast, _bool if _n in ("isnan", "isinf") else _first_dtype)
for _n in BINARY:
    _def(_n, "elementwise", 2, _bcast, _first_dtype)
for _n in COMPARE:
    _def(_n, "elementwise", 2, _bcast, _bool)
_def("where", "elementwise", 3, _bcast, lambda ins, a: ins[1].dtype)
_def("cast", "elementwise", 1, _bcast, _attr_dtype)
for _n in REDUCE:
    _def(_n, "reduce", 1, _reduce_shape, (lambda ins, a: "int64") if _n.startswith("arg") else _first_dtype)
for _n in SCAN:
    _def(_n, "scan", 1, lambda ins, a: tuple(ins[0].shape), _first_dtype)
_def("matmul", "contraction", 2, _matmul_shape, _first_dtype)
_def("conv2d", "window", 2, _conv_shape, _first_dtype)
_def("pool2d", "window", 1, _pool_shape, _pool_dtype)
_def("adaptive_avg_pool2d", "window", 1, _adaptive_shape, _first_dtype)
_def("view", "view", 1, _attr_shape, _first_dtype)
# softmax(steps(q @ kt)) @ v over [*, L, D] x [*, D, S] x [*, S, Dv]; the score steps (scale,
# masks given as further inputs, causal) are an attribute (see graph.attention)
_def("attention", "attention", None, _attention_shape, _first_dtype)
_def("gather", "index", 2, _gather_shape, _first_dtype)
_def("take_along", "index", 2, lambda ins, a: tuple(ins[1].shape), _first_dtype)
_def("index_nd", "index", None, _index_nd_shape, _first_dtype)
# base with base[i0, i1, ...] (on the dims ``dims``, advanced-indexing order) set to values, or
# increased by them (``accumulate``: every repeated index adds, in order): inputs base, values,
# one index tensor per indexed dim
_def("index_put", "index", None, _index_put_shape, _first_dtype)
_def("concat", "concat", None, _concat_shape, _first_dtype)
_def("pad", "index", 1, _pad_shape, _first_dtype)
_def("full", "generator", 0, _attr_shape, _attr_dtype)
_def("iota", "generator", 0, _attr_shape, _attr_dtype)


def infer(op: str, inputs: Sequence[Any], attrs: dict) -> tuple[Shape, str]:
    """Shape and dtype of ``op`` applied to ``inputs``: the one place these rules live."""
    d = OPS.get(op)
    if d is None:
        raise Unsupported(f"unknown graph op {op!r}")
    if d.arity is not None and len(inputs) != d.arity:
        raise Unsupported(f"{op} takes {d.arity} inputs, got {len(inputs)}")
    if d.kind == "elementwise" and op not in ("where", "cast") and len({i.dtype for i in inputs}) > 1:
        raise Unsupported(f"{op}: mixed input dtypes {[i.dtype for i in inputs]} (insert casts)")
    return tuple(d.shape(inputs, attrs)), d.dtype(inputs, attrs)
