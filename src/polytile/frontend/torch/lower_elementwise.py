"""Lowering rules: elementwise math, comparisons, casts, tensor creation."""
from __future__ import annotations

import torch

from ...dtypes import Unsupported, from_torch
from ...graph import compose
from ...graph.ir import Node
from .registry import lowers

aten = torch.ops.aten

# ATen op -> graph scalar function, for ops whose result is computed in the output dtype
_UNARY = {
    aten.neg: "neg", aten.abs: "abs", aten.exp: "exp", aten.log: "log", aten.log1p: "log1p",
    aten.expm1: "expm1", aten.sqrt: "sqrt", aten.rsqrt: "rsqrt", aten.sin: "sin", aten.cos: "cos",
    aten.tan: "tan", aten.tanh: "tanh", aten.sigmoid: "sigmoid", aten.relu: "relu", aten.erf: "erf",
    aten.floor: "floor", aten.ceil: "ceil", aten.trunc: "trunc", aten.sign: "sign",
    aten.reciprocal: "reciprocal", aten.asin: "asin", aten.acos: "acos", aten.atan: "atan",
    aten.sinh: "sinh", aten.cosh: "cosh", aten.exp2: "exp2", aten.log2: "log2", aten.log10: "log10",
    aten.bitwise_not: "bitwise_not", aten.erfinv: "erfinv",
}
_BINARY = {
    aten.mul: "mul", aten.div: "div", aten.maximum: "maximum", aten.minimum: "minimum",
    aten.remainder: "remainder", aten.fmod: "fmod", aten.atan2: "atan2",
    aten.bitwise_and: "bitwise_and", aten.bitwise_or: "bitwise_or", aten.bitwise_xor: "bitwise_xor",
}
_COMPARE = {aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le", aten.gt: "gt", aten.ge: "ge"}
_LOGICAL = {aten.logical_and: "logical_and", aten.logical_or: "logical_or", aten.logical_xor: "logical_xor"}


def _overloads(packet, names):
    """The named overloads that exist and return a tensor (``aten.mul.default`` is Scalar x Scalar)."""
    ops = [getattr(packet, n) for n in names if hasattr(packet, n)]
    return [op for op in ops if str(op._schema.returns[0].type) == "Tensor"]


for _p, _fn in _UNARY.items():
    @lowers(*_overloads(_p, ["default"]))
    def _unary(ctx, x, _fn=_fn):
        return ctx.b.ew(_fn, x, dtype=ctx.out_dtype)

for _p, _fn in _BINARY.items():
    @lowers(*_overloads(_p, ["Tensor", "Scalar", "default", "Scalar_Tensor"]))
    def _binary(ctx, a, c, _fn=_fn):
        return ctx.b.ew(_fn, a, c, dtype=ctx.out_dtype)

for _p, _fn in _COMPARE.items():
    @lowers(*_overloads(_p, ["Tensor", "Scalar"]))
    def _compare(ctx, a, c, _fn=_fn):
        return ctx.b.ew(_fn, a, c, dtype=ctx.arg_dtype(0, 1))

for _p, _fn in _LOGICAL.items():
    @lowers(_p.default)
    def _logical(ctx, a, c, _fn=_fn):
        return ctx.b.ew(_fn, ctx.b.cast(a, "bool"), ctx.b.cast(c, "bool"))


@lowers(aten.logical_not.default)
def logical_not(ctx, x):
    return ctx.b.ew("logical_not", ctx.b.cast(x, "bool"))


@lowers(aten.isnan.default)
def isnan(ctx, x):
    return ctx.b.node("isnan", [x])


@lowers(aten.isinf.default)
def isinf(ctx, x):
    return ctx.b.node("isinf", [x])


def _floordiv(ctx, a, c):
    dt = ctx.out_dtype
    if dt.startswith("float"):
        return compose.floordiv(ctx.b, ctx.b.scalar_or(a, dt), ctx.b.scalar_or(c, dt))
    return ctx.b.ew("floordiv", a, c, dtype=dt)


@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(ctx, a, c, rounding_mode=None):
    if rounding_mode == "floor":
        return _floordiv(ctx, a, c)
    return ctx.b.ew({None: "div", "trunc": "truncdiv"}[rounding_mode], a, c, dtype=ctx.out_dtype)


@lowers(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(ctx, a, c):
    return _floordiv(ctx, a, c)


@lowers(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def add_sub(ctx, a, c, alpha=1):
    dt = ctx.out_dtype
    if alpha != 1:
        c = ctx.b.ew("mul", c, alpha, dtype=dt)
    op = "add" if ctx.node.target in (aten.add.Tensor, aten.add.Scalar) else "sub"
    if dt == "bool" and op == "add":
        return ctx.b.ew("logical_or", a, c, dtype=dt)
    return ctx.b.ew(op, a, c, dtype=dt)


@lowers(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(ctx, a, c, alpha=1):
    dt = ctx.out_dtype
    if alpha != 1:
        a = ctx.b.ew("mul", a, alpha, dtype=dt)
    return ctx.b.ew("sub", c, a, dtype=dt)


@lowers(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def pow_(ctx, a, e):
    dt = ctx.out_dtype
    if not isinstance(e, Node) and isinstance(a, Node):
        if e in (2, 3, 4) and not isinstance(e, bool):  # x*x(*x...): no libm call (GPT-2's GELU cubes)
            x = ctx.b.cast(a, dt)
            y = ctx.b.ew("mul", x, x)
            if e == 3:
                return ctx.b.ew("mul", y, x)
            return ctx.b.ew("mul", y, y) if e == 4 else y
        if e == 1:
            return ctx.b.ew("identity", a, dtype=dt)
        if e == 0.5 and dt.startswith("float"):
            return ctx.b.ew("sqrt", a, dtype=dt)
    return ctx.b.ew("pow", a, e, dtype=dt)


@lowers(aten.round.default)
def round_(ctx, x):
    return ctx.b.ew("round", x, dtype=ctx.out_dtype)


@lowers(aten.round.decimals)
def round_decimals(ctx, x, decimals=0):
    s = 10.0 ** decimals
    return ctx.b.ew("div", ctx.b.ew("round", ctx.b.ew("mul", x, s)), s)


def _clamp(ctx, x, lo, hi):
    """Bounds and input in the result dtype (a 0-d float64 bound does not widen a float32 x)."""
    b, dt = ctx.b, ctx.out_dtype
    return compose.clamp(b, b.cast(x, dt), None if lo is None else b.scalar_or(lo, dt),
                         None if hi is None else b.scalar_or(hi, dt))


@lowers(aten.clamp.default, aten.clamp.Tensor)
def clamp(ctx, x, min=None, max=None):
    return _clamp(ctx, x, min, max)


@lowers(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(ctx, x, lo):
    return _clamp(ctx, x, lo, None)


@lowers(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(ctx, x, hi):
    return _clamp(ctx, x, None, hi)


@lowers(aten.hardtanh.default)
def hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return _clamp(ctx, x, min_val, max_val)


@lowers(aten.gelu.default)
def gelu(ctx, x, approximate="none"):
    return compose.gelu(ctx.b, x, approximate)


@lowers(aten.silu.default)
def silu(ctx, x):
    return ctx.b.ew("mul", x, ctx.b.ew("sigmoid", x))


@lowers(aten.hardsigmoid.default)
def hardsigmoid(ctx, x):
    return ctx.b.ew("div", compose.clamp(ctx.b, ctx.b.ew("add", x, 3.0), 0.0, 6.0), 6.0)


@lowers(aten.hardswish.default)
def hardswish(ctx, x):
    return ctx.b.ew("mul", x, hardsigmoid(ctx, x))


@lowers(aten.leaky_relu.default)
def leaky_relu(ctx, x, negative_slope=0.01):
    b = ctx.b
    return b.where(b.ew("gt", x, 0.0, dtype=x.dtype), x, b.ew("mul", x, negative_slope))


@lowers(aten.elu.default)
def elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    b = ctx.b
    neg = b.ew("mul", b.ew("expm1", b.ew("mul", x, float(input_scale))), float(alpha))
    return b.ew("mul", b.where(b.ew("gt", x, 0.0, dtype=x.dtype), x, neg), float(scale))


@lowers(aten.softplus.default)
def softplus(ctx, x, beta=1.0, threshold=20.0):
    b = ctx.b
    bx = b.ew("mul", x, float(beta))
    soft = b.ew("div", b.ew("log1p", b.ew("exp", bx)), float(beta))
    return b.where(b.ew("gt", bx, float(threshold), dtype=x.dtype), x, soft)


@lowers(aten.mish.default)
def mish(ctx, x):
    return ctx.b.ew("mul", x, ctx.b.ew("tanh", softplus(ctx, x)))


@lowers(aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar)
def where(ctx, cond, a, c):
    return ctx.b.where(cond, a, c, dtype=ctx.out_dtype)


@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(ctx, x, mask, value):
    return ctx.b.where(mask, value, x, dtype=ctx.out_dtype)


@lowers(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(ctx, a, end, weight):
    b = ctx.b
    return b.ew("add", a, b.ew("mul", b.ew("sub", end, a), weight))


# ---------------------------------------------------------------- casts and copies
def _check_device(device):
    if device is not None and torch.device(device).type != "cpu":
        raise Unsupported(f"device {device}")


@lowers(aten._to_copy.default)
def to_copy(ctx, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    _check_device(device)
    return ctx.b.cast(x, ctx.out_dtype)


@lowers(torch.ops.prims.convert_element_type.default)
def convert_element_type(ctx, x, dtype):
    return ctx.b.cast(x, ctx.out_dtype)


@lowers(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
        aten.contiguous.default if hasattr(aten, "contiguous") else aten.clone.default)
def identity(ctx, x, memory_format=None):
    return x


@lowers(aten.copy.default)
def copy(ctx, dst, src, non_blocking=False):
    return ctx.b.cast(ctx.b.expand(src, dst.shape), dst.dtype)


# ---------------------------------------------------------------- creation
def _full(ctx, value):
    return ctx.b.full(value, ctx.out_dtype, ctx.out_shape)


@lowers(aten.full.default)
def full(ctx, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device)
    return _full(ctx, fill_value)


@lowers(aten.full_like.default)
def full_like(ctx, x, fill_value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_device(device)
    return _full(ctx, fill_value)


@lowers(aten.zeros_like.default, aten.empty_like.default, aten.zeros.default, aten.empty.memory_format,
        aten.new_zeros.default, aten.new_empty.default, aten.empty_strided.default, aten.empty_permuted.default)
def zeros(ctx, *args, **kwargs):
    _check_device(kwargs.get("device"))
    return _full(ctx, 0)


@lowers(aten.new_empty_strided.default)
def new_empty_strided(ctx, x, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    """Uninitialized memory: zeros, when the strides asked for are the contiguous ones (the
    graph's tensors are; a later as_strided of other strides would read another layout)."""
    _check_device(device)
    expect, acc = [], 1
    for k in reversed(size):
        expect.append(acc)
        acc *= max(k, 1)
    if any(k > 1 and st != e for k, st, e in zip(size, stride, reversed(expect))):
        raise Unsupported("new_empty_strided with strides other than contiguous")
    return _full(ctx, 0)


@lowers(aten.ones_like.default, aten.ones.default, aten.new_ones.default)
def ones(ctx, *args, **kwargs):
    _check_device(kwargs.get("device"))
    return _full(ctx, 1)


@lowers(aten.new_full.default)
def new_full(ctx, x, size, fill_value, **kwargs):
    return _full(ctx, fill_value)


@lowers(aten.fill.Scalar)
def fill(ctx, x, value):
    return _full(ctx, value)


@lowers(aten.scalar_tensor.default)
def scalar_tensor(ctx, value, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(ctx, value)


@lowers(aten.arange.start_step, aten.arange.start, aten.arange.default)
def arange(ctx, *args, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device)
    if len(args) == 1:
        start, step = 0, 1
    else:
        start, step = args[0], (args[2] if len(args) > 2 else 1)
    dt = ctx.out_dtype
    n = ctx.out_shape[0]
    if dt.startswith("float"):
        idx = ctx.b.iota(n, "int64")
        return ctx.b.ew("add", ctx.b.ew("mul", ctx.b.cast(idx, dt), float(step)), float(start))
    return ctx.b.iota(n, dt, int(start), int(step))
