"""Lowering rules: reductions and arg-reductions."""
from __future__ import annotations

from .registry import ir_dtype, lowers

_REDUCE = {"reduce_sum": "reduce_sum", "reduce_max": "reduce_max", "reduce_min": "reduce_min",
           "reduce_prod": "reduce_prod", "reduce_and": "reduce_min", "reduce_or": "reduce_max"}


for _p, _op in _REDUCE.items():
    @lowers(_p)
    def _reduce(ctx, x, axes, _op=_op, **params):
        if not axes:  # reducing over no axis is the identity (the builder reads () as "all")
            return x
        return ctx.b.reduce(_op, x, list(axes), False)


@lowers("argmax", "argmin")
def arg_reduce(ctx, x, axes, index_dtype):
    """The graph's arg-reductions give int64 indices; jax asks for ``index_dtype`` (int32 by default)."""
    b = ctx.b
    r = b.reduce(ctx.prim, x, list(axes), False)
    return b.cast(r, ir_dtype(index_dtype))
