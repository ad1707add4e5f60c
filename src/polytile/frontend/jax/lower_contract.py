"""Lowering rules: ``dot_general`` and ``conv_general_dilated`` onto the graph's matmul and conv2d.

Operands are only permuted and regrouped (views), so the contraction stays the graph's
``matmul`` / ``conv2d`` node that the tiling passes recognize.
"""
from __future__ import annotations

import math

from ...dtypes import Unsupported
from ...graph.ir import Node
from .registry import lowers


def _unit_stride(b, x: Node, dims: list[int]) -> bool:
    """The last of ``dims`` is x's contiguous dimension (strides of x's base layout)."""
    return bool(dims) and b.strided(x)[2][dims[-1]] == 1


@lowers("dot_general")
def dot_general(ctx, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                out_sharding=None, **params):
    """out[batch..., lhs free..., rhs free...] as a matmul of [batch..., M, K] x [batch..., K, N]
    (batch and contracting dims in any order on either side).

    The operands are swapped (out^T = rhs^T lhs^T, transposed back as a view) when that gives the
    row-major form, K contiguous in the left operand and N in the right one, and the jaxpr's order
    does not: ``jnp.einsum`` may put ``v`` first in ``p @ v``, which hides attention's shape."""
    b = ctx.b
    (lc, rc), (lb, rb) = dimension_numbers
    lc, rc, lb, rb = (tuple(int(d) for d in t) for t in (lc, rc, lb, rb))
    dt = ctx.out_dtype
    lhs, rhs = b.cast(lhs, dt), b.cast(rhs, dt)
    lf = [d for d in range(len(lhs.shape)) if d not in lc and d not in lb]
    rf = [d for d in range(len(rhs.shape)) if d not in rc and d not in rb]
    batch = [lhs.shape[d] for d in lb]
    m_dims, n_dims = [lhs.shape[d] for d in lf], [rhs.shape[d] for d in rf]
    k = math.prod(lhs.shape[d] for d in lc)

    def score(a, ac, c, cf):
        return _unit_stride(b, a, list(ac)) + _unit_stride(b, c, list(cf))

    swap = score(rhs, rc, lhs, lf) > score(lhs, lc, rhs, rf)
    if swap:
        lhs, rhs, lc, rc, lb, rb, lf, rf, m_dims, n_dims = rhs, lhs, rc, lc, rb, lb, rf, lf, n_dims, m_dims
    a = b.reshape(b.permute(lhs, list(lb) + lf + list(lc)), batch + [math.prod(m_dims), k])
    c = b.reshape(b.permute(rhs, list(rb) + list(rc) + rf), batch + [k, math.prod(n_dims)])
    y = b.reshape(b.matmul(a, c), batch + m_dims + n_dims)
    if swap:  # y is [batch, rhs free, lhs free]
        nb, nm = len(batch), len(m_dims)
        y = b.permute(y, list(range(nb)) + list(range(nb + nm, len(y.shape))) + list(range(nb, nb + nm)))
    return y


def _inverse(perm) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


@lowers("conv_general_dilated")
def conv_general_dilated(ctx, lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                         feature_group_count, batch_group_count, precision=None, preferred_element_type=None,
                         **params):
    """Any layout (NHWC, NCHW, HWIO, OIHW ...) is viewed as NCHW x OIHW, convolved, and the result
    viewed back in the output layout. 1-d convolutions run as 2-d ones of height 1; asymmetric
    padding is conv2d's ``padding_hi``. Input dilation (transposed convolution) is not lowered."""
    b = ctx.b
    nsp = len(lhs.shape) - 2
    if nsp not in (1, 2):
        raise Unsupported(f"{nsp}-d convolution")
    if any(d != 1 for d in lhs_dilation):
        raise Unsupported("convolution with input (lhs) dilation")
    if batch_group_count != 1:
        raise Unsupported("convolution with batch_group_count != 1")
    if dimension_numbers is None:
        lhs_spec = rhs_spec = out_spec = tuple(range(nsp + 2))
    else:
        lhs_spec, rhs_spec, out_spec = dimension_numbers
    dt = ctx.out_dtype
    x = b.permute(b.cast(lhs, dt), list(lhs_spec))
    w = b.permute(b.cast(rhs, dt), list(rhs_spec))
    strides, dil, pads = list(window_strides), list(rhs_dilation), [tuple(int(v) for v in p) for p in padding]
    if nsp == 1:
        x, w = b.unsqueeze(x, 2), b.unsqueeze(w, 2)
        strides, dil, pads = [1] + strides, [1] + dil, [(0, 0)] + pads
    if any(lo < 0 or hi < 0 for lo, hi in pads):
        raise Unsupported("convolution with negative padding")
    lo, hi = tuple(p[0] for p in pads), tuple(p[1] for p in pads)
    extra = {"padding_hi": hi} if hi != lo else {}  # asymmetric ("SAME" with an even stride)
    y = b.node("conv2d", [x, w], stride=tuple(int(s) for s in strides), padding=lo,
               dilation=tuple(int(d) for d in dil), groups=int(feature_group_count), **extra)
    if nsp == 1:
        y = b.squeeze(y, [2])
    return b.permute(y, _inverse(out_spec))
