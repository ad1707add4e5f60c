"""Quantized matmuls and convolutions as contractions of their integer values.

PyTorch 2 export quantization leaves a quantized linear layer as ``dequantize(xq) @
dequantize(wq).T``: each operand an int8/uint8 tensor q turned into ``(q - zero) * scale``
(``frontend.torch.lower_quant``), with zero and scale constant along the reduction (per tensor,
or per output channel for weights). Computed that way, every call writes float32 copies of the
weights and activations (four times their bytes) before the contraction reads them. The same
value, with a = xq, w = wq read as they are:

    sum_k (a - za)(w - zw) sa sw = sa sw (sum_k a w - zw sum_k a - za sum_k w + K za zw)

The contraction ``sum_k a w`` then reads the integer tensors in place, converting where it reads
them (``transform.contraction_nest``: widening reads), or as groups of four bytes multiplied by
the machine's int8 dot products; the row and column sums are reductions of 1/N of its work
(the weight's are computed once per weight change with ``cache_weights``), and the rest is an
elementwise epilogue fused into it. The integer products are exact in float32 and their sums
too up to 2^24; past that the float32 sum rounds as the reference's float32 sum of the
dequantized products does.

A convolution's zero padding pads the dequantized input, i.e. a pads with za: the rewrite pads
the integer input with za explicitly (a uint8 copy) and convolves without padding; channels
added to reach a multiple of 4 (``integer_contractions``) are za in the input and 0 in the
weight, so that every term of the sum stays what it was. Grouped
convolutions (the ``sum_k a`` term is per group) keep their float32 form. A max pool of such
values pools the integers (``_max_pool``)."""
from __future__ import annotations

from dataclasses import dataclass

from .builder import GraphBuilder, contiguous_strides, rewrite_nodes
from .ir import Graph, Node
from .ops import conv_padding
from .symbols import is_symbolic

INT8 = ("int8", "uint8")


@dataclass(frozen=True)
class Dequantized:
    q: Node  # the integer values
    zero: Node  # zero point and scale, broadcast against q's shape
    scale: Node


def dequantized(x: Node) -> Dequantized | None:
    """``x`` as ``(q - zero) * scale`` with q int8/uint8, in the two forms ``lower_quant``
    builds: ``(float(q) - zero) * scale`` (per tensor) and ``float(int64(q) - zero) * scale``
    (per channel)."""
    if x.op != "mul" or x.dtype != "float32":
        return None
    e, scale = x.inputs
    if e.op == "sub" and e.inputs[0].op == "cast" and e.dtype == "float32":
        q, zero = e.inputs[0].inputs[0], e.inputs[1]
    elif e.op == "cast" and e.dtype == "float32" and e.inputs[0].op == "sub" and e.inputs[0].inputs[0].op == "cast" \
            and e.inputs[0].dtype == "int64":
        q, zero = e.inputs[0].inputs[0].inputs[0], e.inputs[0].inputs[1]
    else:
        return None
    if q.dtype not in INT8 or tuple(q.shape) != tuple(x.shape) or scale.dtype != "float32":
        return None
    return Dequantized(q, zero, scale)


def _axes(shape, strides, offset, base_shape) -> tuple[list[int | None], list[int]] | None:
    """For a view (shape, strides, offset) of a contiguous tensor of ``base_shape``: the base
    axis each view axis walks (None: broadcast or of size 1) and the base coordinates of the
    view's first element; None unless each view axis walks one base axis (permutes, slices,
    broadcasts, unsqueezes)."""
    cs = contiguous_strides(base_shape)
    start = [(offset // s) % n if n else 0 for s, n in zip(cs, base_shape)]
    axes: list[int | None] = []
    for n, st in zip(shape, strides):
        if n == 1 or st == 0:
            axes.append(None)
            continue
        js = [j for j, (s, m) in enumerate(zip(cs, base_shape))
              if s == st and start[j] + n <= m and j not in axes]  # (within that axis: not a flattening)
        if not js:
            return None
        axes.append(js[0])
    return axes, start


def _seen_as(b: GraphBuilder, t: Node, base: Node, view: Node) -> Node | None:
    """``t`` (broadcastable to ``base``'s shape) indexed as ``view`` (a view of ``base``, or
    ``base`` itself) indexes ``base``."""
    _, shape, strides, offset = b.strided(view)
    tb, _, tst, toff = b.strided(b.expand(t, base.shape))
    if tb.op == "full":
        return b.full(tb.attr("value"), tb.dtype, shape)
    if not any(tst):  # (one value broadcast: any view of base sees it everywhere)
        return b._make_view(tb, shape, [0] * len(shape), toff)
    m = _axes(shape, strides, offset, base.shape)
    if m is None:
        return None
    axes, start = m
    st = [0 if j is None else tst[j] for j in axes]
    return b._make_view(tb, shape, st, toff + sum(s * o for s, o in zip(tst, start)))


def _operand(b: GraphBuilder, x: Node, fixed: tuple[int, ...]):
    """(integer values, zero, scale) of a contraction operand ``x`` that is a view of a
    dequantized tensor whose zero and scale do not vary along the axes ``fixed`` (its
    reduction axes): the integer values as x views them (int8/uint8), zero and scale indexed
    as x, of x's shape."""
    base, shape, strides, offset = b.strided(x)
    d = dequantized(base)
    if d is None:
        return None
    zero, scale = _seen_as(b, d.zero, base, x), _seen_as(b, d.scale, base, x)
    if zero is None or scale is None:
        return None
    for t in (zero, scale):
        if t.op == "full":  # (one value)
            continue
        st = b.strided(t)[2]
        if any(st[a] != 0 and t.shape[a] != 1 for a in fixed):
            return None
    return b._make_view(d.q, shape, strides, offset), zero, scale


def _wide(b: GraphBuilder, q: Node) -> Node:
    """The integer values ``q`` (a view or not) as float32, one conversion per use: each
    consumer converts where it reads them, the integers alone are stored."""
    base, shape, strides, offset = b.strided(q)
    return b._make_view(b.node("cast", (base,), dtype="float32"), shape, strides, offset)


def _first(b: GraphBuilder, t: Node, axes: tuple[int, ...]) -> Node:
    """``t`` at index 0 of ``axes`` (kept, of size 1), as float32."""
    for a in axes:
        t = b.slice(t, a, 0, 1)
    return b.cast(t, "float32")


def _zero(t: Node) -> bool:
    return t.op == "full" and t.attr("value") == 0


def _combine(b: GraphBuilder, product, za: Node, zb: Node, ra: Node, cb: Node, k: int, scale: Node) -> Node:
    """scale * (product() - zb ra - za cb + k za zb), the terms of a zero point that is the
    constant 0 left out. The terms are built before the contraction (``product()``), so that
    the program computes them first and its epilogue can fuse into the contraction."""
    terms = []
    if not _zero(zb):
        terms.append(("sub", b.ew("mul", zb, ra)))
    if not _zero(za):
        terms.append(("sub", b.ew("mul", za, cb)))
        if not _zero(zb):
            terms.append(("add", b.ew("mul", b.ew("mul", za, zb), float(k))))
    t = product()
    for op, term in terms:
        t = b.ew(op, t, term)
    return b.ew("mul", t, scale)


def _matmul(b: GraphBuilder, n: Node, multiple: int) -> Node | None:
    x, y = n.inputs
    if len(x.shape) < 2 or len(y.shape) < 2:
        return None
    ox = _operand(b, x, (len(x.shape) - 1,))
    oy = _operand(b, y, (len(y.shape) - 2,))
    if ox is None or oy is None:
        return None
    (qa, za, sa), (qb, zb, sb) = ox, oy
    za, sa = _first(b, za, (-1,)), _first(b, sa, (-1,))
    zb, sb = _first(b, zb, (-2,)), _first(b, sb, (-2,))
    ra = b.reduce("reduce_sum", _wide(b, qa), [-1], keepdim=True) if not _zero(zb) else zb
    cb = b.reduce("reduce_sum", _wide(b, qb), [-2], keepdim=True) if not _zero(za) else za
    scale = b.ew("mul", sa, sb)
    return _combine(b, lambda: b.matmul(_wide(b, qa), _wide(b, qb)), za, zb, ra, cb, x.shape[-1], scale)


def _conv2d(b: GraphBuilder, n: Node, multiple: int) -> Node | None:
    x, w = n.inputs
    attrs = dict(n.attrs)
    if attrs["groups"] != 1:
        return None
    ox = _operand(b, x, (0, 1, 2, 3))  # (per tensor: the padding value must be one number)
    ow = _operand(b, w, (1, 2, 3))
    if ox is None or ow is None or ox[1].op != "full":
        return None
    (qa, za, sa), (qw, zw, sw) = ox, ow
    ph, qh, pw, qw_ = conv_padding(attrs)
    cp = -w.shape[1] % multiple  # channels added (zero weights: each term of the sum below stays)
    if ph or qh or pw or qw_ or cp:
        # (the integer input padded with its zero point: the dequantized input's zero)
        qa = b.node("pad", [qa], pads=((0, 0), (0, cp), (ph, qh), (pw, qw_)), value=int(za.attr("value")))
        attrs = {**{k: v for k, v in attrs.items() if k != "padding_hi"}, "padding": (0, 0)}
    if cp:
        qw = b.node("pad", [qw], pads=((0, 0), (0, cp), (0, 0), (0, 0)), value=0)
    za, sa = _first(b, za, (0, 1, 2, 3)), _first(b, sa, (0, 1, 2, 3))
    zw = b.reshape(_first(b, zw, (1, 2, 3)), [1, w.shape[0], 1, 1])
    sw = b.reshape(_first(b, sw, (1, 2, 3)), [1, w.shape[0], 1, 1])
    C, kh, kw = qw.shape[1:]
    # sum of a over each output's window: a's channels summed, then the window of that sum
    # (one pass over a, then kh kw adds per pixel: 1/C of a convolution with an all-ones filter)
    ra = b.node("conv2d", [b.reduce("reduce_sum", _wide(b, qa), [1], keepdim=True), b.full(1.0, "float32", (1, 1, kh, kw))],
                **attrs) if not _zero(zw) else zw
    cb = b.reshape(b.reduce("reduce_sum", _wide(b, qw), [1, 2, 3]), [1, w.shape[0], 1, 1]) if not _zero(za) else za
    scale = b.ew("mul", sa, sw)
    return _combine(b, lambda: b.node("conv2d", [_wide(b, qa), _wide(b, qw)], **attrs), za, zw, ra, cb, C * kh * kw,
                    scale)


def _max_pool(b: GraphBuilder, n: Node, multiple: int) -> Node | None:
    """A max pool of values dequantized per tensor with a positive scale: the dequantization is
    increasing, so the pool takes the maximum of the integers and dequantizes that (no
    arithmetic per window element)."""
    if n.attr("mode") != "max":
        return None
    o = _operand(b, n.inputs[0], ())
    if o is None or o[1].op != "full" or o[2].op != "full" or not o[2].attr("value") > 0:
        return None
    q, zero, scale = o
    pooled = b.node("pool2d", [_wide(b, q)], **dict(n.attrs))
    return b.ew("mul", b.ew("sub", pooled, float(zero.attr("value"))), float(scale.attr("value")))


RULES = {"matmul": _matmul, "conv2d": _conv2d, "pool2d": _max_pool}


def integer_contractions(g: Graph, multiple: int = 1) -> Graph:
    """``g`` with its matmuls and convolutions of two dequantized int8/uint8 operands computed
    on the integer values (see the module docstring); ``g`` itself where there are none.
    ``multiple``: a convolution's input channels are padded to a multiple of it (4 where the
    target multiplies groups of four bytes: a network's 3-channel first convolution)."""
    if not any(n.op in RULES and all(dequantized(GraphBuilder.strided(i)[0]) for i in n.inputs) for n in g.nodes):
        return g
    if is_symbolic([n.shape for n in g.nodes]):
        return g
    return rewrite_nodes(g, lambda b, n: RULES[n.op](b, n, multiple) if n.op in RULES else None)
