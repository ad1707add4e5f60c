"""Scalar-op templates of the Triton renderer, and the helper functions they call.

One template per op of ``graph.ops`` (``(rendered args, result dtype, arg dtype) -> Triton
expression``), with the semantics of the C renderer's table (``codegen.c.OPS``), which follows
eager: NaN-propagating maximum/minimum, floor division and modulo with the divisor's sign,
rounding half to even, the sign of zero kept. The helpers use only ``triton.language`` core
functions, so the same source runs in Triton's CPU interpreter (where ``libdevice`` does not
work) and compiles for the GPU. Ops with no template raise ``Unsupported``: the graph then runs
through ATen.
"""
from __future__ import annotations

from typing import Callable

from ..dtypes import Unsupported

TL_DTYPE = {
    "float32": "tl.float32", "float64": "tl.float64", "float16": "tl.float16", "bfloat16": "tl.bfloat16",
    "int64": "tl.int64", "int32": "tl.int32", "int16": "tl.int16", "int8": "tl.int8", "uint8": "tl.uint8",
    "bool": "tl.int1",
}

# @triton.jit helpers at the top of every generated module
PRELUDE = '''
INF = tl.constexpr(float("inf"))
NAN = tl.constexpr(float("nan"))


@triton.jit
def pt_floordiv_i(a, b):
    # floor division whichever way the integer // of the platform rounds
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


@triton.jit
def pt_mod_i(a, b):
    return a - pt_floordiv_i(a, b) * b


@triton.jit
def pt_truncdiv_i(a, b):
    q = pt_floordiv_i(a, b)
    return tl.where((q < 0) & (q * b != a), q + 1, q)


@triton.jit
def pt_trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def pt_rint(x):
    f = tl.floor(x)
    d = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0
    r = tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, tl.where(odd, f + 1.0, f)))
    return tl.where(r == 0, x * 0.0, r)  # -0.3 rounds to -0.0


@triton.jit
def pt_fmod(a, b):
    # a - trunc(a / b) * b with one rounding (exact while the quotient fits the mantissa), then
    # the quotient's off-by-one corrected; the result has a's sign, zeros included
    q = pt_trunc(a / b)
    r = tl.fma(-q, b, a)
    ab = tl.abs(b)
    r = tl.where((r != 0) & ((r < 0) != (a < 0)), tl.where(a < 0, r - ab, r + ab), r)
    r = tl.where(tl.abs(r) >= ab, tl.where(a < 0, r + ab, r - ab), r)
    return tl.where(r == 0, a * 0.0, r)


@triton.jit
def pt_mod_f(a, b):
    # eager's remainder: fmod moved to the divisor's sign
    r = pt_fmod(a, b)
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def pt_expm1(x):
    u = tl.exp(x)
    small = tl.abs(x) < 0.5
    lu = tl.log(tl.where(small & (u != 1.0), u, 2.0))
    return tl.where(u == 1.0, x, tl.where(small, (u - 1.0) * (x / lu), u - 1.0))


@triton.jit
def pt_log1p(x):
    u = 1.0 + x
    small = tl.abs(x) < 0.5
    d = tl.where(small & (u != 1.0), u - 1.0, 1.0)
    return tl.where(u == 1.0, x, tl.where(small, tl.log(u) * (x / d), tl.log(u)))


@triton.jit
def pt_tanh(x):
    e = pt_expm1(-2.0 * tl.abs(x))
    t = -e / (2.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def pt_sinh(x):
    return (pt_expm1(x) - pt_expm1(-x)) * 0.5


@triton.jit
def pt_cosh(x):
    return (tl.exp(x) + tl.exp(-x)) * 0.5


@triton.jit
def pt_pow_f(a, b):
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    whole = tl.floor(b) == b
    odd = whole & ((b - 2.0 * tl.floor(b * 0.5)) != 0)
    r = tl.where((a < 0) & odd, -r, r)
    r = tl.where((a < 0) & (b == b) & ~whole, NAN, r)
    return tl.where((b == 0) | (a == 1.0), 1.0, r)


@triton.jit
def pt_add(a, b):
    return a + b


@triton.jit
def pt_maximum_f(a, b):
    return tl.where((a != a) | (a > b), a, b)


@triton.jit
def pt_minimum_f(a, b):
    return tl.where((a != a) | (a < b), a, b)
'''


def _isfloat(dt: str) -> bool:
    return dt in ("float32", "float64", "float16", "bfloat16")


def _f(name: str, float_only: bool = True) -> Callable:
    def t(a, d, at):
        if float_only and not _isfloat(d):
            raise Unsupported(f"Triton renderer: {name} of {d}")
        return f"{name}({a[0]})"
    return t


OPS: dict[str, Callable[[list[str], str, str], str]] = {
    "identity": lambda a, d, t: a[0],
    "add": lambda a, d, t: f"({a[0]} + {a[1]})",
    "sub": lambda a, d, t: f"({a[0]} - {a[1]})",
    "mul": lambda a, d, t: f"({a[0]} * {a[1]})",
    "div": lambda a, d, t: f"({a[0]} / {a[1]})" if _isfloat(d) else f"pt_truncdiv_i({a[0]}, {a[1]})",
    "truncdiv": lambda a, d, t: f"pt_trunc({a[0]} / {a[1]})" if _isfloat(d) else f"pt_truncdiv_i({a[0]}, {a[1]})",
    "floordiv": lambda a, d, t: f"tl.floor({a[0]} / {a[1]})" if _isfloat(d) else f"pt_floordiv_i({a[0]}, {a[1]})",
    "remainder": lambda a, d, t: f"pt_mod_f({a[0]}, {a[1]})" if _isfloat(d) else f"pt_mod_i({a[0]}, {a[1]})",
    "fmod": lambda a, d, t: f"pt_fmod({a[0]}, {a[1]})" if _isfloat(d) else f"tl.where({a[1]} == 0, 0, {a[0]} - pt_truncdiv_i({a[0]}, {a[1]}) * {a[1]})",
    "pow": lambda a, d, t: f"pt_pow_f({a[0]}, tl.zeros_like({a[0]}) + {a[1]})" if _isfloat(d) else _unsupported("integer pow"),
    "maximum": lambda a, d, t: (f"pt_maximum_f({a[0]}, {a[1]})" if _isfloat(d)
                                else f"tl.where({a[0]} > {a[1]}, {a[0]}, {a[1]})"),
    "minimum": lambda a, d, t: (f"pt_minimum_f({a[0]}, {a[1]})" if _isfloat(d)
                                else f"tl.where({a[0]} < {a[1]}, {a[0]}, {a[1]})"),
    "eq": lambda a, d, t: f"({a[0]} == {a[1]})",
    "ne": lambda a, d, t: f"({a[0]} != {a[1]})",
    "lt": lambda a, d, t: f"({a[0]} < {a[1]})",
    "le": lambda a, d, t: f"({a[0]} <= {a[1]})",
    "gt": lambda a, d, t: f"({a[0]} > {a[1]})",
    "ge": lambda a, d, t: f"({a[0]} >= {a[1]})",
    "logical_and": lambda a, d, t: f"(({a[0]} != 0) & ({a[1]} != 0))",
    "logical_or": lambda a, d, t: f"(({a[0]} != 0) | ({a[1]} != 0))",
    "logical_xor": lambda a, d, t: f"(({a[0]} != 0) != ({a[1]} != 0))",
    "logical_not": lambda a, d, t: f"({a[0]} == 0)",
    "bitwise_and": lambda a, d, t: f"({a[0]} & {a[1]})",
    "bitwise_or": lambda a, d, t: f"({a[0]} | {a[1]})",
    "bitwise_xor": lambda a, d, t: f"({a[0]} ^ {a[1]})",
    "bitwise_not": lambda a, d, t: f"(~{a[0]})" if d != "bool" else f"({a[0]} == 0)",
    "where": lambda a, d, t: f"tl.where({a[0]}, {a[1]}, {a[2]})",
    "neg": lambda a, d, t: f"(-{a[0]})" if d != "bool" else a[0],
    "abs": lambda a, d, t: f"tl.abs({a[0]})",
    "relu": lambda a, d, t: f"tl.where({a[0]} < 0, 0, {a[0]})",
    "sigmoid": lambda a, d, t: f"(1.0 / (1.0 + tl.exp(-{a[0]})))",
    "reciprocal": lambda a, d, t: f"(1.0 / {a[0]})",
    "rsqrt": lambda a, d, t: f"(1.0 / tl.sqrt({a[0]}))",
    "sqrt": _f("tl.sqrt"),
    "exp": _f("tl.exp"),
    "exp2": _f("tl.exp2"),
    "log": _f("tl.log"),
    "log2": _f("tl.log2"),
    "log10": lambda a, d, t: f"(tl.log2({a[0]}) * 0.30102999566398120)",
    "sin": _f("tl.sin"),
    "cos": _f("tl.cos"),
    "tan": lambda a, d, t: f"(tl.sin({a[0]}) / tl.cos({a[0]}))",
    "erf": _f("tl.erf"),
    "tanh": _f("pt_tanh"),
    "sinh": _f("pt_sinh"),
    "cosh": _f("pt_cosh"),
    "expm1": _f("pt_expm1"),
    "log1p": _f("pt_log1p"),
    "sign": lambda a, d, t: f"(({a[0]} > 0).to({TL_DTYPE[d]}) - ({a[0]} < 0).to({TL_DTYPE[d]}))",
    "isnan": lambda a, d, t: f"({a[0]} != {a[0]})",
    "isinf": lambda a, d, t: f"(tl.abs({a[0]}) == INF)" if _isfloat(t) else f"({a[0]} != {a[0]})",
    "round": lambda a, d, t: f"pt_rint({a[0]})" if _isfloat(d) else a[0],
    "floor": lambda a, d, t: f"tl.floor({a[0]})" if _isfloat(d) else a[0],
    "ceil": lambda a, d, t: f"tl.ceil({a[0]})" if _isfloat(d) else a[0],
    "trunc": lambda a, d, t: f"pt_trunc({a[0]})" if _isfloat(d) else a[0],
}


def _unsupported(what: str) -> str:
    raise Unsupported(f"Triton renderer: {what}")


def render_op(fn: str, args: list[str], dtype: str, arg_dtype: str) -> str:
    t = OPS.get(fn)
    if t is None:
        raise Unsupported(f"Triton renderer has no template for scalar op {fn!r}")
    return t(args, dtype, arg_dtype)
