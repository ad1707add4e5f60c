"""The contraction work of a model call (matmul, bmm, convolution, attention), counted by torch's
FlopCounterMode on an eager call. With the measured FMA peak it bounds what any compiler can do:
``GFLOP / peak`` is the time of the contractions alone at 100% of the peak, everything else free."""
from __future__ import annotations

from typing import Callable


def contraction_gflop(call: Callable[[], object]) -> float | None:
    """GFLOP (multiply-adds counted as 2) of one ``call()``; None where torch cannot count it."""
    try:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            call()
        return counter.get_total_flops() / 1e9
    except Exception:  # a counting failure must not fail the benchmark
        return None


def peak_ms(gflop: float | None, peak_gflops: float | None) -> float | None:
    """Milliseconds the contractions take at exactly the FMA peak."""
    return gflop / peak_gflops * 1e3 if gflop and peak_gflops else None
