"""The CPU the generated code runs on, as the CPU backend's cost models see it.

Detected once from the OS (``/proc/cpuinfo`` flags, ``/sys`` cache sizes, the CPU affinity
mask). ``Options.machine`` overrides any field (``{"machine": {"vector_bytes": 32}}``) or
starts from a named description instead of the detected one (``{"machine": {"preset":
"zen3"}}``): the tests that assert the structure of generated code name one, so that they
assert the same thing on every host. The ISA flags are those the kernel reports, i.e. what
``-march=native`` will use; a description wider than the host still runs there (the C
compiler splits the vectors), only slower.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import platform
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class CPUMachine:
    arch: str                 # x86_64 | aarch64 | ...
    isa: tuple[str, ...]      # vector ISA features present (avx2, fma, avx512f, neon, ...)
    vector_bytes: int         # widest SIMD register the compiler will use
    vector_registers: int     # architectural SIMD registers
    fma: bool
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    cores: int

    cache_line: int = 64
    page_bytes: int = 4096
    l1d_ways: int = 8         # associativity of the L1 data cache

    def lanes(self, itemsize: int = 4) -> int:
        return max(1, self.vector_bytes // itemsize)

    @property
    def bf16_dot(self) -> bool:
        """Whether the machine has a bfloat16 pair dot product into float32 (AVX512_BF16's
        ``vdpbf16ps``): bfloat16 contractions then multiply pairs of their elements."""
        return "avx512_bf16" in self.isa

    @property
    def int8_dot(self) -> bool:
        """Whether the machine has an int8 dot product of four-byte groups into int32 lanes
        (AVX512-VNNI's ``vpdpbusd``): quantized contractions then multiply groups of four."""
        return "avx512_vnni" in self.isa

    @property
    def l1_way_bytes(self) -> int:
        """Bytes of one L1 way: addresses this far apart map to the same set."""
        return self.l1d_bytes // self.l1d_ways


_KIB, _MIB = 1 << 10, 1 << 20
_AVX512 = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512vl", "avx512bw")
# Named descriptions of the hosts polytile is tested on (2 cores, as the CI machines have)
PRESETS: dict[str, CPUMachine] = {
    "xeon-avx512": CPUMachine("x86_64", _AVX512, 64, 32, True, 48 * _KIB, 2 * _MIB, 32 * _MIB, 2, l1d_ways=12),
    "zen4": CPUMachine("x86_64", _AVX512 + ("avx512_bf16", "avx512_vnni"), 64, 32, True, 32 * _KIB, 1 * _MIB, 32 * _MIB, 2, l1d_ways=8),
    "zen5": CPUMachine("x86_64", _AVX512 + ("avx512_bf16", "avx512_vnni"), 64, 32, True, 48 * _KIB, 1 * _MIB, 32 * _MIB, 2, l1d_ways=12),
    "zen3": CPUMachine("x86_64", ("sse4_2", "avx", "avx2", "fma"), 32, 16, True, 32 * _KIB, 512 * _KIB,
                       32 * _MIB, 2, l1d_ways=8),
    "sse": CPUMachine("x86_64", ("sse4_2",), 16, 16, False, 32 * _KIB, 256 * _KIB, 8 * _MIB, 2, l1d_ways=8),
    "neon": CPUMachine("aarch64", ("neon", "asimd"), 16, 32, True, 64 * _KIB, 1 * _MIB, 32 * _MIB, 2, l1d_ways=4),
}


_ISA = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512vl", "avx512bw", "avx512_bf16", "avx512_vnni", "neon", "asimd", "sve")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _cache_sizes() -> dict[str, int]:
    """``l1``, ``l2``, ``l3`` sizes, and the L1 data cache's ``l1_ways`` and ``line``, from sysfs."""
    out = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for d in sorted(os.listdir(base)):
            if not d.startswith("index"):
                continue
            level, kind, size = (_read(os.path.join(base, d, f)) for f in ("level", "type", "size"))
            mult = {"K": 1024, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            if kind in ("Data", "Unified"):
                out[f"l{level}"] = int(size.rstrip("KMG")) * mult
            if kind == "Data" and level == "1":
                out["l1_ways"] = int(_read(os.path.join(base, d, "ways_of_associativity")))
                out["line"] = int(_read(os.path.join(base, d, "coherency_line_size")))
    except (OSError, ValueError):
        pass
    return out


@functools.lru_cache(maxsize=None)
def detect() -> CPUMachine:
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
    return CPUMachine(arch, isa, vb, regs, fma, caches.get("l1", 32 << 10), caches.get("l2", 512 << 10),
                      caches.get("l3", 8 << 20), cores, cache_line=caches.get("line") or 64,
                      l1d_ways=caches.get("l1_ways") or 8)


def resolve(overrides: Mapping[str, Any] | None) -> CPUMachine:
    """The detected machine, or the preset that ``overrides["preset"]`` names, with the other
    fields of ``overrides`` applied (unknown fields and presets raise a ValueError)."""
    over = dict(overrides or {})
    name = over.pop("preset", None)
    if name is not None and name not in PRESETS:
        raise ValueError(f"polytile: unknown machine preset {name!r}; presets are {sorted(PRESETS)}")
    t = PRESETS[name] if name is not None else detect()
    if not over:
        return t
    valid = {f.name for f in dataclasses.fields(CPUMachine)}
    bad = sorted(set(over) - valid)
    if bad:
        raise ValueError(f"polytile: unknown machine field(s) {bad}; valid fields are {sorted(valid | {'preset'})}")
    return dataclasses.replace(t, **over)
