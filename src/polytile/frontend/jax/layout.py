"""Layout propagation through elementwise ops, at lowering time.

The graph's convolution is NCHW; a JAX model in NHWC (Flax's layout) gets each conv output as a
transposed view, and the elementwise ops after it (bias, activation) would store their results in
NHWC order, only for the next convolution to read them through a transposed view again. When an
elementwise op's full-size operands are all the same permutation of contiguous buffers (the other
operands being broadcasts: a bias, a scalar), it is computed in the buffers' own order and its
result returned as the same permuted view: the NHWC <-> NCHW views then cancel between layers.
"""
from __future__ import annotations

from ...graph.builder import GraphBuilder, contiguous_strides
from ...graph.ir import Node


def permutation_of(x: Node) -> list[int] | None:
    """perm if x is exactly ``permute(base, perm)`` of its (contiguous) base, perm not the identity."""
    if x.op != "view" or x.attr("offset") != 0 or x.numel != x.inputs[0].numel or x.numel <= 1:
        return None
    base = x.inputs[0]
    if len(base.shape) != len(x.shape):
        return None
    bst = contiguous_strides(base.shape)
    free = list(range(len(base.shape)))
    perm: list[int | None] = [None] * len(x.shape)
    for d, (n, st) in enumerate(zip(x.shape, x.attr("strides"))):
        if n == 1:
            continue
        k = next((k for k in free if base.shape[k] == n and bst[k] == st), None)
        if k is None:
            return None
        perm[d] = k
        free.remove(k)
    for d in range(len(perm)):
        if perm[d] is None:
            k = next(k for k in free if base.shape[k] == 1)
            perm[d] = k
            free.remove(k)
    if perm == list(range(len(perm))):
        return None
    return perm  # type: ignore[return-value]


def _is_broadcast(x: Node, shape) -> bool:
    """x is smaller than the result (a scalar, a bias vector, a broadcast view)."""
    if x.op == "full":
        return True
    if x.op == "view":
        return x.inputs[0].numel < x.numel or x.numel < _numel(shape)
    return x.numel < _numel(shape)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def in_base_layout(b: GraphBuilder, op: str, args: list, shape) -> tuple[list, list[int]] | None:
    """(operands rewritten into the common base order, perm) when ``op`` over ``args`` should run
    in that order (see the module doc), else None. The caller applies ``b.permute(result, perm)``."""
    nodes = [a for a in args if isinstance(a, Node)]
    full = [a for a in nodes if not _is_broadcast(a, shape)]
    if not full or any(tuple(a.shape) != tuple(shape) for a in full):
        return None
    perm = permutation_of(full[0])
    if perm is None or any(permutation_of(a) != perm for a in full[1:]):
        return None
    inv = _inverse(perm)
    out = []
    for a in args:
        if not isinstance(a, Node):
            out.append(a)
            continue
        if len(a.shape) < len(shape):
            a = b.reshape(a, [1] * (len(shape) - len(a.shape)) + list(a.shape))
        out.append(b.permute(a, inv))
    return out, perm


def ew(b: GraphBuilder, op: str, *args, dtype: str | None = None) -> Node:
    """``b.ew`` with layout propagation."""
    shape = _bshape(args)
    r = in_base_layout(b, op, list(args), shape) if shape is not None else None
    if r is None:
        return b.ew(op, *args, dtype=dtype)
    ins, perm = r
    return b.permute(b.ew(op, *ins, dtype=dtype), perm)


def where(b: GraphBuilder, cond, x, y, dtype: str | None = None) -> Node:
    """``b.where`` with layout propagation."""
    shape = _bshape((cond, x, y))
    r = in_base_layout(b, "where", [cond, x, y], shape) if shape is not None else None
    if r is None:
        return b.where(cond, x, y, dtype=dtype)
    (c2, x2, y2), perm = r
    return b.permute(b.where(c2, x2, y2, dtype=dtype), perm)


def _bshape(args):
    from ...graph.ops import broadcast_shapes

    try:
        return broadcast_shapes(*(a.shape for a in args if isinstance(a, Node)))
    except Exception:
        return None
