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
from polytile.accuracy import assert_accurate
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
        ok, details = close_to_reference([out], [ref], [float_model(x)])  # (the rule of `bench models --quantize`)
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


qd = torch.ops.quantized_decomposed
XS, XZ = 0.05, 7  # the activations' scale and zero point (per tensor)


def _float_products(x, w, wt, img, k3):
    """Contractions of every form the tiled code takes, as ``_quantized_products`` gives them
    their dequantized operands: a linear layer (x @ w.T: both contiguous along the reduction),
    x @ W (W's reduction along its rows), a reduction of length 77 (not a multiple of 4), few
    rows, a padded 3x3 convolution over 16 channels, a 1x1 one, a strided one over 3 channels
    (padded to 4 where the machine multiplies quads), a max pool."""
    F = torch.nn.functional
    return (F.linear(x, w, w[:, 0]).relu(), x @ wt, x[:, :77] @ w[:, :77].T, x[:5] @ wt, F.conv2d(img, k3, padding=1),
            F.conv2d(img, k3[:, :, :1, :1]) * 2, F.conv2d(img[:, :3], k3[:, :3], stride=2, padding=1),
            F.max_pool2d(img, 3, 2, 1))


def _dequantized(xq, wq, wtq, imgq, kq, ws, wz, wts, wtz, ks, kz):
    return (qd.dequantize_per_tensor.default(xq, XS, XZ, 0, 255, torch.uint8),
            qd.dequantize_per_channel.default(wq, ws, wz, 0, -128, 127, torch.int8),
            qd.dequantize_per_channel.default(wtq, wts, wtz, 1, -128, 127, torch.int8),
            qd.dequantize_per_tensor.default(imgq, XS, XZ, 0, 255, torch.uint8),
            qd.dequantize_per_channel.default(kq, ks, kz, 0, -128, 127, torch.int8))


def _quantized_products(*q):
    return _float_products(*_dequantized(*q))


def _quantized_inputs():
    """uint8 activations with zero point 7 (0 and 255 included), int8 weights with per-channel
    scales and zero points, some of them not 0 (-128 and 127 included)."""
    g = torch.Generator().manual_seed(5)

    def ints(lo, hi, *shape):
        return torch.randint(lo, hi + 1, shape, generator=g)

    xq, imgq = ints(0, 255, 70, 96).to(torch.uint8), ints(0, 255, 2, 16, 9, 11).to(torch.uint8)
    wq, wtq, kq = (ints(-128, 127, *s).to(torch.int8) for s in ((80, 96), (96, 72), (24, 16, 3, 3)))
    xq[0, :4], wq[1, :4] = torch.tensor([0, 255, 0, 255], dtype=torch.uint8), torch.tensor([-128, 127, -128, 127],
                                                                                           dtype=torch.int8)
    scales = [torch.rand(n, generator=g) * 0.01 + 0.001 for n in (80, 72, 24)]
    zeros = [ints(-3, 3, n) for n in (80, 72, 24)]
    zeros[0][:40] = 0
    return (xq, wq, wtq, imgq, kq, scales[0], zeros[0], scales[1], zeros[1], scales[2], zeros[2])


@pytest.mark.parametrize("machine", [*({"preset": p} for p in NUMERIC),
                                     {"preset": "zen4", "isa": ("avx512f", "avx512vl", "avx512bw", "fma")}],
                         ids=[*NUMERIC, "zen4-no-vnni"])
def test_int8_contractions_match_the_dequantized_reference(machine):
    """Every contraction form on dequantized uint8 x int8 operands runs on the integer values
    (``graph.quantized``: int8 quads where the description has AVX512-VNNI, widening reads
    elsewhere) and is as accurate as eager's float32 products of the dequantized values,
    against float64 ones."""
    torch._dynamo.reset()
    q = _quantized_inputs()
    f = torch.compile(_quantized_products, backend="polytile", options={"fallback": False, "machine": machine})
    st0 = polytile.stats()
    out = f(*q)
    assert polytile.stats()["eager_runs"] == st0["eager_runs"]
    ref = _quantized_products(*q)
    assert_accurate(out, ref, _float_products(*(t.double() for t in _dequantized(*q))), 1e-5)


def _int8_linear_kernels(isa, batch: int = 0):
    from polytile.affine.build import build
    from polytile.compiler import passes_for
    from polytile.graph.builder import GraphBuilder
    from polytile.graph.quantized import integer_contractions
    from polytile.options import Options

    from machines import pinned

    b = GraphBuilder()
    xq, wq = b.input(0, [batch, 40, 256] if batch else [128, 256], "uint8"), b.input(1, [96, 256], "int8")
    ws, wz = b.input(2, [96, 1], "float32"), b.input(3, [96, 1], "int64")
    x = b.ew("mul", b.ew("sub", b.cast(xq, "float32"), float(XZ)), XS)
    if batch:  # (a transformer's tokens of several sequences as the rows: x.reshape(-1, 256))
        x = b.reshape(x, [batch * 40, 256])
    w = b.ew("mul", b.cast(b.ew("sub", b.cast(wq, "int64"), wz), "float32"), ws)
    g = integer_contractions(b.graph([b.matmul(x, b.node("view", (w,), offset=0, shape=(256, 96), strides=(1, 256)))]))
    p = build(g)
    for _, fn in passes_for(Options(threads=2, machine=pinned(isa=isa))):
        p = fn(p)
    return p


@pytest.mark.parametrize("batch", [0, 3], ids=["2d", "3d-rows"])
@pytest.mark.parametrize("vnni", [True, False], ids=["avx512_vnni", "no-vnni"])
def test_int8_linear_reads_its_integer_operands_in_place(vnni, batch):
    """A quantized linear layer on the pinned machine: no kernel writes a float32 copy of its
    operands (the contraction converts where it reads); with AVX512-VNNI the register tiles
    multiply quads of bytes (``dot4us`` on quad loads of both inputs, the reduction loop a
    quarter as long) and convert their int32 sums once, without it they convert the loads.
    Also with the rows from a 3-d activation (sequences x tokens): the row index the fused
    conversion reads through is split into (sequence, token) and flattened again, still linear."""
    from polytile.affine.ir import GROUPS, Load, Op, Store, stmt_exprs, walk_exprs, walk_stmts

    p = _int8_linear_kernels(("avx512f", "avx512vl", "avx512bw", "fma") + (("avx512_vnni",) if vnni else ()), batch)
    big = {b.name for b in p.buffers if b.kind == "temp" and b.dtype == "float32" and b.size >= 96 * 256}
    stores = {s.buf for k in p.kernels if "matmul" not in k.name for s in walk_stmts(k.body) if isinstance(s, Store)}
    assert not big & stores  # (the matmul's packs hold quads or floats: written by the matmul's own pack)
    exprs = [e for k in p.kernels for s in walk_stmts(k.body) for x in stmt_exprs(s) for e in walk_exprs(x)]
    dots = [e for e in exprs if isinstance(e, Op) and e.fn in ("dot4us", "dot4su")]
    converts = [e for e in exprs if isinstance(e, Op) and e.fn == "i32_float"]
    quad_loads = {e.buf for e in exprs if isinstance(e, Load) and e.dtype.split("x")[0] in GROUPS}
    widening = [e for e in exprs if isinstance(e, Op) and e.fn == "cast" and isinstance(e.args[0], Load)
                and e.args[0].dtype.split("x")[0] in ("int8", "uint8")]
    if vnni:
        assert dots and converts and quad_loads == {"in0", "in1"}
    else:
        assert not dots and not quad_loads and widening


def test_int8_quad_emulation_gives_the_instruction_results():
    """Compiled without AVX512-VNNI (``-mno-avx512vnni``), the quad products run the C prelude's
    integer emulation: the same int32 sums as ``vpdpbusd`` (on a host without it both runs
    emulate), so the same bits."""
    q = _quantized_inputs()
    base = polytile.options.Options().cflags
    outs = []
    for cflags in (base, base + ("-mno-avx512vnni",)):
        torch._dynamo.reset()
        opts = {"fallback": False, "machine": {"preset": "zen4"}, "cflags": cflags}
        outs.append(torch.compile(_quantized_products, backend="polytile", options=opts)(*q))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_requantized_conv_feeds_its_max_pool_as_uint8():
    """conv -> ReLU -> quantize -> dequantize -> max pool (a quantized ResNet's stem) on the
    pinned machine: the pool reads the uint8 tensor (its windows take the maximum of the
    integers, the dequantization after them), not a float32 one, and no window element
    recomputes the requantization."""
    from polytile.affine.build import build
    from polytile.affine.ir import Load, Op, walk_exprs, walk_stmts, Store
    from polytile.compiler import passes_for
    from polytile.graph.builder import GraphBuilder
    from polytile.graph.quantized import integer_contractions
    from polytile.options import Options

    from machines import pinned

    b = GraphBuilder()
    xq, wq = b.input(0, [1, 8, 20, 20], "uint8"), b.input(1, [16, 8, 3, 3], "int8")
    x = b.ew("mul", b.ew("sub", b.cast(xq, "float32"), float(XZ)), XS)
    w = b.ew("mul", b.cast(wq, "float32"), 0.01)
    y = b.node("relu", [b.node("conv2d", [x, w], stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)])
    q = b.cast(b.ew("minimum", b.ew("maximum", b.ew("add", b.node("round", [b.ew("mul", y, 20.0)]), 3.0), 0.0),
                    255.0), "uint8")
    d = b.ew("mul", b.ew("sub", b.cast(q, "float32"), 3.0), 0.05)
    g = integer_contractions(b.graph([b.node("pool2d", [d], mode="max", kernel=(3, 3), stride=(2, 2), padding=(1, 1),
                                             dilation=(1, 1), ceil_mode=False)]), 4)
    p = build(g)
    for _, fn in passes_for(Options(threads=2, machine=pinned())):
        p = fn(p)
    dtypes = {buf.name: buf.dtype for buf in p.buffers}
    (pool,) = [k for k in p.kernels if "pool2d" in k.name]
    window = [e for s in walk_stmts(pool.body) if isinstance(s, Store) for e in walk_exprs(s.value)
              if isinstance(e, Op) and e.fn == "maximum" and isinstance(s.value, Op) and s.value.fn == "maximum"]
    reads = {e.buf for x in window for e in walk_exprs(x) if isinstance(e, Load) and e.buf in dtypes}  # (not its accumulators)
    assert window and reads and all(dtypes[r] == "uint8" for r in reads)
    assert not any(isinstance(e, Op) and e.fn == "round" for x in window for e in walk_exprs(x))


@pytest.mark.parametrize("preset", ["zen4", "zen3"])
def test_dynamic_int8_linear_layers_match_pytorch_quantized_reference(preset):
    """Dynamic quantization (the x86 quantizer's ``is_dynamic=True``: each activation's scale
    and zero point chosen per call from its range, ``choose_qparams``) compiles with no
    fallback and matches the converted model run eagerly, a range with negative values and a
    ReLU's non-negative one alike."""
    torch._dynamo.reset()
    torch.manual_seed(4)
    x = torch.randn(24, 64) * 3
    m = torch.export.export(_mlp().eval(), (x,)).module()
    q = xiq.X86InductorQuantizer()
    q.set_global(xiq.get_default_x86_inductor_quantization_config(is_dynamic=True))
    m = pt2e.prepare_pt2e(m, q)
    m(x)
    m = pt2e.convert_pt2e(m)
    st0 = polytile.stats()
    f = torch.compile(m, backend="polytile", options={"fallback": False, "machine": {"preset": preset}})
    with torch.no_grad():
        out, ref = f(x), m(x)
        out2, ref2 = f(x * 0.1 + 1), m(x * 0.1 + 1)  # (other ranges: other scales, the same code)
    st = polytile.stats()
    assert dict(st["ops_fallen_back"]) == dict(st0["ops_fallen_back"]) and st["eager_runs"] == st0["eager_runs"]
    for o, r in ((out, ref), (out2, ref2)):
        diff = (o - r).abs()
        assert diff.max() <= 2 * r.abs().max() / 127 and (diff > 1e-5 * r.abs().max()).float().mean() <= 0.05
