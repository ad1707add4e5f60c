"""bfloat16 contractions as products of element pairs (AVX512_BF16's ``vdpbf16ps``).

``vdpbf16ps acc, x, y`` adds to each float32 lane of ``acc`` the products of the two
bfloat16 halves of the same 32-bit lane of ``x`` and ``y``: a dot product of pairs of
consecutive reduction elements, at twice the rate of float32 FMAs, reading half the bytes.
A contraction nest whose operands are both bfloat16 becomes the same nest over pairs: its
innermost reduction loop runs half as many times, each operand element is a pair of
reduction elements seen as one 32-bit element (``affine.ir.PAIR``: loads indexed in pairs,
read as float32 bits by ``pair_bits``), and the register tiles multiply with ``dot2``. A
convolution pairs its input channels (moved innermost: its 3 x 3 window loops are odd and
its padding test reads them). Every
pack, copy and transpose of the tiled form then moves 32-bit elements as it moves floats
(bits only: no arithmetic touches a pair before ``dot2``). An operand contiguous along the
reduction (a linear layer's weight, row-major activations) is read as pairs in place; one
whose reduction runs along its rows (x @ W with W of K x N, an image's channels) is paired by
its pack, two rows' elements into one (``pair_of``).

The products of two bfloat16 values are exact in float32, so the pair product differs from
the float32 FMA chain only in the order of two roundings per pair; like eager's oneDNN
kernels on such machines, ``vdpbf16ps`` treats denormal inputs and results as zero.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from ..affine.ir import PAIR, Load, Op, Var, add, c, mul, trip_count, walk_exprs
from ..affine.linear import linear_form, to_expr
from .contraction_nest import Nest
from .fusion_util import subst_vars

if TYPE_CHECKING:
    from ..backends.cpu.machine import CPUMachine


def in_groups(ld: Load, r: str, g: int = 2, group: str = PAIR) -> Load | None:
    """``ld`` (reduction index r = g r') as a load of groups of g elements (``group``: an
    ``affine.ir.GROUPS`` type), where it walks r contiguously and its other strides and offset
    are multiples of g (groups stay whole and aligned to groups)."""
    lf = linear_form(subst_vars(ld, {r: mul(Var(r), c(g))}).index)
    if lf is None or lf[0].get(r, 0) != g or lf[1] % g or any(k % g for k in lf[0].values()):
        return None
    return Load(ld.buf, to_expr({v: k // g for v, k in lf[0].items()}, lf[1] // g), group)


def _pair(ld: Load, r: str) -> tuple[Load, Op] | None:
    """(the load the nest's analyses see, the pair's value) of operand ``ld`` over pairs of r:
    in place where it walks r contiguously, else two elements one r-step apart."""
    p = in_groups(ld, r)
    if p is not None:
        return p, Op("pair_bits", (p,), "float32")
    lf = linear_form(ld.index)
    if lf is None or lf[0].get(r, 0) <= 0:
        return None
    even = subst_vars(ld, {r: mul(Var(r), c(2))})
    return even, Op("pair_of", (even, replace(even, index=add(even.index, c(lf[0][r])))), "float32")


def paired(n: Nest, machine: CPUMachine) -> Nest | None:
    """``n`` over pairs of one of its reduction loops (see the module docstring), moved
    innermost (the order of a reduction's terms is free), or None where the machine has no
    pair dot product or the nest does not fit: operands not both bfloat16, no reduction loop
    of even length that the condition (padding) does not read. The innermost loop is
    preferred, then the others from the inside out (a convolution's input channels, whose
    kernel window loops are odd: 3 x 3)."""
    if not machine.bf16_dot or n.pairs or not n.x.dtype == n.y.dtype == "bfloat16":
        return None
    return grouped(n, 2, _pair, "dot2")


def grouped(n: Nest, g: int, group: Callable[[Load, str], tuple[Load, Op] | None], dot: str) -> Nest | None:
    """``n`` over groups of ``g`` of its innermost reduction loop whose length g divides, that
    the condition does not read and along which ``group`` (an operand's load, the loop ->
    the load the analyses see and the group's value, or None) groups both operands; the
    others tried from the inside out; moved innermost. None where no loop fits."""
    cond_vars = {v.name for v in walk_exprs(n.cond) if isinstance(v, Var)} if n.cond is not None else set()
    for q in reversed(range(len(n.rloops))):
        rl = n.rloops[q]
        T = trip_count(rl)
        if not T or T % g or rl.var in cond_vars:
            continue
        gx, gy = group(n.x, rl.var), group(n.y, rl.var)
        if gx is None or gy is None:
            continue
        rloops = [*n.rloops[:q], *n.rloops[q + 1:], replace(rl, hi=c(T // g))]
        return replace(n, rloops=rloops, x=gx[0], y=gy[0], xval=gx[1], yval=gy[1], pairs=True, dot=dot)
    return None
