"""Graph IR -> loaded native graph: affine lowering, pass pipeline, memory plan, C, cc, load."""
from __future__ import annotations

import os
import time
import warnings

from . import counters as stats
from . import profiling
from .affine.build import build
from .affine.ir import buffers_used
from .affine.printer import format_program
from .codegen.c import UNIT_MARK, render
from .dump import Dumper
from .graph.attention import fuse_attention
from .graph.builder import contiguous_strides
from .graph.ir import Graph, format_graph, verify_graph
from .options import Options
from .runtime.cache import discard
from .runtime.cc import build_shared_object
from .runtime.loader import NativeGraph, TensorSpec
from .runtime.memory_plan import plan_memory
from .target import resolve as resolve_target
from .transform.cache_static import mark_static_inputs
from .transform.pipeline import run_pipeline


def compile_graph_ir(graph: Graph, input_specs: list[TensorSpec], options: Options, name: str,
                     dumper: Dumper | None = None, input_labels: list[str] | None = None) -> NativeGraph:
    t0 = time.perf_counter()
    if options.verify:
        verify_graph(graph)
    if dumper:
        dumper.write("graph.txt", format_graph(graph))
    if options.fusion and options.fuse_attention:
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
    prog = build(graph, resolve_target(options.target), options.threads)
    if options.cache_weights:
        prog = mark_static_inputs(prog, {k for k, s in enumerate(input_specs) if s.static})
    stats.add_phase("affine build", time.perf_counter() - t1)
    if dumper:
        dumper.write("affine_build.mlir", format_program(prog))
    prog = run_pipeline(prog, options, (lambda p_name, p: dumper.write(f"affine_{p_name}.mlir", format_program(p)))
                        if dumper else None)
    t2 = time.perf_counter()
    plan = plan_memory(prog)
    srcs = render(prog, plan.offsets, units=max(1, min(options.threads, os.cpu_count() or 1)),
                  profile=options.profile)
    t3 = time.perf_counter()
    stats.add_phase("memory plan and C rendering", t3 - t2)
    if dumper:
        dumper.write("kernel.c", UNIT_MARK.join(srcs))
    so, hit = build_shared_object(srcs, options)
    stats.bump("cache_hits" if hit else "cache_misses")
    stats.bump("kernels_generated", len(prog.kernels))
    stats.bump("intermediate_bytes", plan.temp_bytes)
    stats.bump("arena_bytes", plan.arena_bytes)
    stats.bump("cached_kernels", sum(1 for k in prog.kernels if k.cached))
    stats.bump("cache_bytes", plan.cache_bytes)
    stats.bump("graphs_compiled")
    outs = [TensorSpec(n.shape, contiguous_strides(n.shape), n.dtype) for n in graph.outputs]
    cached_reads = {b for k in prog.kernels if k.cached for b in buffers_used(k)[0]}
    cached_inputs = tuple(sorted(b.index for b in prog.buffers if b.kind == "input" and b.name in cached_reads))

    def load(path):
        return NativeGraph(path, input_specs, outs, plan.arena_bytes, options.threads, name=name,
                           input_labels=input_labels, reuse_outputs=options.reuse_outputs,
                           cache_bytes=plan.cache_bytes, cached_inputs=cached_inputs)

    try:
        ng = load(so)
    except OSError:  # a cached object that does not load: built again, once
        if not hit:
            raise
        discard(so)
        so, _ = build_shared_object(srcs, options)
        ng = load(so)
    stats.add_phase("C compile and load", time.perf_counter() - t3)
    ng.memory_plan = plan
    ng.num_kernels = len(prog.kernels)
    if options.profile:
        profiling.register(ng)
    stats.bump("compile_seconds", time.perf_counter() - t0)
    return ng
