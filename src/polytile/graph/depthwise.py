"""Depthwise convolutions over an explicitly padded input (a CPU backend graph pass).

A depthwise convolution (one filter per channel) is not register-tiled: its nest runs over
output rows and strips of pixels with the filter's taps inside. With the zero padding implicit,
each tap's pixel loop has bounds that depend on the tap (the row's first and last pixels would
read the padding), so the C compiler vectorizes it with peeled iterations per tap; over a
padded copy of the input (one pass over it) every tap reads one constant range. Only for
output rows of at least ``MIN_WIDTH`` pixels and stride 1: on narrower rows (one strip of
pixels, whose peeled iterations cost little) and with stride 2 (the padded copy of a 112x112
input for a 56x56 output) the padded copy's pass costs more than it saves (measurements:
benchmarks/README.md and the commit that added this pass)."""
from __future__ import annotations

from .builder import GraphBuilder, rewrite_nodes
from .ir import Graph, Node
from .ops import conv_padding

MIN_WIDTH = 48  # output pixels per row: 56-pixel rows gain from the padded copy, 28-pixel ones lose


def _padded_depthwise(n: Node) -> bool:
    if n.op != "conv2d" or n.attr("groups") <= 1 or n.attr("groups") != n.inputs[0].shape[1]:
        return False
    return (any(conv_padding(dict(n.attrs))) and n.shape[3] >= MIN_WIDTH and tuple(n.attr("stride")) == (1, 1)
            and n.inputs[0].dtype.startswith("float"))


def pad_depthwise(g: Graph) -> Graph:
    """``g`` with each depthwise convolution's zero padding applied to its input by a ``pad``
    node, the convolution itself unpadded (the same values: the padding is zeros either way)."""
    if not any(_padded_depthwise(n) for n in g.nodes):
        return g

    def rule(b: GraphBuilder, n: Node) -> Node | None:
        if not _padded_depthwise(n):
            return None
        attrs = dict(n.attrs)
        ph, qh, pw, qw = conv_padding(attrs)
        x = b.node("pad", [n.inputs[0]], pads=((0, 0), (0, 0), (ph, qh), (pw, qw)), value=0.0)
        attrs = {**{k: v for k, v in attrs.items() if k != "padding_hi"}, "padding": (0, 0)}
        return b.node("conv2d", [x, *n.inputs[1:]], **attrs)

    return rewrite_nodes(g, rule)
