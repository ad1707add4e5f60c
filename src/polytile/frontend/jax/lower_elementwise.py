"""Lowering rules: elementwise math, comparisons, selection and casts."""
from __future__ import annotations

import math

from ...dtypes import Unsupported, is_float
from ...graph.ir import Node
from . import layout
from .registry import ir_dtype, lowers

# primitive -> graph scalar function, computed in the result dtype
_UNARY = {
    "neg": "neg", "abs": "abs", "exp": "exp", "exp2": "exp2", "log": "log", "log1p": "log1p", "expm1": "expm1",
    "sqrt": "sqrt", "rsqrt": "rsqrt", "sin": "sin", "cos": "cos", "tan": "tan", "tanh": "tanh",
    "logistic": "sigmoid", "erf": "erf", "floor": "floor", "ceil": "ceil", "sign": "sign", "asin": "asin",
    "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh",
}
_BINARY = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "pow": "pow", "atan2": "atan2", "rem": "fmod",
    "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor",
}
_COMPARE = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}


def _float_only(ctx, x: Node) -> None:
    if not is_float(x.dtype):
        raise Unsupported(f"{ctx.prim} on {x.dtype}")


for _p, _fn in _UNARY.items():
    @lowers(_p)
    def _unary(ctx, x, accuracy=None, _fn=_fn, **params):
        if _fn not in ("neg", "abs", "sign"):
            _float_only(ctx, x)
        return layout.ew(ctx.b, _fn, x, dtype=ctx.out_dtype)

for _p, _fn in _BINARY.items():
    @lowers(_p)
    def _binary(ctx, a, c, _fn=_fn, **params):
        return layout.ew(ctx.b, _fn, a, c, dtype=ctx.out_dtype)

for _p, _fn in _COMPARE.items():
    @lowers(_p)
    def _compare(ctx, a, c, _fn=_fn, **params):
        return ctx.b.ew(_fn, a, c, dtype=a.dtype)


def _scalar_value(x: Node):
    return x.attr("value") if x.op == "full" else None


@lowers("max", "min")
def max_min(ctx, a, c):
    """``max(x, -inf)`` is ``x`` (as jax.nn.softmax writes its row maximum): dropped, so that the
    softmax stays recognizable (graph.attention)."""
    neutral = -math.inf if ctx.prim == "max" else math.inf
    for x, y in ((a, c), (c, a)):
        if _scalar_value(y) == neutral and x.shape == ctx.out_shape:
            return x
    return layout.ew(ctx.b, "maximum" if ctx.prim == "max" else "minimum", a, c, dtype=ctx.out_dtype)


@lowers("erfc")
def erfc(ctx, x, accuracy=None):
    """1 - erf(x): exact to an absolute 6e-8 (jax.nn.gelu's exact form uses erfc)."""
    _float_only(ctx, x)
    return ctx.b.ew("sub", 1.0, ctx.b.ew("erf", x), dtype=ctx.out_dtype)


@lowers("erf_inv")
def erf_inv(ctx, x):
    if x.dtype != "float32":
        raise Unsupported(f"erf_inv on {x.dtype}")
    return ctx.b.ew("erfinv", x)


@lowers("round")
def round_(ctx, x, rounding_method=0):
    """Ties to even (``jnp.round``) or away from zero (``lax.round``'s default)."""
    _float_only(ctx, x)
    b = ctx.b
    even = b.ew("round", x)
    if int(rounding_method) == 1:
        return even
    t = b.ew("trunc", x)
    tie = b.ew("eq", b.ew("abs", b.ew("sub", x, t)), 0.5)
    return b.where(tie, b.ew("add", t, b.ew("sign", x)), even)


@lowers("is_finite")
def is_finite(ctx, x):
    b = ctx.b
    return b.ew("logical_not", b.ew("logical_or", b.node("isnan", [x]), b.node("isinf", [x])))


@lowers("not")
def not_(ctx, x):
    return ctx.b.ew("logical_not" if x.dtype == "bool" else "bitwise_not", x)


@lowers("square")
def square(ctx, x):
    return ctx.b.ew("mul", x, x)


@lowers("integer_pow")
def integer_pow(ctx, x, y):
    """x ** y by repeated squaring (products only; a negative y takes the reciprocal)."""
    b = ctx.b
    n = abs(int(y))
    if n == 0:
        return b.full(1, x.dtype, x.shape)
    if n > 64:
        raise Unsupported(f"integer_pow with exponent {y}")
    result, base = None, x
    while n:
        if n & 1:
            result = base if result is None else b.ew("mul", result, base)
        n >>= 1
        if n:
            base = b.ew("mul", base, base)
    if y < 0:
        _float_only(ctx, x)
        result = b.ew("reciprocal", result)
    return result


@lowers("clamp")
def clamp(ctx, lo, x, hi):
    b = ctx.b
    return b.ew("minimum", b.ew("maximum", x, lo, dtype=x.dtype), hi, dtype=x.dtype)


@lowers("select_n")
def select_n(ctx, which, *cases):
    """cases[which]: a bool ``which`` picks cases[1] where true; an int one chains ``where``s."""
    b = ctx.b
    dt = ctx.out_dtype
    if len(cases) == 1:
        return b.expand(cases[0], ctx.out_shape)
    if which.dtype == "bool":
        if len(cases) != 2:
            raise Unsupported("select_n with a bool selector and more than two cases")
        return layout.where(b, which, cases[1], cases[0], dtype=dt)
    out = cases[-1]
    for k in range(len(cases) - 2, -1, -1):
        out = b.where(b.ew("eq", which, k, dtype=which.dtype), cases[k], out, dtype=dt)
    return out


@lowers("convert_element_type")
def convert_element_type(ctx, x, new_dtype, weak_type=False, sharding=None):
    return ctx.b.cast(x, ir_dtype(new_dtype))


@lowers("stop_gradient", "copy", "optimization_barrier")
def identity(ctx, *xs, **params):
    """No computation in a forward program."""
    return xs[0] if len(xs) == 1 else tuple(xs)


@lowers("reduce_precision")
def reduce_precision(ctx, x, exponent_bits, mantissa_bits):
    if (x.dtype, exponent_bits, mantissa_bits) in (("float32", 8, 23), ("float64", 11, 52)):
        return x
    raise Unsupported(f"reduce_precision to e{exponent_bits}m{mantissa_bits}")
