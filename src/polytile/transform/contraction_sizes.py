"""Sizes of the register tile and of the reduction blocks of ``tile_contractions``, from the
CPUMachine (vector registers and width, L2 size, cores): the analytical part of its cost model."""
from __future__ import annotations

from math import gcd
from typing import TYPE_CHECKING

from ..affine.ir import Expr, trip_count
from ..affine.linear import linear_form, to_expr
from .contraction_nest import Nest
from .contraction_plan import static_schedule

if TYPE_CHECKING:  # a scheduling pass of the CPU backend, sized by its machine description
    from ..backends.cpu.machine import CPUMachine


def tile_sizes(t: CPUMachine) -> tuple[int, int, int]:
    """(MR, NV, VW): rows of the register tile, vectors per row, lanes per vector."""
    vw = t.lanes(4)
    nv = 2
    mr = max(1, min(8 if t.vector_registers <= 16 else 14, (t.vector_registers - nv - 1) // nv))
    return mr, nv, vw


def wide_tile(t: CPUMachine, mr: int, nv: int, vw: int, N: int, K: int) -> tuple[int, int]:
    """(MR, NV) for a nest with N columns: with 32 vector registers and columns for it, a 9 x 3
    vector tile instead of 14 x 2 (each panel then meets all of X once per 48 columns, not 32,
    which helps most GEMM shapes). Matmul-like nests only (one column loop): on convolutions
    (pixels as columns) it helps some shapes and hurts others."""
    # the panels shared over the cores unless they all fit in the L2 (then the row tiles are,
    # see ``rows_outer``)
    panels_shared = -(-N // (3 * vw)) * K * 3 * vw * 4 > t.l2_bytes // 2
    if t.vector_registers >= 32 and N >= 3 * vw and not (panels_shared and _unbalanced(N, 3 * vw, nv * vw, t)):
        return (t.vector_registers - 3 - 1) // 3, 3
    return mr, nv


def _unbalanced(N: int, wide: int, narrow: int, t: CPUMachine) -> bool:
    """Whether panels of ``wide`` columns, shared over the cores by OpenMP's static schedule,
    leave the busiest core more than 1/12 more columns to compute than panels of ``narrow`` do
    (a partial last panel computes only the vectors it has columns for). N = 512 over two
    cores: 11 panels of 48, six on one core, 288 columns, against 8 + 8 panels of 32, 256
    columns."""
    vw = t.lanes(4)

    def busiest(nr: int) -> int:
        panels = -(-N // nr)
        return static_schedule([nr] * (panels - 1) + [-(-(N - (panels - 1) * nr) // vw) * vw], t.cores)

    return 12 * busiest(wide) > 13 * busiest(narrow)


def k_block(n: Nest, K: int, nr: int, t: CPUMachine, panels: int = 1) -> int:
    """KC, the reduction block, when a packed panel of the whole reduction (K x nr) would not fit
    in half the L2 (K = 500000: the panels and the row operand would stream from memory once per
    panel); 0 for no blocking. Nests without a batch loop (or with one of one step: a
    convolution's single group); a block is a range of the outermost reduction loop with the
    inner ones whole (an implicit GEMM, a convolution: a range of input channels with all of
    (kh, kw)). Blocks of about a quarter of the L2 for ``panels`` panels
    together (few panels: every row tile meets all of them, see ``few_panels_block``), balanced
    over K."""
    if any(trip_count(f) != 1 for f in n.batch) or K * nr * 4 * panels <= t.l2_bytes // 2:
        return 0
    vw = t.lanes(4)
    inner = K // trip_count(n.rloops[0])  # the reduction per step of the outermost loop
    unit = vw * inner // gcd(vw, inner)  # whole steps, whole vectors where that is not too coarse
    most = t.l2_bytes // 4 // (panels * nr * 4)
    if unit > most and inner > 1:
        unit = inner
    most = max(unit, most // unit * unit)
    blocks = -(-K // most)
    return -(-(-(-K // blocks)) // unit) * unit


ALL_PANELS_MIN_KC = 128  # the shortest block worth every panel's block at once (``reduction_block``)


def reduction_block(n: Nest, M: int, N: int, K: int, nr: int, t: CPUMachine) -> tuple[int, bool]:
    """(KC, all_panels) for a tiled nest with panels of ``nr`` columns: KC = 0 for an unblocked
    reduction; ``all_panels``: every panel's block is packed per block and every row tile meets
    them all (an implicit GEMM with many panels; ``few_panels_block``)."""
    kc = k_block(n, K, nr, t)
    panels = -(-N // nr)
    if len(n.jloops) > 1 or n.cond is not None:
        # an implicit GEMM (a convolution) is blocked only when its panels' blocks fit in the
        # L2 together at a block long enough and there are panels enough for every core:
        # all of them packed per block and every row tile meeting them, X read once in all
        # instead of once per panel; with fewer panels, streaming X once per panel unblocked
        # is faster
        kc_all = k_block(n, K, nr, t, panels) if kc and panels >= 4 * t.cores else 0
        return (kc_all, True) if kc_all >= ALL_PANELS_MIN_KC else (0, False)
    if panels < 4 * t.cores and (kc or M * K * 4 > t.l2_bytes):
        # few panels: each block of all of them must stay in the L2 together while every row
        # tile meets them; also when each panel fits but not all of them, and X does not fit in
        # the L2: unblocked, X would stream from memory once per panel (e.g. the 16 MB weight
        # of a swapped linear, read once per panel)
        return k_block(n, K, nr, t, panels), False
    return kc, False


def chunk_start(r0: Expr, inner: int) -> Expr:
    """The first step of the outermost reduction loop in a block that starts at flat index
    ``r0`` (a multiple of ``inner``, the reduction per step: ``k_block``)."""
    lf = linear_form(r0)
    assert lf is not None and lf[1] % inner == 0 and all(k % inner == 0 for k in lf[0].values()), r0
    return to_expr({v: k // inner for v, k in lf[0].items()}, lf[1] // inner)
