"""The GPU cost model: one ``KernelPlan`` per kernel (``codegen.triton`` renders it).

A contraction that ``dot`` can run gets output tiles sized to its extents (at most 128 x 128,
at least the 16 x 16 a tensor-core instruction needs), a reduction step of 32 fp32 elements,
8 warps for the large tile and as many pipeline stages as the shared memory holds. A kernel
whose inner loops can run across columns (``codegen.triton_rows``: softmax, norms, row
reductions) gets row tiles of about 4096 elements (columns: the loops' trip count rounded up
to a power of two). Every other kernel runs as lanes: up to 1024 per program.
"""
from __future__ import annotations

import math

from ...affine.ir import Kernel, Program
from ...codegen.triton import KernelPlan
from ...codegen.triton_dot import dot_shape
from ...codegen.triton_kernel import outer_band
from ...codegen.triton_rows import vector_extent
from .machine import GPUMachine

LANES = 1024
ROW_TILE = 4096  # elements of a rows x cols tile
MAX_COLS = 8192
MAX_TILE = 128
MIN_TILE = 16


def _pow2_tile(extent: int) -> int:
    t = MIN_TILE
    while t < extent and t < MAX_TILE:
        t *= 2
    return t


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def plan_kernel(k: Kernel, machine: GPUMachine, precision: str) -> KernelPlan:
    shape = dot_shape(k) if k.contraction else None
    if shape is not None:
        bm, bn, bk = _pow2_tile(math.prod(shape.extents(shape.rows))), _pow2_tile(math.prod(shape.extents(shape.cols))), 32
        stage_bytes = (bm * bk + bk * bn) * 4
        stages = max(1, min(4, machine.smem_per_block // stage_bytes))
        warps = 8 if bm * bn >= 128 * 128 else 4
        return KernelPlan("dot", bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, precision=precision)
    band, inner = outer_band(k.body)
    total = 1
    for f in band:
        total *= f.hi.value - f.lo.value
    n = vector_extent(inner, MAX_COLS)
    if n > 0:
        cols = _pow2(n)
        rows = max(1, min(ROW_TILE // cols, _pow2(total)))
        return KernelPlan("rows", block=rows, cols=cols, warps=8 if rows * cols > ROW_TILE else 4)
    block = 1
    while block < min(total, LANES):
        block *= 2
    return KernelPlan("lanes", block=block, warps=4 if block >= 128 else 1)


def plan_kernels(prog: Program, machine: GPUMachine, precision: str = "ieee") -> dict[str, KernelPlan]:
    return {k.name: plan_kernel(k, machine, precision) for k in prog.kernels}
