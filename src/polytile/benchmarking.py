"""Side-by-side timing: systems run alternately (A B C A B C ...), medians after warm-up."""
from __future__ import annotations

import statistics
import time
from typing import Callable, Mapping


def time_side_by_side(fns: Mapping[str, Callable[[], object]], *, warmup: int = 2, rounds: int = 10,
                      min_seconds: float = 0.0) -> dict[str, float]:
    """Median seconds per call of each zero-argument function, measured alternately."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    start = time.perf_counter()
    r = 0
    while r < rounds or time.perf_counter() - start < min_seconds:
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            samples[k].append(time.perf_counter() - t)
        r += 1
    return {k: statistics.median(v) for k, v in samples.items()}


def format_table(headers: list[str], rows: list[list[object]]) -> str:
    """A markdown table."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells]
    return "\n".join(out)
