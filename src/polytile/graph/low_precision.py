"""bfloat16 and float16 as storage types: every op computes in float32 and rounds its result
where eager PyTorch rounds it.

Eager runs an op on half-precision tensors by computing in float32 ("opmath") and rounding
the result to the half type; composite ops that keep float32 inside (layer norm, softmax)
reach the graph already decomposed with their own casts. ``widen`` makes that explicit: an op
with half-precision inputs or result reads each half input through a cast to float32, runs in
float32, and its result is cast back to its half type. Views, inputs and casts stay as they
are; a half constant (a scalar operand) enters float32 arithmetic unrounded, as eager's
opmath applies a Python scalar. Those roundings are marked (``opmath``): after fusion, a
value rounded and read on as float32 inside one kernel keeps its float32 value instead, as
Inductor's kernels do (more accurate than eager's rounding at every op; eager's roundings
exactly with ``Options.emulate_precision_casts``, see ``transform.half_rounding``); a value
stored to memory is rounded where eager rounds it. Matmuls and
convolutions accumulate in float32 and round once, as eager's half-precision kernels do: they
read their half-precision operands in place (the casts fuse into them, see
``transform.contraction_nest``), and bfloat16 ones as pairs of elements where the machine has a
pair dot product (``transform.bf16_pairs``)."""
from __future__ import annotations

from ..dtypes import LOW
from .builder import GraphBuilder, rewrite_nodes
from .ir import Graph, Node, topo_nodes

KEEP = ("input", "view", "cast")  # ops whose half-precision values need no float32 computation


def widen(g: Graph) -> Graph:
    """``g`` with its half-precision arithmetic in float32 (see the module docstring); ``g``
    itself when it has no half-precision value."""
    if not any(n.dtype in LOW for n in g.nodes):
        return g
    b = GraphBuilder()
    new: dict[int, Node] = {}  # old node id -> its replacement (same dtype as the old node)

    def wide(x: Node) -> Node:
        y = new[x.id]
        if y.dtype not in LOW:
            return y
        if y.op == "full":  # a scalar operand: eager applies it in float32, unrounded
            return b.node("full", (), **{**dict(y.attrs), "dtype": "float32"})
        return b.node("cast", (y,), dtype="float32")

    for n in g.nodes:
        ins = [new[i.id] for i in n.inputs]
        attrs = dict(n.attrs)
        if n.op == "input":
            new[n.id] = n
        elif n.op in KEEP or not (n.dtype in LOW or any(i.dtype in LOW for i in ins)):
            same = all(x is y for x, y in zip(ins, n.inputs))
            new[n.id] = n if same else b.node(n.op, ins, **attrs)
        elif n.op == "full" and n.dtype in LOW:
            new[n.id] = n  # (stored as a half value where it is materialized: rounded by the renderer)
        elif n.op == "iota" and n.dtype in LOW:
            new[n.id] = b.node("cast", (b.node(n.op, (), **{**attrs, "dtype": "float32"}),), dtype=n.dtype)
        else:
            out = b.node(n.op, [wide(i) if new[i.id].dtype in LOW else new[i.id] for i in n.inputs], **attrs)
            # (``opmath``: this rounding may be left out where the value stays inside a fused
            # kernel, see transform.half_rounding)
            new[n.id] = b.node("cast", (out,), dtype=n.dtype, opmath=True) if n.dtype in LOW else out
    outputs = tuple(new[o.id] for o in g.outputs)
    return Graph(g.inputs, outputs, topo_nodes(outputs, g.inputs))


CONTRACTIONS = ("matmul", "conv2d")
HALF_OF = {"bf16": "bfloat16", "fp16": "float16"}


def round_contraction_operands(g: Graph, precision: str) -> Graph:
    """``g`` with the float32 operands of its matmuls and convolutions rounded to the half type
    ``precision`` names ("bf16" or "fp16"; ``Options.mm_conv_precision``): they accumulate in
    float32 as before, but read half-precision values (bfloat16 pairs at twice the float32
    rate where the machine has them). Relative error of each product term about 2^-8 for
    bf16, 2^-11 for fp16 (rounding of both operands), against 2^-24 in float32."""
    half = HALF_OF[precision]
    if not any(n.op in CONTRACTIONS and any(i.dtype == "float32" for i in n.inputs) for n in g.nodes):
        return g

    def rule(b: GraphBuilder, n: Node) -> Node | None:
        if n.op not in CONTRACTIONS or not any(x.dtype == "float32" for x in n.inputs):
            return None
        ins = [b.node("cast", (b.node("cast", (x,), dtype=half),), dtype="float32") if x.dtype == "float32" else x
               for x in n.inputs]
        return b.node(n.op, ins, **dict(n.attrs))

    return rewrite_nodes(g, rule)


def _half_read(x: Node) -> Node | None:
    """The bfloat16 tensor ``x`` reads as float32 (``cast(bf16 -> float32)``), if it is one."""
    return x.inputs[0] if x.op == "cast" and x.dtype == "float32" and x.inputs[0].dtype == "bfloat16" else None


def pad_pair_channels(g: Graph) -> Graph:
    """``g`` with the convolutions of bfloat16 operands over an odd number of input channels
    (an image's 3) given one more, zero in both operands: their products then run as pairs
    of channels (``transform.bf16_pairs``), whose reduction must be even; the added products
    are 0."""
    def odd(n: Node) -> bool:
        return (n.op == "conv2d" and n.attr("groups") == 1 and n.inputs[1].shape[1] % 2 == 1
                and all(_half_read(i) is not None for i in n.inputs))

    if not any(odd(n) for n in g.nodes):
        return g

    def rule(b: GraphBuilder, n: Node) -> Node | None:
        if not odd(n):
            return None
        x, w = (_half_read(i) for i in n.inputs)
        x = b.node("pad", [x], pads=((0, 0), (0, 1), (0, 0), (0, 0)), value=0.0)
        w = b.node("pad", [w], pads=((0, 0), (0, 1), (0, 0), (0, 0)), value=0.0)
        return b.node("conv2d", [b.cast(x, "float32"), b.cast(w, "float32")], **dict(n.attrs))

    return rewrite_nodes(g, rule)
