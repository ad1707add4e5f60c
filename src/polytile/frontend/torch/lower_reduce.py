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


@lowers(aten.var.correction, aten.var.dim)
def var(ctx, x, dim=None, *args, correction=None, keepdim=False, unbiased=None):
    if ctx.node.target == aten.var.dim:
        unbiased = args[0] if args else (True if unbiased is None else unbiased)
        keepdim = args[1] if len(args) > 1 else keepdim
        correction = 1 if unbiased else 0
    return compose.var(ctx.b, x, _dims(dim), 1 if correction is None else correction, keepdim)


@lowers(aten.std.correction)
def std(ctx, x, dim=None, correction=None, keepdim=False):
    return ctx.b.ew("sqrt", compose.var(ctx.b, x, _dims(dim), 1 if correction is None else correction, keepdim))


@lowers(aten.var_mean.correction)
def var_mean(ctx, x, dim=None, correction=None, keepdim=False):
    d = _dims(dim)
    return compose.var(ctx.b, x, d, 1 if correction is None else correction, keepdim), compose.mean(ctx.b, x, d, keepdim)


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


@lowers(aten.cumsum.default)
def cumsum(ctx, x, dim, dtype=None):
    """An inclusive scan as a contraction with a triangular 0/1 matrix (quadratic work, so only
    for dims up to 4096: position ids and masks, not long sequences)."""
    b = ctx.b
    dt = ctx.out_dtype
    if not x.shape:
        return b.cast(x, dt)
    dim %= len(x.shape)
    n = x.shape[dim]
    if n > 4096:
        raise Unsupported(f"cumsum over {n} elements")
    rows = b.reshape(b.iota(n, "int64"), [n, 1])
    cols = b.reshape(b.iota(n, "int64"), [1, n])
    tri = b.cast(b.ew("le", rows, cols), dt)  # tri[j, i] = 1 if j <= i
    if len(x.shape) == 1:
        return b.squeeze(b.matmul(b.unsqueeze(b.cast(x, dt), 0), tri), [0])
    xt = b.transpose(b.cast(x, dt), dim, -1)
    return b.transpose(b.matmul(xt, tri), dim, -1)
