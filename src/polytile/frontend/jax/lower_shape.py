"""Lowering rules: broadcasts, reshapes, transposes, slices, concatenation, padding, iota.

Most of these are views: the builder folds them into one strided index map of their base.
"""
from __future__ import annotations

from ...dtypes import Unsupported
from ...graph.ir import Node
from .registry import ir_dtype, lowers

_REDUCE_OPS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod")


def _keepdim_reduce(b, x: Node, shape: list[int]) -> Node | None:
    """x = reduce(y, axes) viewed as ``shape`` = y's shape with the reduced axes as 1: the same
    reduction with keepdim (the form graph passes such as the softmax match look for)."""
    if x.op not in _REDUCE_OPS or x.attr("keepdim"):
        return None
    y = x.inputs[0]
    axes = set(x.attr("axes"))
    if tuple(shape) != tuple(1 if k in axes else s for k, s in enumerate(y.shape)):
        return None
    return b.node(x.op, [y], axes=tuple(sorted(axes)), keepdim=True)


@lowers("broadcast_in_dim")
def broadcast_in_dim(ctx, x, *dyn, shape, broadcast_dimensions, sharding=None):
    if dyn:
        raise Unsupported("broadcast_in_dim with dynamic shapes")
    b = ctx.b
    inter = [1] * len(shape)
    for k, d in enumerate(broadcast_dimensions):
        inter[d] = x.shape[k]
    y = _keepdim_reduce(b, x, inter) or b.reshape(x, inter)
    return b.expand(y, list(shape))


@lowers("reshape")
def reshape(ctx, x, *dyn, new_sizes, dimensions=None, sharding=None):
    if dyn or dimensions is not None:
        raise Unsupported("reshape with dynamic sizes or a dimension order")
    return ctx.b.reshape(x, list(new_sizes))


@lowers("transpose")
def transpose(ctx, x, permutation):
    return ctx.b.permute(x, list(permutation))


@lowers("squeeze")
def squeeze(ctx, x, dimensions):
    return ctx.b.squeeze(x, list(dimensions)) if dimensions else x


def _slice(b, x: Node, starts, limits, strides=None) -> Node:
    for d, (s, e) in enumerate(zip(starts, limits)):
        st = strides[d] if strides else 1
        if (s, e, st) != (0, x.shape[d], 1):
            x = b.slice(x, d, int(s), int(e), int(st))
    return x


@lowers("slice")
def slice_(ctx, x, start_indices, limit_indices, strides=None):
    return _slice(ctx.b, x, start_indices, limit_indices, strides)


@lowers("dynamic_slice")
def dynamic_slice(ctx, x, *starts, slice_sizes):
    """Start indices known when compiling (literals, constants); clamped into range like XLA."""
    if len(starts) != len(x.shape):
        raise Unsupported("dynamic_slice with dynamic sizes")
    lo = []
    for d, (s, size) in enumerate(zip(starts, slice_sizes)):
        if s.op != "full":
            raise Unsupported("dynamic_slice with a start index computed at run time")
        lo.append(max(0, min(int(s.attr("value")), x.shape[d] - int(size))))
    return _slice(ctx.b, x, lo, [s + int(n) for s, n in zip(lo, slice_sizes)])


@lowers("split")
def split(ctx, x, sizes, axis):
    out, start = [], 0
    for n in sizes:
        out.append(ctx.b.slice(x, axis, start, start + int(n)))
        start += int(n)
    return tuple(out)


@lowers("concatenate")
def concatenate(ctx, *xs, dimension):
    return ctx.b.concat(list(xs), int(dimension))


@lowers("stack")
def stack(ctx, *xs, axis):
    return ctx.b.concat([ctx.b.unsqueeze(x, axis) for x in xs], int(axis))


@lowers("pad")
def pad(ctx, x, value, padding_config):
    """Edge padding with a constant value (no interior padding, no negative pads)."""
    if value.op != "full":
        raise Unsupported("pad with a value computed at run time")
    if any(i != 0 or lo < 0 or hi < 0 for lo, hi, i in padding_config):
        raise Unsupported(f"pad with interior or negative padding {padding_config}")
    if all(lo == 0 and hi == 0 for lo, hi, _ in padding_config):
        return x
    return ctx.b.node("pad", [x], pads=tuple((int(lo), int(hi)) for lo, hi, _ in padding_config),
                      value=value.attr("value"))


@lowers("iota")
def iota(ctx, dtype, shape, dimension, sharding=None):
    b = ctx.b
    dt = ir_dtype(dtype)
    n = shape[dimension]
    inter = [1] * len(shape)
    inter[dimension] = n
    return b.expand(b.reshape(b.iota(n, dt), inter), list(shape))
