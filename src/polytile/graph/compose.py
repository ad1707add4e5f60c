"""Composite ops built from the closed op set (shared by every frontend)."""
from __future__ import annotations

import math
from typing import Sequence

from .builder import GraphBuilder
from .ir import Node


def numel_of(x: Node, axes: Sequence[int] | None) -> int:
    if not axes or not x.shape:  # a 0-d tensor: dim 0 / -1 is its one element
        return x.numel
    n = 1
    for a in axes:
        n *= x.shape[a % len(x.shape)]
    return n


def mean(b: GraphBuilder, x: Node, axes, keepdim=False) -> Node:
    s = b.reduce("reduce_sum", x, axes, keepdim)
    n = numel_of(x, axes)
    return b.ew("div", s, float(n)) if n else b.ew("mul", s, float("nan"))


def var(b: GraphBuilder, x: Node, axes, correction: float = 1.0, keepdim=False) -> Node:
    m = mean(b, x, axes, True)
    d = b.ew("sub", x, m)
    ss = b.reduce("reduce_sum", b.ew("mul", d, d), axes, keepdim)
    n = numel_of(x, axes) - correction
    return b.ew("div", ss, float(max(n, 0)))


def softmax(b: GraphBuilder, x: Node, axis: int, log: bool = False) -> Node:
    if x.numel == 0:
        return x
    m = b.reduce("reduce_max", x, [axis], True)
    # an all -inf row gives NaN (inf - inf), as in PyTorch
    z = b.ew("sub", x, m)
    e = b.ew("exp", z)
    s = b.reduce("reduce_sum", e, [axis], True)
    if log:
        return b.ew("sub", z, b.ew("log", s))
    return b.ew("div", e, s)


def layer_norm(b: GraphBuilder, x: Node, nd: int, weight, bias, eps: float):
    """(out, mean, rstd) over the last ``nd`` dims; mean/rstd keep those dims as size 1."""
    axes = list(range(len(x.shape) - nd, len(x.shape)))
    m = mean(b, x, axes, True)
    d = b.ew("sub", x, m)
    v = mean(b, b.ew("mul", d, d), axes, True)
    rstd = b.ew("rsqrt", b.ew("add", v, float(eps)))
    y = b.ew("mul", d, rstd)
    if weight is not None:
        y = b.ew("mul", y, weight)
    if bias is not None:
        y = b.ew("add", y, bias)
    return y, m, rstd


def channel(b: GraphBuilder, v: Node, rank: int) -> Node:
    """A per-channel vector (dim 1) viewed for broadcasting against a rank-``rank`` tensor."""
    return b.reshape(v, [v.shape[0]] + [1] * (rank - 2))


def batch_norm_eval(b: GraphBuilder, x: Node, weight, bias, mean_: Node, var_: Node, eps: float) -> Node:
    r = len(x.shape)
    scale = b.ew("rsqrt", b.ew("add", var_, float(eps)))
    if weight is not None:
        scale = b.ew("mul", scale, weight)
    shift = b.ew("neg", b.ew("mul", mean_, scale))
    if bias is not None:
        shift = b.ew("add", shift, bias)
    return b.ew("add", b.ew("mul", x, channel(b, scale, r)), channel(b, shift, r))


def gelu(b: GraphBuilder, x: Node, approximate: str = "none") -> Node:
    if approximate == "tanh":
        inner = b.ew("mul", b.ew("add", x, b.ew("mul", b.ew("mul", b.ew("mul", x, x), x), 0.044715)),
                     math.sqrt(2 / math.pi))
        return b.ew("mul", b.ew("mul", x, 0.5), b.ew("add", b.ew("tanh", inner), 1.0))
    return b.ew("mul", b.ew("mul", x, 0.5), b.ew("add", b.ew("erf", b.ew("mul", x, 1 / math.sqrt(2))), 1.0))


def floordiv(b: GraphBuilder, x: Node, y: Node) -> Node:
    """Floor division of floats as PyTorch does it (c10::div_floor_floating): from fmod, so that
    e.g. 1.0 // 0.1 is 9 (like Python), not floor(1.0 / 0.1) = 10. x and y of one float dtype."""
    mod = b.ew("fmod", x, y)
    div = b.ew("div", b.ew("sub", x, mod), y)
    wrong_sign = b.ew("logical_and", b.ew("ne", mod, 0.0), b.ew("ne", b.ew("lt", y, 0.0), b.ew("lt", mod, 0.0)))
    div = b.where(wrong_sign, b.ew("sub", div, 1.0), div)
    q = b.ew("floor", div)
    q = b.where(b.ew("gt", b.ew("sub", div, q), 0.5), b.ew("add", q, 1.0), q)
    return b.where(b.ew("eq", y, 0.0), b.ew("div", x, y), q)  # x / 0: inf or nan, as in PyTorch


def clamp(b: GraphBuilder, x: Node, lo=None, hi=None) -> Node:
    if lo is not None:
        x = b.ew("maximum", x, lo, dtype=b.result_dtype(x, lo))
    if hi is not None:
        x = b.ew("minimum", x, hi, dtype=b.result_dtype(x, hi))
    return x


def linear(b: GraphBuilder, x: Node, w: Node, bias: Node | None) -> Node:
    """x @ w.T + bias, w of shape [out, in]."""
    y = b.matmul(x if len(x.shape) >= 2 else b.unsqueeze(x, 0), b.transpose(w, 0, 1))
    if len(x.shape) < 2:
        y = b.squeeze(y, [0])
    return b.ew("add", y, bias) if bias is not None else y
