"""Half-precision roundings left out inside fused kernels.

``graph.low_precision.widen`` computes every bfloat16/float16 op in float32 and rounds its
result to the half type, as eager does; those roundings are ``narrow`` ops. Where fusion put
the producer and its consumer in one kernel, the consumer reads ``cast<float32>(narrow(x))``:
here it reads ``x`` instead, the float32 value, as Inductor's kernels do. The result is more
accurate than eager's (one rounding, at the store, instead of one per op), and differs from
it where eager's intermediate roundings matter (most where terms cancel); a value stored to
memory, a kernel's output or an intermediate tensor, is still rounded at its store. A user's
own cast (``x.to(bfloat16)``) is a ``cast``, never left out. ``Options.emulate_precision_casts`` skips this pass (eager's bits).
"""
from __future__ import annotations

from dataclasses import replace

from ..affine.ir import Expr, Op, Program
from .fusion_util import map_stmt_exprs


def _keep(e: Expr) -> Expr:
    if isinstance(e, Op) and e.fn == "cast" and e.dtype == "float32":
        x = e.args[0]
        if isinstance(x, Op) and x.fn == "narrow" and x.args[0].dtype == "float32":
            return x.args[0]
    return e


def keep_float32(p: Program) -> Program:
    return replace(p, kernels=tuple(replace(k, body=map_stmt_exprs(k.body, _keep)) for k in p.kernels))
