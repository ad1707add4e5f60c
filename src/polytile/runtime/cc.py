"""Compile generated C with the system compiler into a shared object, through the cache."""
from __future__ import annotations

import functools
import os
import subprocess
import tempfile

from .. import __version__
from ..options import Options
from . import cache

BASE_FLAGS = ("-std=gnu11", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno")


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


def build_shared_object(source: str, options: Options) -> tuple[str, bool]:
    """Path of a shared object for ``source`` and whether it came from the cache."""
    flags = tuple(options.cflags) + BASE_FLAGS
    k = cache.key(source, " ".join(flags), compiler_version(options.cc), __version__, _cpu_signature())
    d = cache.ensure_private_dir(options.cache_dir)
    so = os.path.join(d, f"{k}.so")
    if os.path.exists(so):
        return so, True
    with tempfile.TemporaryDirectory(dir=d, prefix=".build-") as tmp:
        src = os.path.join(tmp, "kernel.c")
        with open(src, "w") as f:
            f.write(source)
        out = os.path.join(tmp, "kernel.so")
        r = subprocess.run([options.cc, *flags, src, "-o", out, "-lm"], capture_output=True, text=True)
        if r.returncode != 0:
            raise CompileError(f"{options.cc} failed:\n{r.stderr[-4000:]}")
        with open(out, "rb") as f:
            cache.atomic_write_bytes(so, f.read())
        # keep the source next to the object for inspection
        cache.atomic_write_bytes(os.path.join(d, f"{k}.c"), source.encode())
    return so, False
