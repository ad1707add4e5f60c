"""int8-quantized models from PyTorch 2 export quantization (``prepare_pt2e`` /
``convert_pt2e`` with the x86 quantizer: uint8 activations per tensor, int8 weights per
channel), compiled with no fallback (``frontend.torch.lower_quant``) and compared with
PyTorch's own quantized reference: the converted model run eagerly. Both quantize the same
float32 values; where a value lands within a float32 rounding of a quantization boundary the
two may round it to neighbouring steps, so the check is: at most a few elements one output
step apart, none further."""
from __future__ import annotations

import pytest
import torch

import polytile
from polytile.bench.quantize import close_to_reference

from machines import NUMERIC

pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
xiq = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")


def _quantized(model: torch.nn.Module, x: torch.Tensor) -> torch.nn.Module:
    m = torch.export.export(model.eval(), (x,)).module()
    q = xiq.X86InductorQuantizer()
    q.set_global(xiq.get_default_x86_inductor_quantization_config())
    m = pt2e.prepare_pt2e(m, q)
    for _ in range(3):
        m(x + 0.1 * torch.randn_like(x))  # calibration
    return pt2e.convert_pt2e(m)


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 96), torch.nn.ReLU(),
                               torch.nn.Linear(96, 10))


def _cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, stride=2),
                               torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))


@pytest.mark.parametrize("preset", NUMERIC)
@pytest.mark.parametrize("name,make,shape", [("mlp", _mlp, (16, 64)), ("cnn", _cnn, (2, 3, 20, 20))], ids=["mlp", "cnn"])
def test_pt2e_int8_model_matches_pytorch_quantized_reference(name, make, shape, preset):
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(*shape)
    float_model = make().eval()
    q = _quantized(float_model, x)
    st0 = polytile.stats()
    f = torch.compile(q, backend="polytile", options={"fallback": False, "machine": {"preset": preset}})
    with torch.no_grad():
        out, ref = f(x), q(x)
    st = polytile.stats()
    assert dict(st["ops_fallen_back"]) == dict(st0["ops_fallen_back"]) and st["eager_runs"] == st0["eager_runs"]
    assert out.dtype == ref.dtype == torch.float32 and out.shape == ref.shape
    diff = (out - ref).abs()
    step = ref.abs().max() / 127  # (about one quantization step of the last layer's input scale, an upper bound)
    assert diff.max() <= 2 * step
    assert (diff > 1e-5 * ref.abs().max()).float().mean() <= 0.05
    with torch.no_grad():
        ok, details = close_to_reference(out, ref, float_model(x))  # (the rule of `bench models --quantize`)
    assert ok, details


def test_quantize_ops_round_half_to_even_and_saturate():
    """quantize_per_tensor rounds ties to even and saturates at its bounds, as the reference."""
    torch._dynamo.reset()
    qd = torch.ops.quantized_decomposed

    def f(x):
        q = qd.quantize_per_tensor.default(x, 0.5, 3, 0, 255, torch.uint8)
        return q, qd.dequantize_per_tensor.default(q, 0.5, 3, 0, 255, torch.uint8)

    x = torch.tensor([0.25, 0.75, 1.25, -1.75, -100.0, 100.0, 126.0, 0.0, -0.25])
    out = torch.compile(f, backend="polytile", options={"fallback": False})(x)
    for o, r in zip(out, f(x)):
        assert o.dtype == r.dtype and torch.equal(o, r)
