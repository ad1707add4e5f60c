"""int8 contractions as dot products of four-element groups (AVX512-VNNI's ``vpdpbusd``).

``vpdpbusd acc, u, s`` adds to each int32 lane of ``acc`` the four products of the unsigned
bytes of the same 32-bit lane of u and the signed bytes of s: exact integer products and sums,
four times the multiply-adds of a float32 FMA per instruction, reading a quarter of the bytes.
A quantized matmul computed on its integer values (``graph.quantized``: uint8 activations,
int8 weights, read as float32 by the plain nest) becomes the same nest over groups of four
reduction elements, as ``bf16_pairs`` makes bfloat16 nests run over pairs: each operand
element is four bytes seen as one 32-bit element (``affine.ir.QUAD_U8``/``QUAD_I8``, read in
place where an operand walks the reduction contiguously, else packed from four elements:
``quad_of``), packs move them as floats (bits only), and the register tiles multiply with ``dot4us`` (the row operand unsigned) or
``dot4su``. The accumulators then hold int32 lanes (in float registers: bits only) until the
reduction ends, where ``i32_float`` converts them for the epilogue (``tile_nests.row_tiles``).

The sums are exact while they fit in int32: 255 * 128 * 4 per group, so at most
``MAX_GROUPS`` groups; a longer reduction keeps the float32 form. Without the instruction (the
compiler does not target it) an exact emulation gives the same results, slowly: the machine
description says whether to use groups (``CPUMachine.int8_dot``)."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..affine.ir import QUAD_I8, QUAD_U8, Load, Op, Var, add, c, mul, trip_count
from ..affine.linear import linear_form
from .bf16_pairs import grouped, in_groups
from .contraction_nest import Nest
from .fusion_util import subst_vars

if TYPE_CHECKING:
    from ..backends.cpu.machine import CPUMachine

MAX_GROUPS = (2**31 - 1) // (255 * 128 * 4)  # groups of four whose int32 sum cannot overflow
QUAD = {"uint8": QUAD_U8, "int8": QUAD_I8}


def _quad(ld: Load, r: str) -> tuple[Load, Op] | None:
    """(the load the nest's analyses see, the quad's value) of operand ``ld`` over groups of
    four of r: in place where it walks r contiguously, else four elements one r-step apart
    (an image's channels: packed by the panels, ``quad_of``)."""
    g = in_groups(ld, r, 4, QUAD[ld.dtype])
    if g is not None:
        return g, Op("pair_bits", (g,), "float32")
    lf = linear_form(ld.index)
    if lf is None or lf[0].get(r, 0) <= 0:
        return None
    first = subst_vars(ld, {r: mul(Var(r), c(4))})
    return first, Op("quad_of", tuple(replace(first, index=add(first.index, c(k * lf[0][r]))) for k in range(4)),
                     "float32")


def quads(n: Nest, machine: CPUMachine) -> Nest | None:
    """``n`` over groups of four of one of its reduction loops (of a length divisible by 4, not
    read by the condition), moved innermost, where the machine has the int8 dot product and one
    operand is uint8, the other int8; None otherwise. The innermost loop is preferred, then
    the others from the inside out (a convolution's input channels)."""
    if not machine.int8_dot or n.pairs or {n.x.dtype, n.y.dtype} != {"uint8", "int8"}:
        return None
    K = 1
    for f in n.rloops:
        K *= trip_count(f) or 0
    if not 0 < K <= 4 * MAX_GROUPS:
        return None
    return grouped(n, 4, _quad, "dot4us" if n.x.dtype == "uint8" else "dot4su")
