"""int8 versions of the benchmark models: PyTorch 2 export quantization (``prepare_pt2e`` /
``convert_pt2e`` with the x86 quantizer: uint8 activations per tensor, int8 weights per
channel), calibrated on the model's own inputs. Every system then runs the same converted
model: eager runs its quantize/dequantize ops as PyTorch's reference, Inductor (with
``freezing=True``) its int8 path."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

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


def varied_inputs(w: Workload, n: int, seed: int = 0) -> list[tuple[tuple, dict]]:
    """The workload's own inputs and ``n`` more of the same shapes and types: integer tensors
    (token ids, masks) drawn uniformly within their own range, floating tensors normal with
    their own mean and deviation, anything else as it is."""
    g = torch.Generator().manual_seed(seed)

    def vary(x):
        if not isinstance(x, torch.Tensor) or x.dtype == torch.bool or x.numel() == 0:
            return x
        if x.is_floating_point():
            return (torch.randn(x.shape, generator=g) * x.float().std() + x.float().mean()).to(x.dtype)
        return torch.randint(int(x.min()), int(x.max()) + 1, x.shape, generator=g, dtype=x.dtype)

    own = (tuple(w.args), dict(w.kwargs or {}))
    return [own] + [tree_map(vary, own) for _ in range(n)]


def close_to_reference(outs: list, refs: list, float_outs: list) -> tuple[bool, list[str]]:
    """Whether the outputs ``outs`` (one per input) are as good a quantized result as the
    quantized model's eager outputs ``refs``. Both quantize float32 values computed in a
    different order, and a value within a float32 rounding of a quantization boundary lands one
    step away; in a deep model such steps spread to every output. So the rule of DESIGN.md
    with the float model's outputs ``float_outs`` as the reference: RMSE(out, float_out) <= 1.5
    RMSE(ref, float_out) + 1e-6 of the output's range (the quantization error itself sets the
    scale), each output's errors pooled over the inputs: a classifier's few logits give an
    RMSE of one input that moves by 4x from input to input (GPT-2's two scores: eager int8
    0.0027 to 0.0119 over six inputs), too few values to tell a result from luck."""
    details = []
    per_input = [list(zip(tree_leaves(o), tree_leaves(r), tree_leaves(f))) for o, r, f in zip(outs, refs, float_outs)]
    for k in range(len(per_input[0])):
        if not isinstance(per_input[0][k][1], torch.Tensor) or not per_input[0][k][1].is_floating_point():
            continue
        o, r, f = (torch.cat([leaves[k][j].double().flatten() for leaves in per_input]) for j in range(3))
        e_out, e_ref = (o - f).pow(2).mean().sqrt().item(), (r - f).pow(2).mean().sqrt().item()
        if not e_out <= 1.5 * e_ref + 1e-6 * f.abs().max().item():
            details.append(f"out[{k}]: RMSE vs the float model {e_out:.3g} > 1.5 x eager int8's {e_ref:.3g}"
                           f" (over {len(outs)} inputs)")
    return not details, details
