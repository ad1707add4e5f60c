"""int8 versions of the benchmark models: PyTorch 2 export quantization (``prepare_pt2e`` /
``convert_pt2e`` with the x86 quantizer: uint8 activations per tensor, int8 weights per
channel), calibrated on the model's own inputs. Every system then runs the same converted
model: eager runs its quantize/dequantize ops as PyTorch's reference, Inductor (with
``freezing=True``) its int8 path."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from .zoo import Workload


def int8_pt2e(w: Workload) -> Workload:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    m = torch.export.export(w.model.eval(), tuple(w.args), dict(w.kwargs or {})).module()
    q = xiq.X86InductorQuantizer()
    q.set_global(xiq.get_default_x86_inductor_quantization_config())
    m = prepare_pt2e(m, q)
    with torch.no_grad():
        m(*w.args, **(w.kwargs or {}))  # calibration
    return replace(w, model=convert_pt2e(m))


def close_to_reference(out: Any, ref: Any, float_out: Any) -> tuple[bool, list[str]]:
    """Whether ``out`` is as good a quantized result as the quantized model's eager output
    ``ref``. Both quantize float32 values computed in a different order, and a value within a
    float32 rounding of a quantization boundary lands one step away; in a deep model such steps
    spread to every output. So the rule of DESIGN.md with the float model's output
    ``float_out`` as the reference: RMSE(out, float_out) <= 1.5 RMSE(ref, float_out) + 1e-6 of
    the output's range (the quantization error itself sets the scale)."""
    details = []
    for k, (o, r, f) in enumerate(zip(tree_leaves(out), tree_leaves(ref), tree_leaves(float_out))):
        if not isinstance(r, torch.Tensor) or not r.is_floating_point():
            continue
        o, r, f = o.double(), r.double(), f.double()
        e_out, e_ref = (o - f).pow(2).mean().sqrt().item(), (r - f).pow(2).mean().sqrt().item()
        if not e_out <= 1.5 * e_ref + 1e-6 * f.abs().max().item():
            details.append(f"out[{k}]: RMSE vs the float model {e_out:.3g} > 1.5 x eager int8's {e_ref:.3g}")
    return not details, details
