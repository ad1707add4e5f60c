"""Flat jaxpr -> compiled segments + JAX fallbacks -> one callable on flat lists of arrays.

Equations are lowered in order into the current segment's graph builder. An equation without a
rule (or whose rule raises ``Unsupported``, or returns something unlike the equation's result
types) closes the segment and runs through JAX; lowering goes on in a new segment after it.
Consecutive fallback equations run together under one ``jax.jit``. With no fallback the whole
function is one native call. Fallbacks are counted in ``polytile.stats()["ops_fallen_back"]``
as ``jax.<primitive>``, like the torch frontend's ATen fallbacks.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp

from ... import counters as stats
from ...compiler import compile_graph_ir
from ...dtypes import Unsupported
from ...dump import dumper_for, next_graph_name
from ...graph.builder import GraphBuilder, contiguous_strides
from ...graph.ir import Node
from ...options import Options
from ...runtime.loader import TensorSpec
from .convert import to_jax, to_torch
from .flatten import FlatEqn, FlatJaxpr, Lit, flatten
from .registry import LOWERINGS, Ctx, ensure_loaded, ir_dtype

log = logging.getLogger("polytile")


@dataclass
class Segment:
    """Equations lowered into one graph, compiled into one native call."""
    b: GraphBuilder = field(default_factory=GraphBuilder)
    env: dict = field(default_factory=dict)  # key -> Node
    eqns: list = field(default_factory=list)
    inputs: list = field(default_factory=list)  # keys, in IR input order
    specs: list = field(default_factory=list)
    native: Any = None
    out_keys: list = field(default_factory=list)  # keys whose values leave the segment
    out_map: list = field(default_factory=list)  # per out key: its index among the native outputs

    def external(self, key: int, aval) -> Node:
        """IR input for a value produced outside this segment (contiguous: jax arrays and native
        outputs always are)."""
        shape = tuple(int(s) for s in aval.shape)
        dtype = ir_dtype(aval.dtype)
        n = self.b.input(len(self.inputs), shape, dtype)
        self.inputs.append(key)
        self.specs.append(TensorSpec(shape, contiguous_strides(shape), dtype))
        self.env[key] = n
        return n


@dataclass
class JaxStep:
    """Consecutive equations that run through JAX (one ``jax.jit`` of their bind calls)."""
    eqns: list
    in_keys: list = field(default_factory=list)
    out_keys: list = field(default_factory=list)
    fn: Any = None


def _literal(b: GraphBuilder, lit: Lit) -> Node:
    shape = tuple(int(s) for s in getattr(lit.aval, "shape", ()))
    if shape:
        raise Unsupported("a non-scalar literal")
    return b.full(lit.val.item() if hasattr(lit.val, "item") else lit.val, ir_dtype(lit.aval.dtype), ())


def _value_in(seg: Segment, ref, flat: FlatJaxpr) -> Node:
    if isinstance(ref, Lit):
        return _literal(seg.b, ref)
    if ref in seg.env:
        return seg.env[ref]
    return seg.external(ref, flat.avals[ref])


def _check_result(eqn: FlatEqn, vals, flat: FlatJaxpr) -> None:
    if len(vals) != len(eqn.outs):
        raise Unsupported(f"rule returned {len(vals)} values for {len(eqn.outs)} results")
    for v, k in zip(vals, eqn.outs):
        aval = flat.avals[k]
        want = (tuple(int(s) for s in aval.shape), ir_dtype(aval.dtype))
        if not isinstance(v, Node) or (v.shape, v.dtype) != want:
            got = (v.shape, v.dtype) if isinstance(v, Node) else type(v).__name__
            raise Unsupported(f"rule result {got} differs from the primitive's {want}")


_warned: set = set()


def _warn_once(name: str, err: str | None) -> None:
    """One warning per primitive (and reason) per process; details at debug level after that."""
    msg = f"polytile: jax primitive {name} runs in JAX ({err or 'no lowering rule'})"
    if (name, err) in _warned:
        log.debug(msg)
        return
    _warned.add((name, err))
    log.warning(msg)


def _lower_eqn(cur: Segment, eqn: FlatEqn, flat: FlatJaxpr) -> str | None:
    """Lower ``eqn`` into ``cur``; None on success, else why it cannot be (the segment is left
    as it was)."""
    rule = LOWERINGS.get(eqn.name)
    if rule is None:
        return "no lowering rule"
    mark = len(cur.inputs)
    try:
        args = [_value_in(cur, r, flat) for r in eqn.ins]
        val = rule(Ctx(cur.b, eqn.name, [flat.avals[k] for k in eqn.outs]), *args, **eqn.params)
        vals = tuple(val) if isinstance(val, (tuple, list)) else (val,)
        _check_result(eqn, vals, flat)
    except Unsupported as e:
        err = str(e)
    except Exception as e:  # a bug in a rule must not crash the user's program
        err = f"lowering rule failed: {type(e).__name__}: {e}"
    else:
        for k, v in zip(eqn.outs, vals):
            cur.env[k] = v
        cur.eqns.append(eqn)
        return None
    for added in cur.inputs[mark:]:  # undo the inputs this attempt created
        del cur.env[added]
    del cur.inputs[mark:], cur.specs[mark:]
    cur.b.inputs = cur.b.inputs[:mark]
    return err


def compile_jaxpr(closed, options: Options, name: str | None = None):
    """Compile a ``ClosedJaxpr``; returns ``f(flat_args) -> list of jax arrays`` (its outputs)."""
    ensure_loaded()
    name = name or next_graph_name()
    dumper = dumper_for(options.dump_dir, name)
    if dumper:
        dumper.write("jaxpr.txt", str(closed))
    flat = flatten(closed)
    steps: list = []  # Segment | FlatEqn (through JAX)
    cur = Segment()
    for eqn in flat.eqns:
        err = _lower_eqn(cur, eqn, flat)
        if err is None:
            continue
        if not options.fallback:
            raise Unsupported(f"polytile: no lowering for jax primitive {eqn.name} ({err})")
        stats.fell_back(f"jax.{eqn.name}")
        _warn_once(eqn.name, err)
        if cur.eqns:
            steps.append(cur)
            cur = Segment()
        steps.append(eqn)
    if cur.eqns:
        steps.append(cur)

    final: list = []
    for k, st in enumerate(steps):
        if not isinstance(st, Segment):
            final.append(st)
            continue
        st.out_keys = _leaving(st.eqns, flat)
        if not st.out_keys:  # nothing it computes is used
            continue
        try:
            _finish_segment(st, options, f"{name}_s{k}" if len(steps) > 1 else name, dumper)
            stats.bump("ops_compiled", len(st.eqns))
            final.append(st)
        except Exception as e:
            if not options.fallback:
                raise
            log.warning("polytile: compiling %s failed, running its %d equations in JAX: %s", name, len(st.eqns), e)
            stats.bump("graphs_failed")
            for eq in st.eqns:
                stats.fell_back(f"jax.{eq.name}")
                final.append(eq)
    return _make_runner(_group_jax_steps(final, flat), flat)


def _leaving(eqns: list, flat: FlatJaxpr) -> list[int]:
    """Keys produced by ``eqns`` that an equation outside them uses, or that are outputs."""
    inside = set(map(id, eqns))
    used = {r for r in flat.out_refs if isinstance(r, int)}
    for e in flat.eqns:
        if id(e) not in inside:
            used.update(r for r in e.ins if isinstance(r, int))
    return [k for e in eqns for k in e.outs if k in used]


def _finish_segment(seg: Segment, options: Options, name: str, dumper) -> None:
    b = seg.b
    uniq: dict[int, int] = {}
    outputs: list[Node] = []
    for k in seg.out_keys:
        v = seg.env[k]
        if v.op in ("view", "input", "full", "iota"):
            v = b.node("identity", (v,))
        if v.id not in uniq:
            uniq[v.id] = len(outputs)
            outputs.append(v)
        seg.out_map.append(uniq[v.id])
    labels = [f"value {k}" for k in seg.inputs]
    seg.native = compile_graph_ir(b.graph(outputs), seg.specs, options, name, dumper, labels)


def _bind(eqn: FlatEqn, args: list) -> list:
    """Run one equation through JAX, as ``jax.core.eval_jaxpr`` does."""
    bp = eqn.prim.get_bind_params(eqn.params)
    subfuns, params = bp if isinstance(bp, tuple) else ((), bp)  # older jax: (subfuns, params)
    ctx = getattr(getattr(eqn.eqn, "ctx", None), "manager", None)
    if ctx is not None:
        with ctx:
            out = eqn.prim.bind(*subfuns, *args, **params)
    else:
        out = eqn.prim.bind(*subfuns, *args, **params)
    return list(out) if eqn.prim.multiple_results else [out]


def _group_jax_steps(steps: list, flat: FlatJaxpr) -> list:
    """Runs of consecutive fallback equations -> one ``JaxStep`` each, run under ``jax.jit``."""
    out: list = []
    for st in steps:
        if isinstance(st, FlatEqn):
            if out and isinstance(out[-1], JaxStep):
                out[-1].eqns.append(st)
            else:
                out.append(JaxStep([st]))
        else:
            out.append(st)
    for st in out:
        if isinstance(st, JaxStep):
            produced = {k for e in st.eqns for k in e.outs}
            ins: list[int] = []
            for e in st.eqns:
                ins += [r for r in e.ins if isinstance(r, int) and r not in produced and r not in ins]
            st.in_keys = ins
            st.out_keys = _leaving(st.eqns, flat)
            st.fn = jax.jit(_jax_group_fn(st))
    return out


def _jax_group_fn(st: JaxStep):
    def run(*args):
        env = dict(zip(st.in_keys, args))
        for e in st.eqns:
            vals = _bind(e, [r.val if isinstance(r, Lit) else env[r] for r in e.ins])
            env.update(zip(e.outs, vals))
        return [env[k] for k in st.out_keys]
    return run


def _const_out(lit: Lit):
    return jnp.asarray(lit.val, dtype=lit.aval.dtype)


def _make_runner(steps: list, flat: FlatJaxpr):
    nargs = len(flat.in_keys)
    torch_consts = {k: to_torch(jnp.asarray(v)) for k, v in flat.consts.items()}
    segs = [s for s in steps if isinstance(s, Segment)]
    arg_pos = {k: i for i, k in enumerate(flat.in_keys)}

    if len(steps) == 1 and segs and all(isinstance(r, int) and r in segs[0].out_keys for r in flat.out_refs):
        # the whole function is one native call
        seg = segs[0]
        native = seg.native
        srcs = [(arg_pos[k], None) if k in arg_pos else (None, torch_consts[k]) for k in seg.inputs]
        outs_at = [seg.out_map[seg.out_keys.index(r)] for r in flat.out_refs]

        def run_one(args):
            if len(args) != nargs:
                raise TypeError(f"polytile: the compiled function takes {nargs} arrays, got {len(args)}")
            outs = native(*[to_torch(args[i]) if c is None else c for i, c in srcs])
            return [to_jax(outs[m]) for m in outs_at]

        run_one.steps = steps
        return run_one

    def run(args):
        if len(args) != nargs:
            raise TypeError(f"polytile: the compiled function takes {nargs} arrays, got {len(args)}")
        env = dict(flat.consts)
        env.update(zip(flat.in_keys, args))
        for st in steps:
            if isinstance(st, Segment):
                outs = st.native(*[torch_consts[k] if k in torch_consts else to_torch(env[k]) for k in st.inputs])
                for k, m in zip(st.out_keys, st.out_map):
                    env[k] = outs[m]
            else:
                vals = st.fn(*[to_jax(env[k]) for k in st.in_keys])
                env.update(zip(st.out_keys, vals))
        return [_const_out(r) if isinstance(r, Lit) else to_jax(env[r]) for r in flat.out_refs]

    run.steps = steps
    return run
