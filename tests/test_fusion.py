"""Fusion passes (issue 4): IR fixtures per fusion kind, fused == unfused execution, illegal
fusions refused, per-kind option flags, intermediates eliminated from the memory plan.

The IR fixtures live in tests/fixtures/fusion/<case>.mlir (the program before and after the
fusion passes). After an intended change to the passes, rewrite them with
``python tests/test_fusion.py --update`` and review the diff.
"""
from __future__ import annotations

import difflib
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import polytile
from polytile.affine.build import build
from polytile.affine.ir import (Alloc, Buffer, Const, For, Kernel, Load, Op, Program, Store, Var, c, stmt_exprs,
                               walk_exprs, walk_stmts)
from polytile.affine.printer import format_program
from polytile.graph import compose
from polytile.graph.builder import GraphBuilder
from polytile.options import Options
from polytile.transform import fuse_epilogues, fuse_loops, fuse_producers, parallelize
from polytile.compiler import passes_for
from polytile.transform.pipeline import shared_passes

from accuracy import assert_accurate, fp64_reference
from machines import pinned

F32 = "float32"
FIXTURES = Path(__file__).parent / "fixtures" / "fusion"


def fuse(p: Program, **opts) -> Program:
    """The shared passes (dead code, fusion), which every backend runs first."""
    o = Options(**{"threads": 2, **opts})
    for name, fn in shared_passes(o):
        if name != "drop_dead_kernels":
            p = fn(p)
    return p


# ---------------------------------------------------------------- graphs, one per fusion kind
def g_elementwise_chain():
    b = GraphBuilder()
    x = b.input(0, [8, 32], F32)
    y = b.ew("mul", x, b.full(2.0, F32))
    y = b.ew("add", y, b.full(1.0, F32))
    y = b.ew("relu", y)
    y = b.ew("sigmoid", b.ew("sub", y, b.full(3.0, F32)))
    return b.graph([b.ew("tanh", y)])


def g_broadcast_view():  # producer read through a transpose and a broadcast
    b = GraphBuilder()
    x = b.input(0, [8, 32], F32)
    v = b.input(1, [8], F32)
    e = b.ew("exp", x)
    t = b.transpose(e, 0, 1)  # [32, 8]
    return b.graph([b.ew("mul", t, v)])


def g_reduction_with_producer():  # sum(x * x) over rows: the square is recomputed in the loop
    b = GraphBuilder()
    x = b.input(0, [8, 32], F32)
    return b.graph([b.reduce("reduce_sum", b.ew("mul", x, x), [1])])


def g_reduction_epilogue():  # mean = sum / n, written at the reduction's store
    b = GraphBuilder()
    x = b.input(0, [8, 32], F32)
    return b.graph([compose.mean(b, x, [1])])


def g_matmul_epilogue():  # gelu(x @ w + bias): one store of the final value
    b = GraphBuilder()
    x, w, bias = b.input(0, [8, 16], F32), b.input(1, [16, 32], F32), b.input(2, [32], F32)
    return b.graph([compose.gelu(b, b.ew("add", b.matmul(x, w), bias))])


def g_softmax():  # reduce -> reduce -> normalize in one nest, intermediates local
    b = GraphBuilder()
    x = b.input(0, [8, 32], F32)
    return b.graph([compose.softmax(b, x, 1)])


def g_layer_norm_residual():
    b = GraphBuilder()
    x, r = b.input(0, [8, 32], F32), b.input(1, [8, 32], F32)
    w, bias = b.input(2, [32], F32), b.input(3, [32], F32)
    return b.graph([compose.layer_norm(b, b.ew("add", x, r), 1, w, bias, 1e-5)[0]])


def g_siblings():  # max and sum of the same rows, then their sum
    b = GraphBuilder()
    x = b.input(0, [64, 32], F32)
    mx = b.reduce("reduce_max", x, [1])
    sm = b.reduce("reduce_sum", x, [1])
    return b.graph([mx, sm])


GRAPHS = {f.__name__[2:]: f for f in (g_elementwise_chain, g_broadcast_view, g_reduction_with_producer,
                                      g_reduction_epilogue, g_matmul_epilogue, g_softmax,
                                      g_layer_norm_residual, g_siblings)}


def fixture_text(name: str) -> str:
    p = build(GRAPHS[name]())
    return f"// before fusion\n{format_program(p)}\n// after fusion\n{format_program(fuse(p))}\n"


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_ir_fixture(name):
    path = FIXTURES / f"{name}.mlir"
    got = fixture_text(name)
    want = path.read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(path), "now"))
        pytest.fail(f"fused IR differs from the fixture (update with `python tests/test_fusion.py --update` "
                    f"if intended):\n{diff}")


def _temps(p: Program) -> list[str]:
    return [b.name for b in p.buffers if b.kind == "temp"]


@pytest.mark.parametrize("name,kernels", [
    ("elementwise_chain", 1), ("broadcast_view", 1), ("reduction_with_producer", 1), ("reduction_epilogue", 1),
    ("matmul_epilogue", 1), ("softmax", 1), ("layer_norm_residual", 1), ("siblings", 1)])
def test_fused_structure(name, kernels):
    before = build(GRAPHS[name]())
    after = fuse(before)
    assert len(before.kernels) > kernels
    assert len(after.kernels) == kernels
    assert _temps(after) == []  # every intermediate eliminated or made local


def test_softmax_intermediates_become_local_arrays():
    after = fuse(build(g_softmax()))
    allocs = {s.name: s.size for s in walk_stmts(after.kernels[0].body) if isinstance(s, Alloc)}
    assert sorted(allocs.values()) == [1, 1, 32]  # max and sum as scalars, exp row of 32
    root = after.kernels[0].body[0]
    assert isinstance(root, For) and root.parallel  # the row loop stays parallel


# ---------------------------------------------------------------- illegal fusions refused
def _kernel(name, body, contraction=False):
    return Kernel(name, tuple(body), name, contraction)


def _loop(v, n, body, parallel=True):
    return For(v, c(0), c(n), tuple(body), parallel=parallel)


def _prog(kernels, temps=("t",), n=16):
    bufs = [Buffer("in0", F32, n * n, "input", 0), Buffer("out0", F32, n * n, "output", 0)]
    bufs += [Buffer(t, F32, n * n, "temp") for t in temps]
    return Program(tuple(bufs), tuple(kernels))


def _ld(buf, idx):
    return Load(buf, idx, F32)


def _ix(i, j, n=16):
    return Op("add", (Op("mul", (i, c(n)), "int64"), j), "int64")


def _row_nests(shift: int, n=16):
    """P: t[i, j] = exp(in[i, j]); C: out[i, j] = t[i + shift, j] (reads another row when shift)."""
    i, j = Var("i"), Var("j")
    p = _kernel("p", [_loop("i", n, [_loop("j", n, [Store("t", _ix(i, j), Op("exp", (_ld("in0", _ix(i, j)),), F32))])])])
    src = Op("remainder", (Op("add", (i, c(shift)), "int64"), c(n)), "int64") if shift else i
    cbody = [Store("out0", _ix(i, j), Op("add", (_ld("t", _ix(src, j)), _ld("t", _ix(src, j))), F32))]
    return p, _kernel("c", [_loop("i", n, [_loop("j", n, cbody)])])


def test_loop_fusion_refused_across_rows():
    """A consumer row that reads another producer row: the dependence is carried by the shared
    loop, so loop fusion there is illegal (and fusing without the loop parallel is refused)."""
    p, k = _row_nests(shift=1)
    prog = _prog([p, k])
    out = fuse_loops.fuse_loops(parallelize.check_parallel(prog), threads=1)
    assert len(out.kernels) == 2
    p, k = _row_nests(shift=0)  # the same nests reading their own row do fuse
    out = fuse_loops.fuse_loops(parallelize.check_parallel(_prog([p, k])), threads=1)
    assert len(out.kernels) == 1 and _temps(out) == []


def test_loop_fusion_refused_for_transposed_dependence():
    """Softmax over dim 0 of a square matrix: the column reduction and the row-major normalize
    share loop bounds, but column j's result is read by every row: no fusion at that loop."""
    b = GraphBuilder()
    x = b.input(0, [16, 16], F32)
    s = b.reduce("reduce_sum", x, [0], keepdim=True)
    prog = build(b.graph([b.ew("div", x, s)]))
    out = fuse(prog)
    assert len(out.kernels) == 2


def test_anti_dependence_refuses_fusion():
    """C overwrites (in a shifted row) a buffer P still reads: a write-after-read carried by the
    shared loop forbids fusion."""
    n = 16
    i, j = Var("i"), Var("j")
    p = _kernel("p", [_loop("i", n, [_loop("j", n, [Store("t", _ix(i, j), _ld("u", _ix(Op("remainder", (Op("add", (i, c(1)), "int64"), c(n)), "int64"), j)))])])])
    k = _kernel("c", [_loop("i", n, [_loop("j", n, [Store("u", _ix(i, j), _ld("t", _ix(i, j)))])])])
    prog = replace(_prog([p, k], temps=("t", "u")))
    out = fuse_loops.fuse_loops(parallelize.check_parallel(prog), threads=1)
    assert len(out.kernels) == 2


def test_epilogue_refused_when_intermediate_has_another_reader():
    b = GraphBuilder()
    x, w = b.input(0, [8, 16], F32), b.input(1, [16, 8], F32)
    mm = b.matmul(x, w)
    prog = build(b.graph([b.ew("relu", mm), b.reduce("reduce_sum", mm, [1])]))
    out = fuse_epilogues.fuse_epilogues(parallelize.check_parallel(prog))
    assert any("t0" == b.name for b in out.buffers)  # the matmul result stays in memory
    assert len(out.kernels) == 3


def test_epilogue_refused_for_broadcast_read():
    """A consumer reading each reduction result many times is not an epilogue (no bijection)."""
    b = GraphBuilder()
    x = b.input(0, [8, 32], F32)
    s = b.reduce("reduce_sum", x, [1], keepdim=True)
    prog = build(b.graph([b.ew("sub", x, s)]))
    out = fuse_epilogues.fuse_epilogues(parallelize.check_parallel(prog))
    assert len(out.kernels) == 2


def test_producer_not_recomputed_inside_contraction():
    """An elementwise producer of a matmul operand is read N times per element: recomputing it
    in the reduction loop costs more than storing it, so it stays a separate nest."""
    b = GraphBuilder()
    x, w = b.input(0, [8, 16], F32), b.input(1, [16, 64], F32)
    prog = build(b.graph([b.matmul(b.ew("exp", x), w)]))
    out = fuse_producers.fuse_producers(parallelize.check_parallel(prog))
    assert len(out.kernels) == 2
    b = GraphBuilder()  # read once per element (an elementwise consumer): recomputed in place
    x = b.input(0, [8, 16], F32)
    prog = build(b.graph([b.ew("mul", b.ew("exp", x), b.full(2.0, F32))]))
    assert len(fuse_producers.fuse_producers(parallelize.check_parallel(prog)).kernels) == 1


def test_producer_not_recomputed_in_a_strided_depthwise_conv():
    """A stride-2 3x3 depthwise convolution reads each input element about 2.25 times: within
    the recomputation budget, but recomputing inside a contraction's reduction keeps its
    operand from being a plain load (it was measured slower), so the producer stays."""
    b = GraphBuilder()
    x, w = b.input(0, [1, 8, 80, 80], F32), b.input(1, [8, 1, 3, 3], F32)  # wide: the row form
    act = b.ew("relu", b.ew("add", b.ew("mul", x, b.full(0.5, F32)), b.full(1.0, F32)))
    conv = b.node("conv2d", (act, w), stride=(2, 2), padding=(1, 1), dilation=(1, 1), groups=8)
    out = fuse_producers.fuse_producers(parallelize.check_parallel(build(b.graph([conv]))))
    assert len(out.kernels) == 2 and "relu" not in out.kernels[-1].origin


def test_producer_fused_into_a_small_depthwise_plane_copy():
    """On small maps a depthwise convolution copies each input plane once into a zero-halo
    buffer: the producer is read once per element there and is recomputed in the copy."""
    b = GraphBuilder()
    x, w = b.input(0, [1, 8, 16, 16], F32), b.input(1, [8, 1, 3, 3], F32)
    act = b.ew("relu", b.ew("add", b.ew("mul", x, b.full(0.5, F32)), b.full(1.0, F32)))
    conv = b.node("conv2d", (act, w), stride=(2, 2), padding=(1, 1), dilation=(1, 1), groups=8)
    from polytile.backends.cpu.conv import lower_conv2d  # the CPU backend's choice of the plane form

    out = fuse_producers.fuse_producers(parallelize.check_parallel(build(b.graph([conv]), {"conv2d": lower_conv2d})))
    (k,) = out.kernels
    assert "relu" in k.origin and any(isinstance(s, Alloc) and s.name == "xplane" for s in walk_stmts(k.body))


def test_producer_reading_a_later_write_is_not_moved():
    """Recomputing P at its consumer would read ``u`` after a nest in between rewrote it."""
    n = 16
    i, j = Var("i"), Var("j")
    p = _kernel("p", [_loop("i", n, [_loop("j", n, [Store("t", _ix(i, j), Op("exp", (_ld("u", _ix(i, j)),), F32))])])])
    mid = _kernel("m", [_loop("i", n, [_loop("j", n, [Store("u", _ix(i, j), _ld("in0", _ix(i, j)))])])])
    k = _kernel("c", [_loop("i", n, [_loop("j", n, [Store("out0", _ix(i, j), _ld("t", _ix(i, j)))])])])
    prog = _prog([p, mid, k], temps=("t", "u"))
    out = fuse_producers.fuse_producers(parallelize.check_parallel(prog))
    assert [k.name for k in out.kernels][:2] == ["p", "m"]


# ---------------------------------------------------------------- options
def test_fusion_flags_turn_each_kind_off():
    g = g_layer_norm_residual
    n_off = len(fuse(build(g()), fusion=False).kernels)
    assert n_off == len(build(g()).kernels)
    full = format_program(fuse(build(g())))
    for flag in ("fuse_producers", "fuse_epilogues", "fuse_loops"):
        assert format_program(fuse(build(g()), **{flag: False})) != full, flag
    assert len(fuse(build(g()), fuse_loops=False).kernels) > 1
    assert len(fuse(build(g_siblings()), fuse_siblings=False).kernels) == 2


# ---------------------------------------------------------------- execution: fused == unfused == eager
def _transformer_tail(x, r, w, b, w2, b2):
    h = F.layer_norm(x + r, (x.shape[-1],), w, b)
    return F.gelu(h) * 0.5 + torch.softmax(h, -1)


def _with_nan(x):
    x[1, 3] = float("nan")
    x[4, 39] = float("nan")
    x[5, :] = float("-inf")
    return x


WORKLOADS = {
    "softmax": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(33, 77),)),
    "log_softmax_dim0": (lambda x: torch.log_softmax(x, 0), lambda: (torch.randn(20, 20),)),
    "layer_norm_residual": (lambda x, r, w, b: F.layer_norm(x + r, (96,), w, b),
                            lambda: (torch.randn(4, 9, 96), torch.randn(4, 9, 96), torch.randn(96), torch.randn(96))),
    "rms_norm": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
                 lambda: (torch.randn(6, 128), torch.randn(128))),
    "gelu_mlp": (lambda x, w, b: F.gelu(x @ w + b), lambda: (torch.randn(16, 64), torch.randn(64, 48), torch.randn(48))),
    "chain8": (lambda x: ((((x * 2 + 1).relu() - 3).sigmoid() * 4).tanh() + 1).exp() / 3,
               lambda: (torch.randn(5, 7, 11),)),
    "bn_relu": (lambda x, m, v, w, b: F.relu(F.batch_norm(x, m, v, w, b, training=False)),
                lambda: (torch.randn(2, 8, 5, 5), torch.randn(8), torch.rand(8) + 0.5, torch.randn(8), torch.randn(8))),
    "conv_bn_relu_residual": (lambda x, cw, m, v: F.relu(F.batch_norm(F.conv2d(x, cw, padding=1), m, v, training=False) + x),
                              lambda: (torch.randn(1, 8, 9, 9), torch.randn(8, 8, 3, 3), torch.randn(8), torch.rand(8) + 0.5)),
    "transformer_tail": (_transformer_tail, lambda: (torch.randn(2, 5, 32), torch.randn(2, 5, 32), torch.randn(32),
                                                    torch.randn(32), None, None)),
    "max_min_with_nan": (lambda x: (x.amax(-1), x.amin(-1), torch.softmax(x, -1)), lambda: (_with_nan(torch.randn(6, 40)),)),
    "var_mean_dims": (lambda x: torch.var_mean(x, dim=(0, 2)), lambda: (torch.randn(4, 6, 10),)),
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_fused_equals_unfused_and_eager(name):
    fn, make = WORKLOADS[name]
    args = make()
    ref = fn(*args)
    outs = {}
    for fusion in (True, False):
        torch._dynamo.reset()
        polytile.reset_stats()
        out = torch.compile(fn, backend="polytile", options={"fusion": fusion, "fallback": False})(*args)
        outs[fusion] = (out, polytile.stats().get("kernels_generated", 0))
        assert_accurate(out, ref, lambda: fp64_reference(fn, args), 1e-4)
    assert outs[True][1] <= outs[False][1]
    for a, b in zip(*(torch.utils._pytree.tree_leaves(outs[f][0]) for f in (True, False))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_memory_plan_shrinks():
    from polytile.compiler import compile_graph_ir
    from polytile.runtime.loader import TensorSpec

    sizes = {}
    for fusion in (True, False):
        g = g_layer_norm_residual()
        specs = [TensorSpec(n.shape, tuple(torch.empty(n.shape).stride()), n.dtype) for n in g.inputs]
        ng = compile_graph_ir(g, specs, Options(fusion=fusion), "ln")
        sizes[fusion] = (ng.memory_plan.arena_bytes, ng.num_kernels)
    assert sizes[True][0] == 0 and sizes[False][0] > 0
    assert sizes[True][1] == 1 < sizes[False][1]


if __name__ == "__main__" and "--update" in sys.argv:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name in sorted(GRAPHS):
        (FIXTURES / f"{name}.mlir").write_text(fixture_text(name))
        print("wrote", FIXTURES / f"{name}.mlir")


def test_pad_is_an_interior_copy_and_fills_and_fuses_affinely():
    """Padding lowers to a condition-free copy of the interior plus fill slabs, so a producer
    fused into it is read through an affine index (no floordiv/mod per element) and its
    transcendental calls vectorize (TF-style 'same' padding after BN + SiLU)."""
    b = GraphBuilder()
    x = b.input(0, [2, 8, 12, 12], F32)
    act = b.ew("sigmoid", b.ew("mul", x, b.full(2.0, F32)))
    padded = b.node("pad", (act,), pads=((0, 0), (0, 0), (0, 1), (1, 1)), value=0.0)
    p = build(b.graph([padded]))
    for name, fn in passes_for(Options(threads=1, machine=pinned())):
        p = fn(p)
    (k,) = p.kernels
    ops = {x.fn for s in walk_stmts(k.body) for e in stmt_exprs(s) for x in walk_exprs(e) if isinstance(x, Op)}
    assert "sigmoid" in ops and not ops & {"floordiv", "remainder", "where"}
    assert len([s for s in k.body if isinstance(s, For)]) == 4  # interior, one slab in H, two in W
    xs = torch.randn(2, 8, 12, 12)
    fn = lambda t: F.pad(torch.sigmoid(t * 2), (1, 1, 0, 1))  # noqa: E731
    torch._dynamo.reset()
    out = torch.compile(fn, backend="polytile", options={"fallback": False})(xs)
    torch.testing.assert_close(out, fn(xs))
