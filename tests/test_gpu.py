"""The GPU backend (Triton), run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set by
conftest): every kind of kernel it generates computes eager's function, and the contraction
kernels compile ahead of time to tensor-core code for sm_80, sm_90a and sm_100a."""
from __future__ import annotations

import gc
import json

import pytest
import torch
import torch.nn.functional as F

import polytile
from polytile.backends import select
from polytile.backends.gpu import GPUBackend
from polytile.backends.gpu.machine import PRESETS, resolve
from polytile.runtime.loader import KernelRuntimeError
from polytile.runtime.triton_launcher import TritonGraph

from accuracy import assert_accurate, fp64_reference
from test_machines import CASES

GPU = {"target": "gpu", "fallback": False}


def _run(fn, args, tol=1e-4, **opts):
    torch._dynamo.reset()
    polytile.reset_stats()
    with torch.no_grad():
        out = torch.compile(fn, backend="polytile", options={**GPU, **opts})(*args)
        ref = fn(*args)
    s = polytile.stats()
    assert s["graphs_compiled"] >= 1 and not s.get("ops_fallen_back")
    assert_accurate(out, ref, lambda: fp64_reference(fn, args), tol)
    return s


def _graphs() -> list[TritonGraph]:
    return [o for o in gc.get_objects() if type(o) is TritonGraph]


def _compiled_graphs(fn, args, **opts) -> list:
    before = {id(g) for g in _graphs()}
    _run(fn, args, **opts)
    return [g for g in _graphs() if id(g) not in before]


def test_the_gpu_target_takes_cpu_tensors_only_in_the_interpreter(monkeypatch):
    assert select("gpu", "cpu").name == "gpu"  # TRITON_INTERPRET=1 (conftest)
    assert select(None, "cuda").name == "gpu"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not GPUBackend().accepts("cpu") and GPUBackend().accepts("cuda")


def test_machine_presets_and_overrides():
    assert resolve({"preset": "a100"}).arch == "sm_80" and resolve({"preset": "h100"}).arch == "sm_90a"
    assert resolve({"preset": "b200", "sm_count": 100}).sm_count == 100
    with pytest.raises(ValueError, match="presets are"):
        resolve({"preset": "v100"})
    with pytest.raises(ValueError, match="fields are"):
        resolve({"vector_bytes": 16})
    assert set(PRESETS) >= {"a100", "h100", "b200"}


def _special(n=61):
    x = torch.randn(n, 7) * 3
    x[0, :6] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 0.0, 1e-6])
    return x


def test_elementwise_ops_with_special_values():
    def fn(x, y):
        return (torch.relu(x) + torch.sigmoid(y), torch.tanh(x), torch.expm1(x * 0.1), torch.log1p(x.abs()),
                torch.maximum(x, y), torch.minimum(x, y), torch.floor(x), torch.round(x), torch.trunc(x),
                torch.remainder(x, 1.5), torch.sign(x), torch.where(x > y, x, y * 2), x.sinh(), x.cosh(),
                torch.pow(x.abs(), 1.7), torch.pow(x, 3.0), torch.pow(x, 2.0), torch.erf(x), torch.isnan(x),
                torch.isinf(x), torch.exp(x * 0.5), torch.rsqrt(x.abs()), torch.floor_divide(x, 0.7))
    _run(fn, (_special(), _special().flip(0)))


def test_integer_and_boolean_ops():
    def fn(a, b):
        return (a // 3, a % 3, torch.div(a, 4, rounding_mode="trunc"), a * b - 7, (a > b) & (b > 0),
                torch.where(a > 0, a, -a), torch.maximum(a, b), (a.float() / 3).to(torch.int64))
    a = torch.randint(-50, 50, (33, 5))
    _run(fn, (a, torch.randint(-5, 5, (33, 5))))


def test_reductions_and_row_kernels():
    def fn(x, w, b):
        y = F.layer_norm(x, (x.shape[-1],), w, b)
        return (torch.softmax(y, -1), x.sum(0), x.amax(-1), x.mean((0, 2)), torch.argmax(x, -1),
                torch.cumsum(x, 1), torch.logsumexp(x, -1))
    x = torch.randn(3, 19, 45)
    x[0, 0, 2] = float("nan")
    _run(fn, (x, torch.randn(45), torch.randn(45)))


def test_softmax_and_norms_become_row_tiles_in_registers():
    """A fused layer norm + softmax (reductions and elementwise steps over the last dim) runs
    as row tiles: its reductions across columns, its row-local arrays in registers."""
    def fn(x, w, b):
        return torch.softmax(F.layer_norm(x, (x.shape[-1],), w, b) * 2, -1)
    x = torch.randn(37, 100)
    x[3, 7] = float("inf")
    x[5, :] = float("-inf")
    s = _run(fn, (x, torch.randn(100), torch.randn(100)))
    assert s["gpu_row_kernels"] >= 1 and s["gpu_scratch_arrays"] == 0 and s["gpu_lane_kernels"] == 0


@pytest.mark.parametrize("m,n,k,at", [(37, 29, 53, False), (64, 128, 32, False), (5, 200, 70, True),
                                      (130, 3, 17, False)])
def test_matmuls_become_block_tiles_with_dot(m, n, k, at):
    a = torch.randn(k, m).t() if at else torch.randn(m, k)
    b, bias = torch.randn(k, n), torch.randn(n)
    s = _run(lambda a, b, bias: torch.relu(a @ b + bias) * 0.5, (a, b, bias))
    # one kernel: bias, relu and the scale run in its epilogue; a product of under 4 columns
    # is not one for the tensor cores (its reduction runs across the columns of a row tile)
    assert s["kernels_generated"] == 1 and s["gpu_dot_kernels"] == (1 if n >= 4 else 0)


@pytest.mark.parametrize("c,k,hw,ks,stride,groups", [(8, 16, 9, 3, 2, 1), (6, 10, 12, 5, 1, 1), (8, 16, 7, 3, 1, 4),
                                                     (16, 24, 6, 1, 1, 1)])
def test_convolutions_are_implicit_gemms(c, k, hw, ks, stride, groups):
    """A convolution (padded, strided, grouped, depthwise, 1x1) is one dot kernel: the rows of its
    tiles are (image, y, x), the columns output channels, the reduction (channel, ky, kx), the
    padding a mask on the input tile; bias and activation run in its epilogue."""
    x, w, b = torch.randn(2, c, hw, hw), torch.randn(k, c // groups, ks, ks), torch.randn(k)
    fn = lambda x, w, b: F.silu(F.conv2d(x, w, b, stride=stride, padding=ks // 2, groups=groups))  # noqa: E731
    s = _run(fn, (x, w, b))
    assert s["gpu_dot_kernels"] == 1 and s["gpu_lane_kernels"] == 0


def test_depthwise_convolution_runs_as_lanes_without_scratch():
    """One output per lane, its taps in registers: not a product for the tensor cores (one
    output channel per group), and not the CPU's padded planes."""
    x, w, b = torch.randn(2, 12, 8, 8), torch.randn(12, 1, 3, 3), torch.randn(12)
    s = _run(lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=12), (x, w, b))
    assert s["gpu_lane_kernels"] == 1 and s["gpu_scratch_arrays"] == 0 and s["gpu_dot_kernels"] == 0


def test_cache_weights_option():
    """``cache_weights`` (a CPU backend pass keeps weight-only values; the GPU backend keeps
    none yet) leaves the GPU graph correct, an in-place weight update included."""
    lin = torch.nn.Sequential(torch.nn.Linear(40, 24), torch.nn.ReLU(), torch.nn.Linear(24, 8)).eval()
    x = torch.randn(5, 40)
    _run(lin, (x,), cache_weights=True)
    with torch.no_grad():
        c = torch.compile(lin, backend="polytile", options={**GPU, "cache_weights": True})
        c(x)
        lin[0].weight.mul_(2)
        torch.testing.assert_close(c(x), lin(x), rtol=1e-5, atol=1e-5)


def test_batched_matmul_and_linear():
    q, kt = torch.randn(3, 2, 21, 16), torch.randn(3, 2, 16, 33)
    s = _run(lambda q, kt: torch.softmax(q @ kt, -1), (q, kt))
    assert s["gpu_dot_kernels"] == 1
    lin = torch.nn.Linear(40, 24)
    _run(lin, (torch.randn(2, 9, 40),))


def test_tiles_shrink_until_they_fill_the_sms():
    """The GPU cost model reads the machine: a 256x256 product is 4 tiles of 128x128, fewer than
    an H100's 132 SMs: its tiles shrink (to 64 rows, 32 columns: 32 tiles); on a made-up 4-SM
    machine the 128x128 tiles stay."""
    def tiles(machine):
        (g,) = _compiled_graphs(torch.mm, (torch.randn(256, 300), torch.randn(300, 256)), machine=machine)
        (k,) = g.kernels
        return k.plan.bm, k.plan.bn
    assert tiles({"preset": "h100"}) == (64, 32)
    assert tiles({"preset": "h100", "sm_count": 4}) == (128, 128)


def test_fp32_matmul_precision_follows_torch():
    from polytile.backends.gpu import fp32_matmul_precision

    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert fp32_matmul_precision() == "ieee"
        torch.set_float32_matmul_precision("high")
        assert fp32_matmul_precision() == "tf32"
    finally:
        torch.set_float32_matmul_precision(old)


def _sdpa(L, S, D, Dv=None, heads=2, kv_heads=2, causal=False, mask=None):
    q, k, v = torch.randn(2, heads, L, D), torch.randn(2, kv_heads, S, D), torch.randn(2, kv_heads, S, Dv or D)
    if mask is None:
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                               enable_gqa=heads != kv_heads)), (q, k, v)
    return (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)), (q, k, v, mask)


@pytest.mark.parametrize("case", ["self", "causal", "gqa", "cross", "decode", "float-mask", "bool-mask", "d-not-dv",
                                  "long-head"])
def test_attention_is_one_flash_kernel(case):
    """Attention runs as one flash kernel (blocks of keys, two tl.dot per block, the scores
    never stored): self, causal (blocks past the diagonal skipped), grouped-query, cross,
    one query (decode), additive and boolean masks (a row with every key masked is 0, as
    SDPA's), a value width other than the key width."""
    boolmask = torch.rand(2, 1, 21, 70) > 0.3
    boolmask[0, 0, 3] = False
    make = {"self": lambda: _sdpa(45, 45, 16), "causal": lambda: _sdpa(70, 70, 32, causal=True),
            "gqa": lambda: _sdpa(33, 40, 16, heads=4, kv_heads=2, causal=True),
            "cross": lambda: _sdpa(19, 130, 16), "decode": lambda: _sdpa(1, 77, 32, heads=4, kv_heads=2),
            "float-mask": lambda: _sdpa(21, 70, 16, mask=torch.randn(2, 1, 21, 70)),
            "bool-mask": lambda: _sdpa(21, 70, 16, mask=boolmask),
            "d-not-dv": lambda: (lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v,
                                 (torch.randn(3, 20, 24), torch.randn(3, 30, 24), torch.randn(3, 30, 40))),
            "long-head": lambda: _sdpa(17, 33, 96)}[case]
    fn, args = make()
    (g,) = _compiled_graphs(fn, args)
    s = polytile.stats()
    assert s["gpu_flash_kernels"] == 1 and s["gpu_lane_kernels"] == 0 and s["gpu_scratch_arrays"] == 0
    # causal: the key loop of a query tile ends at its last row's diagonal
    assert ("for j0 in range(0, tl.minimum(" in g.source) == (case in ("causal", "gqa"))


def test_mixed_precision_contractions_on_an_fp32_model():
    """mm_conv_precision="fp16": operands rounded to fp16 for the tensor cores, fp32 accumulation:
    the result is that of eager on fp16-rounded operands (and within fp16 accuracy of fp32)."""
    a, b = torch.randn(40, 70), torch.randn(70, 24)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(torch.mm, backend="polytile", options={**GPU, "mm_conv_precision": "fp16"})(a, b)
    rounded = a.half().float() @ b.half().float()
    torch.testing.assert_close(out, rounded, rtol=1e-5, atol=1e-4)
    assert (out - a @ b).abs().max() > 1e-4  # the rounding is visible: the option took effect
    with pytest.raises(ValueError, match="mm_conv_precision"):
        polytile.Options.from_dict({"mm_conv_precision": "fp8"})


def test_fp32_conv_precision_follows_cudnn_flag():
    from polytile.backends.gpu import fp32_conv_precision

    # (the flags() context: other tests may have disabled setting the global flags directly)
    with torch.backends.cudnn.flags(allow_tf32=False):
        assert fp32_conv_precision() == "ieee"
    with torch.backends.cudnn.flags(allow_tf32=True):
        assert fp32_conv_precision() == "tf32"


@pytest.mark.parametrize("kind,i", [(k, i) for k, makes in CASES.items() for i in range(len(makes))
                                    if k in ("conv", "norms", "attention")][::2])
def test_the_cpu_backends_cases(kind, i):
    torch.manual_seed(0)
    fn, args = CASES[kind][i]()
    _run(fn, args)


def test_padding_and_pooling_read_only_inside_the_input():
    def fn(x):
        return F.max_pool2d(F.pad(x, (1, 2, 0, 1), value=-1.0), 3, 2, 1), F.avg_pool2d(x, 2)
    _run(fn, (torch.randn(2, 3, 11, 9),))


def test_sibling_nests_under_a_small_band_become_separate_kernels():
    """A pad writes its interior and each halo side in its own nest under the batch loop (one
    iteration): each nest becomes its own kernel whose parallel loops fill the grid, in order."""
    fn = lambda x: F.pad(x, (1, 2, 0, 1), value=-1.0) * 2  # noqa: E731
    (g,) = _compiled_graphs(fn, (torch.randn(1, 3, 7, 6),), fuse_producers=False, fuse_epilogues=False)
    pads = [k for k in g.kernels if "_pad_" in k.name]
    assert len(pads) == 4 and all(k.grid >= 1 and k.plan.kind == "lanes" for k in pads)
    assert max(k.grid * k.plan.block for k in pads) >= 3 * 7 * 6  # the interior copy: one lane per element


def test_index_out_of_range_raises():
    emb = torch.nn.Embedding(10, 4)
    c = torch.compile(emb, backend="polytile", options=GPU)
    ok = torch.tensor([[1, 2], [9, 0]])
    with torch.no_grad():
        torch.testing.assert_close(c(ok), emb(ok))
        with pytest.raises(KernelRuntimeError, match="index out of range"):
            c(torch.tensor([[1, 2], [10, 0]]))
        torch.testing.assert_close(c(ok), emb(ok))


def test_inputs_in_another_layout_are_copied():
    fn = lambda x, y: x * 2 + y  # noqa: E731
    c = torch.compile(fn, backend="polytile", options=GPU)
    x, y = torch.randn(8, 6), torch.randn(8, 6)
    with torch.no_grad():
        torch.testing.assert_close(c(x, y), fn(x, y))
        xt = torch.randn(6, 8).t()
        torch.testing.assert_close(c(xt, y), fn(xt, y))


def test_small_models_end_to_end():
    mlp = torch.nn.Sequential(torch.nn.Linear(30, 64), torch.nn.GELU(), torch.nn.Linear(64, 10)).eval()
    _run(mlp, (torch.randn(5, 30),))
    cnn = CASES["model"][0]
    fn, args = cnn()
    _run(fn, args)


def test_bert_with_two_layers_end_to_end():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32)
    m = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 120, (2, 11))
    _run(lambda ids: m(input_ids=ids).last_hidden_state, (ids,))


def test_generated_source_is_dumped(tmp_path):
    fn = lambda x, w: torch.tanh(x @ w)  # noqa: E731
    _run(fn, (torch.randn(16, 16), torch.randn(16, 16)), dump_dir=str(tmp_path))
    src = next(tmp_path.rglob("*kernels.py")).read_text()
    assert "@triton.jit" in src and "tl.dot(" in src and "pt_tanh(" in src


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_contractions_compile_to_tensor_core_code(arch, precision):
    """Ahead of time, without a GPU (a process without the interpreter): with TF32 allowed (as
    torch's "high" matmul precision does) or bf16 operands, every dot kernel (matmuls and an
    implicit-GEMM convolution) uses the arch's tensor-core instruction, spills nothing and fits
    the shared memory of the arch's machine."""
    from polytile.backends.gpu.aot import compile_in_subprocess, spec_of

    m = torch.nn.Sequential(torch.nn.Conv2d(8, 32, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(32 * 36, 128),
                            torch.nn.GELU(), torch.nn.Linear(128, 64))
    x = torch.randn(4, 8, 6, 6)
    if precision == "bf16":  # the interpreter's bf16 arithmetic is wrong (DESIGN.md 8): compile only
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(m, backend="polytile", options={**GPU, "mm_conv_precision": precision})(x)
    else:
        _run(m, (x,), tol=1e-2, mm_conv_precision=precision)
    g = [g for g in _graphs() if [k.plan.precision for k in g.kernels if k.plan.kind == "dot"] == [precision] * 3][-1]
    facts = compile_in_subprocess(spec_of(g), arch)
    dots = {n: f for n, f in facts.items() if f["kind"] == "dot"}
    assert len(dots) == 3
    limit = {"sm_80": PRESETS["a100"], "sm_90a": PRESETS["h100"], "sm_100a": PRESETS["b200"]}[arch].smem_per_block
    for name, f in dots.items():
        assert f["tensor_core"], (name, f)
        assert f["local_bytes"] == 0 and f["stack_bytes"] == 0 and f["ptx_local_stores"] == 0, (name, f)
        assert 0 < f["shared_bytes"] <= limit, (name, f)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("precision", ["tf32", "ieee"])
@pytest.mark.parametrize("D", [64, 128])
def test_flash_attention_compiles_without_spills(arch, precision, D):
    """The flash kernel of BERT- and Llama-sized heads (an additive mask), planned for the arch's
    machine, compiles without spills,
    within the arch's shared memory; with TF32 its two products run on the tensor cores (in
    IEEE fp32 they run on the FMA units, with smaller tiles that fit the registers)."""
    from polytile.backends.gpu.aot import compile_in_subprocess, spec_of

    q, k, v = (torch.randn(1, 2, 70, D) for _ in range(3))
    mask = torch.randn(1, 1, 1, 70)
    fn = lambda q, k, v, m: torch.softmax(q @ k.transpose(-1, -2) / 8.0 + m, -1) @ v  # noqa: E731
    machine = {"sm_80": "a100", "sm_90a": "h100"}[arch]
    (g,) = _compiled_graphs(fn, (q, k, v, mask), mm_conv_precision=precision, machine={"preset": machine})
    assert [k.plan.kind for k in g.kernels] == ["flash"]
    (f,) = compile_in_subprocess(spec_of(g), arch).values()
    limit = {"sm_80": PRESETS["a100"], "sm_90a": PRESETS["h100"]}[arch].smem_per_block
    assert (f["tensor_core"] or f["mma_sync"]) == (precision == "tf32"), f
    assert f["local_bytes"] == 0 and f["stack_bytes"] == 0 and f["ptx_local_stores"] == 0, f
    assert 0 < f["shared_bytes"] <= limit, f


def test_the_gpu_benchmark_script_runs(tmp_path):
    """``polytile bench gpu`` end to end on one shape of each file, in the interpreter (its
    flow, checks and report; the timings mean nothing here)."""
    from polytile.bench import gpu

    shapes = tmp_path / "shapes"
    shapes.mkdir()
    (shapes / "gemm_shapes.csv").write_text("M,N,K,a_transposed,b_transposed\n24,40,16,false,true\n")
    (shapes / "conv_shapes.csv").write_text("N,C,H,W,K,R,S,stride,pad,dilation,groups\n1,4,6,6,8,3,3,1,1,1,1\n")
    (shapes / "attention_configs.csv").write_text("batch,heads,kv_heads,seq_q,seq_k,head_dim,causal\n1,2,1,8,16,16,true\n")
    text = gpu.run(str(shapes), str(tmp_path / "out"), rounds=1, autotune=False, models=False, device="cpu")
    res = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    by = {(r["section"], r["case"]): r for r in res}
    assert by[("gemm fp32", "24x40x16 bT")]["status"] == "pass" and "polytile_ms" in by[("gemm fp32", "24x40x16 bT")]
    assert by[("conv fp32", "N1 C4 6x6 K8 3x3 s1 p1")]["status"] == "pass"
    # fp16 graphs have no lowering yet (low precision is issue 31): reported, not timed
    assert by[("gemm fp16", "24x40x16 bT")]["status"] in ("fallback", "pass")
    assert "polytile GPU benchmark" in text and len(res) == 5


def test_the_gpu_benchmarks_model_section_runs(tmp_path, monkeypatch):
    """The model section's flow (batch 1 and 8, fp16 and fp32, HF keyword inputs), with a tiny
    BERT standing in for the suite's models (the interpreter is far too slow for them)."""
    transformers = pytest.importorskip("transformers")
    from polytile.bench import gpu, zoo

    def tiny(spec, batch=None, seed=0, dropout=True):
        torch.manual_seed(seed)
        cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=48, max_position_embeddings=16)
        return zoo.Workload(spec, transformers.BertModel(cfg).eval(), (), {"input_ids": torch.randint(0, 64, (batch, 8))})

    monkeypatch.setattr(zoo, "build", tiny)
    monkeypatch.setattr(gpu, "MODELS", [("huggingface", "BertForMaskedLM")])
    shapes = tmp_path / "shapes"
    shapes.mkdir()
    for f in ("gemm_shapes.csv", "conv_shapes.csv", "attention_configs.csv"):
        (shapes / f).write_text({"gemm_shapes.csv": "M,N,K,a_transposed,b_transposed\n",
                                 "conv_shapes.csv": "N,C,H,W,K,R,S,stride,pad,dilation,groups\n",
                                 "attention_configs.csv": "batch,heads,kv_heads,seq_q,seq_k,head_dim,causal\n"}[f])
    (shapes / "models.csv").write_text("huggingface,BertForMaskedLM,1\n")
    gpu.run(str(shapes), str(tmp_path / "out"), rounds=1, autotune=False, device="cpu")
    res = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    status = {(r["section"], r["case"]): r["status"] for r in res}
    assert status[("model fp32", "BertForMaskedLM b1")] == "pass" and status[("model fp32", "BertForMaskedLM b8")] == "pass"
    assert status[("model fp16", "BertForMaskedLM b1")] in ("fallback", "pass")


def test_every_kernel_form_compiles_for_the_gpu():
    """Not only the interpreter: every kernel of graphs covering all four forms, the scalar-op
    templates and helpers, index errors and scratch arrays compiles with Triton's real compiler
    for sm_90a (a process without the interpreter), and the register-held forms spill nothing."""
    from polytile.backends.gpu.aot import compile_in_subprocess, spec_of

    def ops(x, y, i):
        return (torch.relu(x) + torch.sigmoid(y), torch.tanh(x), torch.expm1(x), torch.log1p(x.abs()),
                torch.maximum(x, y), torch.floor(x), torch.round(x), torch.remainder(x, 1.5), torch.fmod(x, 0.7),
                torch.sign(x), x.sinh(), x.cosh(), torch.pow(x.abs(), 1.7), torch.erf(x), torch.isinf(x),
                torch.floor_divide(i, 3), i % 3, torch.div(i, 4, rounding_mode="trunc"), (i > 0) & (x > 0))

    def rows(x, w, b):
        return torch.softmax(F.layer_norm(x, (x.shape[-1],), w, b), -1), x.sum(0), torch.argmax(x, -1), x.cumsum(1)

    emb = torch.nn.Embedding(50, 16)
    cases = [(ops, (torch.randn(8, 8), torch.randn(8, 8), torch.randint(-9, 9, (8, 8)))),
             (rows, (torch.randn(6, 40), torch.randn(40), torch.randn(40))),
             (lambda ids: emb(ids) * 2, (torch.randint(0, 50, (3, 5)),)),
             (lambda x: (F.max_pool2d(x, 3, 2, 1), F.avg_pool2d(x, 2), F.conv2d(x, torch.ones(4, 1, 3, 3), groups=4)),
              (torch.randn(1, 4, 9, 9),)),
             _sdpa(20, 30, 16, causal=True),
             (lambda a, b: torch.relu(a @ b), (torch.randn(40, 24), torch.randn(24, 33)))]
    forms = set()
    for fn, args in cases:
        for g in _compiled_graphs(fn, args):
            facts = compile_in_subprocess(spec_of(g), "sm_90a")
            assert set(facts) == {k.name for k in g.kernels}
            for name, f in facts.items():
                forms.add(f["kind"])
                if f["kind"] in ("rows", "dot", "flash"):
                    assert f["local_bytes"] == 0 and f["stack_bytes"] == 0, (name, f)
    assert forms == {"lanes", "rows", "dot", "flash"}


@pytest.mark.parametrize("op", ["flash", "efficient", "efficient-bias"])
def test_cuda_sdpa_ops_become_the_flash_kernel(op):
    """The attention ops SDPA dispatches to on CUDA tensors (traced here on CPU tensors through
    their meta functions) lower like the CPU one: one flash kernel."""
    aten = torch.ops.aten
    q, k, v = torch.randn(2, 3, 10, 16), torch.randn(2, 3, 12, 16), torch.randn(2, 3, 12, 16)
    bias = torch.randn(2, 3, 10, 12)
    fns = {"flash": lambda q, k, v: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0],
           "efficient": lambda q, k, v: aten._scaled_dot_product_efficient_attention(q, k, v, None, False, 0.0,
                                                                                     True)[0],
           "efficient-bias": lambda q, k, v: aten._scaled_dot_product_efficient_attention(q, k, v, bias, False)[0]}
    torch._dynamo.reset()
    polytile.reset_stats()
    with torch.no_grad():
        out = torch.compile(fns[op], backend="polytile", options=GPU)(q, k, v)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias if op == "efficient-bias" else None,
                                         is_causal=op != "efficient-bias")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert polytile.stats()["gpu_flash_kernels"] == 1
