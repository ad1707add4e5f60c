"""The CPU backend: C with OpenMP and GCC vector extensions, built by the system C compiler and
loaded with ctypes.

Its machine description is ``machine.CPUMachine``; it lowers attention itself
(``attention.lower_attention``: a tiled online-softmax nest sized from the caches); its
scheduling passes register-tile and pack contractions, tile transposes, make loop bounds
exact, coalesce loops and assign OpenMP parallel loops; ``emit`` plans the memory, renders C
(``codegen.c``), builds a shared object (``runtime.cc``, cached) and loads it
(``runtime.loader.NativeGraph``)."""
from __future__ import annotations

import os
import time
from typing import Any, Mapping

from ... import counters as stats
from ...affine.ir import buffers_used
from ...affine.attention import key_blocked_nest
from ...codegen.c import UNIT_MARK, render
from ...graph.low_precision import HALF_OF, pad_pair_channels, round_contraction_operands
from ...graph.depthwise import pad_depthwise
from ...graph.quantized import integer_contractions
from ...graph.symbols import is_symbolic
from ...runtime.cache import discard
from ...runtime.cc import build_shared_object
from ...runtime.loader import NativeGraph, SymbolicGraph
from ...runtime.memory_plan import plan_memory
from ...transform import (bounds, cache_static, coalesce, hoist, interchange, parallelize, row_blocks,
                          tile_contractions, tile_transposes)
from ...transform.contraction_sizes import tile_sizes
from ...transform.pipeline import run_pipeline, shared_passes
from .. import Backend, EmitRequest, Pass
from .attention import lower_attention
from .conv import lower_conv2d
from .machine import CPUMachine, resolve

SINK_TILE = 512  # iterations of a sunk parallel loop's tile (interchange.sink_parallel_loops)
# register tiles' rows in the blocks of a symbolic number of rows (``row_blocks``): the largest
# for the full blocks, the smallest that holds them for the rows those leave (padded)
ROW_BLOCK_TILES = (8, 4, 2)
ATTENTION_KEY_VECTORS = 4  # vectors of keys per block of an attention with symbolic sizes


class CPUBackend(Backend):
    name = "cpu"
    device = "cpu"

    def machine(self, overrides: Mapping[str, Any] | None) -> CPUMachine:
        return resolve(overrides)

    def op_lowerings(self, machine: CPUMachine, options) -> dict:
        def attention(b, n):
            if is_symbolic(n.shape, *(i.shape for i in n.inputs)):  # tiles need sizes: blocks of keys
                b.emit(n, key_blocked_nest(b, n, ATTENTION_KEY_VECTORS * machine.lanes(4)))
                return
            pack, main = lower_attention(b, n, machine, options.threads)
            if pack:  # the key-major form reads K and V in place when it can
                b.emit(n, pack, f"pack K, V for {n.op}{list(n.shape)}")
            b.emit(n, main)

        return {"attention": attention, "conv2d": lower_conv2d}

    def graph_passes(self, machine: CPUMachine, options) -> list:
        # "bf16"/"fp16": float32 contractions with half-precision operands (bfloat16 pairs where
        # the machine has them); "ieee" and "tf32" (which a CPU has no unit for) keep float32
        p = options.mm_conv_precision
        # quantized matmuls and convolutions on their integer values (int8 quads: channels
        # padded to a multiple of 4 where the machine multiplies quads)
        ints = [lambda g: integer_contractions(g, 4 if machine.int8_dot else 1)]
        half = [lambda g: round_contraction_operands(g, p)] if p in HALF_OF else []
        # (bfloat16 convolutions over 3 channels padded to 4: pairs of channels)
        return ints + half + ([pad_pair_channels] if machine.bf16_dot else []) + [pad_depthwise]

    def passes(self, machine: CPUMachine, options) -> list[Pass]:
        o = options
        return [
            ("tile_contractions", lambda p: tile_contractions.tile_contractions(p, machine, prefetch=o.prefetch)
             if o.tile_contractions else p),
            ("tile_transposes", lambda p: tile_transposes.tile_transposes(p, machine.lanes(4))),
            ("sink_parallel_loops", lambda p: interchange.sink_parallel_loops(
                p, tile=SINK_TILE, workers=o.threads, lanes=machine.lanes(4),
                split=interchange.SplitRows(max_bytes=machine.l1d_bytes // 2))),
            ("conditions_to_bounds", bounds.conditions_to_bounds),
            ("hoist_divisors", hoist.hoist_divisors),
            ("coalesce_loops", coalesce.coalesce_loops),
            ("check_parallel_again", parallelize.check_parallel),
            ("assign_omp", lambda p: parallelize.assign_omp(p, threads=o.threads, min_work=o.parallel_min_work)),
            ("cache_static_kernels", cache_static.cache_static_kernels),  # (no static buffers: no-op)
        ]

    def symbolic_passes(self, machine: CPUMachine, options) -> list[Pass]:
        """Programs with symbolic sizes: runs of kernels over a symbolic number of rows that hold
        a contraction run in static blocks of rows scheduled as static programs are
        (``row_blocks``: blocks of 8 register tiles' rows, the rows they leave in one padded
        block of 2, 4 or 8 tiles' rows); the other kernels as plain nests whose parallel loops
        with static extents sink below reductions (x @ W reads W's rows contiguously) and whose
        checked parallel loops run on the OpenMP threads."""
        o = options
        rest = [
            ("sink_parallel_loops", lambda p: interchange.sink_parallel_loops(p, tile=SINK_TILE, workers=o.threads,
                                                                              lanes=machine.lanes(4))),
            ("check_parallel_again", parallelize.check_parallel),
            ("assign_omp", lambda p: parallelize.assign_omp(p, threads=o.threads, min_work=o.parallel_min_work)),
        ]
        if not (o.tile_contractions and o.row_blocks):
            return rest
        static = shared_passes(o) + self.passes(machine, o)
        mr = tile_sizes(machine)[0]
        plan = row_blocks.RowBlocks(sizes=tuple(t * mr for t in ROW_BLOCK_TILES))
        return [("block_rows", lambda p: row_blocks.block_rows(
            p, plan, static=lambda q: run_pipeline(q, static, o), rest=lambda q: run_pipeline(q, rest, o)))]

    def emit(self, prog, request: EmitRequest) -> NativeGraph:
        o = request.options
        t0 = time.perf_counter()
        plan = plan_memory(prog)
        symbols = list(prog.symbols)
        srcs = render(prog, plan.offsets, units=max(1, min(o.threads, os.cpu_count() or 1)), profile=o.profile,
                      dynamic=plan.dynamic)
        t1 = time.perf_counter()
        stats.add_phase("memory plan and C rendering", t1 - t0)
        if request.dumper:
            request.dumper.write("kernel.c", UNIT_MARK.join(srcs))
        so, hit = build_shared_object(srcs, o)
        stats.bump("cache_hits" if hit else "cache_misses")
        stats.bump("intermediate_bytes", plan.temp_bytes)
        stats.bump("arena_bytes", plan.arena_bytes)
        stats.bump("cached_kernels", sum(1 for k in prog.kernels if k.cached))
        stats.bump("cache_bytes", plan.cache_bytes)
        cached_reads = {b for k in prog.kernels if k.cached for b in buffers_used(k)[0]}
        cached_inputs = tuple(sorted(b.index for b in prog.buffers if b.kind == "input" and b.name in cached_reads))

        def load(path):
            if symbols:
                return SymbolicGraph(path, request.input_specs, request.output_specs, plan.arena_bytes, o.threads,
                                     symbols=symbols, name=request.name, input_labels=request.input_labels,
                                     cache_bytes=plan.cache_bytes, cached_inputs=cached_inputs)
            return NativeGraph(path, request.input_specs, request.output_specs, plan.arena_bytes, o.threads,
                               name=request.name, input_labels=request.input_labels, reuse_outputs=o.reuse_outputs,
                               cache_bytes=plan.cache_bytes, cached_inputs=cached_inputs)

        try:
            ng = load(so)
        except OSError:  # a cached object that does not load: built again, once
            if not hit:
                raise
            discard(so)
            so, _ = build_shared_object(srcs, o)
            ng = load(so)
        stats.add_phase("C compile and load", time.perf_counter() - t1)
        ng.memory_plan = plan
        return ng
