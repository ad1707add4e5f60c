"""ATen FX graph -> compiled segments + ATen fallbacks -> one Python callable.

Nodes are lowered in order into the current segment's graph builder. A node without a rule
(or whose rule raises ``Unsupported``) closes the segment and runs through ATen; lowering goes
on in a new segment after it. With no fallback the whole graph is one native call.
"""
from __future__ import annotations

import logging
import operator
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.fx as fx

from ... import counters as stats
from ...compiler import compile_graph_ir
from ...dtypes import Unsupported, from_torch
from ...dump import dumper_for, next_graph_name
from ...graph.builder import GraphBuilder, contiguous_strides
from ...graph.ir import Node
from ...options import Options
from ...graph.symbols import evaluate
from ...runtime.loader import InputMismatchError, LayoutMismatchError, TensorSpec
from .symbolic import HEAVY, assumed_equal, bind_placeholders, is_sym_value, op_name, shape_of, strides_of, to_size
from .registry import LOWERINGS, Ctx, ensure_loaded

log = logging.getLogger("polytile")


def _spec_of(t: torch.Tensor) -> TensorSpec:
    """Sizes and strides as ints, or ``Sym``s where they are symbolic (dynamic shapes)."""
    return TensorSpec(shape_of(t), strides_of(t), from_torch(t.dtype))


def _is_contiguous(spec: TensorSpec) -> bool:
    return all(s == c or n <= 1 for s, c, n in zip(spec.strides, contiguous_strides(spec.shape), spec.shape))


@dataclass
class Segment:
    b: GraphBuilder = field(default_factory=GraphBuilder)
    env: dict = field(default_factory=dict)  # fx node -> IR value (Node / tuple / python value)
    nodes: list = field(default_factory=list)  # fx nodes lowered here
    inputs: list = field(default_factory=list)  # (fx node or ("const", tensor)), in IR input order
    specs: list = field(default_factory=list)
    native: Any = None
    out_nodes: list = field(default_factory=list)  # fx nodes whose values leave the segment
    out_map: list = field(default_factory=list)  # per out node: int | tuple of (int | python value)
    device: str | None = None  # torch device type of its inputs: picks the backend
    parametric: bool = False  # its shapes hold symbolic sizes: compiled once for every size

    def external(self, fx_node, value, static: bool = False) -> Node:
        """IR input for a value produced outside this segment (``static``: a parameter or
        buffer, see ``TensorSpec.static``)."""
        if not isinstance(value, torch.Tensor):
            raise Unsupported(f"non-tensor input {fx_node} ({type(value).__name__})")
        if self.device not in (None, value.device.type):
            raise Unsupported(f"inputs on {self.device} and on {value.device.type}")
        self.device = value.device.type
        spec = replace(_spec_of(value), static=static)
        if any(s < 0 for s in spec.strides):
            raise Unsupported("negative strides")
        k = len(self.inputs)
        if _is_contiguous(spec):
            n = self.b.input(k, spec.shape, spec.dtype)
        else:  # the flat storage span it covers, then a strided view of it
            extent = 1 + sum((s - 1) * st for s, st in zip(spec.shape, spec.strides)) if all(spec.shape) else 0
            n = self.b.as_strided(self.b.input(k, (extent,), spec.dtype), spec.shape, spec.strides, 0)
        self.inputs.append(fx_node)
        self.specs.append(spec)
        self.env[fx_node] = n
        return n


def _example(node, gm, example_inputs, placeholders):
    if node.op == "placeholder":
        return example_inputs[placeholders.index(node)]
    if node.op == "get_attr":
        return getattr(gm, node.target)
    return node.meta.get("val")


def _half(node) -> bool:
    """An op with a bfloat16 or float16 result or input (``Options.half_types``)."""
    vals = [node.meta.get("val"), *(a.meta.get("val") for a in node.all_input_nodes)]
    return any(getattr(v, "dtype", None) in (torch.bfloat16, torch.float16) for v in vals)


def _fallback_reason(node) -> str:
    return str(node.target)


_warned: set = set()


def _warn_once(target, err) -> None:
    """One warning per op (and reason) per process; details at debug level after that."""
    msg = f"polytile: {target} runs in ATen ({err or 'no lowering rule'})"
    if (target, err) in _warned:
        log.debug(msg)
        return
    _warned.add((target, err))
    log.warning(msg)


def _warn_failed(name: str, n_ops: int, e: Exception) -> None:
    """One warning per cause (a missing compiler fails every graph the same way); the
    graphs after the first are logged at debug level."""
    cause = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    msg = f"polytile: compiling {name} failed, running its {n_ops} ops in ATen: {e}"
    if cause in _warned:
        log.debug(msg)
        return
    _warned.add(cause)
    log.warning(msg + " (further graphs failing this way are logged at debug level)")


def compile_aten_graph(gm: fx.GraphModule, example_inputs, options: Options, params: frozenset[int] = frozenset()):
    """Compile an ATen FX graph; returns ``f(*args) -> list`` of its outputs. ``params``: the
    positions of the inputs that are parameters or buffers (see ``TensorSpec.static``)."""
    if any(is_sym_value(x) for x in example_inputs):
        with assumed_equal(gm):
            return _compile(gm, example_inputs, options, params)
    return _compile(gm, example_inputs, options, params)


def _compile(gm: fx.GraphModule, example_inputs, options: Options, params: frozenset[int]):
    t_start = time.perf_counter()
    ensure_loaded()
    name = next_graph_name()
    dumper = dumper_for(options.dump_dir, name)
    if dumper:
        dumper.write("fx_graph.txt", gm.print_readable(print_output=False) if hasattr(gm, "print_readable") else str(gm.graph))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    steps: list = []  # Segment | fx.Node (run through ATen)
    cur = Segment()
    owner: dict = {}  # fx node -> Segment that computes it

    def value_in(seg: Segment, a):
        if isinstance(a, fx.Node):
            if a in seg.env:
                return seg.env[a]
            ex = _example(a, gm, example_inputs, placeholders)
            if type(ex) in (int, float, bool):  # a static scalar (shape arithmetic): a constant here
                return ex
            if isinstance(ex, torch.SymInt):  # a symbolic size: a parameter of the compiled code
                return to_size(ex)
            static = a.op == "get_attr" or (a.op == "placeholder" and placeholders.index(a) in params)
            return seg.external(a, ex, static)
        if isinstance(a, (list, tuple)):
            return type(a)(value_in(seg, x) for x in a)
        if isinstance(a, torch.dtype):
            return a
        if isinstance(a, torch.Tensor):
            raise Unsupported("tensor constant in arguments")
        return a

    pre: list = []  # static shape arithmetic (python scalars): evaluated first, never a fallback
    # symbolic sizes: size arithmetic is evaluated per call from the symbols the inputs bind;
    # ops on symbolic shapes go to parametric segments, the others to static ones as before
    symbolic = any(is_sym_value(x) for x in example_inputs)
    sym_nodes: dict = {}  # fx node -> its size (a Sym or int)

    def symbolic_op(node) -> bool:
        return is_sym_value(node.meta.get("val")) or any(
            is_sym_value(_example(a, gm, example_inputs, placeholders)) for a in node.all_input_nodes)

    # light static ops on parameters only (a weight's transpose or view) go where their users
    # go: into a parametric segment when those are symbolic, rather than a static segment whose
    # output (a copy of the weight) is made at every call
    with_users: set = set()
    if symbolic:
        param_nodes = {placeholders[k] for k in params if k < len(placeholders)}
        for node in reversed(gm.graph.nodes):
            if node.op == "call_function" and op_name(node) not in HEAVY and not symbolic_op(node) and all(
                    a.op == "get_attr" or a in param_nodes for a in node.all_input_nodes) and node.users and all(
                    u in with_users or (u.op == "call_function" and symbolic_op(u)) for u in node.users):
                with_users.add(node)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_function" and type(node.meta.get("val")) in (int, float, bool):
            pre.append(node)
            continue
        if node.op == "call_function" and node.target is operator.getitem and node.args[0] in cur.env:
            cur.env[node] = cur.env[node.args[0]][node.args[1]]
            cur.nodes.append(node)
            owner[node] = cur
            continue
        if symbolic:
            val = node.meta.get("val")
            if node.op == "call_function" and isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                sym_nodes[node] = to_size(val)  # (Unsupported for a SymFloat: the caller specializes)
                continue
            param = symbolic_op(node) or node in with_users
            if not param and cur.parametric and op_name(node) not in HEAVY:
                param = True  # light static ops (views, elementwise) stay with their symbolic neighbours
            if param != cur.parametric:
                if cur.nodes:
                    steps.append(cur)
                cur = Segment(parametric=param)
        rule = LOWERINGS.get(node.target) if node.op == "call_function" else None
        err = None
        if rule is not None and options.half_types == "aten" and _half(node):
            rule, err = None, "bfloat16/float16: ATen's half-precision kernels (option half_types)"
        if rule is not None:
            mark = len(cur.inputs)
            try:
                args = value_in(cur, node.args)
                kwargs = {k: value_in(cur, v) for k, v in node.kwargs.items()}
                val = rule(Ctx(cur.b, node), *args, **kwargs)
                cur.env[node] = val
                cur.nodes.append(node)
                owner[node] = cur
                continue
            except Unsupported as e:
                err = str(e)
            except Exception as e:  # a bug in a rule must not crash the user's program
                err = f"lowering rule failed: {type(e).__name__}: {e}"
            for added in cur.inputs[mark:]:  # undo the inputs this attempt created
                del cur.env[added]
            del cur.inputs[mark:], cur.specs[mark:]
            cur.b.inputs = cur.b.inputs[:mark]
        if node.op == "get_attr":
            owner[node] = None
            steps.append(node)
            continue
        if not options.fallback:
            raise Unsupported(f"polytile: no lowering for {node.target}" + (f" ({err})" if err else ""))
        if node.op == "call_function" and node.target is not operator.getitem:
            stats.fell_back(_fallback_reason(node))
            _warn_once(node.target, err)
        if cur.nodes:
            steps.append(cur)
            cur = Segment()
        steps.append(node)
        owner[node] = None
    if cur.nodes:
        steps.append(cur)

    stats.add_phase("ATen lowering", time.perf_counter() - t_start)
    # which values leave each segment
    for seg in [s for s in steps if isinstance(s, Segment)]:
        seg_set = set(seg.nodes)
        seg.out_nodes = [n for n in seg.nodes if any(u not in seg_set for u in n.users)]

    # compile each segment; a failure falls back to ATen for that segment
    final: list = []
    for k, st in enumerate(steps):
        if not isinstance(st, Segment):
            final.append(st)
            continue
        if not st.out_nodes:  # nothing it computes is used
            continue
        try:
            _finish_segment(st, options, f"{name}_s{k}" if len(steps) > 1 else name, dumper, placeholders)
            stats.bump("ops_compiled", sum(1 for n in st.nodes if n.target is not operator.getitem))
            final.append(st)
        except Exception as e:
            if not options.fallback:
                raise
            _warn_failed(name, len(st.nodes), e)
            stats.bump("graphs_failed")
            for n in st.nodes:
                if n.target is not operator.getitem:
                    stats.fell_back(_fallback_reason(n))
                final.append(n)
    # static scalars are constants of this compiled graph (its shapes are checked at each call)
    consts = {n: n.meta["val"] for n in pre}
    templates = None
    if symbolic:  # per placeholder: what binds the symbols at a call
        templates = [(shape_of(ex) if isinstance(ex, torch.Tensor) else to_size(ex) if isinstance(ex, torch.SymInt)
                      else None) for ex in example_inputs]
    return _make_runner(gm, final, placeholders, out_node, consts, templates, sym_nodes)


def _layout(val) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    if not isinstance(val, torch.Tensor):
        return None
    return shape_of(val), strides_of(val)


def dense_order(layout) -> tuple[int, ...] | None:
    """The permutation that lists a layout's dims (``(shape, strides)``, an FX node's example
    value's) from the outermost to the innermost in memory, when it is dense but not row-major
    (a transpose, a channels-last tensor); None when it is row-major or not dense (those leave
    the graph row-major)."""
    if layout is None or len(layout[0]) < 2:
        return None
    shape, strides = layout
    if _is_contiguous(TensorSpec(shape, strides, "f32")):
        return None
    perm = tuple(sorted(range(len(shape)), key=lambda d: (-strides[d], d)))
    inner = contiguous_strides([shape[d] for d in perm])
    if any(strides[d] != c and shape[d] > 1 for d, c in zip(perm, inner)):
        return None
    return perm


def broadcast_dims(layout) -> list[int]:
    """Dims of a layout with stride 0 and more than one element (an expanded tensor)."""
    return [] if layout is None else [d for d, (n, st) in enumerate(zip(*layout)) if st == 0 and n > 1]


def _finish_segment(seg: Segment, options: Options, name: str, dumper, placeholders) -> None:
    b = seg.b
    uniq: dict[int, int] = {}
    outputs: list[Node] = []

    def export(v, val):
        if isinstance(v, Node) and (v.op == "input" or (v.op == "view" and v.inputs[0].op == "input")):
            # a view of an input leaves as a view of the caller's tensor, as in eager (a saved
            # transposed weight is not copied once per layer that saves it)
            _, shape, strides, off = b.strided(v)
            if all(st >= 0 for st in strides):
                return ("alias", v.attr("index") if v.op == "input" else v.inputs[0].attr("index"),
                        tuple(shape), tuple(strides), off)
        layout = _layout(val) if isinstance(v, Node) else None
        if broadcast_dims(layout):
            # an expanded result (stride 0) leaves expanded, as in eager: one element written
            # along those dims, expanded on the way out
            zero = broadcast_dims(layout)
            small = v
            for d in zero:
                small = b.slice(small, d, 0, 1)
            shape, strides = layout
            inner = ([1 if d in zero else n for d, n in enumerate(shape)], strides)
            return ("expand", export_dense(small, inner), tuple(shape))
        if isinstance(v, Node):
            return export_dense(v, layout)
        if isinstance(v, (tuple, list)):
            vals = val if isinstance(val, (tuple, list)) and len(val) == len(v) else [None] * len(v)
            return ("tuple", tuple(export(x, xv) for x, xv in zip(v, vals)))
        return ("const", v)

    def export_dense(v, layout):
        # an output leaves with the strides of eager's result (AOTAutograd compiled the backward
        # graph, and dynamo the code after the graph, for those): it is written in the order of
        # its memory and handed out as a permuted view of that
        perm = dense_order(layout)
        if perm is not None:
            v = b.permute(v, perm)
        if v.op in ("view", "input", "full", "iota"):
            v = b.node("identity", (v,))
        if v.id not in uniq:
            uniq[v.id] = len(outputs)
            outputs.append(v)
        if perm is not None:
            return ("permute", uniq[v.id], tuple(sorted(range(len(perm)), key=perm.__getitem__)))
        return uniq[v.id]

    seg.out_map = [export(seg.env[n], n.meta.get("val")) for n in seg.out_nodes]
    graph = b.graph(outputs)
    labels = [f"input {placeholders.index(i)} ({i.name})" if i in placeholders else f"value {i.name}"
              for i in seg.inputs]
    seg.native = compile_graph_ir(graph, seg.specs, options, name, dumper, labels, device=seg.device or "cpu")


def _arg_count_error(n, args):
    from ...runtime.loader import InputMismatchError

    raise InputMismatchError(f"polytile: the compiled graph takes {n} inputs, got {len(args)}")


def _warn_eager(what: str, err: Exception) -> None:
    stats.bump("eager_runs")
    _warn_once(f"{what} (this call)", str(err))


def _make_runner(gm, steps, placeholders, out_node, consts, templates=None, sym_nodes=None):
    """``consts``: the graph's static scalars (sizes of its tensors), known at compile time.
    With symbolic sizes, ``templates`` (per placeholder: its shape or size in symbols, see
    ``symbolic.bind_placeholders``) bind the symbols at each call, and ``sym_nodes`` (size
    arithmetic nodes -> their size) are evaluated with them."""
    sym_nodes = sym_nodes or {}

    def load(env, a):  # an op's arguments as eager gives them: nodes replaced inside any structure
        return fx.node.map_arg(a, env.__getitem__)

    def unpack(outs, m, ins, specs, syms):
        """A segment's output from its native outputs (``outs``) and inputs (``ins``, compiled
        for ``specs``) by its out_map entry ``m`` (sizes in it bound by ``syms``)."""
        if isinstance(m, int):
            return outs[m]
        kind, *v = m
        if kind == "permute":
            return outs[v[0]].permute(v[1])
        if kind == "expand":
            return unpack(outs, v[0], ins, specs, syms).expand(evaluate(v[1], syms))
        if kind == "alias":
            k, shape, strides, offset = evaluate(v, syms)
            t = ins[k]
            spec_strides = evaluate(specs[k].strides, syms)
            if not all(s == e or n <= 1 for s, e, n in zip(t.stride(), spec_strides, t.shape)):
                t = torch.empty_strided(t.shape, spec_strides, dtype=t.dtype).copy_(t)  # read in another layout
            return t.as_strided(shape, strides, t.storage_offset() + offset)
        return tuple(unpack(outs, x, ins, specs, syms) for x in v[0]) if kind == "tuple" else v[0]

    def run_segment(seg, env, syms):
        ins = [env[i] for i in seg.inputs]
        try:
            # (a parametric segment whose ops all came out static compiled to a static graph)
            outs = seg.native(*ins, symbols=syms) if hasattr(seg.native, "bind") else seg.native(*ins)
        except (LayoutMismatchError, InputMismatchError) as e:
            # an input laid out as no compiled kernel reads it, or sizes the symbols cannot take
            if not (seg.parametric or isinstance(e, LayoutMismatchError)):
                raise
            _warn_eager(f"segment {seg.native.name}", e)
            for n in seg.nodes:
                env[n] = n.target(*load(env, n.args), **load(env, n.kwargs))
            return
        for n, m in zip(seg.out_nodes, seg.out_map):
            env[n] = unpack(outs, m, ins, seg.specs, syms)

    segs = [s for s in steps if isinstance(s, Segment)]
    nargs = len(placeholders)
    outs_spec = out_node.args[0]
    if templates is None and len(steps) == 1 and len(segs) == 1 and all(
            isinstance(i, fx.Node) and i.op == "placeholder" for i in segs[0].inputs) and all(
            isinstance(o, fx.Node) and o in segs[0].out_nodes for o in outs_spec):
        # the whole graph is one native call: index arithmetic only
        seg = segs[0]
        in_pos = [placeholders.index(i) for i in seg.inputs]
        out_maps = [seg.out_map[seg.out_nodes.index(o)] for o in outs_spec]
        native = seg.native
        direct_in = in_pos == list(range(nargs))
        direct = direct_in and out_maps == list(range(len(seg.out_nodes)))
        plain = all(isinstance(m, int) for m in out_maps)

        def run_one(*args):
            if len(args) != nargs:
                _arg_count_error(nargs, args)
            try:
                outs = native(*args) if direct_in else native(*[args[k] for k in in_pos])
            except LayoutMismatchError as e:
                _warn_eager(f"graph {native.name}", e)
                return list(gm(*args))
            if direct:  # inputs and outputs in the graph's order: no reshuffling
                return outs
            if plain:
                return [outs[m] for m in out_maps]
            ins = args if direct_in else [args[k] for k in in_pos]
            return [unpack(outs, m, ins, seg.specs, None) for m in out_maps]

        def run_boxed(args):
            return run_one(*args)

        run_boxed._boxed_call = True  # AOTAutograd's list-of-arguments convention
        run_one.steps = steps
        run_one.boxed = run_boxed
        return run_one

    def run(*args):
        if len(args) != nargs:
            _arg_count_error(nargs, args)
        env = dict(zip(placeholders, args))
        env.update(consts)
        syms = None
        if templates is not None:
            try:
                syms = bind_placeholders(templates, args)
            except InputMismatchError as e:
                _warn_eager(f"graph {gm.__class__.__name__}", e)
                return list(gm(*args))
            for n, size in sym_nodes.items():
                env[n] = evaluate(size, syms)
        for st in steps:
            if isinstance(st, Segment):
                run_segment(st, env, syms)
            elif st.op == "get_attr":
                env[st] = getattr(gm, st.target)
            else:
                env[st] = st.target(*load(env, st.args), **load(env, st.kwargs))
        return list(load(env, out_node.args[0]))

    run.steps = steps
    return run
