"""The machine's measured FMA peak: a tiny generated C loop of independent vector FMAs,
compiled with the same compiler and flags as the kernels, run on every thread."""
from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile

from ..options import Options
from ..backends.cpu.machine import CPUMachine, detect
from ..codegen.c import FMA_ATTRIBUTE

_SRC = r"""
#include <omp.h>
typedef float vf __attribute__((vector_size(%(vb)d)));
__attribute__((%(fma)s)) double pt_peak(long iters, int threads) {
  double t0 = omp_get_wtime();
  float sink = 0;
  #pragma omp parallel num_threads(threads) reduction(+:sink)
  {
    vf b, c;
    for (int i = 0; i < %(lanes)d; ++i) { b[i] = 1.0f - 1e-7f * i; c[i] = 1e-9f; }
%(decl)s
    for (long n = 0; n < iters; ++n) {
%(body)s
    }
    vf s = c;
%(sum)s
    for (int i = 0; i < %(lanes)d; ++i) sink += s[i];
  }
  double dt = omp_get_wtime() - t0;
  return sink == 12345.0f ? 0 : 2.0 * %(lanes)d * %(acc)d * (double)iters * threads / dt;
}
"""


def fma_peak(threads: int, target: CPUMachine | None = None, options: Options | None = None,
             iters: int = 20_000_000) -> float:
    """FLOP/s of the FMA loop on ``threads`` threads (best of three)."""
    t = target or detect()
    o = options or Options()
    acc = max(8, t.vector_registers - 4)
    # one named variable per accumulator: an array of them lets gcc interchange the
    # loops into latency-bound chains kept in memory
    names = [f"a{j}" for j in range(acc)]
    src = _SRC % {
        "vb": t.vector_bytes, "lanes": t.lanes(4),
        "decl": "\n".join(f"    vf {a} = b * {j + 1}.0f;" for j, a in enumerate(names)),
        "body": "\n".join(f"      {a} = {a} * b + c;" for a in names),
        "sum": "\n".join(f"    s += {a};" for a in names),
        "acc": acc,
        # multiply-adds fused as in the contraction kernels (the default flags keep them apart)
        "fma": FMA_ATTRIBUTE,
    }
    return _best_of_three(src, "pt_peak", o, iters, threads)


def _best_of_three(src: str, fn: str, o: Options, iters: int, threads: int) -> float:
    """The C loop ``src`` built with the kernels' compiler and flags; its function ``fn``'s
    FLOP/s, best of three runs."""
    with tempfile.TemporaryDirectory(prefix="polytile-peak-") as d:
        c, so = os.path.join(d, "peak.c"), os.path.join(d, "peak.so")
        with open(c, "w") as f:
            f.write(src)
        subprocess.run([o.cc, *o.cflags, "-fopenmp", "-shared", "-fPIC", c, "-o", so], check=True,
                       capture_output=True)
        run = getattr(ctypes.CDLL(so), fn)
        run.restype = ctypes.c_double
        run.argtypes = [ctypes.c_long, ctypes.c_int]
        return max(run(iters, threads) for _ in range(3))


_BF16_SRC = r"""
#include <omp.h>
#include <immintrin.h>
double pt_bf16_peak(long iters, int threads) {
#if defined(__AVX512BF16__)
  double t0 = omp_get_wtime();
  float sink = 0;
  #pragma omp parallel num_threads(threads) reduction(+:sink)
  {
    __m512bh x = (__m512bh)_mm512_set1_ps(1.0f), y = (__m512bh)_mm512_set1_ps(1e-9f);
%(decl)s
    for (long n = 0; n < iters; ++n) {
%(body)s
      __asm__("" : "+v"(x));
    }
    __m512 s = _mm512_setzero_ps();
%(sum)s
    sink += _mm512_reduce_add_ps(s);
  }
  double dt = omp_get_wtime() - t0;
  return sink == 12345.0f ? 0 : 2.0 * 32 * %(acc)d * (double)iters * threads / dt;
#else
  return 0;
#endif
}
"""


def bf16_dot_peak(threads: int, options: Options | None = None, iters: int = 20_000_000) -> float:
    """FLOP/s of a loop of independent ``vdpbf16ps`` (32 bfloat16 multiply-adds each) on
    ``threads`` threads, best of three; 0 where the compiler does not target AVX512_BF16."""
    o = options or Options()
    acc = 24
    names = [f"a{j}" for j in range(acc)]
    src = _BF16_SRC % {
        "decl": "\n".join(f"    __m512 {a} = _mm512_set1_ps({j + 1}.0f);" for j, a in enumerate(names)),
        "body": "\n".join(f"      {a} = _mm512_dpbf16_ps({a}, x, y);" for a in names),
        "sum": "\n".join(f"    s = _mm512_add_ps(s, {a});" for a in names),
        "acc": acc,
    }
    return _best_of_three(src, "pt_bf16_peak", o, iters, threads)
