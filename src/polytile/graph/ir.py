"""Tensor graph IR: immutable nodes with static shapes, one dtype each, in topological order.

A node is an operation from the closed set in ``graph.ops.OPS``. Views are nodes too
(``view``: a strided index map into its base, never a copy); every other node owns a buffer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable


@dataclass(frozen=True, eq=False)
class Node:
    op: str
    inputs: tuple["Node", ...]
    attrs: tuple[tuple[str, Any], ...]
    shape: tuple[int, ...]
    dtype: str
    id: int

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def name(self) -> str:
        return f"%{self.id}"

    def __repr__(self) -> str:  # short, for error messages
        return f"{self.name}:{self.op}{list(self.shape)}:{self.dtype}"


@dataclass(frozen=True)
class Graph:
    inputs: tuple[Node, ...]
    outputs: tuple[Node, ...]
    nodes: tuple[Node, ...]  # topological order, inputs included

    def users(self) -> dict[int, list[Node]]:
        u: dict[int, list[Node]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                u[i.id].append(n)
        return u


def topo_nodes(outputs: Iterable[Node], inputs: Iterable[Node] = ()) -> tuple[Node, ...]:
    """All nodes reachable from ``outputs`` (plus ``inputs``), in a topological order by id."""
    seen: dict[int, Node] = {n.id: n for n in inputs}
    stack = list(outputs)
    while stack:
        n = stack.pop()
        if n.id in seen:
            continue
        seen[n.id] = n
        stack.extend(n.inputs)
    return tuple(sorted(seen.values(), key=lambda n: n.id))


def format_graph(g: Graph) -> str:
    """Readable text form: one line per node."""
    lines = ["graph("]
    for n in g.inputs:
        lines.append(f"  {n.name}: {n.dtype}{list(n.shape)}  # input {n.attr('index')}")
    lines.append(") {")
    for n in g.nodes:
        if n.op == "input":
            continue
        args = ", ".join(i.name for i in n.inputs)
        attrs = ", ".join(f"{k}={v}" for k, v in n.attrs)
        sep = ", " if args and attrs else ""
        lines.append(f"  {n.name} = {n.op}({args}{sep}{attrs}) : {n.dtype}{list(n.shape)}")
    lines.append("  return " + ", ".join(o.name for o in g.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"


def verify_graph(g: Graph) -> None:
    """Structural checks: topological order, shapes/dtypes consistent with the op table."""
    from .ops import OPS, infer

    pos = {n.id: k for k, n in enumerate(g.nodes)}
    for k, n in enumerate(g.nodes):
        if n.op not in OPS:
            raise AssertionError(f"unknown op {n.op!r} in {n!r}")
        for i in n.inputs:
            if i.id not in pos or pos[i.id] >= k:
                raise AssertionError(f"{n!r} uses {i!r} before it is defined")
        if n.op != "input":
            shape, dtype = infer(n.op, n.inputs, dict(n.attrs))
            if tuple(shape) != n.shape or dtype != n.dtype:
                raise AssertionError(f"{n!r}: op table says {dtype}{list(shape)}")
    for o in g.outputs:
        if o.id not in pos:
            raise AssertionError(f"output {o!r} not in graph")
