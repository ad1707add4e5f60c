"""Load a compiled graph and run it: one native call per execution, inputs checked first."""
from __future__ import annotations

import ctypes
import math
import threading
from dataclasses import dataclass
from typing import Mapping

import torch

from .. import counters as stats
from ..dtypes import to_torch
from ..graph.symbols import evaluate, solve
from .output_pool import MIN_POOLED_BYTES, OutputPool
from .weight_cache import CacheSets


class InputMismatchError(TypeError):
    """A compiled graph was called with inputs unlike the ones it was compiled for."""


class LayoutMismatchError(InputMismatchError):
    """An input's strides differ from the compiled ones in a way a copy cannot repair (the
    caller may run the graph's ops in ATen instead)."""


class KernelRuntimeError(RuntimeError):
    """A generated kernel reported an error (e.g. an index out of range)."""


_ERRORS = {1: "index out of range in an indexing op (index_select / embedding / gather / index_put / scatter)",
           2: "out of memory for a temporary sized by the call's sizes"}


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    static: bool = False  # a parameter or buffer: values derived from it may be kept between calls

    def describe(self) -> str:
        return f"{self.dtype}{list(self.shape)} strides {list(self.strides)}"


def _empty_maker():
    """A function (shape, strides, dtype) -> uninitialized CPU tensor: torch's C fast path that
    compiled Inductor code uses (about a third of the cost of ``torch.empty``) where this torch
    has it."""
    try:
        from torch._C._dynamo.guards import _empty_strided_cpu

        _empty_strided_cpu((1,), (1,), torch.float32)
        return _empty_strided_cpu
    except (ImportError, AttributeError, TypeError, RuntimeError):
        return lambda shape, strides, dtype: torch.empty_strided(shape, strides, dtype=dtype)


_empty = _empty_maker()


def _same_strides(t: torch.Tensor, spec: TensorSpec) -> bool:
    return all(s == e or n <= 1 for s, e, n in zip(t.stride(), spec.strides, spec.shape))


def _copyable(spec: TensorSpec) -> bool:
    """Whether a tensor laid out as ``spec`` can be written element by element: no two indices
    share an address (dims of size > 1 sorted by stride, each stride at least the extent of
    the dims inside it)."""
    extent = 1
    for n, s in sorted(((n, s) for n, s in zip(spec.shape, spec.strides) if n > 1), key=lambda d: d[1]):
        if s < extent:
            return False
        extent = s * n
    return True


def check_inputs(args, specs: list[TensorSpec], dtypes: list, labels: list[str], name: str,
                 device: str) -> tuple[list, int]:
    """(``args`` as compiled code of ``device`` reads them, how many were copied into the
    compiled layout): see ``NativeGraph.check``; shared by every backend's runtime."""
    if len(args) != len(specs):
        raise InputMismatchError(f"polytile {name}: expected {len(specs)} inputs, got {len(args)}")
    out = list(args)
    copied = 0
    for k, (label, t, spec, dt) in enumerate(zip(labels, args, specs, dtypes)):
        if not isinstance(t, torch.Tensor):
            raise InputMismatchError(f"polytile {name}: {label} is {type(t).__name__}, not a tensor")
        if t.device.type != device:
            raise InputMismatchError(f"polytile {name}: {label} is on {t.device}; compiled for {device}")
        if t.dtype != dt or tuple(t.shape) != spec.shape:
            raise InputMismatchError(
                f"polytile {name}: {label} is {str(t.dtype).replace('torch.', '')}{list(t.shape)}; "
                f"compiled for {spec.describe()}")
        if not _same_strides(t, spec):
            if not _copyable(spec):
                raise LayoutMismatchError(
                    f"polytile {name}: {label} has strides {list(t.stride())}; compiled for "
                    f"{spec.describe()}, a layout it cannot be copied into")
            out[k] = torch.empty_strided(spec.shape, spec.strides, dtype=dt, device=t.device).copy_(t)
            copied += 1
            stats.bump("input_relayouts")
    return out, copied


class NativeGraph:
    """A compiled graph: ``graph(*tensors) -> list of output tensors``."""

    def __init__(self, so_path: str, inputs: list[TensorSpec], outputs: list[TensorSpec],
                 arena_bytes: int, threads: int, entry: str = "pt_entry", name: str = "graph",
                 input_labels: list[str] | None = None, reuse_outputs: bool = True,
                 cache_bytes: int = 0, cached_inputs: tuple[int, ...] = (), refresh: str = "pt_refresh"):
        self.so_path = so_path
        self._lib = ctypes.CDLL(so_path)
        self._fn, self._refresh = (self._entry(e) for e in (entry, refresh))
        # the cached kernels (``cache_static``): their results live in ``cache`` between calls,
        # one set per group of parameter tensors, recomputed when the storage or version of one
        # of the parameters they read changes
        self.cache_bytes = cache_bytes
        self.cache = CacheSets(cache_bytes)
        self.cached_inputs = tuple(cached_inputs)
        self._no_cache: torch.Tensor | None = None
        self.refreshes = 0  # how many times the cached kernels ran
        self.relayouts = 0  # inputs copied into the compiled layout
        self.inputs, self.outputs = inputs, outputs
        self._in_dtypes = [to_torch(s.dtype) for s in inputs]
        self._out_dtypes = [to_torch(s.dtype) for s in outputs]
        self.arena_bytes = arena_bytes
        self.arena: torch.Tensor | None = None  # allocated on the first call (compile may run under fake mode)
        self.threads = threads
        self.name = name
        self.input_labels = input_labels or [f"input {k}" for k in range(len(inputs))]
        self._nargs = len(inputs) + len(outputs) + 2
        self._argv_type = ctypes.c_void_p * self._nargs
        self._expect = [(dt, s.shape, s.strides) for dt, s in zip(self._in_dtypes, inputs)]
        self._out_make = [(s.shape, s.strides, dt) for s, dt in zip(outputs, self._out_dtypes)]  # contiguous
        sizes = [math.prod(s.shape) * dt.itemsize for s, dt in zip(outputs, self._out_dtypes)]
        self._out_bytes = [n if reuse_outputs and n >= MIN_POOLED_BYTES else 0 for n in sizes]
        # two calls' worth: the caller usually holds the last result while the next one is made
        self.output_pool = OutputPool(2 * sum(self._out_bytes)) if any(self._out_bytes) else None
        self._lock = threading.Lock()
        self._argv = self._argv_type()  # filled and used under the lock

    def _entry(self, name: str):
        fn = getattr(self._lib, name)
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        fn.restype = ctypes.c_int
        return fn

    def _cache_for(self, args):
        """(the cache the call's parameters select, whether the cached kernels must run into it)."""
        if not self.cached_inputs:
            return self._no_cache, False
        return self.cache.select(tuple(args[i] for i in self.cached_inputs))

    def _refresh_cache(self, argv) -> int:
        """Run the cached kernels into the selected cache (under the lock); their error code."""
        err = self._refresh(argv, self.threads)
        if not err:  # (a failed refresh is retried on the next call)
            self.cache.done()
            self.refreshes += 1
            stats.bump("cache_refreshes")
        return err

    def check(self, args) -> list:
        """The arguments as the compiled code reads them: each one checked against its spec, and
        one whose strides differ but which holds the same values (dtype, shape, device) copied
        into the compiled layout. Raises ``InputMismatchError`` for a call that can never be
        valid (count, type, dtype, shape, device) and for a layout that cannot be copied into
        (a compiled layout whose elements overlap, as an expanded input: the compiled code
        relies on the repeated values)."""
        out, copied = check_inputs(args, self.inputs, self._in_dtypes, self.input_labels, self.name, "cpu")
        self.relayouts += copied
        return out

    def _fast_ok(self, args) -> bool:
        """The common case in one pass: exactly the compiled dtype, shape and strides on cpu."""
        if len(args) != len(self._expect):
            return False
        for t, (dt, shape, strides) in zip(args, self._expect):
            if not isinstance(t, torch.Tensor) or t.dtype != dt or t.shape != shape or t.stride() != strides \
                    or not t.is_cpu:
                return False
        return True

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        if not self._fast_ok(args):
            args = self.check(args)
        if self.arena is None:
            self.arena = torch.empty(max(self.arena_bytes, 64), dtype=torch.uint8)
            self._no_cache = torch.empty(64, dtype=torch.uint8)
        # (a pooled size is nonzero only where there is a pool)
        outs = [self.output_pool.empty(shape, strides, dt, n) if n else _empty(shape, strides, dt)
                for (shape, strides, dt), n in zip(self._out_make, self._out_bytes)]
        with self._lock:
            argv = self._argv
            cache, stale = self._cache_for(args)
            argv[:] = [*[t.data_ptr() for t in args], *[t.data_ptr() for t in outs], self.arena.data_ptr(),
                       cache.data_ptr()]
            err = self._refresh_cache(argv) if stale else 0
            if not err:
                err = self._fn(argv, self.threads)
        if err:
            raise KernelRuntimeError(f"polytile {self.name}: {_ERRORS.get(err, f'kernel error {err}')}")
        return outs


class SymbolicGraph(NativeGraph):
    """A compiled graph whose sizes are symbols (``graph.symbols``): one native library for
    every size. Each call binds the symbols from its inputs' shapes (or takes them from the
    caller, ``symbols=``), checks the inputs against the specs evaluated with them, allocates
    the outputs, and passes the values to the entry point after the cache pointer."""

    def __init__(self, so_path: str, inputs: list[TensorSpec], outputs: list[TensorSpec], arena_bytes: int,
                 threads: int, symbols: list[str], name: str = "graph", input_labels: list[str] | None = None,
                 cache_bytes: int = 0, cached_inputs: tuple[int, ...] = ()):
        self.symbols = list(symbols)
        self._sizes_type = ctypes.c_int64 * max(1, len(self.symbols))
        super().__init__(so_path, inputs, outputs, arena_bytes, threads, name=name, input_labels=input_labels,
                         reuse_outputs=False, cache_bytes=cache_bytes, cached_inputs=cached_inputs)
        self._argv_type = ctypes.c_void_p * (self._nargs + 1)
        self._argv = self._argv_type()
        self._made: dict = {}

    def bind(self, args, symbols: Mapping[str, int] | None = None) -> dict[str, int]:
        """The symbols' values for this call: ``symbols`` and what the inputs' shapes determine."""
        env = {s: symbols[s] for s in self.symbols if s in symbols} if symbols else {}
        if len(env) == len(self.symbols):  # given by the caller: the shapes are checked against them
            return env
        dims, vals = [], []
        for k, (t, spec) in enumerate(zip(args, self.inputs)):
            if not isinstance(t, torch.Tensor) or t.dim() != len(spec.shape):
                raise InputMismatchError(f"polytile {self.name}: {self.input_labels[k]} is not a tensor of "
                                         f"{len(spec.shape)} dims (compiled for {spec.describe()})")
            dims += spec.shape
            vals += t.shape
        if not solve(dims, vals, env) or set(self.symbols) - env.keys():
            raise InputMismatchError(
                f"polytile {self.name}: the inputs' shapes {[list(t.shape) for t in args]} do not fit the compiled "
                f"sizes {[list(s.shape) for s in self.inputs]}")
        return env

    def __call__(self, *args: torch.Tensor, symbols: Mapping[str, int] | None = None) -> list[torch.Tensor]:
        if len(args) != len(self.inputs):
            raise InputMismatchError(f"polytile {self.name}: expected {len(self.inputs)} inputs, got {len(args)}")
        env = self.bind(args, symbols)
        key = tuple(env[s] for s in self.symbols)
        made = self._made.get(key)
        if made is None:  # the specs with these sizes (a decoding loop meets each length once or twice)
            if len(self._made) > 64:
                self._made.clear()
            made = self._made[key] = (
                [TensorSpec(evaluate(s.shape, env), evaluate(s.strides, env), s.dtype, s.static) for s in self.inputs],
                [(evaluate(s.shape, env), evaluate(s.strides, env), dt) for s, dt in zip(self.outputs, self._out_dtypes)])
        specs, out_make = made
        args, copied = check_inputs(args, specs, self._in_dtypes, self.input_labels, self.name, "cpu")
        self.relayouts += copied
        if self.arena is None:
            self.arena = torch.empty(max(self.arena_bytes, 64), dtype=torch.uint8)
            self._no_cache = torch.empty(64, dtype=torch.uint8)
        outs = [_empty(shape, strides, dt) for shape, strides, dt in out_make]
        sizes = self._sizes_type(*key)
        with self._lock:
            argv = self._argv
            cache, stale = self._cache_for(args)
            argv[:] = [*[t.data_ptr() for t in args], *[t.data_ptr() for t in outs], self.arena.data_ptr(),
                       cache.data_ptr(), ctypes.addressof(sizes)]
            err = self._refresh_cache(argv) if stale else 0
            if not err:
                err = self._fn(argv, self.threads)
        if err:
            raise KernelRuntimeError(f"polytile {self.name}: {_ERRORS.get(err, f'kernel error {err}')}")
        return outs
