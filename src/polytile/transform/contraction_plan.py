"""The decisions ``tile_contractions`` takes for one contraction nest, as frozen records that the
tile builders (``tile_nests``, ``panel_pack``) read instead of long argument lists, and the one
model of how OpenMP's static schedule shares loop iterations among the cores."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..affine.ir import Expr, Var, vector_type
from .contraction_nest import Nest

if TYPE_CHECKING:
    from ..backends.cpu.machine import CPUMachine

FLOAT_BYTES = 4  # the contractions tiled are float32


@dataclass(frozen=True)
class Panels:
    """The packed panels of the column operand Y: ``full`` panels of nr columns, ``total`` with
    the partial last one, which has ``tail`` columns (0: none)."""
    full: int
    total: int
    tail: int


@dataclass(frozen=True)
class XPack:
    """X packed into Xp[bl][tile][R][rows]: ``tiles`` row tiles of ``rows`` rows per batch index."""
    buf: str
    bl: Expr
    tiles: int
    rows: int


@dataclass(frozen=True)
class RowGroup:
    """``count`` register tiles of ``mr`` rows from row ``i0``; ``lo``, ``hi``: the range of the
    tile loop when the rows are shared among parts (``split_rows``), else [0, count).
    ``x_copied``: the tiles' rows of X were copied into ``xrows`` by the caller (``copy_x_rows``)."""
    mr: int
    i0: Expr
    count: int
    lo: Expr | None = None
    hi: Expr | None = None
    x_copied: bool = False


@dataclass(frozen=True)
class KBlock:
    """One block of a blocked reduction: rows r0 + [0, kc) of the reduction; the tiles start
    from ``acc`` (row stride ``ldc``) when ``reload`` holds and are stored there unless
    ``final`` holds (then the epilogue runs)."""
    r0: Expr
    kc: int
    reload: Expr
    final: Expr
    acc: str
    ldc: int


@dataclass(frozen=True)
class At:
    """A place in a buffer: ``buf`` at flat index ``index``."""
    buf: str
    index: Expr


@dataclass(frozen=True)
class ContractionPlan:
    """One tiled contraction: the nest ``n``; its flat reduction of ``K`` over index ``R``;
    vectors of ``vw`` lanes; packed panels of ``nr`` columns (the packed row stride and the
    column step of panel jo), ``panels`` of them in ``packed`` (Yp[bl][jo][R][nr]; "" when each
    panel is packed in the panel loop); X packed (``xpack``) or read in place (None); the
    machine the sizes were chosen for."""
    n: Nest
    K: int
    R: Var
    vw: int
    nr: int
    panels: Panels
    packed: str
    bl: Expr
    xpack: XPack | None
    machine: "CPUMachine"

    @property
    def vt(self) -> str:
        return vector_type("float32", self.vw)

    @property
    def line(self) -> int:
        """Floats per cache line."""
        return self.machine.cache_line // FLOAT_BYTES


def static_schedule(costs: list[int], workers: int) -> int:
    """The largest total cost one worker gets when OpenMP's static schedule (libgomp's: the
    first ``len(costs) % workers`` workers take one iteration more) shares iterations with
    these ``costs`` among ``workers``, in order."""
    size, extra = divmod(len(costs), workers)
    busiest, at = 0, 0
    for t in range(workers):
        k = size + (1 if t < extra else 0)
        busiest = max(busiest, sum(costs[at:at + k]))
        at += k
    return busiest


@dataclass(frozen=True)
class RowMajor:
    """A row-major M x ``cols`` temp ``buf`` that finished tiles are stored into (``out_kernel``)."""
    buf: str
    cols: int
