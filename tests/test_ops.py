"""Per-op sweep: every ATen op polytile lowers, compiled and compared against eager PyTorch.

One table (``CASES``) drives everything. A case is an id, a function written with ordinary
torch ops, and a generator of its inputs (seeded from the id). Each case is compiled with
``torch.compile(fn, backend="polytile", dynamic=False)`` under ``torch.no_grad()`` and must

* match eager by the accuracy rule of DESIGN.md section 4 (tests/accuracy.py) with tol 1e-4:
  allclose(atol=rtol=1e-4), else an RMSE comparison against a float64 run; int/bool results
  must be equal, and dtypes and shapes must match;
* compile natively, with nothing falling back to ATen (``stats()["ops_fallen_back"] == {}``).

Cases that compute several ops in one graph (to keep the compile count, and the runtime, low)
return a dict keyed by op name, so a failure names the op.

A few rules are for ATen overloads that the core-ATen decompositions rewrite before polytile sees
a graph (``aten.hardswish``, ``aten.rsub``, ``aten.t`` ...). Cases with ``path="aten"`` reach those
rules directly: the function calls the overloads explicitly, is traced with ``fx.symbolic_trace``
(no dispatch, so nothing is decomposed) and compiled with ``polytile.compile_graph``; overloads
without a tensor argument (``aten.zeros``, ``aten.arange``) are traced with make_fx instead
(``path="aten_factory"``).

A case that fails for a reason outside the lowering rules carries ``xfail=<reason>`` (a strict
xfail: it must keep failing until the bug is fixed).

The last test checks that every rule of the lowering table was invoked by at least one case.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.utils._pytree import tree_leaves

import polytile
from accuracy import assert_accurate, fp64_reference  # tests/accuracy.py: the DESIGN.md section 4 rule
from polytile.frontend.torch.registry import LOWERINGS, ensure_loaded

aten = torch.ops.aten
TOL = 1e-4


# ------------------------------------------------------------------------------ the table
@dataclass(frozen=True)
class Case:
    id: str
    fn: Callable
    make: Callable[[], tuple]  # fresh inputs (the test seeds the RNG from the id first)
    path: str = "dynamo"  # "dynamo": torch.compile; "aten" / "aten_factory": explicit overloads, see _compile_aten
    xfail: str | None = None  # a known failure outside the lowering rules (strict xfail)
    reference: Callable | None = None  # eager's function where ``fn`` has no CPU kernel (CUDA-only ops)


CASES: list[Case] = []


def case(id: str, fn: Callable, make: Callable[[], tuple], **kw) -> None:
    assert all(c.id != id for c in CASES), f"duplicate case id {id}"
    CASES.append(Case(id, fn, make, **kw))


# input generators
def randn(*s, dtype=torch.float32):
    return torch.randn(s, dtype=dtype)


def pos(*s):  # (0.1, 2.1): domain of log, sqrt, ...
    return torch.rand(s) * 2 + 0.1


def unit(*s):  # (-0.9, 0.9): domain of asin, acos, erfinv
    return torch.rand(s) * 1.8 - 0.9


def wide(*s):  # spread-out values for rounding ops (never exactly .5)
    return torch.randn(s) * 4 + 0.013


def ints(lo, hi, *s, dtype=torch.int64):
    return torch.randint(lo, hi, s, dtype=dtype)


def nonzero_ints(lo, hi, *s, dtype=torch.int64):
    x = torch.randint(lo, hi, s, dtype=dtype)
    return torch.where(x == 0, torch.ones_like(x), x)


def bools(*s):
    return torch.rand(s) > 0.5


def special(*s):  # finite values with some nan / +-inf sprinkled in
    x = torch.randn(s)
    flat = x.view(-1)
    flat[::5] = float("nan")
    flat[1::7] = float("inf")
    flat[2::9] = float("-inf")
    return x


# Layouts of one float operand: how the compiled graph receives it. Non-contiguous ones reach the
# graph as strided views of the caller's storage.
LAYOUTS = {
    "7x13": lambda g: g(7, 13),
    "transposed": lambda g: g(13, 7).t(),
    "sliced": lambda g: g(9, 27)[1:8, 1::2],  # offset + step: [7, 13]
    "expanded": lambda g: g(7, 1).expand(7, 13),
    "0d": lambda g: g(),
    "size1": lambda g: g(1, 5, 1),
    "3d_permuted": lambda g: g(5, 3, 4).permute(1, 2, 0),
}
ODD_LAYOUTS = ["transposed", "sliced", "expanded", "0d", "size1", "3d_permuted"]


def _rot(k: int) -> str:
    return ODD_LAYOUTS[k % len(ODD_LAYOUTS)]


# ---------------------------------------------------------------- elementwise: unary (float)
UNARY = [  # (name, fn, generator)
    ("neg", torch.neg, randn), ("abs", torch.abs, randn), ("exp", torch.exp, randn),
    ("log", torch.log, pos), ("log1p", torch.log1p, pos), ("expm1", torch.expm1, randn),
    ("sqrt", torch.sqrt, pos), ("rsqrt", torch.rsqrt, pos), ("sin", torch.sin, randn),
    ("cos", torch.cos, randn), ("tan", torch.tan, unit), ("tanh", torch.tanh, randn),
    ("sigmoid", torch.sigmoid, randn), ("relu", torch.relu, randn), ("erf", torch.erf, randn),
    ("floor", torch.floor, wide), ("ceil", torch.ceil, wide), ("trunc", torch.trunc, wide),
    ("round", torch.round, wide), ("round_decimals", lambda x: torch.round(x, decimals=2), wide),
    ("sign", torch.sign, lambda *s: torch.randn(s).round()),  # has exact zeros
    ("reciprocal", torch.reciprocal, pos), ("asin", torch.asin, unit), ("acos", torch.acos, unit),
    ("atan", torch.atan, randn), ("sinh", torch.sinh, randn), ("cosh", torch.cosh, randn),
    ("exp2", torch.exp2, randn), ("log2", torch.log2, pos), ("log10", torch.log10, pos),
    ("erfinv", torch.erfinv, unit), ("square", torch.square, randn), ("frac", torch.frac, wide),
    ("sigmoid_float64", torch.sigmoid, lambda *s: randn(*s, dtype=torch.float64)),
]


def _grouped(table):
    """{generator: {name: fn}} of a (name, fn, generator, ...) table, in table order."""
    groups: dict = {}
    for name, fn, gen, *_ in table:
        groups.setdefault(gen, {})[name] = fn
    return groups


def _all_of(fns):
    """One compiled function computing several ops; results keyed by op name (failures say which)."""
    return lambda *xs: {name: fn(*xs) for name, fn in fns.items()}


# each op alone on one odd layout (rotating), and all ops sharing an input domain in one graph on 7x13
for _k, (_name, _fn, _gen) in enumerate(UNARY):
    case(f"{_name}-{_rot(_k)}", lambda x, _fn=_fn: _fn(x), lambda _g=_gen, _l=_rot(_k): (LAYOUTS[_l](_g),))
for _gen, _fns in _grouped(UNARY).items():
    case(f"unary-7x13-{'-'.join(_fns)}", _all_of(_fns), lambda _g=_gen: (_g(7, 13),))

case("isnan-isinf-special", lambda x: (torch.isnan(x), torch.isinf(x), torch.isfinite(x)), lambda: (special(7, 13),))
case("isnan-isinf-transposed", lambda x: (torch.isnan(x), torch.isinf(x)), lambda: (special(13, 7).t(),))
case("nan_to_num", lambda x: torch.nan_to_num(x, nan=0.5, posinf=9.0, neginf=-9.0), lambda: (special(7, 13),))
case("int-neg-abs-sign", lambda x: (-x, x.abs(), x.sign()), lambda: (ints(-9, 9, 7, 13),))
case("bitwise_not-int64", lambda x: ~x, lambda: (ints(-50, 50, 7, 13),))
case("bitwise_not-bool-transposed", lambda x: ~x, lambda: (bools(13, 7).t(),))
case("logical_not-float", torch.logical_not, lambda: (torch.randn(7, 13).round(),))
case("logical_not-bool-0d", torch.logical_not, lambda: (torch.tensor(True),))

# ---------------------------------------------------------------- elementwise: binary
PAIRS = {  # (a, b) layouts with broadcasting
    "same": lambda g: (g(7, 13), g(7, 13)),
    "bcast_7x1_1x13": lambda g: (g(7, 1), g(1, 13)),
    "bcast_rank_13": lambda g: (g(3, 7, 13), g(13)),
    "transposed_sliced": lambda g: (g(13, 7).t(), g(7, 26)[:, ::2]),
    "0d_tensor": lambda g: (g(), g(7, 13)),
    "expanded_size1": lambda g: (g(1, 13).expand(7, 13), g(7, 1, 1)),
}
PAIR_ODD = ["bcast_7x1_1x13", "bcast_rank_13", "transposed_sliced", "0d_tensor", "expanded_size1"]
BINARY = [  # (name, fn(a, b), generator of a, generator of b or None = same)
    ("add", torch.add, randn, None), ("add_alpha", lambda a, b: torch.add(a, b, alpha=2.5), randn, None),
    ("sub", torch.sub, randn, None), ("sub_alpha", lambda a, b: torch.sub(a, b, alpha=-0.5), randn, None),
    ("mul", torch.mul, randn, None), ("div", torch.div, randn, pos),
    ("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc"), wide, pos),
    ("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor"), wide, pos),
    ("maximum", torch.maximum, randn, None), ("minimum", torch.minimum, randn, None),
    ("remainder", torch.remainder, wide, randn), ("fmod", torch.fmod, wide, randn),
    ("atan2", torch.atan2, randn, None), ("pow", torch.pow, pos, randn),
    ("floor_divide", torch.floor_divide, wide, pos), ("xlogy", torch.xlogy, randn, pos),
]


def _pair_maker(pair, ga, gb):
    def make():
        a, _ = PAIRS[pair](ga)
        _, b = PAIRS[pair](gb or ga)
        return a, b
    return make


# each op alone on one odd pair of layouts (rotating), and ops sharing input domains in one graph
for _k, (_name, _fn, _ga, _gb) in enumerate(BINARY):
    _p = PAIR_ODD[_k % len(PAIR_ODD)]
    case(f"{_name}-{_p}", lambda a, b, _fn=_fn: _fn(a, b), _pair_maker(_p, _ga, _gb))
for (_ga, _gb), _fns in _grouped([(n, f, (ga, gb)) for n, f, ga, gb in BINARY]).items():
    case(f"binary-same-{'-'.join(_fns)}", _all_of(_fns), _pair_maker("same", _ga, _gb))

# python scalars as the second (or first) operand
case("scalar-arith", lambda x: (x + 2, x - 0.5, x * 3, x / 4, 2 - x, 1 / x, x ** 2, x ** 0.5, x ** 3, 2 ** x),
     lambda: (pos(7, 13),))
case("scalar-arith-0d", lambda x: (x * 1.5 + 1, 3 - x, x ** 1), lambda: (randn(),))
case("scalar-remainder-fmod", lambda x: (x % 1.5, torch.fmod(x, -1.25), torch.remainder(2.5, x)),
     lambda: (wide(7, 13),))
case("div-modes-scalar", lambda x: (torch.div(x, 3, rounding_mode="trunc"), torch.div(x, -2.5, rounding_mode="floor")),
     lambda: (wide(7, 13),))
case("lerp", lambda a, b, w: (torch.lerp(a, b, 0.3), torch.lerp(a, b, w)), lambda: (randn(7, 13), randn(13), torch.rand(7, 1)))

# integer and mixed-dtype arithmetic (exact for int results)
case("int-add-sub-mul", lambda a, b: (a + b, a - b, a * b, a + 3, a * -2), lambda: (ints(-9, 9, 7, 13), ints(-9, 9, 13)))
case("int32-int64-promote", lambda a, b: (a + b, a * b, a - 1), lambda: (ints(-9, 9, 7, 13, dtype=torch.int32), ints(-9, 9, 7, 1)))
case("int32-scalar", lambda a: (a + 3, a * 2, a // 3, a % 4), lambda: (ints(-20, 20, 7, 13, dtype=torch.int32),))
case("int-float-promote", lambda a, b: (a + b, a * 2.5, a / 4, b - a), lambda: (ints(-9, 9, 7, 13), randn(7, 13)))
case("int-truediv", lambda a, b: a / b, lambda: (ints(-20, 20, 7, 13), nonzero_ints(-5, 5, 7, 13)))
case("int-div-modes", lambda a, b: (torch.div(a, b, rounding_mode="trunc"), torch.div(a, b, rounding_mode="floor"), a // b),
     lambda: (ints(-20, 20, 7, 13), nonzero_ints(-5, 5, 7, 13)))
case("int-remainder-fmod", lambda a, b: (torch.remainder(a, b), torch.fmod(a, b), a % 3, torch.fmod(a, -3)),
     lambda: (ints(-20, 20, 7, 13), nonzero_ints(-5, 5, 13)))
case("int-maximum-minimum", lambda a, b: (torch.maximum(a, b), torch.minimum(a, b)), lambda: (ints(-9, 9, 7, 13), ints(-9, 9, 7, 1)))
case("float-pow-small-int", lambda a: (a ** 3, a ** 4, torch.pow(a, 3.0), a ** 2.5), lambda: (randn(7, 13).abs() + 0.1,))
case("int-pow", lambda a, b: (a ** 2, a ** 3, torch.pow(a, b)), lambda: (ints(-5, 5, 7, 13), ints(0, 4, 7, 13)))
case("int-bitwise", lambda a, b: (a & b, a | b, a ^ b, a & 6, 5 | a), lambda: (ints(-50, 50, 7, 13), ints(0, 64, 13)))
case("bool-bitwise", lambda a, b: (a & b, a | b, a ^ b), lambda: (bools(7, 13), bools(13, 7).t()))
case("bool-add-mul", lambda a, b: (a + b, a * b), lambda: (bools(7, 13), bools(7, 1)))
case("uint8-int8-add", lambda a, b: (a + b, a * 2), lambda: (ints(0, 100, 7, 13, dtype=torch.uint8), ints(-9, 9, 13, dtype=torch.int8)))
case("float64-float32-promote", lambda a, b: (a + b, a * b), lambda: (randn(7, 13, dtype=torch.float64), randn(13)))

# comparisons (bool results)
COMPARE = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}
case("compare-float-bcast", lambda a, b: {n: (f(a, b), f(a, 0.0)) for n, f in COMPARE.items()},
     lambda: (torch.randn(7, 13).round(), torch.randn(13).round()))
case("compare-int-transposed", lambda a, b: {n: (f(a, b), f(a, 2), f(a, 1.5)) for n, f in COMPARE.items()},
     lambda: (ints(-3, 3, 13, 7).t(), ints(-3, 3, 7, 1, dtype=torch.int32)))
case("compare-float32-vs-0d-float64", lambda a, b: {n: f(a, b) for n, f in COMPARE.items()},  # compares in float32
     lambda: (torch.tensor([0.1, 0.2, 0.3, -0.1]), torch.tensor(0.1, dtype=torch.float64)))
case("eq-bool", lambda a, b: (a == b, a != b), lambda: (bools(7, 13), bools(7, 13)))
case("compare-0d", lambda a, b: (a < b, a >= b), lambda: (randn(), randn(7, 13)))
case("logical-bool", lambda a, b: (torch.logical_and(a, b), torch.logical_or(a, b), torch.logical_xor(a, b)),
     lambda: (bools(7, 13), bools(13)))
case("logical-float-int", lambda a, b: (torch.logical_and(a, b), torch.logical_or(a, b), torch.logical_xor(a, b)),
     lambda: (torch.randn(7, 13).round(), ints(-1, 2, 7, 13)))

# where / masked_fill / clamp
case("where-bcast", lambda c, a, b: torch.where(c, a, b), lambda: (bools(7, 13), randn(13), randn(7, 1)))
case("where-scalars", lambda c, a: (torch.where(c, a, 0.0), torch.where(c, -1.0, a), torch.where(c, 1.0, 0.0)),
     lambda: (bools(7, 13), randn(7, 13)))
case("where-int", lambda c, a, b: torch.where(c, a, b), lambda: (bools(13, 7).t(), ints(-9, 9, 7, 13), ints(-9, 9, 13, dtype=torch.int32)))
case("where-from-compare", lambda a: torch.where(a > 0, a, a * 0.1), lambda: (randn(7, 13)[:, ::2],))
case("masked_fill-scalar", lambda x, m: (x.masked_fill(m, -1.5), x.masked_fill(m, float("-inf"))), lambda: (randn(7, 13), bools(13)))
case("masked_fill-0d-tensor", lambda x, m, v: x.masked_fill(m, v), lambda: (randn(13, 7).t(), bools(7, 1), randn()))
case("masked_fill-int", lambda x, m: x.masked_fill(m, 7), lambda: (ints(-9, 9, 7, 13), bools(7, 13)))
case("clamp-min-max", lambda x: (torch.clamp(x, -0.5, 0.5), torch.clamp(x, min=0.1), torch.clamp(x, max=-0.2)),
     lambda: (randn(7, 13),))
case("clamp-tensor-bounds", lambda x, lo, hi: torch.clamp(x, lo, hi), lambda: (randn(7, 13), -torch.rand(13), torch.rand(7, 1)))
case("clamp-tensor-min-only", lambda x, lo: (torch.clamp(x, min=lo), torch.clamp_min(x, lo), torch.clamp_max(x, lo)),
     lambda: (randn(13, 7).t(), randn(13)))
case("clamp-int", lambda x: (torch.clamp(x, -3, 4), torch.clamp(x, min=0)), lambda: (ints(-9, 9, 7, 13),))
case("clamp-int-float-bound", lambda x: torch.clamp(x, 0.5, 3.5), lambda: (ints(-9, 9, 7, 13),))
case("clamp-0d", lambda x: torch.clamp(x, -0.1, 0.1), lambda: (randn(),))

# ---------------------------------------------------------------- activations
ACTIVATIONS = [
    ("gelu", F.gelu), ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")), ("silu", F.silu),
    ("hardswish", F.hardswish), ("hardsigmoid", F.hardsigmoid), ("leaky_relu", F.leaky_relu),
    ("leaky_relu_0.2", lambda x: F.leaky_relu(x, 0.2)), ("elu", F.elu), ("elu_alpha", lambda x: F.elu(x, alpha=0.5)),
    ("selu", F.selu), ("celu", lambda x: F.celu(x, alpha=1.5)), ("softplus", F.softplus),
    ("softplus_beta", lambda x: F.softplus(x, beta=2.0, threshold=5.0)), ("mish", F.mish),
    ("hardtanh", F.hardtanh), ("relu6", F.relu6), ("logsigmoid", F.logsigmoid),
]
for _k, (_name, _fn) in enumerate(ACTIVATIONS):
    case(f"{_name}-{_rot(_k)}", lambda x, _fn=_fn: _fn(x), lambda _l=_rot(_k): (LAYOUTS[_l](wide),))
case("activations-7x13", _all_of(dict(ACTIVATIONS)), lambda: (wide(7, 13),))
case("activations-extreme-values", _all_of(dict(ACTIVATIONS)),
     lambda: (torch.tensor([-100.0, -20.5, -19.9, -5.0, -3.0, -1e-3, 0.0, 1e-3, 3.0, 5.0, 19.9, 20.5, 100.0]),))

# ---------------------------------------------------------------- casts and copies
CASTS = [  # (name, generator, target dtype)
    ("float-int64", lambda: wide(7, 13) * 3, torch.int64), ("float-int32", lambda: wide(13, 7).t(), torch.int32),
    ("float-bool", lambda: torch.randn(7, 13).round(), torch.bool), ("float-float64", lambda: randn(7, 13), torch.float64),
    ("float64-float32", lambda: randn(7, 13, dtype=torch.float64), torch.float32),
    ("int64-float", lambda: ints(-99, 99, 7, 13), torch.float32), ("int64-int32", lambda: ints(-99, 99, 7, 13), torch.int32),
    ("int32-int64", lambda: ints(-99, 99, 7, 13, dtype=torch.int32), torch.int64),
    ("int-bool", lambda: ints(-2, 2, 7, 13), torch.bool), ("bool-float", lambda: bools(7, 13), torch.float32),
    ("bool-int64", lambda: bools(13, 7).t(), torch.int64), ("int64-uint8", lambda: ints(0, 255, 7, 13), torch.uint8),
    ("float-int64-0d", lambda: wide(), torch.int64), ("float-int64-expanded", lambda: wide(7, 1).expand(7, 13), torch.int64),
]
for _name, _gen, _dt in CASTS:
    case(f"to_copy-{_name}", lambda x, _dt=_dt: x.to(_dt), lambda _gen=_gen: (_gen(),))
case("type_as-and-back", lambda x, y: (x.type_as(y) + y, y.long()), lambda: (ints(-9, 9, 7, 13), randn(7, 13)))
case("clone-transposed", lambda x: x.t().clone(), lambda: (randn(7, 13),))
case("contiguous-sliced", lambda x: x[:, 1::3].contiguous(), lambda: (randn(7, 13),))
case("copy_-into-empty", lambda x: torch.empty(7, 13).copy_(x.t()), lambda: (randn(13, 7),))
case("copy_-bcast-cast", lambda x: torch.zeros(7, 13, dtype=torch.float64).copy_(x), lambda: (ints(-9, 9, 13),))

# ---------------------------------------------------------------- creation
case("arange-int", lambda x: (torch.arange(13), x + torch.arange(13)), lambda: (ints(-9, 9, 7, 13),))
case("arange-start-step", lambda x: (torch.arange(2, 40, 3), torch.arange(-5, 5, dtype=torch.int32), x * torch.arange(7, 0, -1).view(7, 1)),
     lambda: (randn(7, 13),))
case("arange-float", lambda x: (torch.arange(0.0, 1.3, 0.1), x + torch.arange(13, dtype=torch.float32), torch.arange(5.0, dtype=torch.float64)),
     lambda: (randn(7, 13),))
case("full-zeros-ones", lambda x: (torch.full((7, 13), 3.5), torch.zeros(3, 4, dtype=torch.int32), torch.ones(2, 3, dtype=torch.bool),
                                   x + torch.ones(13), torch.full((), -2.0)),
     lambda: (randn(7, 13),))
case("like-constructors", lambda x, i: (torch.zeros_like(x), torch.ones_like(i), torch.full_like(x, 7.25), torch.empty_like(x).fill_(2.0),
                                        x.new_zeros(3, 2), x.new_ones(4), x.new_full((2, 5), -3.0), x.new_empty(3).fill_(1.0) + 1,
                                        torch.zeros_like(x.t()) + x.t()),
     lambda: (randn(7, 13), ints(-9, 9, 7, 13)))
case("scalar_tensor-constant", lambda x: x * torch.tensor(2.5) + torch.tensor([1.0, 2.0, 3.0] * 4 + [0.5]), lambda: (randn(7, 13),))

# ---------------------------------------------------------------- reductions
REDUCTIONS = [  # (name, fn, generator)
    ("sum-all", lambda x: x.sum(), lambda: (randn(7, 13),)),
    ("sum-dim1", lambda x: x.sum(1), lambda: (randn(7, 13),)),
    ("sum-dims-keepdim", lambda x: x.sum((0, 2), keepdim=True), lambda: (randn(3, 5, 7),)),
    ("sum-1000", lambda x: (x.sum(-1), x.sum()), lambda: (randn(3, 1000),)),
    ("sum-1000-transposed", lambda x: x.sum(0), lambda: (randn(5, 1003).t(),)),
    ("sum-size1-dim", lambda x: x.sum(1), lambda: (randn(7, 1, 13),)),
    ("sum-0d", lambda x: (x.sum(), x.sum(0)), lambda: (randn(),)),
    ("sum-bool-int", lambda b, i: (b.sum(), b.sum(1), i.sum(0), i.sum()), lambda: (bools(7, 13), ints(-9, 9, 7, 13, dtype=torch.int32))),
    ("sum-dtype-float64", lambda x: x.sum(1, dtype=torch.float64), lambda: (randn(7, 13),)),
    ("mean", lambda x: (x.mean(), x.mean(1), x.mean((0, 1), keepdim=True), x.mean(-1, keepdim=True)), lambda: (randn(3, 7, 13),)),
    ("mean-1000-sliced", lambda x: x.mean(1), lambda: (randn(4, 2001)[:, ::2],)),
    ("amax-amin", lambda x: (x.amax(1), x.amin(0), x.amax((0, 2), keepdim=True), x.amin(), x.amax(-1)), lambda: (randn(3, 7, 13),)),
    ("amax-amin-int", lambda x: (x.amax(0), x.amin(1, keepdim=True)), lambda: (ints(-99, 99, 13, 7).t(),)),
    ("max-min-all", lambda x: (x.max(), x.min()), lambda: (randn(7, 13),)),
    ("max-min-all-int", lambda x: (x.max(), x.min()), lambda: (ints(-99, 99, 7, 13),)),
    ("max-dim", lambda x: tuple(x.max(1)) + tuple(x.max(0, keepdim=True)), lambda: (randn(7, 13),)),
    ("min-dim", lambda x: tuple(x.min(-1)) + tuple(x.min(0, keepdim=True)), lambda: (randn(13, 7).t(),)),
    ("max-dim-ties-int", lambda x: tuple(x.max(1)) + tuple(x.min(0)), lambda: (ints(0, 3, 7, 13),)),
    ("argmax-argmin", lambda x: (x.argmax(), x.argmax(1), x.argmin(0), x.argmax(1, keepdim=True), x.argmin()), lambda: (randn(7, 13),)),
    ("argmax-argmin-keepdim-all", lambda x: (torch.argmax(x, keepdim=True), torch.argmin(x, keepdim=True)), lambda: (randn(3, 5),)),
    ("argmax-ties-int32", lambda x: (x.argmax(0), x.argmin(1), x.argmax()), lambda: (ints(0, 3, 7, 13, dtype=torch.int32),)),
    ("argmax-transposed-1000", lambda x: (x.argmax(0), x.argmin(1)), lambda: (randn(1000, 3).t(),)),
    ("var-std", lambda x: (x.var(1), x.std(0), x.var(), x.std(1, keepdim=True)), lambda: (randn(7, 13),)),
    ("var-std-correction", lambda x: (x.var(1, correction=0), x.std(1, unbiased=False), x.var((0, 2), correction=2)),
     lambda: (randn(3, 7, 13),)),
    ("var-1000-transposed", lambda x: (x.var(0), x.std(0)), lambda: (randn(3, 1000).t() * 3 + 5,)),
    ("var_mean-std_mean", lambda x: torch.var_mean(x, 1) + torch.std_mean(x, 0, keepdim=True), lambda: (randn(7, 13),)),
    ("prod", lambda x: (x.prod(1), x.prod(0, keepdim=True), x.prod()), lambda: (torch.rand(5, 7) + 0.6,)),
    ("prod-int", lambda x: (x.prod(1), x.prod()), lambda: (ints(-3, 4, 4, 5),)),
    ("any-all-bool", lambda b: (b.any(), b.all(), b.any(1), b.all(0), b.any(1, keepdim=True)), lambda: (torch.rand(7, 13) > 0.1,)),
    ("any-all-float-int", lambda x, i: (x.any(1), x.all(0), i.any(), i.all(1)), lambda: (torch.randn(7, 13).round(), ints(0, 3, 13, 7).t())),
    ("any-all-dims", lambda b: (torch.any(b, dim=(0, 2)), torch.all(b, dim=(1, 2))), lambda: (torch.rand(3, 5, 4) > 0.2,)),
    ("logsumexp", lambda x: (torch.logsumexp(x, 1), torch.logsumexp(x, 0, keepdim=True)), lambda: (randn(7, 13) * 10,)),
    ("logsumexp-neginf-row", lambda x: torch.logsumexp(x.masked_fill(torch.arange(13) < 5, float("-inf")), 1),
     lambda: (randn(7, 13),)),
    ("softmax", lambda x: (torch.softmax(x, -1), torch.softmax(x, 0)), lambda: (randn(7, 13) * 5,)),
    ("softmax-3d-dim1-permuted", lambda x: F.softmax(x, dim=1), lambda: (randn(4, 5, 3).permute(2, 0, 1),)),
    ("softmax-1000", lambda x: torch.softmax(x, -1), lambda: (randn(2, 1000) * 3,)),
    ("softmax-masked", lambda x, m: torch.softmax(x.masked_fill(m, float("-inf")), -1),
     lambda: (randn(7, 13), torch.arange(13) > torch.arange(7).view(7, 1))),
    ("softmax-dtype", lambda x: torch.softmax(x, 1, dtype=torch.float64), lambda: (randn(7, 13),)),
    ("log_softmax", lambda x: (F.log_softmax(x, -1), F.log_softmax(x, 0)), lambda: (randn(7, 13) * 5,)),
    ("log_softmax-transposed", lambda x: F.log_softmax(x, 1), lambda: (randn(13, 7).t(),)),
    ("softmax-float64", lambda x: torch.softmax(x, -1), lambda: (randn(7, 13, dtype=torch.float64),)),
]
for _name, _fn, _gen in REDUCTIONS:
    case(_name, _fn, _gen)

# ---------------------------------------------------------------- contractions
CONTRACTIONS = [
    ("mm", torch.mm, lambda: (randn(7, 13), randn(13, 5))),
    ("mm-transposed-inputs", torch.mm, lambda: (randn(13, 7).t(), randn(5, 13).t())),
    ("mm-sliced", torch.mm, lambda: (randn(7, 26)[:, ::2], randn(20, 5)[3:16])),
    ("mm-1xK", torch.mm, lambda: (randn(1, 13), randn(13, 1))),
    ("mm-float64", torch.mm, lambda: (randn(7, 13, dtype=torch.float64), randn(13, 5, dtype=torch.float64))),
    ("mm-int64", torch.mm, lambda: (ints(-5, 5, 7, 13), ints(-5, 5, 13, 5))),
    ("bmm", torch.bmm, lambda: (randn(3, 7, 13), randn(3, 13, 5))),
    ("bmm-permuted", torch.bmm, lambda: (randn(7, 3, 13).transpose(0, 1), randn(3, 5, 13).transpose(1, 2))),
    ("matmul-3d-2d", torch.matmul, lambda: (randn(3, 7, 13), randn(13, 5))),
    ("matmul-4d-bcast", torch.matmul, lambda: (randn(2, 1, 7, 13), randn(3, 13, 5))),
    ("matmul-1d-2d", torch.matmul, lambda: (randn(13), randn(13, 5))),
    ("matmul-2d-1d", torch.matmul, lambda: (randn(7, 13), randn(13))),
    ("dot", torch.dot, lambda: (randn(13), randn(26)[::2])),
    ("matmul-K1000", torch.matmul, lambda: (randn(3, 1000), randn(1000, 4))),
    ("linear-bias", F.linear, lambda: (randn(7, 13), randn(5, 13), randn(5))),
    ("linear-3d-bias", F.linear, lambda: (randn(2, 7, 13), randn(5, 13), randn(5))),
    ("linear-nobias-transposed", lambda x, w: F.linear(x, w), lambda: (randn(13, 7).t(), randn(5, 13))),
    ("linear-1d-input", F.linear, lambda: (randn(13), randn(5, 13), randn(5))),
    ("addmm", torch.addmm, lambda: (randn(5), randn(7, 13), randn(13, 5))),
    ("addmm-beta-alpha", lambda b, x, y: torch.addmm(b, x, y, beta=0.5, alpha=2.0), lambda: (randn(7, 1), randn(7, 13), randn(13, 5))),
    ("addmm-beta0", lambda b, x, y: torch.addmm(b, x, y, beta=0.0), lambda: (randn(7, 5), randn(7, 13), randn(13, 5))),
    ("baddbmm", lambda b, x, y: torch.baddbmm(b, x, y, alpha=0.5), lambda: (randn(3, 7, 5), randn(3, 7, 13), randn(3, 13, 5))),
    ("einsum-bij-bjk", lambda a, b: torch.einsum("bij,bjk->bik", a, b), lambda: (randn(2, 7, 13), randn(2, 13, 5))),
]
for _name, _fn, _gen in CONTRACTIONS:
    case(_name, _fn, _gen)

# ---------------------------------------------------------------- convolution
CONVS = [  # (name, kwargs, x shape, w shape, bias?)
    ("3x3-p1", dict(padding=1), (2, 3, 13, 11), (4, 3, 3, 3), True),
    ("stride2-pad12", dict(stride=2, padding=(1, 2)), (2, 3, 13, 11), (4, 3, 3, 3), True),
    ("dilation2", dict(padding=2, dilation=2), (1, 3, 13, 11), (4, 3, 3, 3), False),
    ("groups2", dict(padding=1, groups=2), (2, 4, 9, 7), (6, 2, 3, 3), True),
    ("depthwise", dict(padding=1, groups=4), (2, 4, 9, 7), (4, 1, 3, 3), True),
    ("depthwise-mult2-stride2", dict(stride=2, padding=1, groups=4), (1, 4, 13, 13), (8, 1, 3, 3), False),
    ("1x1-nobias", dict(), (2, 5, 7, 6), (3, 5, 1, 1), False),
    ("asym-kernel", dict(padding=(1, 0), stride=(1, 2)), (2, 3, 11, 9), (4, 3, 3, 1), True),
    ("same-even-kernel", dict(padding="same"), (1, 3, 9, 8), (2, 3, 4, 4), True),
    ("valid-1x1-spatial", dict(), (2, 3, 3, 3), (4, 3, 3, 3), True),
]
for _name, _kw, _xs, _ws, _bias in CONVS:
    case(f"conv2d-{_name}", lambda x, w, b, _kw=_kw: F.conv2d(x, w, b, **_kw),
         lambda _xs=_xs, _ws=_ws, _bias=_bias: (randn(*_xs), randn(*_ws), randn(_ws[0]) if _bias else None))
case("conv2d-channels_last", lambda x, w, b: F.conv2d(x, w, b, padding=1),
     lambda: (randn(2, 3, 9, 7).to(memory_format=torch.channels_last), randn(4, 3, 3, 3), randn(4)))
case("conv2d-unbatched", lambda x, w: F.conv2d(x, w, padding=1), lambda: (randn(3, 9, 7), randn(4, 3, 3, 3)))
case("conv1d", lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=2), lambda: (randn(2, 3, 17), randn(4, 3, 5), randn(4)))
case("conv1d-groups-dilation", lambda x, w: F.conv1d(x, w, padding=2, dilation=2, groups=2), lambda: (randn(1, 4, 15), randn(4, 2, 3)))
case("conv2d-relu-fused", lambda x, w, b: torch.relu(F.conv2d(x, w, b, padding=1)) + 1, lambda: (randn(1, 3, 8, 8), randn(4, 3, 3, 3), randn(4)))

# ---------------------------------------------------------------- pooling
POOLS = [  # (name, fn, x shape)
    ("max_pool2d-k2", lambda x: F.max_pool2d(x, 2), (2, 3, 13, 11)),
    ("max_pool2d-k3s2p1", lambda x: F.max_pool2d(x, 3, 2, 1), (2, 3, 13, 11)),
    ("max_pool2d-ceil", lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True), (2, 3, 13, 10)),
    ("max_pool2d-ceil-pad", lambda x: F.max_pool2d(x, 2, 2, 1, ceil_mode=True), (1, 2, 7, 8)),
    ("max_pool2d-dilation", lambda x: F.max_pool2d(x, 3, 1, 1, dilation=2), (1, 2, 9, 9)),
    ("max_pool2d-indices", lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), (2, 3, 9, 7)),
    ("max_pool2d-unbatched", lambda x: F.max_pool2d(x, (2, 3), (2, 1)), (3, 9, 7)),
    ("max_pool1d", lambda x: F.max_pool1d(x, 3, 2, 1), (2, 3, 17)),
    ("avg_pool2d-k2", lambda x: F.avg_pool2d(x, 2), (2, 3, 13, 11)),
    ("avg_pool2d-k3s2p1-incl", lambda x: F.avg_pool2d(x, 3, 2, 1), (2, 3, 13, 11)),
    ("avg_pool2d-k3s2p1-excl", lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), (2, 3, 13, 11)),
    ("avg_pool2d-ceil-incl", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), (1, 2, 10, 8)),
    ("avg_pool2d-ceil-excl", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), (1, 2, 10, 8)),
    ("avg_pool2d-ceil-nopad", lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True), (1, 2, 10, 8)),
    ("avg_pool2d-divisor", lambda x: F.avg_pool2d(x, 3, 2, 1, divisor_override=5), (1, 2, 9, 7)),
    ("avg_pool2d-unbatched", lambda x: F.avg_pool2d(x, 2, 1), (3, 6, 5)),
    ("avg_pool1d", lambda x: F.avg_pool1d(x, 3, 2, 1), (2, 3, 17)),
    ("adaptive_avg_pool2d-5x7", lambda x: F.adaptive_avg_pool2d(x, (5, 7)), (2, 3, 13, 11)),
    ("adaptive_avg_pool2d-1", lambda x: F.adaptive_avg_pool2d(x, 1), (2, 3, 13, 11)),
    ("adaptive_avg_pool2d-upsample", lambda x: F.adaptive_avg_pool2d(x, (6, 4)), (1, 2, 4, 3)),
    ("adaptive_avg_pool2d-unbatched", lambda x: F.adaptive_avg_pool2d(x, (3, 2)), (3, 7, 5)),
    ("adaptive_avg_pool1d", lambda x: F.adaptive_avg_pool1d(x, 5), (2, 3, 17)),
    ("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, (4, 3)), (2, 3, 12, 9)),
    ("adaptive_max_pool2d-indices", lambda x: F.adaptive_max_pool2d(x, 2, return_indices=True), (1, 3, 6, 4)),
    ("adaptive_max_pool2d-global-unbatched", lambda x: F.adaptive_max_pool2d(x, 1), (3, 5, 7)),
]
for _name, _fn, _xs in POOLS:
    case(_name, _fn, lambda _xs=_xs: (randn(*_xs),))
case("max_pool2d-channels_last", lambda x: F.max_pool2d(x, 2), lambda: (randn(2, 3, 8, 6).to(memory_format=torch.channels_last),))
case("avg_pool2d-transposed", lambda x: F.avg_pool2d(x, 2), lambda: (randn(2, 3, 8, 6).transpose(2, 3),))

# ---------------------------------------------------------------- normalization
def _bn_make(C, *rest, affine=True):
    return (randn(2, C, *rest), randn(C), torch.rand(C) + 0.5, randn(C) if affine else None, randn(C) if affine else None)


NORMS = [
    ("batch_norm-eval", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False, eps=1e-3), lambda: _bn_make(4, 5, 7)),
    ("batch_norm-eval-noaffine", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False), lambda: _bn_make(4, 5, 7, affine=False)),
    ("batch_norm-eval-1d", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False), lambda: _bn_make(6, 9)),
    ("batch_norm-eval-2d-input", lambda x, m, v, w, b: F.batch_norm(x[:, :, 0], m, v, w, b, training=False), lambda: _bn_make(6, 3)),
    ("batch_norm-eval-channels_last", lambda x, m, v, w, b: F.batch_norm(x.to(memory_format=torch.channels_last), m, v, w, b, training=False),
     lambda: _bn_make(4, 5, 7)),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (13,), w, b), lambda: (randn(3, 7, 13), randn(13), randn(13))),
    ("layer_norm-2dims", lambda x, w, b: F.layer_norm(x, (7, 13), w, b, eps=1e-3), lambda: (randn(3, 7, 13), randn(7, 13), randn(7, 13))),
    ("layer_norm-noaffine-transposed", lambda x: F.layer_norm(x, (7,)), lambda: (randn(3, 7, 13).transpose(1, 2),)),
    ("layer_norm-1000", lambda x, w, b: F.layer_norm(x, (1000,), w, b), lambda: (randn(3, 1000) * 2 + 1, randn(1000), randn(1000))),
    ("group_norm-2", lambda x, w, b: F.group_norm(x, 2, w, b), lambda: (randn(2, 4, 5, 7), randn(4), randn(4))),
    ("group_norm-1-noaffine", lambda x: F.group_norm(x, 1), lambda: (randn(2, 6, 3, 5),)),
    ("group_norm-C", lambda x, w, b: F.group_norm(x, 6, w, b, eps=1e-3), lambda: (randn(2, 6, 3, 5), randn(6), randn(6))),
    ("group_norm-3d-input", lambda x, w, b: F.group_norm(x, 3, w, b), lambda: (randn(2, 6, 11), randn(6), randn(6))),
]
for _name, _fn, _gen in NORMS:
    case(_name, _fn, _gen)


class _BnConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _module(build):
    """A module in eval mode with weights from a fixed seed (the global RNG state is left alone)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return build().eval()


_bn_conv_net = _module(_BnConvNet)
case("module-conv-batchnorm-eval", _bn_conv_net, lambda: (randn(2, 3, 7, 6),))

# nn.TransformerEncoderLayer in eval under no_grad takes the fused path: aten._transformer_encoder_layer_fwd
_enc_post = _module(lambda: torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True))
_enc_pre = _module(lambda: torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", norm_first=True,
                                                            batch_first=True))
case("transformer_encoder_layer-post-norm-relu", _enc_post, lambda: (randn(2, 5, 8),))
case("transformer_encoder_layer-pre-norm-gelu", _enc_pre, lambda: (randn(2, 5, 8),))
case("transformer_encoder_layer-padding-mask", lambda x, m: _enc_post(x, src_key_padding_mask=m),
     lambda: (randn(2, 5, 8), (torch.rand(2, 5) > 0.5) & (torch.arange(5) > 0)))

# ---------------------------------------------------------------- attention
SDPA = [  # (name, fn, generator)
    ("plain", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), lambda: (randn(2, 3, 7, 8), randn(2, 3, 7, 8), randn(2, 3, 7, 8))),
    ("causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     lambda: (randn(2, 3, 7, 8), randn(2, 3, 7, 8), randn(2, 3, 7, 8))),
    ("causal-L-ne-S", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     lambda: (randn(1, 2, 5, 8), randn(1, 2, 9, 8), randn(1, 2, 9, 6))),
    ("bool-mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
     lambda: (randn(2, 3, 7, 8), randn(2, 3, 9, 8), randn(2, 3, 9, 8), (torch.rand(2, 1, 7, 9) > 0.3) | (torch.arange(9) == 0))),
    ("additive-mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
     lambda: (randn(2, 3, 7, 8), randn(2, 3, 7, 8), randn(2, 3, 7, 8), randn(7, 7))),
    ("scale", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3), lambda: (randn(1, 2, 7, 4), randn(1, 2, 7, 4), randn(1, 2, 7, 4))),
    ("3d-transposed-q", lambda q, k, v: F.scaled_dot_product_attention(q.transpose(0, 1), k, v),
     lambda: (randn(7, 2, 8), randn(2, 7, 8), randn(2, 7, 8))),
]
for _name, _fn, _gen in SDPA:
    case(f"sdpa-{_name}", _fn, _gen)

# ---------------------------------------------------------------- indexing
case("embedding", F.embedding, lambda: (ints(0, 10, 3, 5), randn(10, 4)))
case("embedding-padding_idx-int32", lambda i, w: F.embedding(i, w, padding_idx=0), lambda: (ints(0, 10, 13, dtype=torch.int32), randn(10, 7)))
case("embedding-0d-index", F.embedding, lambda: (torch.tensor(3), randn(10, 4)))
case("embedding-module-transposed-weight", lambda i, w: F.embedding(i, w.t()), lambda: (ints(0, 10, 2, 3), randn(4, 10)))
case("index_select-dim0", lambda x, i: torch.index_select(x, 0, i), lambda: (randn(7, 13), ints(0, 7, 5)))
case("index_select-dim1-int32", lambda x, i: torch.index_select(x, 1, i), lambda: (randn(13, 7).t(), ints(0, 7, 9, dtype=torch.int32)))
case("index_select-int-source", lambda x, i: x.index_select(-1, i), lambda: (ints(-9, 9, 3, 4, 13), ints(0, 13, 6)))
case("gather-dim0", lambda x, i: torch.gather(x, 0, i), lambda: (randn(7, 13), ints(0, 7, 4, 13)))
case("gather-dim1-small", lambda x, i: torch.gather(x, 1, i), lambda: (randn(7, 13), ints(0, 13, 5, 3)))
case("gather-dim-1-3d-transposed", lambda x, i: torch.gather(x, -1, i), lambda: (randn(3, 13, 7).transpose(1, 2), ints(0, 13, 3, 7, 13)))
case("take_along_dim-argmax", lambda x: torch.take_along_dim(x, x.argmax(1, keepdim=True), 1), lambda: (randn(7, 13),))
case("index-tensor-dim0", lambda x, i: x[i], lambda: (randn(7, 13), ints(-7, 7, 2, 3)))
case("index-tensor-dim1", lambda x, i: x[:, i], lambda: (randn(7, 13), ints(0, 13, 5)))
case("index-tensor-bool-x", lambda x, i: x[i], lambda: (bools(7, 13), ints(0, 7, 4)))
case("index-tensors-adjacent", lambda x, i, j: x[i, j], lambda: (randn(7, 13), ints(-7, 7, 5), ints(-13, 13, 5)))
case("index-tensors-broadcast", lambda x, i, j: x[:, i, j], lambda: (randn(2, 7, 13).transpose(0, 1), ints(0, 2, 3, 1), ints(-13, 13, 4)))
case("index-tensors-non-adjacent", lambda x, i, j: x[i, :, j], lambda: (randn(4, 5, 6), ints(0, 4, 3), ints(0, 6, 3)))
case("interpolate-nearest", lambda x: (F.interpolate(x, scale_factor=2), F.interpolate(x, size=(7, 5), mode="nearest-exact")),
     lambda: (randn(1, 2, 3, 4),))
case("interpolate-bilinear", lambda x: (F.interpolate(x, size=(5, 7), mode="bilinear"),
                                        F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)),
     lambda: (randn(1, 2, 3, 4),))

# ---------------------------------------------------------------- shapes and views
SHAPES = [
    ("reshape-contig", lambda x: x.reshape(13, 7) * 2, lambda: (randn(7, 13),)),
    ("reshape-transposed-copy", lambda x: x.reshape(-1) + 1, lambda: (randn(13, 7).t(),)),
    ("view-flatten-unflatten", lambda x: (x.flatten(1) + 1, x.view(3, -1).unflatten(1, (5, 7)) * 2), lambda: (randn(3, 5, 7),)),
    ("permute", lambda x: x.permute(2, 0, 1) * 2, lambda: (randn(3, 5, 7),)),
    ("permute-then-reshape", lambda x: x.permute(0, 2, 1).reshape(3, 35) - 1, lambda: (randn(3, 5, 7),)),
    ("transpose-t", lambda x: (x.transpose(0, 1) + 1, x.t() * 3, x.mT.neg()), lambda: (randn(7, 13),)),
    ("movedim", lambda x: torch.movedim(x, 0, -1) + 0.5, lambda: (randn(3, 5, 7),)),
    ("expand", lambda x, y: x.expand(3, 7, 13) + y, lambda: (randn(7, 1), randn(3, 1, 13))),
    ("expand_as-0d", lambda x, y: x.expand_as(y) * y, lambda: (randn(), randn(7, 13))),
    ("slice", lambda x: (x[1:5] * 2, x[:, ::3] + 1, x[-3:, 2:-2] - 1, x[:, 5:100] * 1), lambda: (randn(7, 13),)),
    ("slice-of-transposed", lambda x: x[2:, 1::2] * 2, lambda: (randn(13, 7).t(),)),
    ("select", lambda x: (x[2] * 2, x[:, -1] + 1, x[1, 3] * 1), lambda: (randn(7, 13),)),
    ("narrow", lambda x: x.narrow(1, 3, 5) * 2, lambda: (randn(7, 13),)),
    ("unsqueeze-squeeze", lambda x: (x.unsqueeze(0) * 2, x.unsqueeze(-1) + 1, x.squeeze() * 3, x.squeeze(1) - 1, x.squeeze((0, 1)) / 2),
     lambda: (randn(1, 1, 7),)),
    ("split", lambda x: tuple(t * 2 for t in torch.split(x, 5, dim=1)), lambda: (randn(7, 13),)),
    ("split_with_sizes", lambda x: tuple(t + 1 for t in torch.split(x, [2, 4, 1], dim=0)), lambda: (randn(7, 13),)),
    ("chunk", lambda x: tuple(t * 3 for t in torch.chunk(x, 3, dim=-1)), lambda: (randn(7, 13),)),
    ("unbind", lambda x: tuple(t - 1 for t in torch.unbind(x, 1)), lambda: (randn(7, 3),)),
    ("cat", lambda a, b, c: (torch.cat([a, b, a], 0), torch.cat([a, c], 1) * 2), lambda: (randn(7, 13), randn(2, 13), randn(7, 5))),
    ("cat-noncontig-last-dim", lambda a, b: torch.cat([a, b], -1), lambda: (randn(13, 7).t(), randn(7, 26)[:, ::2])),
    ("cat-mixed-dtype", lambda a, b: torch.cat([a, b], 0), lambda: (ints(-9, 9, 2, 13), randn(7, 13))),
    ("cat-with-empty", lambda a, b: torch.cat([a, b, torch.empty(0)]), lambda: (randn(5), randn(3))),
    ("cat-int-bool", lambda a, b: (torch.cat([a, a], 1), torch.cat([b, b])), lambda: (ints(-9, 9, 3, 4), bools(3, 4))),
    ("stack", lambda a, b: (torch.stack([a, b]), torch.stack([a, b], -1), torch.stack([a, b], 1)), lambda: (randn(7, 13), randn(13, 7).t())),
    ("pad-constant", lambda x: (F.pad(x, (1, 2)), F.pad(x, (1, 1, 2, 0), value=-1.5)), lambda: (randn(2, 7, 13),)),
    ("pad-negative-crop", lambda x: F.pad(x, (-1, 2, 0, -3)), lambda: (randn(7, 13),)),
    ("pad-int-transposed", lambda x: F.pad(x, (2, 2), value=7), lambda: (ints(-9, 9, 13, 7).t(),)),
    ("repeat", lambda x: (x.repeat(2, 3), x.repeat(2, 1, 1)), lambda: (randn(7, 13),)),
    ("repeat-sliced", lambda x: x.repeat(1, 2), lambda: (randn(7, 26)[:, 1::2],)),
    ("tril-triu", lambda x: (torch.tril(x), torch.triu(x), torch.tril(x, -2), torch.triu(x, 1)), lambda: (randn(7, 13),)),
    ("tril-triu-batched", lambda x: (x.tril(1), x.triu(-1)), lambda: (randn(2, 9, 5),)),
    ("tril-int", lambda x: x.tril(), lambda: (ints(-9, 9, 5, 5),)),
    ("as_strided", lambda x: x.as_strided((3, 4), (1, 3), 2) * 2, lambda: (randn(20),)),
    ("view-int-bool", lambda i, b: (i.view(13, 7) + 1, b.reshape(-1).logical_not()), lambda: (ints(-9, 9, 7, 13), bools(7, 13))),
    ("flip", lambda x: (torch.flip(x, (0, 2)) * 2, torch.flip(x[0].t(), (1,)) + 1), lambda: (randn(3, 4, 5),)),
    ("unfold", lambda x: (x.unfold(1, 3, 2).sum(-1), x.unfold(2, 2, 2) * 1), lambda: (randn(2, 9, 4),)),
    ("slice_scatter", lambda x, s, t: (torch.slice_scatter(x, s, 1, 2, 5), torch.slice_scatter(x.t(), t, 0, 1, 7, 2)),
     lambda: (randn(8, 7), randn(8, 3), randn(3, 8))),
    ("as_strided_scatter", lambda x, s, t: (torch.as_strided_scatter(x * 2, s, (3, 2), (6, 2), 1),
                                            torch.as_strided_scatter(x + 1, t, (5,), (7,), 3)),
     lambda: (randn(4, 9), randn(3, 2), randn(5))),
    ("new_empty_strided", lambda x: torch.ops.aten.new_empty_strided(x, (3, 4), (4, 1)).fill_(2.0) + x[:4],
     lambda: (randn(4),)),
    ("masked-put", lambda x, m, n: (torch.index_put(x, (m,), torch.tensor(-1.5)),
                                    torch.index_put(x, (n,), torch.tensor(2.0), accumulate=True)),
     lambda: (randn(4, 3), bools(4), bools(4, 3))),
    ("cumprod-special", lambda x: (torch.cumprod(x, 1), torch.cumsum(x, 1)), lambda: (special(3, 9),)),
]
for _name, _fn, _gen in SHAPES:
    case(_name, _fn, _gen)

# ---------------------------------------------------------------- small composites
case("mlp-block", lambda x, w1, b1, w2: F.linear(F.gelu(F.linear(x, w1, b1)), w2) + x,
     lambda: (randn(2, 7, 13), randn(20, 13), randn(20), randn(13, 20)))
case("attention-by-hand", lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), -1) @ v,
     lambda: (randn(2, 7, 8), randn(2, 7, 8), randn(2, 7, 8)))
case("cumsum", lambda x, i, m: dict(f_last=torch.cumsum(x, -1), f_first=torch.cumsum(x, 0), int_ids=torch.cumsum(i, 1),
                                    bool_mask=torch.cumsum(m, 1), one_d=torch.cumsum(x[0], 0)),
     lambda: (randn(7, 13), ints(0, 3, 2, 9), bools(3, 5)))
case("masked-mean", lambda x, m: (x * m).sum(1) / m.sum(1).clamp(min=1), lambda: (randn(7, 13), bools(7, 13).float()))
case("cross_entropy", lambda x, t: F.cross_entropy(x, t), lambda: (randn(7, 13), ints(0, 13, 7)))
case("normalize", lambda x: F.normalize(x, dim=1), lambda: (randn(7, 13),))

# ---------------------------------------------------------------- edge values and promotions
_NANS = torch.tensor([[1.0, float("nan"), -2.0, 0.5], [float("-inf"), 3.0, float("inf"), -0.0]])
case("div_floor-exact-multiples", lambda a, b: (torch.div(a, 0.1, rounding_mode="floor"), a // b, torch.div(-a, b, rounding_mode="floor"),
                                                torch.div(a, torch.zeros(20), rounding_mode="floor")),  # 1.0 // 0.1 == 9
     lambda: (torch.arange(1, 21, dtype=torch.float32) * 0.1, torch.full((20,), 0.1)))
case("round-half-even", lambda a: (torch.round(a), torch.round(a * 10, decimals=-1), torch.round(a / 10, decimals=1)),
     lambda: (torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 3.49, 1.25, 2.25, 3.5]),))
case("nan-propagation", lambda a: dict(relu=torch.relu(a), clamp=torch.clamp(a, -1, 1), maximum=torch.maximum(a, torch.zeros(4)),
                                       minimum=torch.minimum(a, torch.zeros(4)), amax=a.amax(1), amin=a.amin(0), max_dim=tuple(a.max(1)),
                                       argmax=a.argmax(1), argmin=a.argmin(0), max=a.max(), min=a.min(), sign=torch.sign(a),
                                       sum=a.sum(1), prod=a.prod(0), softmax=torch.softmax(a, 1), isnan=torch.isnan(a)),
     lambda: (_NANS.clone(),))
case("max_pool2d-nan", lambda a: F.max_pool2d(a, 2, return_indices=True), lambda: (_NANS.view(1, 1, 2, 4).clone(),))
case("erfinv-edges", torch.erfinv, lambda: (torch.tensor([-1.0, 1.0, 0.999999, -0.9999, 0.0, 0.5]),))
case("softmax-0d", lambda a: (torch.softmax(a, 0), torch.log_softmax(a, 0)), lambda: (torch.tensor(0.0),))
case("argmax-0d", lambda a: (a.argmax(), a.argmin(0), tuple(a.max(0))), lambda: (torch.tensor(3.0),))
case("index_select-0d-index", lambda a, i: torch.index_select(a, 1, i), lambda: (randn(3, 5), torch.tensor(2)))
case("clamp-0d-float64-bounds", lambda a, lo, hi: (torch.clamp(a, min=lo), torch.clamp(a, lo, hi)),  # stays float32
     lambda: (randn(7, 13), torch.tensor(0.1, dtype=torch.float64), torch.tensor(0.5, dtype=torch.float64)))
case("0d-float64-operand-promotion", lambda a, b, c: (a + b, a * b, torch.where(c, a, b), torch.maximum(a, b)),
     lambda: (randn(7, 13), torch.tensor(0.1, dtype=torch.float64), bools(7, 13)))
case("int32-0d-int64-promotion", lambda a, b: (a + b, a * b, a > b), lambda: (ints(0, 9, 7, 13, dtype=torch.int32), torch.tensor(3)))
case("int-pow-scalar-base", lambda a: (2 ** a, a ** 2, a.pow(0), 0.5 ** a), lambda: (ints(0, 6, 7, 13),))
case("int64-overflow-wraps", lambda a: (a * a, a + a), lambda: (torch.tensor([2**40, -2**35, 3, 2**62]),))
case("float-to-int-negative", lambda a: (a.to(torch.int32), a.to(torch.int64), a.abs().to(torch.uint8)),
     lambda: (torch.tensor([-2.7, 2.7, 0.0, 200.6, -0.5]),))
case("zero-size", lambda a, b: (torch.relu(a), a.sum(0), b.sum(1), torch.cat([a, b.t()[:0]], 0) * 2, a.mean(0), a.amax(1)),
     lambda: (randn(0, 5), randn(5, 0)))
case("unary-on-int-input", lambda a: dict(exp=a.exp(), sqrt=a.abs().sqrt(), sin=a.sin(), sigmoid=a.sigmoid(), erf=a.erf(),
                                          reciprocal=a.reciprocal(), floor=a.floor(), round=a.round(), tanh=a.tanh(), atan2=torch.atan2(a, a + 1)),
     lambda: (nonzero_ints(-5, 5, 7, 13),))
case("unary-on-bool-input", lambda a: dict(exp=a.exp(), sigmoid=a.sigmoid(), cos=a.cos(), neg_as_int=-a.int()), lambda: (bools(7, 13),))
case("arange-fractional-int-dtype", lambda x: (torch.arange(0, 5, 0.5, dtype=torch.int64) + x, torch.arange(-2.5, 3, 1.5, dtype=torch.int32)),
     lambda: (torch.tensor(1),))
case("max_pool2d-indices-all-neginf-windows", lambda a: F.max_pool2d(a, 3, 2, 1, return_indices=True),
     lambda: (torch.full((1, 1, 5, 5), float("-inf")),))
case("as_strided-input-with-offset", lambda a: a.as_strided((3, 4), (1, 3), 7) * 2, lambda: (randn(30)[5:],))
case("sdpa-bool-mask-all-false-row", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
     lambda: (randn(1, 1, 3, 4), randn(1, 1, 3, 4), randn(1, 1, 3, 4),
              torch.tensor([[True, False, False], [False, False, False], [True, True, True]])))
case("sdpa-gqa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
     lambda: (randn(1, 4, 3, 4), randn(1, 2, 3, 4), randn(1, 2, 3, 4)))
# the ops SDPA dispatches to for CUDA tensors, traced here on CPU tensors through their meta functions
case("sdpa-cuda-flash-op", lambda q, k, v: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0],
     lambda: (randn(2, 3, 5, 8), randn(2, 3, 7, 8), randn(2, 3, 7, 8)),
     reference=lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
case("sdpa-cuda-efficient-op-bias",
     lambda q, k, v, m: aten._scaled_dot_product_efficient_attention(q, k, v, m, False)[0],
     lambda: (randn(2, 3, 5, 8), randn(2, 3, 7, 8), randn(2, 3, 7, 8), randn(2, 3, 5, 7)),
     reference=lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m))


# ---------------------------------------------------------------- rules reached only by explicit overloads
def _aten(id: str, fn: Callable, make: Callable[[], tuple], path: str = "aten") -> None:
    case(f"aten-{id}", fn, make, path=path)


_aten("unary-decomposed", lambda x: (aten.hardswish.default(x), aten.hardsigmoid.default(x), aten.silu.default(x),
                                     aten.softplus.default(x, 2.0, 3.0), aten.mish.default(x), aten.detach.default(x),
                                     aten.alias.default(x), aten.lift_fresh_copy.default(x), aten.contiguous.default(x)),
      lambda: (wide(7, 13),))
_aten("clamp-min-max", lambda x, t: (aten.clamp_min.default(x, -0.5), aten.clamp_max.default(x, 0.5),
                                     aten.clamp_min.Tensor(x, t), aten.clamp_max.Tensor(x, t)),
      lambda: (randn(7, 13), randn(13)))
_aten("rsub-lerp", lambda a, b, w: (aten.rsub.Tensor(a, b), aten.rsub.Tensor(a, b, alpha=2), aten.rsub.Scalar(a, 1.5),
                                    aten.lerp.Scalar(a, b, 0.25), aten.lerp.Tensor(a, b, w)),
      lambda: (randn(7, 13), randn(13), torch.rand(7, 1)))
_aten("floor_divide", lambda a, b, i: (aten.floor_divide.default(a, b), aten.floor_divide.Scalar(a, 0.7),
                                       aten.floor_divide.Scalar(i, 3)),
      lambda: (wide(7, 13), pos(13), ints(-20, 20, 7, 13)))
_aten("scalar-first", lambda x, i: (aten.pow.Scalar(2.0, x), aten.remainder.Scalar_Tensor(5.0, x), aten.bitwise_and.Scalar_Tensor(6, i),
                                    aten.bitwise_or.Scalar_Tensor(5, i), aten.bitwise_xor.Scalar_Tensor(3, i)),
      lambda: (pos(7, 13), ints(-50, 50, 7, 13)))
_aten("masked_fill-where", lambda x, m, v: (aten.masked_fill.Scalar(x, m, -2.0), aten.masked_fill.Tensor(x, m, v),
                                            aten.where.ScalarOther(m, x, 0.5), aten.where.ScalarSelf(m, 0.5, x), aten.where.Scalar(m, 1.0, 0.0)),
      lambda: (randn(7, 13), bools(13), randn()))
_aten("scalar-overloads", lambda x, i: (aten.add.Scalar(x, 2.5), aten.add.Scalar(x, 2, 3), aten.sub.Scalar(x, 1.5),
                                        aten.mul.Scalar(x, 3.0), aten.div.Scalar(x, 4.0), aten.div.Scalar_mode(x, 0.7, rounding_mode="floor"),
                                        aten.div.Scalar_mode(i, 3, rounding_mode="trunc"), aten.bitwise_xor.Scalar(i, 5),
                                        aten.bitwise_and.Scalar(i, 6), aten.bitwise_or.Scalar(i, 9), aten.remainder.Scalar(x, 1.5),
                                        aten.fmod.Scalar(x, 1.5), aten.pow.Tensor_Scalar(x, 3), aten.eq.Scalar(i, 2), aten.lt.Scalar(x, 0.5)),
      lambda: (wide(7, 13), ints(-20, 20, 7, 13)))
import torch.ao.quantization.fx._decomposed  # noqa: E402,F401  (registers torch.ops.quantized_decomposed)
_qd = torch.ops.quantized_decomposed
# PT2E quantization's ops (tests/test_quantized.py has whole quantized models): saturation, ties,
# per-channel parameters along a middle axis
_aten("quantize-dequantize", lambda x, s, z, y: (
    _qd.dequantize_per_tensor.default(_qd.quantize_per_tensor.default(x, 0.05, 7, 0, 255, torch.uint8), 0.05, 7, 0, 255,
                                      torch.uint8),
    _qd.quantize_per_tensor.default(y, 0.25, -3, -128, 127, torch.int8),
    _qd.dequantize_per_channel.default(_qd.quantize_per_channel.default(x, s, z, 1, -128, 127, torch.int8), s, z, 1,
                                       -128, 127, torch.int8)),
      lambda: (wide(5, 13, 3), torch.rand(13) * 0.05 + 0.01, torch.randint(-3, 4, (13,)), wide(5, 13, 3) * 40))
# dynamic quantization: parameters chosen from the tensor's range (a range with negatives, and
# one of values all positive: zero point 0), then used as one-element tensors
_aten("quantize-dynamic", lambda x, y: tuple(
    _qd.dequantize_per_tensor.tensor(_qd.quantize_per_tensor.tensor(v, sc, zp, 0, 255, torch.uint8), sc, zp, 0, 255,
                                     torch.uint8)
    for v in (x, y) for sc, zp in [_qd.choose_qparams.tensor(v, 0, 255, 2.0 ** -12, torch.uint8)]),
      lambda: (wide(5, 13, 3), torch.rand(6, 7) + 0.5))
# the check torch.export puts before .to(dtype): computes nothing
_aten("assert-tensor-metadata", lambda x: (aten._assert_tensor_metadata.default(x, None, None, torch.float32), aten.mul.Tensor(x, x))[1:],
      lambda: (wide(4, 5),))
# Overloads without a tensor argument would run at trace time under fx.symbolic_trace: make_fx records them.
_aten("creation", lambda x: (aten.zeros.default([3, 4]), aten.ones.default([2, 5], dtype=torch.int32), aten.zeros_like.default(x),
                             aten.ones_like.default(x), aten.fill.Scalar(x, 2.5),
                             aten.new_zeros.default(x, [3]), aten.new_ones.default(x, [2, 2]), aten.new_full.default(x, [4], 1.5),
                             aten.arange.default(7), aten.arange.start(3, 9), aten.arange.start_step(1.0, 2.0, 0.25),
                             aten.scalar_tensor.default(4.5), aten.full.default([2, 2], 3)),
      lambda: (randn(7, 13),), path="aten_factory")
_aten("empty-then-fill", lambda x: tuple(aten.fill.Scalar(e, 1.5) for e in (
    aten.empty_like.default(x), aten.new_empty.default(x, [3]), aten.empty.memory_format([2, 3]),
    aten.empty_strided.default([2, 3], [3, 1]), aten.empty_permuted.default([2, 3], [1, 0]))),
      lambda: (randn(7, 13),), path="aten_factory")
_aten("reductions", lambda x, b: (aten.sum.default(x), aten.all.default(b), aten.all.dim(b, 1), aten.all.dims(b, [0]),
                                  aten.var.dim(x, [1]), aten.var.dim(x, [0], False, True), aten.std.correction(x, [1], correction=0),
                                  aten.logsumexp.default(x, [1]), aten.min.default(x), aten.max.default(x)),
      lambda: (randn(7, 13), torch.rand(7, 13) > 0.1))
_aten("shapes", lambda x, y: (aten.t.default(x), aten.transpose.int(x, 0, 1), aten.squeeze.default(y), aten.squeeze.dim(y, 0),
                              aten._unsafe_view.default(x, [13, 7]), aten.split.Tensor(x, 4, 1)[3], aten.unbind.int(x, 0)[6],
                              aten.stack.default([x, x], 1), aten.tril.default(x, 1), aten.triu.default(x, -1),
                              aten.narrow.default(x, 1, 2, 5), aten.reshape.default(x, [13, 7]), aten.reshape.default(aten.t.default(x), [-1])),
      lambda: (randn(7, 13), randn(1, 5, 1)))
_aten("dot-baddbmm", lambda a, b, c, x, y: (aten.dot.default(a, b), aten.baddbmm.default(c, x, y, beta=0.5, alpha=2.0)),
      lambda: (randn(13), randn(13), randn(3, 7, 5), randn(3, 7, 13), randn(3, 13, 5)))
_aten("batch_norm-inference", lambda x, w, b, m, v: (aten._native_batch_norm_legit.default(x, w, b, m, v, False, 0.1, 1e-5)[0],
                                                      aten.native_batch_norm.default(x, w, b, m, v, False, 0.1, 1e-5)[0]),
      lambda: (randn(2, 4, 5, 3), randn(4), randn(4), randn(4), torch.rand(4) + 0.5))


_aten("gradients", lambda go, x, w, gp, q, k, v, o, lse, g1: (
    aten.convolution_backward.default(go, x, w, [4], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]),
    aten.avg_pool2d_backward.default(gp, x, [2, 2], [2, 2], [0, 0], False, True, None),
    aten._adaptive_avg_pool2d_backward.default(gp, x),
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default(g1, q, k, v, o, lse, 0.0, True)),
      lambda: (randn(2, 4, 4, 4), randn(2, 3, 8, 8), randn(4, 3, 3, 3), randn(2, 3, 4, 4),
               *_flash_make()))


def _flash_make():
    q, k, v = randn(1, 2, 5, 4), randn(1, 2, 5, 4), randn(1, 2, 5, 4)
    o, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, True)[:2]
    return q, k, v, o, lse, randn(1, 2, 5, 4)


case("conv_transpose", lambda x, w, b, x1, w1: (F.conv_transpose2d(x, w, b, 2, 1, 1), F.conv_transpose2d(x, w[:, :2], None, 1, 0, 0, 2, 2),
                                                F.conv_transpose1d(x1, w1, None, 2, 1, 1)),
     lambda: (randn(2, 4, 5, 5), randn(4, 6, 3, 3), randn(6), randn(2, 4, 9), randn(4, 3, 3)))
case("batch_norm-no-stats", lambda w: F.batch_norm(w.reshape(1, 8, -1), None, None, training=True, eps=1e-5).reshape_as(w),
     lambda: (randn(8, 4, 3, 3),))  # NFNet's weight standardization
_aten("scatter", lambda x, i, s: (aten.scatter.src(x, 1, i, s), aten.scatter.value(x, 1, i, 2.5),
                                  aten.scatter_add.default(x, 1, i, s)),
      lambda: (randn(3, 7), ints(0, 7, 3, 4), randn(3, 5)))
_aten("convert_element_type", lambda x: (torch.ops.prims.convert_element_type.default(x, torch.float64),
                                         torch.ops.prims.convert_element_type.default(x, torch.int32)),
      lambda: (wide(7, 13),))


def _mha_make():  # x [B, L, E=8], 2 heads, and a key padding mask (True: ignore) that keeps key 0
    return (randn(2, 5, 8), randn(24, 8) * 0.3, randn(24), randn(8, 8) * 0.3, randn(8), (torch.rand(2, 5) > 0.5) & (torch.arange(5) > 0))


_aten("native_multi_head_attention", lambda x, wi, bi, wo, bo, m: (
    aten._native_multi_head_attention.default(x, x, x, 8, 2, wi, bi, wo, bo),
    aten._native_multi_head_attention.default(x, x, x, 8, 2, wi, bi, wo, bo, None, True, False)[1],
    aten._native_multi_head_attention.default(x, x, x, 8, 2, wi, bi, wo, bo, None, False)[0],
    aten._native_multi_head_attention.default(x, x, x, 8, 2, wi, bi, wo, bo, m, True, True, 1)), _mha_make)


# ------------------------------------------------------------------------------ running a case
def _seed(c: Case) -> None:
    torch.manual_seed(zlib.crc32(c.id.encode()))


def _compile_aten(fn, inputs, path):
    """Trace ``fn`` so that its explicit overloads stay as written, and compile the ATen graph.

    "aten": fx.symbolic_trace (no dispatch at all; keeps even CompositeImplicit overloads such as
    aten.reshape). "aten_factory": make_fx, which also records overloads without tensor arguments."""
    if path == "aten":
        gm = torch.fx.symbolic_trace(fn)
    else:
        gm = make_fx(fn)(*inputs)
    FakeTensorProp(gm).propagate(*inputs)
    return polytile.compile_graph(gm, inputs)


def run_case(c: Case):
    """Compile and run one case: (inputs, compiled results, eager results, polytile stats)."""
    _seed(c)
    inputs = c.make()
    torch._dynamo.reset()
    with torch.no_grad():
        expected = (c.reference or c.fn)(*inputs)
        polytile.reset_stats()
        if c.path == "dynamo":
            got = torch.compile(c.fn, backend="polytile", dynamic=False)(*inputs)
        else:  # compared as flat lists: a traced graph's outputs may lose the nesting
            got = tree_leaves(_compile_aten(c.fn, list(inputs), c.path)(*inputs))
            expected = tree_leaves(expected)
    return inputs, got, expected, polytile.stats()


RULES_HIT: dict[str, set] = {}  # case id -> lowering-table keys invoked while compiling it


def _record_rules(mp: pytest.MonkeyPatch) -> set:
    """Wrap every rule of the lowering table (undone with ``mp``); returns the set of keys invoked."""
    ensure_loaded()
    hit: set = set()
    for key, rule in list(LOWERINGS.items()):
        def wrapped(*a, _key=key, _rule=rule, **kw):
            hit.add(_key)
            return _rule(*a, **kw)
        mp.setitem(LOWERINGS, key, wrapped)
    return hit


@pytest.fixture
def record_rules(monkeypatch):
    return _record_rules(monkeypatch)


def _param(c: Case):
    marks = [pytest.mark.xfail(reason=c.xfail, strict=True)] if c.xfail else []
    return pytest.param(c, id=c.id, marks=marks)


@pytest.mark.parametrize("c", [_param(c) for c in CASES])
def test_op(c: Case, record_rules):
    inputs, got, expected, st = run_case(c)
    RULES_HIT[c.id] = set(record_rules)
    assert st["ops_fallen_back"] == {}, f"fell back to ATen: {st['ops_fallen_back']}"
    assert st["graphs_failed"] == 0
    assert st["graphs_compiled"] >= 1 and st["ops_compiled"] >= 1, f"nothing was compiled: {st}"

    def ref64():  # the fp64 reference, computed only if some result is not allclose
        try:
            out = fp64_reference(c.reference or c.fn, inputs)
        except Exception:  # e.g. a float32 module captured by the case function: no reference
            return None
        return out if c.path == "dynamo" else tree_leaves(out)

    assert_accurate(got, expected, ref64, TOL)


def test_as_strided_before_its_input_falls_back():
    """as_strided may address storage before its input's first element, which the compiled graph
    does not receive: the rule must refuse (ATen runs it), never read outside the input."""
    def fn(a):
        return a.as_strided((3, 4), (1, 3), 2) * 2

    x = torch.randn(30)[5:]
    torch._dynamo.reset()
    polytile.reset_stats()
    with torch.no_grad():
        got = torch.compile(fn, backend="polytile", dynamic=False)(x)
    assert polytile.stats()["ops_fallen_back"] == {"aten.as_strided.default": 1}
    torch.testing.assert_close(got, fn(x), atol=0, rtol=0)


def test_every_rule_is_exercised():
    """Every rule of the lowering table is invoked by some case (cases not run in this session
    are compiled here to find out)."""
    ensure_loaded()
    hit: set = set()
    for c in CASES:
        if c.id not in RULES_HIT:
            with pytest.MonkeyPatch.context() as mp:
                rec = _record_rules(mp)
                try:
                    run_case(c)
                except Exception:  # that case's own test reports the failure
                    pass
                RULES_HIT[c.id] = rec
        hit |= RULES_HIT[c.id]
    missing = sorted(str(k) for k in set(LOWERINGS) - hit)
    assert not missing, f"lowering rules no case exercises: {missing}"
