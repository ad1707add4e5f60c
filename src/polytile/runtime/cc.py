"""Compile generated C with the system compiler into a shared object, through the cache."""
from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import tempfile

from .. import __version__
from ..options import Options
from . import cache

BASE_FLAGS = ("-std=gnu11", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno")
FAST_MATH = ("-fassociative-math", "-fno-signed-zeros", "-ffp-contract=fast")  # Options.fast_math


class CompileError(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise CompileError(f"C compiler {cc!r} not usable: {e}") from e


@functools.lru_cache(maxsize=None)
def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return os.uname().machine


_PROBE = r"""#include <math.h>
float expf(float) __attribute__((simd("notinbranch")));
void pt_probe(float* a, int n) { for (int i = 0; i < n; ++i) a[i] = expf(a[i]); }
"""


@functools.lru_cache(maxsize=None)
def vector_math(cc: str, cflags: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(compile flags, link flags) that let loops calling exp/log/tanh/... vectorize through
    glibc's vector math library (libmvec), when this compiler and C library have it; else
    empty (the loops then call scalar libm)."""
    with tempfile.TemporaryDirectory(prefix="polytile-probe-") as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(_PROBE)
        try:
            r = subprocess.run([cc, *cflags, *BASE_FLAGS, src, "-o", os.path.join(tmp, "probe.so"), "-lmvec", "-lm"],
                               capture_output=True, text=True)
        except OSError:
            return (), ()
    return (("-DPT_LIBMVEC",), ("-lmvec",)) if r.returncode == 0 else ((), ())


def wide_vectors(cflags: tuple[str, ...]) -> tuple[str, ...]:
    """On an AVX-512 CPU, let gcc's auto-vectorized loops use 512-bit vectors too (it prefers
    256 by default on Intel parts): the attention kernel's row loops run faster with them. The
    explicit vector code of the register tiles uses the Target's width either way."""
    if os.uname().machine != "x86_64" or any(f.startswith("-mprefer-vector-width") for f in cflags):
        return ()
    return ("-mprefer-vector-width=512",) if " avx512f" in _cpu_signature() else ()


def build_shared_object(sources: list[str], options: Options) -> tuple[str, bool]:
    """Path of a shared object built from the translation units ``sources`` (compiled in
    parallel, then linked) and whether it came from the cache."""
    cflags = tuple(options.cflags) + (FAST_MATH if options.fast_math else ())
    vm_cflags, vm_libs = vector_math(options.cc, cflags)
    flags = cflags + wide_vectors(cflags) + BASE_FLAGS + vm_cflags
    k = cache.key(*sources, " ".join(flags), compiler_version(options.cc), __version__, _cpu_signature())
    d = cache.usable_dir(options.cache_dir)
    so = os.path.join(d, f"{k}.so")
    if cache.intact(so):
        return so, True
    with tempfile.TemporaryDirectory(dir=d, prefix=".build-") as tmp:
        procs, objs = [], []
        for i, src in enumerate(sources):
            with open(os.path.join(tmp, f"unit{i}.c"), "w") as f:
                f.write(src)
            objs.append(f"unit{i}.o")
            # relative names in the build folder: the object names no temporary path, so that
            # two processes building the same graph write the same bytes
            procs.append(subprocess.Popen([options.cc, *flags, "-c", f"unit{i}.c", "-o", objs[-1]], cwd=tmp,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        errors = []
        for pr in procs:
            _, err = pr.communicate()
            if pr.returncode != 0:
                errors.append(err)
        if errors:
            raise CompileError(f"{options.cc} failed:\n{errors[0][-4000:]}")
        out = os.path.join(tmp, "kernel.so")
        r = subprocess.run([options.cc, *flags, *objs, "-o", "kernel.so", *vm_libs, "-lm"], cwd=tmp,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise CompileError(f"{options.cc} (link) failed:\n{r.stderr[-4000:]}")
        with open(out, "rb") as f:
            data = f.read()
        # the source next to the object for inspection, the object, then its digest: an entry
        # is used only once the digest (written last, atomically) matches the object
        cache.atomic_write_bytes(os.path.join(d, f"{k}.c"), "".join(sources).encode())
        cache.atomic_write_bytes(so, data)
        cache.atomic_write_bytes(cache.checksum_path(so), hashlib.sha256(data).hexdigest().encode())
    return so, False
