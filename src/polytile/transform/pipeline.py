"""The target-neutral prefix of the pass pipeline, and the loop that runs a pass list.

Each pass is a pure function Program -> Program. ``SHARED_PASSES`` run for every target
(dead code, fusion); the backend's scheduling passes (``backends.Backend.passes``) follow.
With ``Options.dump_dir`` set, the IR after every pass is written there (see ``dump``).
"""
from __future__ import annotations

import time
from typing import Callable

from .. import counters

from ..affine.ir import Program
from ..affine.verify import verify_program
from ..options import Options
from . import dead, fuse_epilogues, fuse_loops, fuse_producers, half_rounding, parallelize

Pass = tuple[str, Callable[[Program], Program]]


def shared_passes(o: Options, symbolic: bool = False) -> list[Pass]:
    """The passes every backend starts from, with ``o``'s fusion switches applied. A program
    with symbolic sizes (``graph.symbols``) gets dead code removal and the parallelism check
    only: the fusion passes are not yet written for parametric domains."""
    if symbolic:
        return [("drop_dead_kernels", dead.drop_dead_kernels), ("check_parallel", parallelize.check_parallel)]
    fuse = o.fusion
    return [
        ("drop_dead_kernels", dead.drop_dead_kernels),
        ("check_parallel", parallelize.check_parallel),
        ("fuse_producers", fuse_producers.fuse_producers if fuse and o.fuse_producers else _same),
        ("fuse_epilogues", fuse_epilogues.fuse_epilogues if fuse and o.fuse_epilogues else _same),
        ("fuse_loops", (lambda p: fuse_loops.fuse_loops(p, flow=o.fuse_loops, siblings=o.fuse_siblings,
                                                        threads=o.threads))
         if fuse and (o.fuse_loops or o.fuse_siblings) else _same),
        ("keep_float32", _same if o.emulate_precision_casts else half_rounding.keep_float32),
        ("check_parallel_fused", parallelize.check_parallel),
    ]


def _same(p: Program) -> Program:
    return p


def run_pipeline(p: Program, passes: list[Pass], options: Options,
                 dump: Callable[[str, Program], None] | None = None) -> Program:
    """Every pass of ``passes`` in order; the verifier checks the input and the result (``Options.verify``)
    and, with ``Options.verify_passes``, the program after each pass. Seconds per pass go to
    ``polytile.stats()["compile_phases"]``."""
    if options.verify:
        verify_program(p)
    start = time.perf_counter()
    for name, fn in passes:
        if time.perf_counter() - start > options.compile_budget_s:
            raise CompileBudgetExceeded(f"polytile: the passes took more than {options.compile_budget_s:g} s "
                                        f"(compile_budget_s), before {name!r}")
        t0 = time.perf_counter()
        try:
            p = fn(p)
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
