"""How the CPU backend builds a convolution's nest: depthwise convolutions on small maps plane
by plane (``depthwise_planes``: a zero-halo copy of the plane, each tap one contiguous
vectorizable loop), every other one as the window nest of ``affine.build`` that the
contraction passes tile."""
from __future__ import annotations

from ...affine.ir import Alloc, Const, For, Load, Op, Stmt, Store, Var, add, c, mul
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
    """``b``: the affine builder."""
    if depthwise_planes_fit(n):
        b.emit(n, depthwise_planes(b, n))
    else:
        b.conv2d(n)


def depthwise_planes(b, n: Node) -> list[Stmt]:
    """A depthwise convolution on small maps, one (image, channel) plane at a time: the plane is
    copied into a local zero-halo buffer (the padding tests disappear), and each tap
    accumulates over the whole plane as one contiguous loop, output rows laid at the padded row
    pitch (q = oh*Wp + ow reads s*q + kh*dh*Wp + kw*dw; the halo columns are computed and
    dropped). Rows of a small map are too short to vectorize on their own."""
    x, w = n.inputs
    N, C, H, W = x.shape
    _, _, R, S = w.shape
    _, _, OH, OW = n.shape
    (s, _), (dh, dw) = n.attr("stride"), n.attr("dilation")
    ph, qh, pw, qw = conv_padding(dict(n.attrs))
    Hp, Wp = H + ph + qh, W + pw + qw
    Q = (OH - 1) * Wp + OW
    dt = n.dtype
    i0, g = Var("i0"), Var("i1")
    q, ih, iw, kh, kw, oh, ow = (Var(v) for v in ("q", "ih", "iw", "kh", "kw", "oh", "ow"))
    xp, acc = "xplane", "accplane"
    zero = Const(0.0, dt)
    tap = Op("mul", (Load(xp, add(mul(q, c(s)), add(mul(kh, c(dh * Wp)), mul(kw, c(dw)))), dt),
                     b.read(w, [g, c(0), kh, kw])), dt)
    body: list[Stmt] = [
        Alloc(xp, dt, Hp * Wp), Alloc(acc, dt, Q),
        For("q", c(0), c(Hp * Wp), (Store(xp, q, zero),), parallel=True),
        For("ih", c(0), c(H), (For("iw", c(0), c(W), (
            Store(xp, add(mul(add(ih, c(ph)), c(Wp)), add(iw, c(pw))), b.read(x, [i0, g, ih, iw])),),
            parallel=True),), parallel=True),
        For("q", c(0), c(Q), (Store(acc, q, zero),), parallel=True),
        For("kh", c(0), c(R), (For("kw", c(0), c(S), (For("q", c(0), c(Q), (
            Store(acc, q, Op("add", (Load(acc, q, dt), tap), dt)),), parallel=True),)),)),
        For("oh", c(0), c(OH), (For("ow", c(0), c(OW), (
            b.store(n, [i0, g, oh, ow], Load(acc, add(mul(oh, c(Wp)), ow), dt)),), parallel=True),),
            parallel=True),
    ]
    return [For("i0", c(0), c(N), (For("i1", c(0), c(C), tuple(body), parallel=True),), parallel=True)]
