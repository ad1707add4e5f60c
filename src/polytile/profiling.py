"""Per-kernel times of graphs compiled with ``options={"profile": True}``.

The generated entry point times each kernel call (``clock_gettime`` around it) into arrays
it exports; this module reads them from every live profiled graph."""
from __future__ import annotations

import ctypes
import threading
import weakref

_graphs: "weakref.WeakSet" = weakref.WeakSet()
_lock = threading.Lock()


def register(graph) -> None:
    with _lock:
        _graphs.add(graph)


def _arrays(graph):
    lib = graph._lib
    n = ctypes.c_int.in_dll(lib, "pt_prof_count").value
    ns = (ctypes.c_double * max(1, n)).in_dll(lib, "pt_prof_ns")
    calls = (ctypes.c_longlong * max(1, n)).in_dll(lib, "pt_prof_calls")
    names = (ctypes.c_char_p * max(1, n)).in_dll(lib, "pt_prof_names")
    return n, ns, calls, names


def profile(reset: bool = False) -> list[dict]:
    """One row per kernel call site of every live profiled graph, slowest first:
    ``{"graph", "kernel", "calls", "ms" (total), "ms_per_call"}``. ``reset`` zeroes the counters
    after reading them."""
    rows = []
    with _lock:
        graphs = list(_graphs)
    for g in graphs:
        n, ns, calls, names = _arrays(g)
        for i in range(n):
            if calls[i]:
                ms = ns[i] / 1e6
                rows.append({"graph": g.name, "kernel": names[i].decode(), "calls": int(calls[i]), "ms": ms,
                             "ms_per_call": ms / calls[i]})
            if reset:
                ns[i], calls[i] = 0.0, 0
    rows.sort(key=lambda r: -r["ms"])
    return rows


def format_profile(rows: list[dict] | None = None, top: int = 25) -> str:
    """A text table of ``profile()`` rows (the ``top`` slowest and the total)."""
    rows = profile() if rows is None else rows
    total = sum(r["ms"] for r in rows) or 1.0
    out = [f"{'ms':>10} {'%':>6} {'calls':>6}  kernel"]
    for r in rows[:top]:
        out.append(f"{r['ms']:10.3f} {100 * r['ms'] / total:6.1f} {r['calls']:6d}  {r['kernel'][:110]}")
    out.append(f"{total:10.3f}  total over {len(rows)} call sites")
    return "\n".join(out)
