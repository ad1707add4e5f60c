"""GraphBuilder: creates nodes through the op table; views are folded into one strided map."""
from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

from .. import dtypes as dt
from ..dtypes import Unsupported
from .ir import Graph, Node, topo_nodes
from .ops import infer
from .symbols import Sym

_ids = itertools.count()


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(st))


def reshape_strides(old_shape, old_strides, new_shape):
    """Strides that view (old_shape, old_strides) as new_shape, or None if a copy is needed."""
    numel = 1
    for s in old_shape:
        numel *= s
    if numel == 0 or not old_shape:
        return contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk = old_strides[-1]
    t_numel, v_numel = 1, 1
    for td in range(len(old_shape) - 1, -1, -1):
        t_numel *= old_shape[td]
        if td == 0 or (old_shape[td - 1] != 1 and old_strides[td - 1] != t_numel * chunk):
            while view_d >= 0 and (v_numel < t_numel or new_shape[view_d] == 1):
                new_strides[view_d] = v_numel * chunk
                v_numel *= new_shape[view_d]
                view_d -= 1
            if v_numel != t_numel:
                return None
            if td > 0:
                chunk = old_strides[td - 1]
                t_numel, v_numel = 1, 1
    if view_d != -1:
        return None
    return tuple(new_strides)


def _size(s):
    """A size or stride as an int (numpy ints, SymInt-free values) or a symbolic ``Sym``."""
    return s if isinstance(s, Sym) else int(s)


class GraphBuilder:
    """Appends nodes; every node's shape and dtype come from ``graph.ops.infer``."""

    def __init__(self) -> None:
        self.inputs: list[Node] = []

    # -- core -------------------------------------------------------------------------------
    def node(self, op: str, inputs: Sequence[Node] = (), **attrs: Any) -> Node:
        for i in inputs:
            if not isinstance(i, Node):
                raise Unsupported(f"{op}: non-tensor input {i!r}")
        shape, dtype = infer(op, inputs, attrs)
        return Node(op, tuple(inputs), tuple(sorted(attrs.items())), shape, dtype, next(_ids))

    def input(self, index: int, shape: Sequence[int], dtype: str) -> Node:
        n = self.node("input", (), index=index, shape=tuple(shape), dtype=dtype)
        self.inputs.append(n)
        return n

    def graph(self, outputs: Sequence[Node]) -> Graph:
        return Graph(tuple(self.inputs), tuple(outputs), topo_nodes(outputs, self.inputs))

    # -- constants --------------------------------------------------------------------------
    def full(self, value: Any, dtype: str, shape: Sequence[int] = ()) -> Node:
        if isinstance(value, Sym):  # a size known at run time (its ``Sym``), as an int or float value
            if dtype == "bool":
                raise Unsupported(f"a symbolic size {value} as a bool")
            return self.node("full", (), value=value, dtype=dtype, shape=tuple(shape))
        if dtype == "bool":
            value = bool(value)
        elif dt.is_int(dtype):
            value = int(value)
        else:
            value = float(value)
        return self.node("full", (), value=value, dtype=dtype, shape=tuple(shape))

    def iota(self, n: int, dtype: str, start: Any = 0, step: Any = 1) -> Node:
        return self.node("iota", (), shape=(n,), dtype=dtype, start=start, step=step)

    # -- elementwise ------------------------------------------------------------------------
    def result_dtype(self, *args: Any) -> str:
        tensors = [a.dtype for a in args if isinstance(a, Node)]
        res = tensors[0] if tensors else "float32"
        for t in tensors[1:]:
            res = dt.promote(res, t)
        for a in args:
            if isinstance(a, Node):
                continue
            if isinstance(a, bool):
                continue
            if isinstance(a, float) and not dt.is_float(res):
                res = "float32"
            elif isinstance(a, int) and res == "bool":
                res = "int64"
        return res

    def cast(self, x: Node, dtype: str) -> Node:
        if x.dtype == dtype:
            return x
        if x.op == "full":
            return self.full(x.attr("value"), dtype, x.shape)
        return self.node("cast", (x,), dtype=dtype)

    def scalar_or(self, a: Any, dtype: str) -> Node:
        return self.cast(a, dtype) if isinstance(a, Node) else self.full(a, dtype)

    def ew(self, op: str, *args: Any, dtype: str | None = None) -> Node:
        """Elementwise op; arguments are cast to ``dtype`` (default: the promoted type)."""
        cdt = dtype or self.result_dtype(*args)
        ins = [self.scalar_or(a, cdt) for a in args]
        return self.node(op, ins)

    def where(self, cond: Any, a: Any, b: Any, dtype: str | None = None) -> Node:
        cdt = dtype or self.result_dtype(a, b)
        return self.node("where", [self.scalar_or(cond, "bool"), self.scalar_or(a, cdt), self.scalar_or(b, cdt)])

    # -- views ------------------------------------------------------------------------------
    @staticmethod
    def strided(x: Node) -> tuple[Node, tuple[int, ...], tuple[int, ...], int]:
        """(base, shape, strides, offset) of x, strides in elements of base's contiguous layout."""
        if x.op == "view":
            return x.inputs[0], x.shape, x.attr("strides"), x.attr("offset")
        return x, x.shape, contiguous_strides(x.shape), 0

    def as_strided(self, x: Node, shape: Sequence[int], strides: Sequence[int], offset: int = 0) -> Node:
        """A view of x's base with absolute strides/offset (aten.as_strided semantics)."""
        base = self.strided(x)[0]
        return self._make_view(base, shape, strides, _size(offset))

    def _view(self, x: Node, shape, strides, offset_delta: int = 0) -> Node:
        """A view of x expressed on x's base (x's own offset plus ``offset_delta``)."""
        base, _, _, off = self.strided(x)
        return self._make_view(base, shape, strides, off + offset_delta)

    def _make_view(self, base: Node, shape, strides, offset: int) -> Node:
        shape, strides = tuple(_size(s) for s in shape), tuple(_size(s) for s in strides)
        if base.op == "full":
            return self.full(base.attr("value"), base.dtype, shape)
        if shape == base.shape and offset == 0 and all(
            s == c or n == 1 for s, c, n in zip(strides, contiguous_strides(shape), shape)
        ):
            return base
        return self.node("view", (base,), shape=shape, strides=strides, offset=offset)

    def permute(self, x: Node, perm: Sequence[int]) -> Node:
        _, shape, st, _ = self.strided(x)
        perm = [p % max(len(shape), 1) for p in perm]
        return self._view(x, [shape[p] for p in perm], [st[p] for p in perm])

    def transpose(self, x: Node, a: int, b: int) -> Node:
        r = len(x.shape)
        perm = list(range(r))
        if r:
            a, b = a % r, b % r
            perm[a], perm[b] = perm[b], perm[a]
        return self.permute(x, perm)

    def expand(self, x: Node, shape: Sequence[int]) -> Node:
        _, xs, st, _ = self.strided(x)
        shape = list(shape)
        lead = len(shape) - len(xs)
        new_st = []
        for k, s in enumerate(shape):
            if k < lead:
                if s == -1:
                    raise Unsupported("expand: -1 in a new leading dim")
                new_st.append(0)
                continue
            xd = xs[k - lead]
            if s == -1:
                shape[k] = s = xd
            if xd == s:
                new_st.append(st[k - lead])
            elif xd == 1:
                new_st.append(0)
            else:
                raise Unsupported(f"expand {xs} -> {shape}")
        return self._view(x, shape, new_st)

    def reshape(self, x: Node, shape: Sequence[int]) -> Node:
        shape = list(shape)
        if -1 in shape:
            known = 1
            for s in shape:
                if s != -1:
                    known *= s
            shape[shape.index(-1)] = x.numel // known if known else 0
        if tuple(shape) == x.shape:
            return x
        _, xs, st, _ = self.strided(x)
        new_st = reshape_strides(xs, st, shape)
        if new_st is None:  # not expressible as a view of the base: materialize, then view
            x = self.node("identity", (x,))
            new_st = reshape_strides(x.shape, contiguous_strides(x.shape), shape)
        return self._view(x, shape, new_st)

    def slice(self, x: Node, dim: int, start: int, end: int, step: int = 1) -> Node:
        _, xs, st, _ = self.strided(x)
        dim %= len(xs)
        n = xs[dim]
        if isinstance(end, int) and end >= 2**62:  # "to the end" (also of a symbolic size)
            end = n
        start = max(0, min(n, start + n if start < 0 else start))
        end = max(start, min(n, end + n if end < 0 else end))
        length = (end - start + step - 1) // step
        shape = list(xs)
        shape[dim] = length
        new_st = list(st)
        new_st[dim] = st[dim] * step
        return self._view(x, shape, new_st, start * st[dim])

    def flip(self, x: Node, dims: Sequence[int]) -> Node:
        """x reversed along ``dims``: a view with negated strides."""
        _, xs, st, _ = self.strided(x)
        new_st, delta = list(st), 0
        for d in {d % len(xs) for d in dims} if xs else ():
            if xs[d] > 1:
                delta += (xs[d] - 1) * st[d]
                new_st[d] = -st[d]
        return self._view(x, xs, new_st, delta)

    def select(self, x: Node, dim: int, index: int) -> Node:
        _, xs, st, _ = self.strided(x)
        dim %= len(xs)
        if index < 0:
            index += xs[dim]
        if not 0 <= index < xs[dim]:
            raise Unsupported(f"select index {index} out of range for size {xs[dim]}")
        shape = [s for k, s in enumerate(xs) if k != dim]
        new_st = [s for k, s in enumerate(st) if k != dim]
        return self._view(x, shape, new_st, index * st[dim])

    def unsqueeze(self, x: Node, dim: int) -> Node:
        _, xs, st, _ = self.strided(x)
        dim = dim % (len(xs) + 1)
        return self._view(x, list(xs[:dim]) + [1] + list(xs[dim:]), list(st[:dim]) + [0] + list(st[dim:]))

    def squeeze(self, x: Node, dims: Sequence[int] | None = None) -> Node:
        _, xs, st, _ = self.strided(x)
        if dims is None:
            dims = [k for k, s in enumerate(xs) if s == 1]
        dims = {d % max(len(xs), 1) for d in dims if xs and xs[d % len(xs)] == 1}
        return self._view(x, [s for k, s in enumerate(xs) if k not in dims], [s for k, s in enumerate(st) if k not in dims])

    def materialize(self, x: Node) -> Node:
        return self.node("identity", (x,)) if x.op in ("view", "full", "input") else x

    # -- structured ops ---------------------------------------------------------------------
    def reduce(self, op: str, x: Node, axes: Sequence[int] | None, keepdim: bool = False) -> Node:
        r = len(x.shape)
        axes = tuple(range(r)) if axes is None or len(axes) == 0 else tuple(sorted({a % r for a in axes})) if r else ()
        if r == 0:
            return x if not op.startswith("arg") else self.full(0, "int64")
        return self.node(op, (x,), axes=axes, keepdim=bool(keepdim))

    def matmul(self, a: Node, b: Node) -> Node:
        return self.node("matmul", (a, b))

    def concat(self, xs: Sequence[Node], axis: int) -> Node:
        xs = [x for x in xs if x.numel > 0 or len(x.shape) != 1]
        if len(xs) == 1:
            return xs[0]
        axis %= len(xs[0].shape)
        return self.node("concat", xs, axis=axis)


def rewrite_nodes(g: Graph, rule: Callable[[GraphBuilder, Node], Node | None]) -> Graph:
    """``g`` with each node rebuilt on its inputs' replacements, then replaced by ``rule(b,
    node)`` where that gives a node (built with ``b``; the same shape and dtype)."""
    b = GraphBuilder()
    new: dict[int, Node] = {}
    for n in g.nodes:
        ins = [new[i.id] for i in n.inputs]
        out = n if n.op == "input" or all(x is y for x, y in zip(ins, n.inputs)) else b.node(n.op, ins, **dict(n.attrs))
        new[n.id] = rule(b, out) or out
    outputs = tuple(new[o.id] for o in g.outputs)
    return Graph(g.inputs, outputs, topo_nodes(outputs, g.inputs))
