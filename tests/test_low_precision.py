"""bfloat16 and float16 graphs compiled (``graph.low_precision``): inputs, weights,
intermediates and outputs in the half type, arithmetic in float32, rounding where eager
rounds. Results against eager by the accuracy rule (multiplier 3 for the half types, the
float64 reference where eager differs), special values included; no op falls back (option
``half_types="compile"``, the default; ``"aten"`` leaves those ops to ATen)."""
from __future__ import annotations

import pytest
import torch
import torchvision
import transformers

import polytile
from polytile.accuracy import assert_accurate
from polytile.dtypes import promote
from polytile.graph.builder import GraphBuilder
from polytile.graph.low_precision import widen

from machines import NUMERIC

HALF = (torch.bfloat16, torch.float16)
COMPILE = {"half_types": "compile"}  # (the default; named where a test depends on it)


def _no_fallback(fn):
    st0 = polytile.stats()
    out = fn()
    st = polytile.stats()
    assert dict(st["ops_fallen_back"]) == dict(st0["ops_fallen_back"])
    assert st["eager_runs"] == st0["eager_runs"]
    return out


def _ops(x, y, w):
    return (torch.exp(x) * y + 1.5, torch.relu(x @ w), x.sum(-1), torch.softmax(x, -1), (x > y).float(),
            x.to(torch.float32) * 2, torch.where(x > 0, x, y).cumsum(0), torch.cat([x, y], 1)[:, ::3])


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("preset", NUMERIC)
def test_half_ops_match_eager(dtype, preset):
    torch._dynamo.reset()
    torch.manual_seed(0)
    x, y, w = torch.randn(33, 40).to(dtype), torch.randn(33, 40).to(dtype), torch.randn(40, 24).to(dtype)
    x[0, 0], x[1, 1], y[2, 2] = float("nan"), float("inf"), float("-inf")
    f = torch.compile(_ops, backend="polytile", options={"fallback": False, "machine": {"preset": preset}, **COMPILE})
    out = _no_fallback(lambda: f(x, y, w))
    ref = _ops(x, y, w)
    for o, r in zip(out, ref):
        assert o.dtype == r.dtype
    assert_accurate(out, ref, lambda: _ops(x.double(), y.double(), w.double()), 1e-2)


def _chain(a, b):
    return ((a + b) * a - b) / (b + 3.0), torch.maximum(a, b) * 0.1, torch.relu(a * 3.0 - 1.0).clamp(max=1.5)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_elementwise_rounds_like_eager_bit_for_bit_when_emulating(dtype):
    """With ``emulate_precision_casts``, each op computes in float32 and rounds its result to the
    half type, as eager does, fused or not: the same bits as eager (the special values
    included: NaN, infinity, -0)."""
    torch._dynamo.reset()
    torch.manual_seed(1)
    a, b = torch.randn(1000).to(dtype), torch.randn(1000).to(dtype)
    a[:3] = torch.tensor([float("nan"), float("inf"), -0.0])
    g = torch.compile(_chain, backend="polytile", options={"fallback": False, "emulate_precision_casts": True,
                                                           **COMPILE})
    for o, r in zip(g(a, b), _chain(a, b)):  # (bits; a NaN's sign and payload aside)
        assert torch.equal(o.isnan(), r.isnan())
        assert torch.equal(o.view(torch.int16)[~r.isnan()], r.view(torch.int16)[~r.isnan()])


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_fused_half_ops_keep_float32_inside_the_kernel(dtype):
    """By default a fused chain of half-precision ops rounds once, at its store (as Inductor):
    each result is the float32 chain's value rounded, at least as close to float64 overall as
    eager's (which rounds after every op); the special values are eager's."""
    torch._dynamo.reset()
    torch.manual_seed(1)
    a, b = torch.randn(1000).to(dtype), torch.randn(1000).to(dtype)
    a[:3] = torch.tensor([float("nan"), float("inf"), -0.0])
    g = torch.compile(_chain, backend="polytile", options={"fallback": False, **COMPILE})
    for o, r, f32, f64 in zip(g(a, b), _chain(a, b), _chain(a.float(), b.float()), _chain(a.double(), b.double())):
        assert torch.equal(o.isnan(), r.isnan()) and torch.equal(o.isinf(), r.isinf())
        num = ~r.isnan()
        assert torch.equal(o[num], f32.to(dtype)[num])  # the float32 chain, rounded once
        fin = r.isfinite()
        assert (o.double() - f64)[fin].norm() <= (r.double() - f64)[fin].norm()


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_models_match_eager_without_fallback(dtype):
    torch._dynamo.reset()
    torch.manual_seed(0)
    gpt = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=512, n_layer=2, n_embd=128, n_head=4))
    gpt = gpt.eval().to(dtype)
    ids = torch.randint(0, 512, (2, 24))
    cnn = torchvision.models.resnet18(num_classes=10).eval().to(dtype)
    img = torch.randn(2, 3, 48, 48).to(dtype)
    with torch.no_grad():
        f = torch.compile(gpt, backend="polytile", options=COMPILE)
        out = _no_fallback(lambda: f(input_ids=ids).logits)
        ref = gpt(input_ids=ids).logits
        assert out.dtype == dtype
        assert_accurate(out, ref, lambda: gpt.double()(input_ids=ids).logits, 1e-2)
        g = torch.compile(cnn, backend="polytile", options=COMPILE)
        out = _no_fallback(lambda: g(img))
        ref = cnn(img)
        assert_accurate(out, ref, lambda: cnn.double()(img.double()), 1e-2)


def test_promotion_follows_torch():
    for a, b in (("bfloat16", "float16"), ("bfloat16", "int64"), ("float16", "float32"), ("bool", "bfloat16"),
                 ("float16", "float64"), ("uint8", "float16")):
        assert promote(a, b) == str(torch.promote_types(getattr(torch, a), getattr(torch, b))).split(".")[1]


def test_widen_computes_in_float32_and_rounds_each_result():
    b = GraphBuilder()
    x, y = b.input(0, (4,), "bfloat16"), b.input(1, (4,), "bfloat16")
    s = b.ew("add", x, y)
    g = widen(b.graph([b.ew("mul", s, 2.0), b.reshape(s, (2, 2))]))
    ops = {n.op: n for n in g.nodes}
    assert ops["add"].dtype == "float32" and ops["mul"].dtype == "float32"
    assert [o.dtype for o in g.outputs] == ["bfloat16", "bfloat16"]
    mul_in = ops["mul"].inputs[0]
    assert mul_in.op == "cast" and mul_in.inputs[0].op == "cast" and mul_in.inputs[0].dtype == "bfloat16"
    assert g.outputs[1].op == "view" and g.outputs[1].inputs[0].dtype == "bfloat16"


def test_half_types_aten_leaves_half_ops_to_aten():
    """``half_types="aten"`` leaves ops on half-precision tensors to ATen: eager's results
    exactly, the float32 ops around them still compiled."""
    torch._dynamo.reset()

    def f(x, w):
        return (x.float() * 2).relu().to(torch.bfloat16) @ w, x.float().sum()

    x, w = torch.randn(16, 32).to(torch.bfloat16), torch.randn(32, 8).to(torch.bfloat16)
    st0 = polytile.stats()
    out = torch.compile(f, backend="polytile", options={"half_types": "aten"})(x, w)
    st = polytile.stats()
    for o, r in zip(out, f(x, w)):
        assert torch.equal(o, r)
    assert st["eager_runs"] == st0["eager_runs"] and st["graphs_compiled"] > st0["graphs_compiled"]
    assert sum(st["ops_fallen_back"].values()) > sum(st0["ops_fallen_back"].values())
    with pytest.raises(ValueError, match="half_types"):
        polytile.options.Options.from_dict({"half_types": "always"})


def _products(x, w, wt, a, b, img, k3):
    """Contractions of every form the tiled code takes: a linear layer (x @ w.T: both operands
    contiguous along the reduction), x @ W (W's reduction along its rows), a batched matmul, a
    reduction of odd length, few rows, a padded 3x3 and a 1x1 convolution (pairs of input
    channels where the machine has bfloat16 pairs), a strided one over 3 channels (padded to
    4 for pairs), with epilogues."""
    return (torch.nn.functional.linear(x, w, w[:, 0]).relu(), x @ wt, torch.bmm(a, b),
            x[:, :77] @ wt[:77], x[:5] @ wt, torch.nn.functional.conv2d(img, k3, padding=1),
            torch.nn.functional.conv2d(img, k3[:, :, :1, :1]) * 2,
            torch.nn.functional.conv2d(img[:, :3], k3[:, :3], stride=2, padding=1))


def _product_inputs(dtype):
    torch.manual_seed(2)
    x, w, wt = torch.randn(70, 96), torch.randn(80, 96), torch.randn(96, 72)
    a, b = torch.randn(3, 40, 64), torch.randn(3, 64, 36)
    img, k3 = torch.randn(2, 16, 9, 11), torch.randn(24, 16, 3, 3)
    x[3, 5], x[4, 6], wt[7, 8], a[0, 1, 2] = float("inf"), float("nan"), float("-inf"), float("inf")
    return tuple(t.to(dtype) for t in (x, w, wt, a, b, img, k3))


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("machine", [*({"preset": p} for p in NUMERIC),
                                     {"preset": "zen4", "isa": ("avx512f", "avx512vl", "avx512bw", "fma")}],
                         ids=[*NUMERIC, "zen4-no-bf16"])
def test_half_contractions_match_eager(dtype, machine):
    """Every contraction form reads its half-precision operands in place (bfloat16 pairs where
    the description has AVX512_BF16, converted elsewhere) and matches eager, infinities and
    NaN in the operands included."""
    torch._dynamo.reset()
    args = _product_inputs(dtype)
    f = torch.compile(_products, backend="polytile", options={"fallback": False, "machine": machine, **COMPILE})
    out = _no_fallback(lambda: f(*args))
    ref = _products(*args)
    for o, r in zip(out, ref):
        assert o.dtype == r.dtype and torch.equal(o.isnan(), r.isnan()) and torch.equal(o.isinf(), r.isinf())
    assert_accurate(out, ref, lambda: _products(*(t.double() for t in args)), 1e-2)


def test_bf16_pair_emulation_gives_the_instruction_bits():
    """Compiled without AVX512_BF16 (``-mno-avx512bf16``), the pair products run the C prelude's
    emulation (the two exact products added to the lane in the instruction's order, odd element
    first): its float32 sums are the bits ``vdpbf16ps`` gives on a host that has it (on one
    without, both runs emulate), and both are accurate against float64."""
    torch.manual_seed(3)
    x, w = torch.randn(64, 1024).to(torch.bfloat16), torch.randn(96, 1024).to(torch.bfloat16)
    x[1, 2] = float("inf")
    base = polytile.options.Options().cflags
    outs = []
    for cflags in (base, base + ("-mno-avx512bf16",)):
        torch._dynamo.reset()
        opts = {"fallback": False, "machine": {"preset": "zen4"}, "cflags": cflags, **COMPILE}
        outs.append(torch.compile(lambda x, w: x.float() @ w.float().T, backend="polytile", options=opts)(x, w))
    assert torch.equal(outs[0], outs[1])
    assert_accurate(outs[1], x.float() @ w.float().T, lambda: x.double() @ w.double().T, 1e-4)


@pytest.mark.parametrize("bf16_dot", [True, False], ids=["avx512_bf16", "no-bf16"])
def test_bf16_linear_reads_its_operands_in_place(bf16_dot):
    """A bfloat16 linear layer on the pinned machine: no conversion kernel; with AVX512_BF16 the register tiles multiply pairs (``dot2`` of pair
    loads, the reduction loop half as long), without it they convert the bfloat16 loads."""
    from polytile.affine.build import build
    from polytile.affine.ir import PAIR, Load, Op, stmt_exprs, walk_exprs, walk_stmts
    from polytile.compiler import passes_for
    from polytile.options import Options
    from machines import pinned

    b = GraphBuilder()
    x, w = b.input(0, [128, 256], "bfloat16"), b.input(1, [96, 256], "bfloat16")
    wt = b.node("view", (w,), offset=0, shape=(256, 96), strides=(1, 256))
    g = widen(b.graph([b.matmul(x, wt)]))
    isa = ("avx512f", "avx512vl", "avx512bw", "fma") + (("avx512_bf16",) if bf16_dot else ())
    p = build(g)
    for _, fn in passes_for(Options(threads=2, machine=pinned(isa=isa))):
        p = fn(p)
    assert all("matmul" in k.name for k in p.kernels)  # (its pack and itself: no conversion kernel)
    exprs = [e for k in p.kernels for s in walk_stmts(k.body) for x in stmt_exprs(s) for e in walk_exprs(x)]
    dots = [e for e in exprs if isinstance(e, Op) and e.fn == "dot2"]
    pair_loads = {e.buf for e in exprs if isinstance(e, Load) and e.dtype.startswith(PAIR)}
    casts = [e for e in exprs if isinstance(e, Op) and e.fn == "cast" and e.args[0].dtype.startswith("bfloat16")]
    if bf16_dot:
        assert dots and pair_loads == {"in0", "in1"} and not casts
    else:
        assert not dots and not pair_loads and casts


def test_bf16_conv_over_three_channels_runs_as_pairs():
    """A bfloat16 convolution over an image's 3 channels on the pinned machine (AVX512_BF16):
    its channels padded to 4 (``graph.low_precision.pad_pair_channels``), the register tiles
    multiply pairs."""
    from polytile.affine.build import build
    from polytile.affine.ir import Op, stmt_exprs, walk_exprs, walk_stmts
    from polytile.backends.cpu import CPUBackend
    from polytile.compiler import passes_for
    from polytile.options import Options
    from machines import pinned

    b = GraphBuilder()
    x, w = b.input(0, [2, 3, 40, 40], "bfloat16"), b.input(1, [32, 3, 7, 7], "bfloat16")
    g = widen(b.graph([b.node("conv2d", [x, w], stride=(2, 2), padding=(3, 3), dilation=(1, 1), groups=1)]))
    o = Options(threads=2, machine=pinned())
    for rewrite in CPUBackend().graph_passes(CPUBackend().machine(o.machine), o):
        g = rewrite(g)
    p = build(g)
    for _, fn in passes_for(o):
        p = fn(p)
    exprs = [e for k in p.kernels for s in walk_stmts(k.body) for x in stmt_exprs(s) for e in walk_exprs(x)]
    assert any(isinstance(e, Op) and e.fn == "dot2" for e in exprs)


@pytest.mark.parametrize("precision,bound", [(None, 1e-5), ("bf16", 2e-2), ("fp16", 3e-3)])
def test_cpu_contraction_precision_option(precision, bound):
    """``mm_conv_precision`` on the CPU: "bf16"/"fp16" round the float32 operands of matmuls and
    convolutions to the half type (float32 accumulation, float32 results); the error against
    float64 grows to that type's rounding, no further, and is clearly above float32's (the
    operands really are rounded)."""
    torch._dynamo.reset()
    torch.manual_seed(4)
    m = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(16 * 36, 64)).eval()
    x = torch.randn(2, 8, 6, 6)
    f = torch.compile(m, backend="polytile", options={"fallback": False, "mm_conv_precision": precision})
    with torch.no_grad():
        out = _no_fallback(lambda: f(x))
        ref = m.double()(x.double())
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert out.dtype == torch.float32 and err < bound
    if precision is not None:
        assert err > 1e-5
