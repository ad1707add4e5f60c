"""The ordered list of passes from the affine IR to what the renderer sees.

Each pass is a pure function Program -> Program. With ``Options.dump_dir`` set, the IR after
every pass is written there (see ``runtime.dump``).
"""
from __future__ import annotations

import time
from typing import Callable

from .. import counters

from ..affine.ir import Program
from ..affine.verify import verify_program
from ..options import Options
from ..target import resolve as resolve_target
from . import (bounds, cache_static, coalesce, dead, fuse_epilogues, fuse_loops, fuse_producers, hoist, interchange, parallelize,
               tile_contractions, tile_transposes)

Pass = tuple[str, Callable[[Program, Options], Program]]

PASSES: list[Pass] = [
    ("drop_dead_kernels", lambda p, o: dead.drop_dead_kernels(p)),
    ("check_parallel", lambda p, o: parallelize.check_parallel(p)),
    ("fuse_producers", lambda p, o: fuse_producers.fuse_producers(p) if o.fusion and o.fuse_producers else p),
    ("fuse_epilogues", lambda p, o: fuse_epilogues.fuse_epilogues(p) if o.fusion and o.fuse_epilogues else p),
    ("fuse_loops", lambda p, o: fuse_loops.fuse_loops(p, flow=o.fuse_loops, siblings=o.fuse_siblings,
                                                      threads=o.threads)
     if o.fusion and (o.fuse_loops or o.fuse_siblings) else p),
    ("check_parallel_fused", lambda p, o: parallelize.check_parallel(p)),
    ("tile_contractions", lambda p, o: tile_contractions.tile_contractions(
        p, resolve_target(o.target), prefetch=o.prefetch)
     if o.tile_contractions else p),
    ("tile_transposes", lambda p, o: tile_transposes.tile_transposes(p, resolve_target(o.target).lanes(4))),
    ("sink_parallel_loops", lambda p, o: interchange.sink_parallel_loops(p, tile=512)),
    ("conditions_to_bounds", lambda p, o: bounds.conditions_to_bounds(p)),
    ("hoist_divisors", lambda p, o: hoist.hoist_divisors(p)),
    ("coalesce_loops", lambda p, o: coalesce.coalesce_loops(p)),
    ("check_parallel_again", lambda p, o: parallelize.check_parallel(p)),
    ("assign_omp", lambda p, o: parallelize.assign_omp(p, threads=o.threads, min_work=o.parallel_min_work)),
    ("cache_static_kernels", lambda p, o: cache_static.cache_static_kernels(p)),  # (no static buffers: no-op)
]


def run_pipeline(p: Program, options: Options, dump: Callable[[str, Program], None] | None = None) -> Program:
    """Every pass in order; the verifier checks the input and the result (``Options.verify``)
    and, with ``Options.verify_passes``, the program after each pass. Seconds per pass go to
    ``polytile.stats()["compile_phases"]``."""
    if options.verify:
        verify_program(p)
    start = time.perf_counter()
    for name, fn in PASSES:
        if time.perf_counter() - start > options.compile_budget_s:
            raise CompileBudgetExceeded(f"polytile: the passes took more than {options.compile_budget_s:g} s "
                                        f"(compile_budget_s), before {name!r}")
        t0 = time.perf_counter()
        try:
            p = fn(p, options)
        except Exception as e:
            raise PassError(name, e) from e
        counters.add_phase(name, time.perf_counter() - t0)
        if options.verify and options.verify_passes:
            verify_program(p)
        if dump:
            dump(name, p)
    if options.verify and not options.verify_passes:
        verify_program(p)
    return p


class CompileBudgetExceeded(RuntimeError):
    pass


class PassError(RuntimeError):
    def __init__(self, name: str, err: Exception):
        super().__init__(f"polytile pass {name!r} failed: {type(err).__name__}: {err}")
        self.pass_name = name
