"""Evaluate small constant subgraphs (built from ``full`` and ``iota`` only) with numpy.

Used by rewrites that need the value of a mask the program computes from indices alone,
e.g. the causal mask ``scaled_dot_product_attention(is_causal=True)`` builds from two iotas.
Returns None for anything that reads a graph input or uses an op outside the small table.
"""
from __future__ import annotations

import numpy as np

from .ir import Node

MAX_ELEMENTS = 1 << 24

_NP_DTYPE = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32, "bool": np.bool_}

_FN = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "neg": np.negative,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_not": np.logical_not, "identity": lambda x: x,
}


def evaluate(n: Node, _memo: dict | None = None) -> np.ndarray | None:
    """The value of ``n`` as an array of its shape, or None if it is not a small constant."""
    memo = {} if _memo is None else _memo
    if n.id in memo:
        return memo[n.id]
    out = _eval(n, memo) if n.numel <= MAX_ELEMENTS and n.dtype in _NP_DTYPE else None
    memo[n.id] = out
    return out


def _eval(n: Node, memo: dict) -> np.ndarray | None:
    dt = _NP_DTYPE[n.dtype]
    if n.op == "full":
        return np.full(n.shape, n.attr("value"), dtype=dt)
    if n.op == "iota":
        return (n.attr("start") + n.attr("step") * np.arange(n.shape[0])).astype(dt)
    args = [evaluate(i, memo) for i in n.inputs]
    if any(a is None for a in args):
        return None
    if n.op == "view":
        flat = np.ascontiguousarray(args[0]).reshape(-1)
        idx = np.full(n.shape, n.attr("offset"), dtype=np.int64)
        for k, (size, stride) in enumerate(zip(n.shape, n.attr("strides"))):
            shape = [1] * len(n.shape)
            shape[k] = size
            idx = idx + (np.arange(size) * stride).reshape(shape)
        return flat[idx]
    if n.op == "where":
        return np.where(args[0], args[1], args[2]).astype(dt)
    if n.op == "cast":
        return args[0].astype(dt)
    fn = _FN.get(n.op)
    if fn is None:
        return None
    return np.broadcast_to(np.asarray(fn(*args)).astype(dt), n.shape)
