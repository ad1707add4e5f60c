"""The fusion cost model (PolyBlocks' criteria, simplified): bytes of memory traffic saved
against arithmetic recomputed, with parallelism and vectorizability kept.

Weights are per scalar operation, in units of one add; a load costs as much as one add
(it hits cache once the nests are fused). The numbers are coarse on purpose: they separate
"always worth it" (each produced element read once) from "recomputes a transcendental per
use" and from "re-executes the producer inside a contraction's reduction loop".
"""
from __future__ import annotations

from ..affine.ir import Const, Expr, Load, Op, Var, walk_exprs, widening

OP_WEIGHT = {
    "exp": 16, "expm1": 16, "log": 16, "log1p": 16, "log2": 16, "tanh": 16, "erf": 16, "sigmoid": 16,
    "sin": 16, "cos": 16, "tan": 16, "atan": 16, "asin": 16, "acos": 16, "sinh": 16, "cosh": 16,
    "asinh": 16, "acosh": 16, "atanh": 16, "pow": 24, "erfinv": 24, "lgamma": 32, "digamma": 32,
    "atan2": 24, "div": 4, "sqrt": 4, "rsqrt": 4, "reciprocal": 4, "remainder": 4, "floordiv": 4, "fmod": 4,
}

RECOMPUTE_BUDGET = 8
"""Weighted operations per produced element that may be recomputed to save writing it to
memory and reading it back (8 bytes of traffic for float32, about 8 adds of vector time)."""

MAX_REUSE = 4
"""A producer read more than this many times per element (by all consumers together) is
never recomputed: it would re-execute inside a consumer's reduction loop (e.g. a matmul)."""

LOCAL_BYTES = 64 * 1024
"""Largest intermediate that loop fusion may shrink to a per-iteration local array, and the
largest per-iteration working set of a buffer passed between fused nests (L2 friendly)."""


LARGE_BYTES = 16 * 1024 * 1024
"""A temporary this large is not kept alive longer by recomputation: a producer whose inputs
include such a buffer is not moved into a consumer that runs after other kernels writing such
buffers (a gradient summed over shared layers, add(add(g1, g2), g3)..., would otherwise keep
every g alive until the last add: 9 GB for ALBERT-xxlarge's backward graph)."""


def keeps_alive(big_inputs_last: list[int], producer: int, consumer: int, big_writers: list[int]) -> bool:
    """Whether moving a producer (kernel ``producer``) to ``consumer`` keeps one of its large
    inputs, whose last reads are at ``big_inputs_last``, alive across a kernel that writes a
    large temporary (positions ``big_writers``)."""
    return any(last < consumer and any(last < w < consumer for w in big_writers) for last in big_inputs_last)


def expr_cost(e: Expr) -> int:
    n = 0
    for x in walk_exprs(e):
        if isinstance(x, Load):
            n += 1
        elif isinstance(x, Op) and x.dtype != "int64":
            n += OP_WEIGHT.get(x.fn, 1)
        elif isinstance(x, (Const, Var)):
            pass
    return n


def narrowing(value: Expr) -> bool:
    """Whether ``value`` is a conversion to an 8-bit integer type (a quantized tensor)."""
    return isinstance(value, Op) and value.fn == "cast" and value.dtype in ("int8", "uint8")


def recomputed(value: Expr, reads_per_element: float, spent: float = 0.0) -> float:
    """Weighted operations per element a consumer recomputes when a producer of ``value``,
    which itself recomputes ``spent`` per element, moves into it."""
    return max(0.0, reads_per_element - 1.0) * expr_cost(value) + reads_per_element * spent


def inline_pays(value: Expr, reads_per_element: float, into_contraction: bool = False, spent: float = 0.0) -> bool:
    """Whether to recompute a producer's value at each use instead of storing it: always when
    each element is read about once; otherwise when the recomputation stays within budget and
    the consumer is not a contraction (its operands must stay plain loads to be packed or
    vectorized: a batch norm + ReLU6 recomputed in a stride-2 depthwise convolution slows
    MobileNetV2 down). A half-precision element read as float32 is always recomputed: the
    contraction reads it converted (``contraction_nest``), the conversion is a shift, and a
    float32 copy would double the operand's traffic. ``spent``: what the consumer would then
    recompute per element in all (``recomputed``, over the chain that moved into it so far):
    within the budget too. A value narrowed to 8 bits (quantized) and read more than once is
    stored: its readers (a max pool's windows) then read a quarter of the bytes."""
    if reads_per_element <= 1.0 + 1e-9 or widening(value):
        return True
    if reads_per_element > MAX_REUSE or into_contraction or narrowing(value):
        return False
    return max(spent, (reads_per_element - 1.0) * expr_cost(value)) <= RECOMPUTE_BUDGET


def loop_fusion_pays(outer_trips: int, band_trips: tuple[int, int], threads: int, footprint_bytes: int | None) -> bool:
    """Fuse two nests at a depth whose loops run ``outer_trips`` iterations when the data passed
    between them per iteration stays in cache and enough parallel iterations remain (no loss
    against what either nest had, or at least four per thread)."""
    if footprint_bytes is None or footprint_bytes > LOCAL_BYTES:
        return False
    return outer_trips >= min(4 * threads, *band_trips)
