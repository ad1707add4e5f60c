"""Evaluate small constant subgraphs (built from ``full`` and ``iota`` only) with numpy.

Used by rewrites that need the value of a mask the program computes from indices alone,
e.g. the causal mask ``scaled_dot_product_attention(is_causal=True)`` builds from two iotas.
Returns None for anything that reads a graph input or uses an op outside the small table.
"""
from __future__ import annotations

import numpy as np

from .symbols import is_symbolic
from .ir import Node

MAX_ELEMENTS = 1 << 24

_NP_DTYPE = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32, "bool": np.bool_}

_FN = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "neg": np.negative,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_not": np.logical_not, "identity": lambda x: x,
}


MAX_NODES = 256  # a mask built from indices is a handful of ops; deeper graphs are not tried


def evaluate(n: Node) -> np.ndarray | None:
    """The value of ``n`` as an array of its shape, or None if it is not a small constant."""
    order: list[Node] = []  # post-order, without recursion (graphs can be thousands of ops deep)
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(n, False)]
    while stack:
        x, done = stack.pop()
        if done:
            order.append(x)
            continue
        if x.id in seen:
            continue
        seen.add(x.id)
        if x.op == "input" or len(seen) > MAX_NODES or is_symbolic(x.shape) or x.numel > MAX_ELEMENTS \
                or x.dtype not in _NP_DTYPE:
            return None
        stack.append((x, True))
        stack.extend((i, False) for i in x.inputs)
    memo: dict[int, np.ndarray] = {}
    for x in order:
        v = _eval(x, memo)
        if v is None:
            return None
        memo[x.id] = v
    return memo[n.id]


def _eval(n: Node, memo: dict) -> np.ndarray | None:
    dt = _NP_DTYPE[n.dtype]
    if n.op == "full":
        return np.full(n.shape, n.attr("value"), dtype=dt)
    if n.op == "iota":
        return (n.attr("start") + n.attr("step") * np.arange(n.shape[0])).astype(dt)
    args = [memo[i.id] for i in n.inputs]
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
