"""A GPU scheduling pass: a kernel whose outer parallel band is small and encloses several
sibling nests (a pad writing its interior and each halo side in its own nest) becomes one
kernel per sibling, each with the band around it, so that each sibling's own parallel loops
join the launch grid.

Legal because the band is parallel (isl found no dependence between its iterations, across
all the siblings it encloses): only a sibling's dependence on an earlier one in the same
iteration remains, and the kernels run in the siblings' order. Siblings that share a
kernel-local array or scalar (a fused softmax's row steps) are left together: splitting them
would undo the fusion.
"""
from __future__ import annotations

from dataclasses import replace

from ...affine.ir import For, Kernel, Program
from ...codegen.triton_kernel import outer_band, total

SMALL_BAND = 4096  # band iterations below which the siblings' own loops are needed for parallelism


def split_sibling_nests(p: Program) -> Program:
    out: list[Kernel] = []
    for k in p.kernels:
        band, inner = outer_band(k.body)
        if k.contraction or len(inner) < 2 or total(band) >= SMALL_BAND or not all(isinstance(s, For) for s in inner):
            out.append(k)
            continue
        for i, s in enumerate(inner):
            body: tuple = (s,)
            for f in reversed(band):
                body = (replace(f, body=body),)
            out.append(replace(k, name=f"{k.name}_{i}", body=body))
    return replace(p, kernels=tuple(out))
