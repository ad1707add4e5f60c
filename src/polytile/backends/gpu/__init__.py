"""The NVIDIA GPU backend: Triton kernels derived from the affine program.

Its machine description is ``machine.GPUMachine`` (SM count, shared memory, tensor-core
shapes; detected from the visible device, or a preset); its cost model (``plan``) gives each
kernel a ``KernelPlan``: a block tile with ``tl.dot`` for contractions, lanes for the rest;
``emit`` renders the kernels (``codegen.triton``), imports them and returns a
``runtime.triton_launcher.TritonGraph``.

Without a GPU, the kernels run in Triton's interpreter on CPU tensors when
``TRITON_INTERPRET=1`` is set before Triton is imported (the test suite does so): the
backend then accepts CPU inputs (``options={"target": "gpu"}``). The same kernels compile
ahead of time for sm_80 / sm_90a / sm_100a without a driver (``aot``).
"""
from __future__ import annotations

import time
from typing import Any, Mapping

from ... import counters as stats
from ...codegen.triton import render_module
from ...options import triton_interpreter
from ...runtime.memory_plan import plan_memory
from .. import Backend, EmitRequest, Pass
from .attention import lower_attention
from .machine import GPUMachine, resolve
from .plan import Precision as _Precision
from .split_nests import split_sibling_nests
from .plan import plan_kernels


def fp32_matmul_precision() -> str:
    """tl.dot's input precision for fp32 matmul operands, as torch users set it
    (``torch.backends.cuda.matmul.allow_tf32`` / ``torch.set_float32_matmul_precision``)."""
    import torch

    return "tf32" if torch.get_float32_matmul_precision() != "highest" else "ieee"


def fp32_conv_precision() -> str:
    """... for fp32 convolutions, as eager's cuDNN convolutions (``torch.backends.cudnn.allow_tf32``,
    on by default)."""
    import torch

    return "tf32" if torch.backends.cudnn.allow_tf32 else "ieee"


class GPUBackend(Backend):
    name = "gpu"
    device = "cuda"

    def accepts(self, device: str) -> bool:
        return device == "cuda" or (device == "cpu" and triton_interpreter())

    def machine(self, overrides: Mapping[str, Any] | None) -> GPUMachine:
        return resolve(overrides)

    def op_lowerings(self, machine: GPUMachine, options) -> dict:
        return {"attention": lambda b, n: b.emit(n, lower_attention(b, n))}

    def passes(self, machine: GPUMachine, options) -> list[Pass]:
        # (the rest of the kernels' mapping onto the GPU is the plan's: see ``emit``)
        return [("split_sibling_nests", split_sibling_nests)]

    def emit(self, prog, request: EmitRequest):
        from ...runtime.triton_launcher import TritonGraph, load_module

        o = request.options
        t0 = time.perf_counter()
        plans = plan_kernels(prog, request.machine, _Precision(o.mm_conv_precision or fp32_matmul_precision(),
                                                               o.mm_conv_precision or fp32_conv_precision()))
        mem = plan_memory(prog)
        src, kernels = render_module(prog, plans)
        if request.dumper:
            request.dumper.write("kernels.py", src)
        mod, path = load_module(src, o.cache_dir)
        stats.add_phase("Triton rendering and import", time.perf_counter() - t0)
        stats.bump("intermediate_bytes", mem.temp_bytes)
        stats.bump("arena_bytes", mem.arena_bytes)
        stats.bump("gpu_dot_kernels", sum(1 for k in kernels if k.plan.kind == "dot"))
        stats.bump("gpu_lane_kernels", sum(1 for k in kernels if k.plan.kind == "lanes"))
        stats.bump("gpu_row_kernels", sum(1 for k in kernels if k.plan.kind == "rows"))
        stats.bump("gpu_flash_kernels", sum(1 for k in kernels if k.plan.kind == "flash"))
        stats.bump("gpu_scratch_arrays", sum(len(k.scratch) for k in kernels))
        device = "cpu" if triton_interpreter() else "cuda"
        g = TritonGraph(mod, path, kernels, {b.name: b for b in prog.buffers}, mem.offsets, mem.arena_bytes,
                        request.input_specs, request.output_specs, device, request.name, request.input_labels,
                        cuda_graphs=o.cuda_graphs)
        g.source = src
        return g
