"""The GPU cost model: one ``KernelPlan`` per kernel (``codegen.triton`` renders it).

A contraction that ``dot`` can run gets output tiles sized to its extents (at most 128 x 128,
at least 64 rows on chips with warpgroup MMA), halved while there are fewer tiles than SMs,
a reduction step of 32 fp32 elements,
8 warps for the large tile and as many pipeline stages as the shared memory holds. A kernel
whose inner loops can run across columns (``codegen.triton_rows``: softmax, norms, row
reductions) gets row tiles of about 4096 elements (columns: the loops' trip count rounded up
to a power of two). Attention gets flash tiles sized so that its registers hold them (checked
without spills by ahead-of-time compiles): fewer keys per block for wider heads, 16-row tiles
when fp32 products run on the FMA units. Every other kernel runs as lanes: up to 1024 per
program.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...affine.ir import Kernel, Program
from ...codegen.triton import KernelPlan
from ...codegen.triton_dot import dot_shape
from ...codegen.triton_flash import flash_shape
from ...codegen.triton_kernel import outer_band, total
from ...codegen.triton_rows import vector_extent
from .machine import GPUMachine

LANES = 1024
ROW_TILE = 4096  # elements of a rows x cols tile
MAX_COLS = 8192
MAX_TILE = 128
MIN_DOT_COLS = 4
MIN_COLS_TILE = 32  # the narrowest column tile the SM-filling rule goes down to
MIN_TILE = 16


def _pow2_tile(extent: int, least: int = MIN_TILE) -> int:
    t = least
    while t < extent and t < MAX_TILE:
        t *= 2
    return t


@dataclass(frozen=True)
class Precision:
    """The tile-product precision of fp32 contractions (``KernelPlan.precision``)."""

    matmul: str = "ieee"
    conv: str = "ieee"

    def of(self, k: Kernel) -> str:
        return self.conv if k.origin.startswith("conv") else self.matmul


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def plan_kernel(k: Kernel, machine: GPUMachine, precision: Precision) -> KernelPlan:
    shape = dot_shape(k) if k.contraction else None
    # a product with fewer than 4 columns (a depthwise convolution: one output channel per
    # group; a matrix-vector product) leaves the tensor cores nearly idle: lanes instead
    if shape is not None and total(shape.cols) >= MIN_DOT_COLS:
        # warpgroup MMA (sm_90 and newer) takes 64 rows at a time: fewer rows than that still get
        # a 64-row tile (a skinny product is bound by reading the other operand anyway)
        least_rows = min(machine.mma[0], 64)
        M, N = total(shape.rows), total(shape.cols)
        bm, bn = _pow2_tile(M, least_rows), _pow2_tile(N)
        # fewer tiles than SMs leaves SMs idle: halve the larger tile side while that adds tiles
        batch = total(shape.batch)
        while batch * -(-M // bm) * -(-N // bn) < machine.sm_count and (bm > least_rows or bn > MIN_COLS_TILE):
            if bn > MIN_COLS_TILE and (bn >= bm or bm <= least_rows):
                bn //= 2
            else:
                bm //= 2
        bk = 32
        stage_bytes = (bm * bk + bk * bn) * 4
        stages = max(1, min(4, machine.smem_per_block // stage_bytes))
        # (fp32 products on the FMA units keep whole tiles in registers: more warps share them)
        warps = 8 if bm * bn >= (64 * 64 if precision.of(k) == "ieee" else 128 * 128) else 4
        return KernelPlan("dot", bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, precision=precision.of(k))
    flash = flash_shape(k)
    if flash is not None:
        depth = max(flash.depth.hi.value - flash.depth.lo.value, flash.out.hi.value - flash.out.lo.value)
        if precision.matmul == "ieee":  # products on the FMA units hold every tile in registers
            return KernelPlan("flash", bm=16, bn=32 if depth <= 32 else 16, warps=8 if depth > 64 else 4, stages=2,
                              precision="ieee")
        # tensor cores: 64 query rows (a warpgroup MMA), fewer keys per block for wider heads
        bm, bn, warps = (64, 64, 4) if depth <= 32 else (64, 32, 8) if depth <= 64 else (64, 16, 4)
        if depth > 64 and machine.capability < 90:  # warp-level MMA keeps more per thread: fewer rows
            bm, bn = 32, 32
        return KernelPlan("flash", bm=bm, bn=bn, warps=warps, stages=2, precision=precision.matmul)
    band, inner = outer_band(k.body)
    iterations = total(band)
    n = vector_extent(inner, MAX_COLS)
    if n > 0:
        cols = _pow2(n)
        rows = max(1, min(ROW_TILE // cols, _pow2(iterations)))
        return KernelPlan("rows", block=rows, cols=cols, warps=8 if rows * cols > ROW_TILE else 4)
    block = _pow2(min(iterations, LANES))
    return KernelPlan("lanes", block=block, warps=4 if block >= 128 else 1)


def plan_kernels(prog: Program, machine: GPUMachine, precision: Precision = Precision()) -> dict[str, KernelPlan]:
    return {k.name: plan_kernel(k, machine, precision) for k in prog.kernels}
