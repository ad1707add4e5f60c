"""The GPU machine description: what the GPU cost model reads (``plan.plan_kernels``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class GPUMachine:
    name: str
    capability: int            # compute capability as 10 * major + minor: 80, 90, 100
    sm_count: int
    smem_per_block: int        # bytes of shared memory one block may use (opt-in maximum)
    regs_per_sm: int = 65536
    warp_size: int = 32
    max_threads_per_block: int = 1024
    mma: tuple[int, int, int] = (16, 8, 16)  # the tensor-core instruction's m, n, k (fp16)

    @property
    def arch(self) -> str:
        """Triton's target architecture name (``sm_90a`` style suffix for wgmma-capable chips)."""
        return f"sm_{self.capability}" + ("a" if self.capability in (90, 100) else "")


PRESETS: dict[str, GPUMachine] = {
    "a100": GPUMachine("a100", 80, 108, 166912, mma=(16, 8, 16)),
    "h100": GPUMachine("h100", 90, 132, 232448, mma=(64, 256, 16)),
    "h200": GPUMachine("h200", 90, 132, 232448, mma=(64, 256, 16)),
    "b200": GPUMachine("b200", 100, 148, 232448, mma=(128, 256, 16)),
}


def detect() -> GPUMachine:
    """The visible CUDA device, or the H100 description when there is none (compiling ahead of
    time, or running kernels in Triton's interpreter)."""
    try:
        import torch

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(torch.cuda.current_device())
            cap = 10 * p.major + p.minor
            base = min(PRESETS.values(), key=lambda m: abs(m.capability - cap))
            smem = getattr(p, "shared_memory_per_block_optin", 0) or base.smem_per_block
            return dataclasses.replace(base, name=p.name, capability=cap, sm_count=p.multi_processor_count,
                                       smem_per_block=smem)
    except Exception:  # no driver: the default description
        pass
    return PRESETS["h100"]


def resolve(overrides: Mapping[str, Any] | None) -> GPUMachine:
    o = dict(overrides or {})
    preset = o.pop("preset", None)
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"polytile: unknown GPU preset {preset!r}; presets are {sorted(PRESETS)}")
    m = PRESETS[preset] if preset else detect()
    names = {f.name for f in dataclasses.fields(GPUMachine)}
    bad = sorted(set(o) - names)
    if bad:
        raise ValueError(f"polytile: unknown GPU machine fields {bad}; fields are {sorted(names)}")
    return dataclasses.replace(m, **o)
