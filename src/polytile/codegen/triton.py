"""The core of the Triton renderer (``codegen.triton``): kernel plans, rendered kernels, and the
statement and expression renderer the three kernel forms share.

(The forms are described in ``codegen.triton``.)

Three forms, chosen per kernel by the GPU backend's plan (``backends.gpu.plan.KernelPlan``):

- ``lanes``: the kernel's outer band of parallel loops is flattened into one index space;
  each program instance runs ``block`` consecutive iterations of it as the lanes of its
  tensors, and everything inside the band (inner loops, accumulators, conditions) runs on
  those lanes in lock step. An inner loop whose bounds differ between lanes runs over the
  union of the lanes' ranges with a mask; an ``If`` becomes a mask (stores and assignments
  under it are predicated); a kernel-local array (``Alloc``) lives in a scratch buffer with
  one slice per lane.
- ``rows``: ``lanes`` with one row per lane and a column axis for the inner loops that are
  elementwise maps or reductions (``codegen.triton_rows``): softmax, norms, row reductions
  with their row-local arrays in registers;
- ``dot`` (``codegen.triton_dot``): a contraction nest (parallel rows ``m``, columns ``n`` and batch loops, one
  reduction loop folding ``a[m, k] * b[k, n]`` into an accumulator) becomes a block tile of
  ``bm x bn`` outputs per program with a loop over ``bk``-wide slices of the reduction, each
  one ``tl.dot`` (tensor cores); the statements after the reduction (the fused epilogue:
  bias, activation, residual) run on the ``bm x bn`` accumulator before its store.
"""
from __future__ import annotations

from ..affine.ir import Kernel, Program
from .triton_dot import render_dot
from .triton_flash import render_flash
from .triton_kernel import HEADER, KernelPlan, Renderer, RenderedKernel, decompose, finish, outer_band, total
from .triton_ops import PRELUDE
from .triton_rows import register_arrays

__all__ = ["KernelPlan", "RenderedKernel", "render_module"]


def _band_lanes(r: Renderer, band, lines: list[str]) -> None:
    """Bind the band's variables to the lanes' coordinates in the flattened band (``f``)."""
    r.names.update(decompose(lines, "    ", "f", band, "v_"))
    r.lane_vars |= {f.var for f in band}
    r.lines = lines


def render_lanes(prog: Program, k: Kernel, plan: KernelPlan) -> RenderedKernel:
    band, inner = outer_band(k.body)
    n = total(band)
    r = Renderer(prog, k, "[BLOCK]", "zi", "f")
    _band_lanes(r, band, [
        "    f = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)",
        f"    m0 = f < {n}",
        "    zi = tl.zeros([BLOCK], tl.int64)",
    ])
    r.stmts(inner, "m0", "    ")
    grid = max(1, -(-n // plan.block))
    scratch = {a: (grid * plan.block * r.local[a].size, r.local[a].dtype) for a in r.local}
    return finish(prog, k, r, plan, grid, scratch, ["BLOCK: tl.constexpr"], {"BLOCK": plan.block})


def render_rows(prog: Program, k: Kernel, plan: KernelPlan) -> RenderedKernel:
    band, inner = outer_band(k.body)
    n = total(band)
    r = Renderer(prog, k, "[ROWS, 1]", "zi", "f")
    r.cols = plan.cols
    r.regs = register_arrays(inner, r.local, plan.cols)
    _band_lanes(r, band, [
        "    f = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)[:, None]",
        f"    m0 = f < {n}",
        "    zi = tl.zeros([ROWS, 1], tl.int64)",
        "    z2 = tl.zeros([ROWS, COLS], tl.int64)",
        "    cols = tl.arange(0, COLS).to(tl.int64)[None, :]",
    ])
    r.stmts(inner, "m0", "    ")
    grid = max(1, -(-n // plan.block))
    scratch = {a: (grid * plan.block * r.local[a].size, r.local[a].dtype) for a in r.local if a not in r.regs}
    return finish(prog, k, r, plan, grid, scratch, ["ROWS: tl.constexpr", "COLS: tl.constexpr"],
                  {"ROWS": plan.block, "COLS": plan.cols})


RENDER = {"lanes": render_lanes, "rows": render_rows, "dot": render_dot, "flash": render_flash}


def render_module(prog: Program, plans: dict[str, KernelPlan]) -> tuple[str, list[RenderedKernel]]:
    """The Python source of a module defining every kernel of ``prog``, and what launching each needs."""
    kernels = []
    for k in prog.kernels:
        plan = plans[k.name]
        kernels.append(RENDER[plan.kind](prog, k, plan))
    src = HEADER + PRELUDE + "\n\n" + "\n\n".join(rk.source for rk in kernels)
    return src, kernels
