"""int8 contractions as dot products of four-element groups (AVX512-VNNI's ``vpdpbusd``).

``vpdpbusd acc, u, s`` adds to each int32 lane of ``acc`` the four products of the unsigned
bytes of the same 32-bit lane of u and the signed bytes of s: exact integer products and sums,
four times the multiply-adds of a float32 FMA per instruction, reading a quarter of the bytes.
A quantized matmul computed on its integer values (``graph.quantized``: uint8 activations,
int8 weights, read as float32 by the plain nest) becomes the same nest over groups of four
reduction elements, as ``bf16_pairs`` makes bfloat16 nests run over pairs: each operand
element is four bytes seen as one 32-bit element (``affine.ir.QUAD_U8``/``QUAD_I8``, read in
place: both operands must walk the reduction contiguously), packs move them as floats (bits
only), and the register tiles multiply with ``dot4us`` (the row operand unsigned) or
``dot4su``. The accumulators then hold int32 lanes (in float registers: bits only) until the
reduction ends, where ``i32_float`` converts them for the epilogue (``tile_nests.row_tiles``).

The sums are exact while they fit in int32: 255 * 128 * 4 per group, so at most
``MAX_GROUPS`` groups; a longer reduction keeps the float32 form. Without the instruction (the
compiler does not target it) an exact emulation gives the same results, slowly: the machine
description says whether to use groups (``CPUMachine.int8_dot``)."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..affine.ir import QUAD_I8, QUAD_U8, Op, Var, c, trip_count, walk_exprs
from .bf16_pairs import in_groups
from .contraction_nest import Nest

if TYPE_CHECKING:
    from ..backends.cpu.machine import CPUMachine

MAX_GROUPS = (2**31 - 1) // (255 * 128 * 4)  # groups of four whose int32 sum cannot overflow
QUAD = {"uint8": QUAD_U8, "int8": QUAD_I8}


def quads(n: Nest, machine: CPUMachine) -> Nest | None:
    """``n`` over groups of four of one of its reduction loops, moved innermost, where the
    machine has the int8 dot product, one operand is uint8 and the other int8, and both walk
    that loop contiguously (a linear layer, x @ w.T); None otherwise."""
    if not machine.int8_dot or n.pairs or {n.x.dtype, n.y.dtype} != {"uint8", "int8"}:
        return None
    cond_vars = {v.name for v in walk_exprs(n.cond) if isinstance(v, Var)} if n.cond is not None else set()
    K = 1
    for f in n.rloops:
        K *= trip_count(f) or 0
    if not 0 < K <= 4 * MAX_GROUPS:
        return None
    for q in reversed(range(len(n.rloops))):
        rl = n.rloops[q]
        T = trip_count(rl)
        if not T or T % 4 or rl.var in cond_vars:
            continue
        gx, gy = in_groups(n.x, rl.var, 4, QUAD[n.x.dtype]), in_groups(n.y, rl.var, 4, QUAD[n.y.dtype])
        if gx is None or gy is None:
            continue
        rloops = [*n.rloops[:q], *n.rloops[q + 1:], replace(rl, hi=c(T // 4))]
        return replace(n, rloops=rloops, x=gx, y=gy, xval=Op("pair_bits", (gx,), "float32"),
                       yval=Op("pair_bits", (gy,), "float32"), pairs=True,
                       dot="dot4us" if n.x.dtype == "uint8" else "dot4su")
    return None
