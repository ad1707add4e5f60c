"""bfloat16 contractions as products of element pairs (AVX512_BF16's ``vdpbf16ps``).

``vdpbf16ps acc, x, y`` adds to each float32 lane of ``acc`` the products of the two
bfloat16 halves of the same 32-bit lane of ``x`` and ``y``: a dot product of pairs of
consecutive reduction elements, at twice the rate of float32 FMAs, reading half the bytes.
A contraction nest whose operands are both bfloat16 becomes the same nest over pairs: its
innermost reduction loop runs half as many times, each operand element is a pair of
reduction elements seen as one 32-bit element (``affine.ir.PAIR``: loads indexed in pairs,
read as float32 bits by ``pair_bits``), and the register tiles multiply with ``dot2``. Every
pack, copy and transpose of the tiled form then moves 32-bit elements as it moves floats
(bits only: no arithmetic touches a pair before ``dot2``). An operand contiguous along the
reduction (a linear layer's weight, row-major activations) is read as pairs in place; one
whose reduction runs along its rows (x @ W with W of K x N) is paired by its pack, two rows'
elements into one (``pair_of``).

The products of two bfloat16 values are exact in float32, so the pair product differs from
the float32 FMA chain only in the order of two roundings per pair; like eager's oneDNN
kernels on such machines, ``vdpbf16ps`` treats denormal inputs and results as zero.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..affine.ir import PAIR, Load, Op, Var, add, c, mul, trip_count
from ..affine.linear import linear_form, to_expr
from .contraction_nest import Nest
from .fusion_util import subst_vars

if TYPE_CHECKING:
    from ..backends.cpu.machine import CPUMachine


def _in_pairs(ld: Load, r: str) -> Load | None:
    """``ld`` (reduction index r = 2 r') as a load of pairs, where it walks r contiguously and
    its other strides and offset are even (pairs stay whole and aligned to pairs)."""
    lf = linear_form(subst_vars(ld, {r: mul(Var(r), c(2))}).index)
    if lf is None or lf[0].get(r, 0) != 2 or lf[1] % 2 or any(k % 2 for k in lf[0].values()):
        return None
    return Load(ld.buf, to_expr({v: k // 2 for v, k in lf[0].items()}, lf[1] // 2), PAIR)


def paired(n: Nest, machine: CPUMachine) -> Nest | None:
    """``n`` over pairs of its innermost reduction (see the module docstring), or None where
    the machine has no pair dot product or the nest does not fit: operands not both
    bfloat16, a condition (padding) in the reduction, an odd reduction, a row operand that
    does not walk the reduction contiguously."""
    if not machine.bf16_dot or n.cond is not None or n.pairs or not n.x.dtype == n.y.dtype == "bfloat16":
        return None
    rl = n.rloops[-1]
    T = trip_count(rl)
    if not T or T % 2:
        return None
    x = _in_pairs(n.x, rl.var)
    if x is None:
        return None
    y = _in_pairs(n.y, rl.var)
    if y is not None:
        yval = Op("pair_bits", (y,), "float32")
    else:
        fy = linear_form(n.y.index)
        if fy is None or fy[0].get(rl.var, 0) <= 0:
            return None
        y = subst_vars(n.y, {rl.var: mul(Var(rl.var), c(2))})
        yval = Op("pair_of", (y, replace(y, index=add(y.index, c(fy[0][rl.var])))), "float32")
    return replace(n, rloops=[*n.rloops[:-1], replace(rl, hi=c(T // 2))], x=x, y=y,
                   xval=Op("pair_bits", (x,), "float32"), yval=yval, pairs=True)
