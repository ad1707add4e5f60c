"""Lowering rules: reductions, softmax and variance."""
from __future__ import annotations

import torch

from ...dtypes import Unsupported
from ...graph import compose
from .registry import lowers

aten = torch.ops.aten


def _dims(dim):
    if dim is None:
        return None
    return [dim] if isinstance(dim, int) else list(dim)


@lowers(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx, x, dim=None, keepdim=False, dtype=None):
    return ctx.b.reduce("reduce_sum", ctx.b.cast(x, ctx.out_dtype), _dims(dim), keepdim)


@lowers(aten.prod.dim_int, aten.prod.default)
def prod(ctx, x, dim=None, keepdim=False, dtype=None):
    return ctx.b.reduce("reduce_prod", ctx.b.cast(x, ctx.out_dtype), _dims(dim), keepdim)


@lowers(aten.mean.dim, aten.mean.default)
def mean(ctx, x, dim=None, keepdim=False, dtype=None):
    return compose.mean(ctx.b, ctx.b.cast(x, ctx.out_dtype), _dims(dim), keepdim)


@lowers(aten.amax.default, aten.max.default)
def amax(ctx, x, dim=None, keepdim=False):
    return ctx.b.reduce("reduce_max", x, _dims(dim), keepdim)


@lowers(aten.amin.default, aten.min.default)
def amin(ctx, x, dim=None, keepdim=False):
    return ctx.b.reduce("reduce_min", x, _dims(dim), keepdim)


@lowers(aten.max.dim)
def max_dim(ctx, x, dim, keepdim=False):
    return ctx.b.reduce("reduce_max", x, [dim], keepdim), ctx.b.reduce("argmax", x, [dim], keepdim)


@lowers(aten.min.dim)
def min_dim(ctx, x, dim, keepdim=False):
    return ctx.b.reduce("reduce_min", x, [dim], keepdim), ctx.b.reduce("argmin", x, [dim], keepdim)


@lowers(aten.argmax.default)
def argmax(ctx, x, dim=None, keepdim=False):
    if dim is None:
        r = ctx.b.reduce("argmax", ctx.b.reshape(x, [x.numel]), [0], False)
        return ctx.b.reshape(r, [1] * len(x.shape)) if keepdim else r
    return ctx.b.reduce("argmax", x, [dim], keepdim)


@lowers(aten.argmin.default)
def argmin(ctx, x, dim=None, keepdim=False):
    if dim is None:
        r = ctx.b.reduce("argmin", ctx.b.reshape(x, [x.numel]), [0], False)
        return ctx.b.reshape(r, [1] * len(x.shape)) if keepdim else r
    return ctx.b.reduce("argmin", x, [dim], keepdim)


@lowers(aten.any.dim, aten.any.dims, aten.any.default)
def any_(ctx, x, dim=None, keepdim=False):
    return ctx.b.reduce("reduce_max", ctx.b.cast(x, "bool"), _dims(dim), keepdim)


@lowers(aten.all.dim, aten.all.dims, aten.all.default)
def all_(ctx, x, dim=None, keepdim=False):
    return ctx.b.reduce("reduce_min", ctx.b.cast(x, "bool"), _dims(dim), keepdim)


def _variance(ctx, x, dims, correction, keepdim, with_mean=False):
    """Eager's CPU variance accumulates a float32 tensor's moments in float64 (squares of large
    values stay finite): the same here, the results rounded back to the output dtype."""
    b, dt = ctx.b, ctx.out_dtype
    xw = b.cast(x, "float64") if dt == "float32" else x
    v = b.cast(compose.var(b, xw, dims, 1 if correction is None else correction, keepdim), dt)
    return (v, b.cast(compose.mean(b, xw, dims, keepdim), dt)) if with_mean else v


@lowers(aten.var.correction, aten.var.dim)
def var(ctx, x, dim=None, *args, correction=None, keepdim=False, unbiased=None):
    if ctx.node.target == aten.var.dim:
        unbiased = args[0] if args else (True if unbiased is None else unbiased)
        keepdim = args[1] if len(args) > 1 else keepdim
        correction = 1 if unbiased else 0
    return _variance(ctx, x, _dims(dim), correction, keepdim)


@lowers(aten.std.correction, aten.std_mean.correction)
def std(ctx, x, dim=None, correction=None, keepdim=False):
    """The square root taken before rounding to float32, as in eager's kernel."""
    b, dt = ctx.b, ctx.out_dtype
    xw = b.cast(x, "float64") if dt == "float32" else x
    d = _dims(dim)
    s = b.cast(b.ew("sqrt", compose.var(b, xw, d, 1 if correction is None else correction, keepdim)), dt)
    if ctx.node.target is aten.std_mean.correction:
        return s, b.cast(compose.mean(b, xw, d, keepdim), dt)
    return s


@lowers(aten.var_mean.correction)
def var_mean(ctx, x, dim=None, correction=None, keepdim=False):
    return _variance(ctx, x, _dims(dim), correction, keepdim, with_mean=True)


@lowers(aten._softmax.default)
def softmax(ctx, x, dim, half_to_float=False):
    return compose.softmax(ctx.b, ctx.b.cast(x, ctx.out_dtype), dim)


@lowers(aten._log_softmax.default)
def log_softmax(ctx, x, dim, half_to_float=False):
    return compose.softmax(ctx.b, ctx.b.cast(x, ctx.out_dtype), dim, log=True)


@lowers(aten.logsumexp.default)
def logsumexp(ctx, x, dim, keepdim=False):
    b = ctx.b
    x = b.cast(x, ctx.out_dtype)
    m = b.reduce("reduce_max", x, _dims(dim), True)
    m = b.where(b.node("isinf", [m]), 0.0, m)  # all -inf rows: avoid inf - inf
    s = b.reduce("reduce_sum", b.ew("exp", b.ew("sub", x, m)), _dims(dim), True)
    r = b.ew("add", b.ew("log", s), m)
    return r if keepdim else b.squeeze(r, _dims(dim))


@lowers(aten.cumsum.default, aten.cumprod.default)
def cumsum(ctx, x, dim, dtype=None):
    """An inclusive scan, in order along ``dim`` (inf and NaN propagate as in eager)."""
    b = ctx.b
    x = b.cast(x, ctx.out_dtype)
    if not x.shape:
        return x
    op = "scan_add" if ctx.node.target is aten.cumsum.default else "scan_mul"
    return b.node(op, [x], axis=dim % len(x.shape))
