"""How the CPU backend builds a convolution's nest: depthwise convolutions on small maps plane
by plane (``affine.build``'s ``depthwise_planes``: a zero-halo copy of the plane, each tap one
contiguous vectorizable loop), every other one as the window nest the contraction passes tile."""
from __future__ import annotations

from ...graph.ir import Node
from ...graph.ops import conv_padding

PLANE_MAX_WIDTH = 32  # output rows narrower than this are too short to vectorize on their own
PLANE_BYTES = 64 * 1024  # the zero-halo copy of one input plane stays within the L1/L2 at this size


def depthwise_planes_fit(n: Node) -> bool:
    x, w = n.inputs
    _, _, H, W = x.shape
    K, Cg = w.shape[:2]
    Kg = K // n.attr("groups")
    (sh, sw) = n.attr("stride")
    ph, qh, pw, qw = conv_padding(dict(n.attrs))
    OW = n.shape[3]
    return (Cg == 1 and Kg == 1 and sh == sw and OW < PLANE_MAX_WIDTH and n.dtype == "float32"
            and (H + ph + qh) * (W + pw + qw) * 4 <= PLANE_BYTES)


def lower_conv2d(b, n: Node) -> None:
    if depthwise_planes_fit(n):
        b.depthwise_planes(n)
    else:
        b.conv2d(n)
