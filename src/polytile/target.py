"""The machine the generated code runs on, as the cost models see it.

Detected once from the OS (``/proc/cpuinfo`` flags, ``/sys`` cache sizes, the CPU affinity
mask); ``Options.target`` overrides any field (``{"target": {"vector_bytes": 32}}``). The ISA
flags are those the kernel reports, i.e. what ``-march=native`` will use.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import platform
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Target:
    arch: str                 # x86_64 | aarch64 | ...
    isa: tuple[str, ...]      # vector ISA features present (avx2, fma, avx512f, neon, ...)
    vector_bytes: int         # widest SIMD register the compiler will use
    vector_registers: int     # architectural SIMD registers
    fma: bool
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    cores: int

    def lanes(self, itemsize: int = 4) -> int:
        return max(1, self.vector_bytes // itemsize)


_ISA = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512vl", "avx512bw", "neon", "asimd", "sve")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cache_sizes() -> dict[str, int]:
    out = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for d in sorted(os.listdir(base)):
            if not d.startswith("index"):
                continue
            with open(os.path.join(base, d, "level")) as f:
                level = f.read().strip()
            with open(os.path.join(base, d, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(base, d, "size")) as f:
                size = f.read().strip()
            mult = {"K": 1024, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            n = int(size.rstrip("KMG")) * mult
            if kind in ("Data", "Unified"):
                out[f"l{level}"] = n
    except (OSError, ValueError):
        pass
    return out


@functools.lru_cache(maxsize=None)
def detect() -> Target:
    flags = _cpu_flags()
    arch = platform.machine()
    isa = tuple(f for f in _ISA if f in flags)
    if arch in ("aarch64", "arm64"):
        vb, regs, fma = 16, 32, True
    elif "avx512f" in flags:
        vb, regs, fma = 64, 32, True
    elif "avx2" in flags or "avx" in flags:
        vb, regs, fma = 32, 16, "fma" in flags
    else:
        vb, regs, fma = 16, 16, False
    caches = _cache_sizes()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return Target(arch, isa, vb, regs, fma, caches.get("l1", 32 << 10), caches.get("l2", 512 << 10),
                  caches.get("l3", 8 << 20), cores)


def resolve(overrides: Mapping[str, Any] | None) -> Target:
    """The detected target with ``overrides`` applied (unknown fields raise a ValueError)."""
    t = detect()
    if not overrides:
        return t
    valid = {f.name for f in dataclasses.fields(Target)}
    bad = sorted(set(overrides) - valid)
    if bad:
        raise ValueError(f"polytile: unknown target field(s) {bad}; valid fields are {sorted(valid)}")
    return dataclasses.replace(t, **dict(overrides))
