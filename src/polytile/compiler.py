"""Graph IR -> compiled graph, through the backend of the target: graph passes, affine
construction, the shared passes, then the backend's passes and its emit (render, build, load)."""
from __future__ import annotations

import time
import warnings

from . import counters as stats
from .affine.build import build
from .affine.printer import format_program
from .backends import Backend, EmitRequest, select
from .dump import Dumper
from .graph.attention import fuse_attention
from .graph.builder import contiguous_strides
from .graph.ir import Graph, format_graph, verify_graph
from .graph.low_precision import widen
from .graph.symbols import is_symbolic
from .options import Options
from .runtime.loader import TensorSpec
from .transform.cache_static import mark_static_inputs
from .transform.pipeline import Pass, run_pipeline, shared_passes


def passes_for(options: Options, backend: Backend | None = None, machine=None, symbolic: bool = False) -> list[Pass]:
    """The whole pass list for ``backend`` (default: the one ``options.target`` or the CPU
    names): the shared prefix, then the backend's scheduling passes (those for programs with
    symbolic sizes when ``symbolic``)."""
    backend = backend or select(options.target, "cpu")
    machine = machine if machine is not None else backend.machine(options.machine)
    if symbolic:
        return shared_passes(options, symbolic=True) + backend.symbolic_passes(machine, options)
    return shared_passes(options) + backend.passes(machine, options)


def compile_graph_ir(graph: Graph, input_specs: list[TensorSpec], options: Options, name: str,
                     dumper: Dumper | None = None, input_labels: list[str] | None = None,
                     device: str = "cpu"):
    """``graph`` compiled by the backend for ``options.target`` (default: ``device``'s)."""
    backend = select(options.target, device)
    machine = backend.machine(options.machine)
    symbolic = is_symbolic([n.shape for n in graph.nodes])
    if symbolic:
        backend.symbolic_passes(machine, options)  # Unsupported before any work where there are none
    t0 = time.perf_counter()
    if options.verify:
        verify_graph(graph)
    if dumper:
        dumper.write("graph.txt", format_graph(graph))
    graph = widen(graph)  # half-precision arithmetic in float32, rounded where eager rounds
    for rewrite in backend.graph_passes(machine, options):
        graph = rewrite(graph)
    lowerings = backend.op_lowerings(machine, options)
    # the fused attention op exists only for targets that lower it
    if options.fusion and options.fuse_attention and "attention" in lowerings:
        try:
            graph = fuse_attention(graph)
        except Exception as e:  # the rewrite is an optimization: compile the graph without it
            warnings.warn(f"polytile: attention rewrite skipped for {name}: {type(e).__name__}: {e}")
        stats.bump("attention_fused", sum(1 for n in graph.nodes if n.op == "attention"))
        if options.verify:
            verify_graph(graph)
        if dumper:
            dumper.write("graph_fuse_attention.txt", format_graph(graph))
    t1 = time.perf_counter()
    stats.add_phase("graph passes", t1 - t0)
    prog = build(graph, lowerings)
    if options.cache_weights:
        prog = mark_static_inputs(prog, {k for k, s in enumerate(input_specs) if s.static})
    stats.add_phase("affine build", time.perf_counter() - t1)
    if dumper:
        dumper.write("affine_build.mlir", format_program(prog))
    prog = run_pipeline(prog, passes_for(options, backend, machine, symbolic), options,
                        (lambda p_name, p: dumper.write(f"affine_{p_name}.mlir", format_program(p)))
                        if dumper else None)
    outs = [TensorSpec(n.shape, contiguous_strides(n.shape), n.dtype) for n in graph.outputs]
    compiled = backend.emit(prog, EmitRequest(input_specs, outs, options, machine, name, input_labels, dumper))
    stats.bump("kernels_generated", len(prog.kernels))
    stats.bump("graphs_compiled")
    compiled.num_kernels = len(prog.kernels)
    if options.profile:
        from . import profiling

        profiling.register(compiled)
    stats.bump("compile_seconds", time.perf_counter() - t0)
    return compiled
