"""Run a graph compiled to Triton kernels: one launch per kernel, in order, on one device.

Temporaries share one arena in device memory (the static plan of ``runtime.memory_plan``);
kernel-local arrays get scratch buffers; inputs are checked as on the CPU path (a tensor in
another layout is copied into the compiled one). The module is imported from a file in the
cache directory (Triton reads the kernels' source from it)."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading

import torch

from .. import counters as stats
from ..dtypes import ITEMSIZE, to_torch
from .cache import usable_dir
from .loader import KernelRuntimeError, TensorSpec, check_inputs


def load_module(source: str, cache_dir: str):
    """The module of ``source``, written to (or found in) the cache directory by its hash."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    d = os.path.join(usable_dir(cache_dir), "triton")
    os.makedirs(d, mode=0o700, exist_ok=True)
    path = os.path.join(d, f"pt_{digest}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    name = f"polytile_triton_{digest}"
    if name in sys.modules:
        return sys.modules[name], path
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod, path


class TritonGraph:
    """A compiled graph: ``graph(*tensors) -> list of output tensors`` on ``device``."""

    def __init__(self, module, module_path: str, kernels: list, buffers: dict, offsets: dict,
                 arena_bytes: int, inputs: list[TensorSpec], outputs: list[TensorSpec], device: str,
                 name: str = "graph", input_labels: list[str] | None = None, cuda_graphs: bool = True):
        self.module, self.module_path, self.kernels = module, module_path, kernels
        self.buffers, self.offsets, self.arena_bytes = buffers, offsets, arena_bytes
        self.inputs, self.outputs, self.device, self.name = inputs, outputs, device, name
        self.input_labels = input_labels or [f"input {k}" for k in range(len(inputs))]
        self._in_dtypes = [to_torch(s.dtype) for s in inputs]
        self._fns = [getattr(module, k.name) for k in kernels]
        self._arena = None
        self._temps: dict[str, torch.Tensor] = {}
        self._scratch: dict[tuple[str, str], torch.Tensor] = {}
        self._lock = threading.Lock()
        self.relayouts = 0
        self.calls = 0
        self._uses_fail = any(k.uses_fail for k in kernels)
        # on a CUDA device, the launch sequence is captured as a CUDA graph at the second call
        self.cuda_graphs = cuda_graphs
        self._graph = None

    def check(self, args) -> list:
        """The arguments checked against the compiled specs, relayouted where needed (as on the CPU)."""
        out, copied = check_inputs(args, self.inputs, self._in_dtypes, self.input_labels, self.name, self.device)
        self.relayouts += copied
        return out

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        args = self.check(args)
        dev = args[0].device if args else torch.device(self.device)
        with self._lock:
            if self._arena is None or self._arena.device != dev:
                self._arena = torch.empty(max(self.arena_bytes, 64), dtype=torch.uint8, device=dev)
                # the temporaries' typed views of the arena, made once
                self._temps = {b.name: self._arena[self.offsets[b.name]:self.offsets[b.name] + b.size * ITEMSIZE[b.dtype]]
                               .view(to_torch(b.dtype)) for b in self.buffers.values() if b.kind not in ("input", "output")}
                self._scratch.clear()
                self._graph = None
            if self._graph is not None:
                return self._replay(args)
            outs = [torch.empty_strided(s.shape, s.strides, dtype=to_torch(s.dtype), device=dev) for s in self.outputs]
            err = torch.zeros(1, dtype=torch.int32, device=dev) if self._uses_fail else None
            self._launch(args, outs, err, dev)
            self.calls += 1
            if self.cuda_graphs and dev.type == "cuda" and self.calls == 2:
                self._capture(args, dev)
        self._check_error(err)
        return outs

    def _launch(self, args, outs, err, dev) -> None:
        """Every kernel once, in order, on the buffers of this call."""
        bound = dict(self._temps)
        for b in self.buffers.values():
            if b.kind == "input":
                bound[b.name] = args[b.index]
            elif b.kind == "output":
                bound[b.name] = outs[b.index]
        for fn, k in zip(self._fns, self.kernels):
            scratch = [self._scratch_for(k, s, n, dev) for s, n in k.scratch.items()]
            fn[(k.grid,)](*[bound[b] for b in k.buffers], *scratch, *([err] if k.uses_fail else []), **k.constexprs,
                          num_warps=k.plan.warps, num_stages=k.plan.stages)

    def _check_error(self, err) -> None:
        if err is not None and int(err.item()):
            raise KernelRuntimeError(f"polytile {self.name}: index out of range in an indexing op")

    def _capture(self, args, dev) -> None:
        """Record the launch sequence as a CUDA graph over fixed input, output and error buffers
        (the kernels are compiled by now): later calls copy their inputs in, replay it and
        hand out copies of the outputs. One launch instead of one per kernel. Any failure to
        capture leaves the graph launching kernel by kernel."""
        try:
            ins = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=dev) for t in args]
            outs = [torch.empty_strided(s.shape, s.strides, dtype=to_torch(s.dtype), device=dev) for s in self.outputs]
            err = torch.zeros(1, dtype=torch.int32, device=dev) if self._uses_fail else None
            torch.cuda.synchronize(dev)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                if err is not None:
                    err.zero_()
                self._launch(ins, outs, err, dev)
            self._graph = (g, ins, outs, err)
            stats.bump("cuda_graphs")
        except Exception as e:  # noqa: BLE001  (kernels still run one launch each)
            self.cuda_graphs = False
            import warnings

            warnings.warn(f"polytile {self.name}: CUDA graph capture failed ({type(e).__name__}: {e}); "
                          "launching kernel by kernel")

    def _replay(self, args) -> list[torch.Tensor]:
        g, ins, outs, err = self._graph
        for dst, src in zip(ins, args):
            dst.copy_(src)
        g.replay()
        res = [o.clone() for o in outs]
        self._check_error(err)
        return res

    def _scratch_for(self, k, name: str, n: int, dev) -> torch.Tensor:
        key = (k.name, name)
        t = self._scratch.get(key)
        if t is None:
            elements, dtype = n
            t = self._scratch[key] = torch.empty(elements, dtype=to_torch(dtype), device=dev)
        return t
