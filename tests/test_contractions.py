"""Register tiling with packing of contraction nests (issue 5): the tiled program against the
untiled one and against eager over many shapes (odd sizes, partial tiles, batches,
transposed operands, fused epilogues); the IR has the expected structure; the Target and
its overrides."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import polytile
from polytile.affine.build import build
from polytile.affine.ir import Alloc, Const, For, If, Let, Load, Op, Store, c, lanes, stmt_exprs, walk_exprs, walk_stmts
from polytile.graph.builder import GraphBuilder
from polytile.options import Options
from polytile.backends.cpu.machine import detect, resolve
from polytile.compiler import passes_for

from accuracy import assert_accurate, fp64_reference
from machines import NUMERIC, pinned

F32 = "float32"


def _compile(fn, args, target=None, **opts):
    """``fn`` compiled for the pinned machine with ``target``'s fields changed."""
    torch._dynamo.reset()
    polytile.reset_stats()
    opts["machine"] = pinned(**(target or {}))
    out = torch.compile(fn, backend="polytile", options={"fallback": False, **opts})(*args)
    return out, polytile.stats()


SHAPES = [(1, 1, 1), (200, 96, 130), (7, 13, 5), (6, 16, 8), (12, 32, 64), (13, 17, 19), (97, 101, 103), (1000, 33, 7),
          (64, 1031, 16), (31, 48, 1),
          # partial last panels of one and two vectors, packed per panel (>= 8 panels, K >= 64)
          # and in a separate pack pass
          (29, 400, 64), (40, 401, 70), (100, 97, 200),
          # few columns: the dot form (reduction vectorized), K with and without a lane tail
          (300, 1, 64), (77, 3, 129), (64, 4, 100), (45, 5, 37), (19, 9, 256), (1, 2, 5000)]


@pytest.mark.parametrize("m,n,k", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
def test_matmul_tiled_equals_untiled_and_eager(m, n, k):
    a, b = torch.randn(m, k), torch.randn(k, n)
    fn = torch.mm
    ref = fn(a, b)
    tiled, _ = _compile(fn, (a, b))
    untiled, _ = _compile(fn, (a, b), tile_contractions=False)
    assert_accurate(tiled, ref, lambda: fp64_reference(fn, (a, b)), 1e-4)
    torch.testing.assert_close(tiled, untiled, rtol=1e-4, atol=1e-4)


CASES = {
    "linear_bias_gelu": (lambda x, w, b: F.gelu(F.linear(x, w, b)), lambda: (torch.randn(37, 70), torch.randn(50, 70),
                                                                          torch.randn(50))),
    "bmm": (torch.bmm, lambda: (torch.randn(3, 29, 40), torch.randn(3, 40, 35))),
    "bmm_broadcast_weight": (lambda x, w: x @ w, lambda: (torch.randn(2, 3, 20, 30), torch.randn(30, 33))),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0),
                lambda: (torch.randn(2, 14, 18), torch.randn(2, 14, 9), torch.randn(2, 9, 18))),
    "transposed_a": (lambda a, b: a.t() @ b, lambda: (torch.randn(40, 23), torch.randn(40, 31))),
    "transposed_a_batched": (lambda a, b: a.transpose(-1, -2) @ b, lambda: (torch.randn(3, 33, 20), torch.randn(3, 33, 40))),
    "mixer_token_mlp": (lambda x, w, b: F.linear(x.transpose(1, 2), w, b).transpose(1, 2),
                        lambda: (torch.randn(2, 49, 24), torch.randn(30, 49), torch.randn(30))),
    "residual_relu_epilogue": (lambda x, w, r: F.relu(x @ w + r), lambda: (torch.randn(20, 24), torch.randn(24, 40),
                                                                           torch.randn(20, 40))),
    "linear_two_outputs_bias_sigmoid": (lambda x, w, b: torch.sigmoid(F.linear(x, w, b)),
                                        lambda: (torch.randn(70, 300), torch.randn(2, 300), torch.randn(2))),
    "bmm_matrix_vector": (torch.bmm, lambda: (torch.randn(3, 40, 57), torch.randn(3, 57, 3))),
    "attention_scores": (lambda q, k: torch.softmax(q @ k.transpose(-1, -2) / 8.0, -1),
                         lambda: (torch.randn(2, 4, 19, 16), torch.randn(2, 4, 21, 16))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_contraction_cases(name):
    fn, make = CASES[name]
    args = make()
    ref = fn(*args)
    tiled, st = _compile(fn, args)
    untiled, _ = _compile(fn, args, tile_contractions=False)
    assert st["ops_fallen_back"] == {}
    assert_accurate(tiled, ref, lambda: fp64_reference(fn, args), 1e-4)
    torch.testing.assert_close(tiled, untiled, rtol=1e-4, atol=1e-4)


CONVS = {
    "3x3_pad1": dict(x=(2, 8, 13, 11), w=(16, 8, 3, 3), padding=1),
    "1x1": dict(x=(1, 24, 7, 9), w=(20, 24, 1, 1)),
    "7x7_stride2_pad3": dict(x=(1, 3, 29, 31), w=(16, 3, 7, 7), stride=2, padding=3),
    "grouped": dict(x=(1, 16, 10, 10), w=(24, 4, 3, 3), padding=1, groups=4),
    "dilated": dict(x=(1, 8, 17, 15), w=(12, 8, 3, 3), padding=2, dilation=2),
    "depthwise": dict(x=(1, 12, 9, 9), w=(12, 1, 3, 3), padding=1, groups=12),
    # small maps: plane by plane through a zero-halo copy (stride, dilation, 5x5, no padding)
    "depthwise_5x5_pad2": dict(x=(2, 12, 14, 14), w=(12, 1, 5, 5), padding=2, groups=12),
    "depthwise_s2_dilated": dict(x=(1, 6, 15, 13), w=(6, 1, 3, 3), stride=2, padding=2, dilation=2, groups=6),
    "depthwise_no_pad_odd": dict(x=(1, 5, 7, 11), w=(5, 1, 3, 2), groups=5),
    "depthwise_wide_rows": dict(x=(1, 4, 6, 70), w=(4, 1, 3, 3), padding=1, groups=4),
    "odd_channels_no_pad": dict(x=(1, 5, 19, 23), w=(7, 5, 3, 2)),
    # output rows wider than a panel: panel rows inside one image row and the padding are vector
    # copies, the others (row crossings, borders) element by element
    "wide_rows_pad1": dict(x=(1, 4, 5, 40), w=(8, 4, 3, 3), padding=1),
    "wide_rows_dilated_pad2": dict(x=(2, 3, 6, 50), w=(7, 3, 3, 3), padding=2, dilation=2),
    "wide_rows_no_pad": dict(x=(1, 6, 4, 70), w=(9, 6, 2, 3)),
    "wide_rows_stride2_pad1": dict(x=(1, 8, 10, 70), w=(16, 8, 3, 3), stride=2, padding=1),
    "wide_rows_stride2_to_the_end": dict(x=(2, 4, 9, 67), w=(12, 4, 3, 3), stride=2),
    # small images: the images' pixels become the columns (batch_into_columns)
    "images_as_columns_7x7": dict(x=(5, 24, 7, 7), w=(40, 24, 3, 3), padding=1),
    "images_as_columns_5x5_s2": dict(x=(3, 16, 9, 9), w=(20, 16, 3, 3), stride=2, padding=1),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv_tiled_equals_untiled_and_eager(name):
    cfg = dict(CONVS[name])
    x, w = torch.randn(*cfg.pop("x")), torch.randn(*cfg.pop("w"))
    bias = torch.randn(w.shape[0])

    def fn(x, w, b):
        return F.relu(F.conv2d(x, w, b, **cfg))

    ref = fn(x, w, bias)
    tiled, st = _compile(fn, (x, w, bias))
    untiled, _ = _compile(fn, (x, w, bias), tile_contractions=False)
    assert st["ops_fallen_back"] == {}
    assert_accurate(tiled, ref, lambda: fp64_reference(fn, (x, w, bias)), 1e-4)
    torch.testing.assert_close(tiled, untiled, rtol=1e-4, atol=1e-4)


def test_conv_is_tiled():
    b = GraphBuilder()
    x, w = b.input(0, [1, 16, 12, 12], F32), b.input(1, [32, 16, 3, 3], F32)
    conv = b.node("conv2d", (x, w), stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    p = _pipeline(build(b.graph([conv])), target={"vector_bytes": 32, "vector_registers": 16})
    # 144 pixels = 9 panels of 16: each panel of the image (im2col, K = 16*3*3) is packed inside
    # the panel loop into a local buffer that the row tiles then read
    (k,) = p.kernels
    assert any(isinstance(s, Alloc) and s.name == "ypanel" and s.size == 144 * 16 for s in walk_stmts(k.body))
    vec = {e.buf for s in walk_stmts(k.body) for e in _exprs(s) if isinstance(e, Load) and lanes(e.dtype) > 1}
    # the tiles read the panel; panel rows that lie in one image row and inside the padding
    # are copied from the image with vector loads (the test at both ends of the row)
    # (panel rows across image rows: vector loads kept under a lane mask, ``pmask``)
    assert "ypanel" in vec and len(vec - {"pmask"}) == 2
    assert any(isinstance(s, If) and any(isinstance(t, Store) and lanes(t.value.dtype) > 1
                                         for t in walk_stmts(s.then)) for s in walk_stmts(k.body))
    # the test sits outside the input-channel loop (it reads only kh, kw and the pixel); inside
    # it, the masked rows test only that their loads stay within the tensor
    tests = [s for s in walk_stmts(k.body) if isinstance(s, If) and any(
        isinstance(t, Store) and lanes(t.value.dtype) > 1 for t in walk_stmts(s.then))]
    outer = [s for s in tests if isinstance(s.then[0], For)]
    assert outer and all(s.then[0].var == "r0" for s in outer)
    assert all(isinstance(t, Store) and t.value.fn == "keep_lanes" for s in tests if s not in outer for t in s.then)


def test_conv_epilogue_stores_pixels_by_their_flat_index():
    """A convolution of one image whose panels span pixel rows (7 x 7 outputs, panels of 32):
    the epilogue addresses the output by the panel's flat pixel index (the image loop of one
    iteration is no reason to decompose it), so no division or remainder per element; and it
    matches eager."""
    b = GraphBuilder()
    x, w, bias = b.input(0, [1, 64, 7, 7], F32), b.input(1, [256, 64, 1, 1], F32), b.input(2, [1, 256, 1, 1], F32)
    conv = b.node("conv2d", (x, w), stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1)
    out = b.node("relu", (b.node("add", (conv, bias)),))
    p = _pipeline(build(b.graph([out])))
    (k,) = [k for k in p.kernels if not k.name.endswith(("_pack", "_packx"))]
    (st,) = {s.buf for s in walk_stmts(k.body) if isinstance(s, Store) and s.buf.startswith("out")} or {None}
    stores = [s for s in walk_stmts(k.body) if isinstance(s, Store) and s.buf == st]
    assert stores
    assert not any(isinstance(e, Op) and e.fn in ("floordiv", "remainder")
                   for s in stores for e in walk_exprs(s.index)), stores[0]
    xs, ws, bs = torch.randn(1, 64, 7, 7), torch.randn(256, 64, 1, 1), torch.randn(1, 256, 1, 1)
    fn = lambda a, c, d: torch.relu(F.conv2d(a, c) + d)  # noqa: E731
    got, _ = _compile(fn, (xs, ws, bs))
    assert_accurate(got, fn(xs, ws, bs), lambda: fp64_reference(fn, (xs, ws, bs)), 1e-4)


def test_separate_conv_pack_scans_image_rows():
    """A separate im2col pack (a short reduction: 4 channels x 3 x 3) whose panels span image
    rows: each panel is packed as the rows it lies on and a column range in each, the padding
    test split into zero fills around copies, no per-pixel coordinate loads; and it matches
    eager."""
    b = GraphBuilder()
    x, w = b.input(0, [1, 4, 14, 14], F32), b.input(1, [32, 4, 3, 3], F32)
    conv = b.node("conv2d", (x, w), stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    p = _pipeline(build(b.graph([conv])))
    pack = next(k for k in p.kernels if k.name.endswith("_pack"))
    stores = [s for s in walk_stmts(pack.body) if isinstance(s, Store) and not s.buf.endswith("_of")]
    # (the vector copies of whole in-row panels read the panel's first pixel: a constant index)
    assert stores and not any(isinstance(e, Load) and e.buf.endswith("_of") and not isinstance(e.index, Const)
                              for s in stores for e in walk_exprs(s.value))
    xs, ws = torch.randn(1, 4, 14, 14), torch.randn(32, 4, 3, 3)
    fn = lambda a, b: F.conv2d(a, b, padding=1)  # noqa: E731
    out, _ = _compile(fn, (xs, ws))
    assert_accurate(out, fn(xs, ws), lambda: fp64_reference(fn, (xs, ws)), 1e-4)


def _pipeline(p, target=None, **opts):
    """Every pass, for the pinned machine with ``target``'s fields changed."""
    o = Options(**{"threads": 2, "machine": pinned(**(target or {})), **opts})
    for name, fn in passes_for(o):
        p = fn(p)
    return p


def test_tiled_ir_structure():
    b = GraphBuilder()
    x, w = b.input(0, [64, 48], F32), b.input(1, [48, 40], F32)
    p = _pipeline(build(b.graph([b.matmul(x, w)])), target={"vector_bytes": 32, "vector_registers": 16})
    names = [k.name for k in p.kernels]
    assert names[0].endswith("_pack") and len(names) == 2
    main = p.kernels[1]
    vec_loads = [e for s in walk_stmts(main.body) for e in _exprs(s) if isinstance(e, Load) and lanes(e.dtype) > 1]
    assert vec_loads and all(e.dtype == "float32x8" for e in vec_loads)
    assert any(isinstance(s, Alloc) and s.size == 6 * 16 for s in walk_stmts(main.body))  # 6 x 16 register tile
    roots = [s for s in main.body if isinstance(s, For)]
    # the three packed panels fit in the L2 together: row tiles outside (full tiles, then the rows
    # left over, 64 % 6), each meeting the two full panels and the partial last one (40 % 16)
    assert len(roots) == 2 and all(r.var == "io" for r in roots)
    for r in roots:
        assert [(f.var, f.lo.value, f.hi.value) for f in r.body] == [("jo", 0, 2), ("jo", 2, 3)]
    stored = [[s.hi.value for s in walk_stmts([r]) if isinstance(s, For) and s.var == "jj"] for r in roots]
    assert stored == [[16, 8], [16, 8]]  # the partial panel's tiles store its 8 columns only
    assert roots[0].workers >= 1  # the tile loops run under OpenMP


def test_partial_last_panel_computes_only_its_vectors():
    # 16 vector registers of 8 lanes: 6 x 2-vector tiles; the last panel has 8 columns (one vector)
    b = GraphBuilder()
    x, w = b.input(0, [64, 48], F32), b.input(1, [48, 40], F32)
    p = _pipeline(build(b.graph([b.matmul(x, w)])), target={"vector_bytes": 32, "vector_registers": 16})
    sizes = [s.size for s in walk_stmts(p.kernels[1].body) if isinstance(s, Alloc) and s.name == "ctile"]
    assert sorted(set(sizes)) == [4 * 8, 6 * 8, 4 * 16, 6 * 16]  # rows 64 % 6 = 4 left over
    # 32 registers: 9 x 3-vector tiles; the 16-column tail panel gets 14 x 2-vector tiles (panels
    # packed one at a time in the panel loop: 8 full ones and a reduction of 64)
    x, w = b.input(0, [64, 64], F32), b.input(1, [64, 8 * 24 + 16], F32)
    p = _pipeline(build(b.graph([b.matmul(x, w)])), target={"vector_bytes": 32, "vector_registers": 32})
    sizes = {s.size for s in walk_stmts(p.kernels[-1].body) if isinstance(s, Alloc) and s.name == "ctile"}
    assert 9 * 24 in sizes and 14 * 16 in sizes and 9 * 16 not in sizes


def test_transposed_row_operand_is_packed():
    b = GraphBuilder()
    a, w = b.input(0, [48, 64], F32), b.input(1, [48, 40], F32)
    p = _pipeline(build(b.graph([b.matmul(b.transpose(a, 0, 1), w)])), target={"vector_bytes": 32, "vector_registers": 16})
    assert [k.name.rsplit("_", 1)[-1] for k in p.kernels] == ["pack", "packx", "matmul"]
    # rows and columns swapped (A^T's columns are contiguous rows of A): the vector panels come
    # from A, and the smaller operand B (40 columns < 64 rows) is the one packed along rows
    assert p.kernels[0].origin.startswith("pack in0") and p.kernels[1].origin.startswith("pack in1")


def test_linear_packs_the_activations_not_the_weight():
    """x @ w.T with few rows: both operands run along the reduction, so the packed one goes
    through a transpose; orient makes it x (64 rows), not the weight (200), and the tiles then
    write the output along their rows. Compared with eager in test_linear_* below."""
    b = GraphBuilder()
    x, w = b.input(0, [64, 100], F32), b.input(1, [200, 100], F32)
    p = _pipeline(build(b.graph([b.matmul(x, b.transpose(w, 0, 1))])),
                  target={"vector_bytes": 32, "vector_registers": 16})
    assert p.kernels[0].name.endswith("_pack") and p.kernels[0].origin.startswith("pack in0")
    a, wt = torch.randn(64, 100), torch.randn(200, 100)
    out, _ = _compile(lambda a, w: F.linear(a, w), (a, wt), target={"vector_bytes": 32, "vector_registers": 16})
    assert_accurate(out, F.linear(a, wt), lambda: fp64_reference(lambda a, w: F.linear(a, w), (a, wt)), 1e-4)


def test_swapped_linear_output_rows_far_apart_go_through_a_temp():
    """x @ w.T swapped (see above) with 512 weight rows: the output's rows are 2 KB apart, so
    the tiles go row-major to a temp (epilogue applied) and an ``_out`` kernel writes the
    output row by row, transposing blocks in registers; 500 weight rows: tiles store straight to the output; and so do 512
    when the temp (64 x 512 floats) is more than twice the L2, and both when it is up to twice
    (the out kernel reads it down its columns)."""
    for n_out, via_temp, l2 in ((512, True, 2 << 20), (500, False, 2 << 20), (512, True, 64 << 10),
                                (512, False, 32 << 10)):
        b = GraphBuilder()
        x, w, bias = b.input(0, [64, 100], F32), b.input(1, [n_out, 100], F32), b.input(2, [n_out], F32)
        y = b.ew("add", b.matmul(x, b.transpose(w, 0, 1)), bias)
        p = _pipeline(build(b.graph([y])), target={"vector_bytes": 32, "vector_registers": 16, "l2_bytes": l2})
        assert p.kernels[-1].name.endswith("_out") == via_temp
        if via_temp:  # the out kernel moves 8 x 8 blocks transposed in registers
            ops = {e.fn for s in walk_stmts(p.kernels[-1].body) if isinstance(s, Let) for e in walk_exprs(s.value)
                   if isinstance(e, Op)}
            assert {"interleave_lo4", "interleave_hi1"} <= ops
        a, wt, bb = torch.randn(64, 100), torch.randn(n_out, 100), torch.randn(n_out)
        out, _ = _compile(F.linear, (a, wt, bb), target={"vector_bytes": 32, "vector_registers": 16})
        assert_accurate(out, F.linear(a, wt, bb), lambda: fp64_reference(F.linear, (a, wt, bb)), 1e-4)


def test_tile_sizes_follow_the_target():
    b = GraphBuilder()
    x, w = b.input(0, [64, 48], F32), b.input(1, [48, 64], F32)
    p = _pipeline(build(b.graph([b.matmul(x, w)])), target={"vector_bytes": 16, "vector_registers": 32})
    main = p.kernels[-1]
    vec = {e.dtype for s in walk_stmts(main.body) for e in _exprs(s) if isinstance(e, Load) and lanes(e.dtype) > 1}
    assert vec == {"float32x4"}


def _exprs(s):
    for e in stmt_exprs(s):
        yield from walk_exprs(e)


def test_narrow_vectors_give_the_same_answer():
    a, b = torch.randn(50, 37), torch.randn(37, 45)
    for vb in (16, 32):
        out, _ = _compile(torch.mm, (a, b), target={"vector_bytes": vb})
        torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)


def test_target_detection_and_overrides():
    t = detect()
    assert t.vector_bytes in (16, 32, 64) and t.cores >= 1 and t.l1d_bytes > 0
    assert resolve({"vector_bytes": 16}).lanes(4) == 4
    with pytest.raises(ValueError, match="valid fields"):
        resolve({"vector_width": 16})
    with pytest.raises(Exception, match="valid fields"):  # dynamo wraps the backend's ValueError
        torch.compile(torch.mm, backend="polytile", options={"machine": {"nope": 1}})(torch.ones(2, 2), torch.ones(2, 2))
    # a named machine instead of the detected one, with fields changed
    z3 = resolve({"preset": "zen3", "cores": 1})
    assert (z3.vector_bytes, z3.vector_registers, z3.l2_bytes, z3.cores) == (32, 16, 512 << 10, 1)
    with pytest.raises(ValueError, match="presets are"):
        resolve({"preset": "pentium"})
    # the target by name; the older spelling (a dict as target) is the machine
    assert Options.from_dict({"target": "cpu"}).target == "cpu"
    assert Options.from_dict({"target": {"vector_bytes": 16}}).machine == {"vector_bytes": 16}
    with pytest.raises(ValueError, match="targets are"):
        Options.from_dict({"target": "tpu"})
    a, b = torch.randn(9, 7), torch.randn(7, 5)
    out = torch.compile(torch.mm, backend="polytile", options={"target": "cpu", "machine": {"preset": "sse"},
                                                                "fallback": False})(a, b)
    torch.testing.assert_close(out, a @ b, rtol=1e-5, atol=1e-5)


def test_few_columns_use_the_dot_form():
    b = GraphBuilder()
    x, w = b.input(0, [64, 100], F32), b.input(1, [100, 3], F32)
    p = _pipeline(build(b.graph([b.matmul(x, w)])), target={"vector_bytes": 32, "vector_registers": 16})
    assert [k.name.endswith("_pack") for k in p.kernels] == [True, False]
    main = p.kernels[1]
    vec_loads = [e for s in walk_stmts(main.body) for e in _exprs(s) if isinstance(e, Load) and lanes(e.dtype) > 1]
    # the reduction is vectorized: both operands loaded 8 lanes at a time along K
    bufs = {e.buf for e in vec_loads}
    assert len(bufs) == 2 and sum(b.startswith("pk") for b in bufs) == 1
    assert all(e.dtype == "float32x8" for e in vec_loads)
    # 64 rows in tiles of 4 (3 columns: 12 accumulators), no rows or columns left over
    assert any(isinstance(s, Alloc) and s.size == 4 * 3 * 8 for s in walk_stmts(main.body))


KBLOCK = [(50, 100, 300, False), (8, 200, 301, True), (20, 97, 320, False), (5, 80, 100, True),
          (100, 130, 777, False),
          # dot form (few columns) and one-vector panels (N = 16 lanes)
          (50, 3, 3000, False), (13, 4, 1001, False), (30, 9, 777, False), (40, 16, 999, False)]


@pytest.mark.parametrize("m,n,k,at", KBLOCK, ids=[f"{m}x{n}x{k}{'aT' if t else ''}" for m, n, k, t in KBLOCK])
def test_long_reductions_run_in_blocks(m, n, k, at):
    """With a tiny (overridden) L2 these reductions are too long for a packed panel: the tiled
    and the dot forms run them in blocks of KC (a sequential block loop, accumulators kept in a
    temp between blocks, the epilogue after the last); the answer is unchanged."""
    a = torch.randn(k, m).t() if at else torch.randn(m, k)
    b = torch.randn(k, n)

    def fn(a, b):
        return torch.sigmoid(a @ b) * 2.0

    ref = fn(a, b)
    for l2 in (16384, 65536):
        out, _ = _compile(fn, (a, b), target={"l2_bytes": l2, "l1d_bytes": 4096})
        assert_accurate(out, ref, lambda: fp64_reference(fn, (a, b)), 1e-4)
    bld = GraphBuilder()
    x = bld.transpose(bld.input(0, [k, m], F32), 0, 1) if at else bld.input(0, [m, k], F32)
    p = _pipeline(build(bld.graph([bld.matmul(x, bld.input(1, [k, n], F32))])),
                  target={"l2_bytes": 16384, "l1d_bytes": 4096}, parallel_min_work=0)
    loops = [s for s in walk_stmts(p.kernels[-1].body) if isinstance(s, For)]
    assert any(f.var == "kb" for f in loops)
    # the work inside the sequential block loop runs under OpenMP (with few panels: the row tiles)
    blocks = [f for f in loops if f.var == "kb"]
    assert all(any(g.workers for g in walk_stmts(f.body) if isinstance(g, For)) for f in blocks)


def test_one_vector_panels_use_the_tiled_form():
    """N = one vector: MR x 1 register tiles on packed panels (X streamed once), not the dot form."""
    b = GraphBuilder()
    x, w = b.input(0, [64, 100], F32), b.input(1, [100, 8], F32)
    p = _pipeline(build(b.graph([b.matmul(x, w)])), target={"vector_bytes": 32, "vector_registers": 16})
    tiles = {s.size for s in walk_stmts(p.kernels[-1].body) if isinstance(s, Alloc) and s.name == "ctile"}
    assert tiles == {6 * 8, 4 * 8}  # 6 rows x one 8-lane vector, 64 % 6 = 4 rows left over


def test_row_blocks_when_the_row_operand_exceeds_the_cache():
    """X larger than half the (overridden, tiny) L3: a sequential loop over blocks of rows
    around the parallel panel loop, OpenMP inside it; the answer is unchanged."""
    tgt = {"vector_bytes": 32, "vector_registers": 16, "l3_bytes": 64 * 1024}
    b = GraphBuilder()
    x, w = b.input(0, [157, 128], F32), b.input(1, [128, 40], F32)
    p = _pipeline(build(b.graph([b.matmul(x, w)])), target=tgt)
    main = p.kernels[-1]
    blocks = [s for s in main.body if isinstance(s, For) and s.var == "ib"]
    assert blocks and all(not s.parallel and s.hi.value == 5 for s in blocks)  # 5 blocks of 30 rows
    assert blocks[0].body[0].workers >= 1  # the full panels run under OpenMP inside each block
    a, bb = torch.randn(157, 128), torch.randn(128, 40)
    out, _ = _compile(torch.mm, (a, bb), target=tgt, threads=2)
    assert_accurate(out, a @ bb, lambda: fp64_reference(torch.mm, (a, bb)), 1e-4)


@pytest.mark.parametrize("m,n,k", [(64, 96, 16), (33, 70, 37), (128, 64, 768), (7, 33, 100),
                                   (100, 200, 37), (20, 50, 64), (128, 300, 40)])
def test_linear_transposed_weight_pack_through_local_tile(m, n, k):
    """A weight contiguous along the reduction (nn.Linear's) is packed through a local
    blocks-of-lanes tile, the reduction tail element by element: results match eager."""
    x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    out, st = _compile(F.linear, (x, w, b))
    assert_accurate(out, F.linear(x, w, b), fp64_reference(F.linear, (x, w, b)), 1e-4)
    assert st["ops_fallen_back"] == {} or not st["ops_fallen_back"]


def test_next_row_tile_prefetched_when_x_is_read_in_place():
    """The swapped linear reads the weight rows (its row operand) in place: each register tile's
    reduction loop prefetches the next tile's rows, one line per 16 reductions, and (its output
    running along its rows) the output lines the next tile's epilogue writes, one output row per
    slot; prefetch=False leaves none. Same answer either way."""
    from polytile.affine.ir import Prefetch
    from polytile.codegen.c import stmts as c_stmts
    b = GraphBuilder()
    x, w = b.input(0, [64, 100], F32), b.input(1, [200, 100], F32)
    g = b.graph([b.matmul(x, b.transpose(w, 0, 1))])
    tgt = {"vector_bytes": 32, "vector_registers": 16, "l2_bytes": 64 << 10}  # the weight (80 KB) streams
    main = _pipeline(build(g), target=tgt).kernels[-1]
    loops = [f for f in walk_stmts(main.body) if isinstance(f, For) and f.var == "rflat"]
    pfs = [[s for s in walk_stmts(f.body) if isinstance(s, Prefetch)] for f in loops]
    assert pfs[0] and not pfs[-1]  # the full row tiles; not the one tile of rows left over (200 % 6)
    reads = [s for s in pfs[0] if not s.write]
    writes = [s for s in pfs[0] if s.write]
    assert {s.buf for s in reads} == {"in1"} and len(reads) >= 2  # the next tile's weight rows
    assert {s.buf for s in writes} == {"out0"}  # 100 reductions: 6 slots for 16 output rows
    assert len(writes) == -(-16 // (100 // 16)) and all(s.locality == 1 for s in reads + writes)
    lines = c_stmts((pfs[0][0], writes[0]), 0)
    assert "__builtin_prefetch(&in1[" in lines[0] and ", 0, 1);" in lines[0]
    assert "__builtin_prefetch(&out0[" in lines[1] and ", 1, 1);" in lines[1]
    off = _pipeline(build(g), target=tgt, prefetch=False).kernels[-1]
    assert not [s for s in walk_stmts(off.body) if isinstance(s, Prefetch)]
    # a weight that stays in the L2 across the panels: the output lines only
    big = _pipeline(build(g), target={**tgt, "l2_bytes": 2 << 20}).kernels[-1]
    assert {s.write for s in walk_stmts(big.body) if isinstance(s, Prefetch)} == {True}
    a, wt = torch.randn(64, 100), torch.randn(200, 100)
    for pf in (True, False):
        out, _ = _compile(F.linear, (a, wt), target=tgt, prefetch=pf)
        assert_accurate(out, F.linear(a, wt), lambda: fp64_reference(F.linear, (a, wt)), 1e-4)


def test_next_panel_prefetched_when_its_rows_lie_pages_apart():
    """x @ w with w [K, N] row-major packs each panel of 48 columns inside the panel loop from
    rows N floats apart. With N = 3072 (rows 12 KB apart, a page each) the first three row
    tiles of panel jo prefetch, to the L2, line io of each row of panel jo + 1 (one line per
    reduction step: 48 columns are three lines); with N = 768 (3 KB apart) nothing of w is
    prefetched, nor with a 512 KB L2 (the panel and the next one's lines, 288 KB, over half
    of it); prefetch=False leaves none. Same answer as eager either way."""
    from polytile.affine.ir import Prefetch
    from polytile.codegen.c import stmts as c_stmts
    for n_out, l2, ahead in ((3072, 1 << 20, True), (768, 1 << 20, False), (3072, 512 << 10, False)):
        tgt = {"vector_bytes": 64, "vector_registers": 32, "cores": 2, "l2_bytes": l2}
        b = GraphBuilder()
        x, w = b.input(0, [128, 768], F32), b.input(1, [768, n_out], F32)
        g = b.graph([b.matmul(x, w)])
        main = _pipeline(build(g), target=tgt).kernels[-1]
        pfs = [s for s in walk_stmts(main.body) if isinstance(s, Prefetch) and s.buf == "in1"]
        assert bool(pfs) == ahead, n_out
        if ahead:
            guards = [s for s in walk_stmts(main.body) if isinstance(s, If) and any(isinstance(t, Prefetch)
                                                                                  for t in s.then)]
            assert guards and all(s.locality == 2 for s in pfs)
            line = c_stmts(guards[0].then, 0)[0]
            assert "(jo + INT64_C(1)) * INT64_C(48)" in line and "io * INT64_C(16)" in line and ", 0, 2);" in line
            off = _pipeline(build(g), target=tgt, prefetch=False).kernels[-1]
            assert not [s for s in walk_stmts(off.body) if isinstance(s, Prefetch)]
    torch.manual_seed(0)
    a, wt = torch.randn(128, 768), torch.randn(768, 3072) / 20
    for pf in (True, False):
        out, _ = _compile(torch.mm, (a, wt), prefetch=pf)
        assert_accurate(out, a @ wt, lambda: fp64_reference(torch.mm, (a, wt)), 1e-4)


def test_packed_row_operand_is_not_prefetched():
    """X packed into its own panels (a transposed row operand): no prefetches of X (its packed
    panels are read in order)."""
    from polytile.affine.ir import Prefetch
    b = GraphBuilder()
    a, w = b.input(0, [48, 64], F32), b.input(1, [48, 40], F32)
    p = _pipeline(build(b.graph([b.matmul(b.transpose(a, 0, 1), w)])), target={"vector_bytes": 32, "vector_registers": 16})
    assert not [s for k in p.kernels for s in walk_stmts(k.body) if isinstance(s, Prefetch) and not s.write]


def test_partial_last_panel_packed_through_the_local_tile_too():
    """The swapped linear packs x (100 rows: panels of 48, 48 and 4 columns) without an
    element-wise gather: the full panels in 16 x 16 register transposes, the partial last one
    through the local tile (its 4 columns, then zeros)."""
    b = GraphBuilder()
    x, w = b.input(0, [100, 64], F32), b.input(1, [300, 64], F32)
    p = _pipeline(build(b.graph([b.matmul(x, b.transpose(w, 0, 1))])),
                  target={"vector_bytes": 64, "vector_registers": 32, "cores": 1})  # one core: 9 x 3 tiles
    pack = p.kernels[0]
    assert pack.name.endswith("_pack") and pack.origin.startswith("pack in0")
    tiles = sorted(s.size for s in walk_stmts(pack.body) if isinstance(s, Alloc) and s.name == "tblk")
    assert tiles == [4 * 16]
    ops = {e.fn for s in walk_stmts(pack.body) if isinstance(s, Let) for e in walk_exprs(s.value)
           if isinstance(e, Op)}
    assert {"interleave_lo8", "interleave_hi1"} <= ops
    zero = [s for s in walk_stmts(pack.body) if isinstance(s, For) and s.var == "jj" and s.lo == Const(4, "int64")]
    assert zero and zero[0].hi == Const(48, "int64")


def test_grouped_conv_with_few_channels_per_group_is_tiled():
    """8 output channels per group (RegNet, ResNeXt) are fewer rows than a register tile: the
    implicit GEMM of each group is still tiled (one 8-row tile per packed im2col panel), and a
    small plain product with as few rows is not (its packing would cost more than it saves)."""
    b = GraphBuilder()
    x, w = b.input(0, [2, 64, 7, 7], F32), b.input(1, [64, 8, 3, 3], F32)
    conv = b.node("conv2d", (x, w), stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=8)
    p = _pipeline(build(b.graph([conv])))
    tiles = {s.size for k in p.kernels for s in walk_stmts(k.body) if isinstance(s, Alloc) and s.name == "ctile"}
    assert tiles and all(t % 8 == 0 and t // 8 >= 16 for t in tiles)  # 8 rows x whole vectors
    b = GraphBuilder()
    a, m = b.input(0, [6, 256], F32), b.input(1, [256, 256], F32)
    p = _pipeline(build(b.graph([b.matmul(a, m)])))
    assert not [s for k in p.kernels for s in walk_stmts(k.body) if isinstance(s, Alloc) and s.name == "ctile"]
    for shape, groups in (((2, 64, 7, 7), 8), ((3, 40, 9, 9), 5), ((1, 48, 14, 14), 8)):
        xs = torch.randn(*shape)
        ws = torch.randn(shape[1], shape[1] // groups, 3, 3)
        fn = lambda a, b, g=groups: F.conv2d(a, b, padding=1, groups=g)  # noqa: E731
        out, _ = _compile(fn, (xs, ws))
        assert_accurate(out, fn(xs, ws), lambda: fp64_reference(fn, (xs, ws)), 1e-4)
    for shape in ((8, 768, 3072), (5, 1000, 1000), (4, 300, 64)):
        xs, ws = torch.randn(shape[0], shape[1]), torch.randn(shape[1], shape[2])
        out, _ = _compile(torch.mm, (xs, ws))
        assert_accurate(out, xs @ ws, lambda: fp64_reference(torch.mm, (xs, ws)), 1e-4)


def test_panel_width_balances_the_cores():
    """N = 512 over two cores: 11 panels of 48 columns would leave one core 6 of them (288
    columns), so the 2-vector panels (16 of 32) are used; N = 1024 (22 vs 32 panels: 528 vs
    512 columns) keeps 3-vector panels, as does one core, and so do panels that all fit in
    the L2 (the row tiles are shared over the cores then)."""
    def widths(n_cols, cores):
        b = GraphBuilder()
        x, w = b.input(0, [512, 256], F32), b.input(1, [256, n_cols], F32)
        p = _pipeline(build(b.graph([b.matmul(x, w)])), target={"vector_bytes": 64, "vector_registers": 32,
                                                                 "cores": cores, "l2_bytes": 256 << 10})
        return {s.size // 16 for k in p.kernels for s in walk_stmts(k.body) if isinstance(s, Alloc) and s.name == "ctile"}
    # (register tiles of 14 x 2 or 9 x 3 vectors, and the 512 % 14 or 512 % 9 rows left over)
    assert widths(512, 2) == {14 * 2, 8 * 2}
    assert 9 * 3 in widths(1024, 2) and 9 * 3 in widths(512, 1)
    b = GraphBuilder()
    x, w = b.input(0, [512, 64], F32), b.input(1, [64, 512], F32)  # 11 panels of 64 x 48: 135 KB
    p = _pipeline(build(b.graph([b.matmul(x, w)])), target={"vector_bytes": 64, "vector_registers": 32, "cores": 2})
    assert 9 * 3 * 16 in {s.size for k in p.kernels for s in walk_stmts(k.body) if isinstance(s, Alloc)}
    a, m = torch.randn(100, 64), torch.randn(64, 512)
    out, _ = _compile(torch.mm, (a, m))
    assert_accurate(out, a @ m, lambda: fp64_reference(torch.mm, (a, m)), 1e-4)


FEW_TOKENS = [(1, 768, 100), (3, 200, 96), (4, 130, 64), (8, 97, 33), (17, 64, 129), (24, 300, 40)]


@pytest.mark.parametrize("m,n,k", FEW_TOKENS, ids=[f"{m}x{n}x{k}" for m, n, k in FEW_TOKENS])
def test_linear_on_few_tokens_streams_the_weight(m, n, k):
    """x @ w.T with fewer rows of x than 3/4 of a panel (decoding a few tokens): the weight's
    rows become the tile rows, read in place along the reduction (the dot form, or one-vector
    panels for 16 tokens), and only x is packed; against eager."""
    b = GraphBuilder()
    x, w = b.input(0, [m, k], F32), b.input(1, [n, k], F32)
    p = _pipeline(build(b.graph([b.matmul(x, b.transpose(w, 0, 1))])))
    packs = [kk for kk in p.kernels if kk.name.endswith("_pack")]
    assert len(packs) == 1 and packs[0].origin.startswith("pack in0")
    main = [kk for kk in p.kernels if not kk.name.endswith("_pack")]
    w_loads = [e for kk in main for s in walk_stmts(kk.body) for e in _exprs(s)
               if isinstance(e, Load) and e.buf == "in1"]
    assert w_loads  # the weight is read in place by the tiles
    a, wt, bias = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    out, _ = _compile(lambda a, w, bb: F.linear(a, w, bb), (a, wt, bias))
    assert_accurate(out, F.linear(a, wt, bias), lambda: fp64_reference(lambda a, w, bb: F.linear(a, w, bb),
                                                                        (a, wt, bias)), 1e-4)


VECTOR_ROWS = [(768, 3072), (3072, 768), (300, 97), (1024, 2048)]


@pytest.mark.parametrize("k,n", VECTOR_ROWS, ids=[f"{k}x{n}" for k, n in VECTOR_ROWS])
def test_one_row_times_a_row_major_matrix_shares_the_reduction(k, n):
    """x @ W with one row of x and a row-major W (GPT-2's Conv1D while decoding): the threads
    share the reduction, each adding whole rows of W into its own accumulator row (an array
    reduction), rather than each reading a short piece of every row; with accumulators past
    half the L1 (2048 columns) the columns are split as before. Against eager."""
    from polytile.affine.ir import For

    b = GraphBuilder()
    x, w = b.input(0, [1, k], F32), b.input(1, [k, n], F32)
    p = _pipeline(build(b.graph([b.matmul(x, w)])))
    loops = [s for kk in p.kernels for s in walk_stmts(kk.body) if isinstance(s, For)]
    shared = [f for f in loops if f.reduce_arrays]
    if n * 4 <= 16 * 1024 and k >= 256:
        assert len(shared) == 1 and shared[0].workers == 1 and shared[0].reduce_arrays[0][1] == n
        assert sum(f.workers for f in loops) == 1  # nothing else runs in parallel
    else:
        assert not shared
    a, wt, bias = torch.randn(1, k), torch.randn(k, n), torch.randn(n)
    out, _ = _compile(torch.addmm, (bias, a, wt), threads=2)
    assert_accurate(out, torch.addmm(bias, a, wt), lambda: fp64_reference(torch.addmm, (bias, a, wt)), 1e-4)


@pytest.mark.parametrize("preset", NUMERIC)
def test_one_row_reductions_shared_by_threads_match_eager_on_every_machine(preset):
    """The shared reduction with each machine description's vectors, with infinities and NaN."""
    torch._dynamo.reset()
    a, wt, bias = torch.randn(2, 1, 640), torch.randn(640, 200), torch.randn(200)
    a[1, 0, 3], wt[5, 7] = float("inf"), float("nan")
    f = torch.compile(lambda a, w, bb: a @ w + bb, backend="polytile",
                      options={"fallback": False, "threads": 2, "machine": {"preset": preset}})
    for row in (a[:1], a[1:]):
        assert_accurate(f(row, wt, bias), row @ wt + bias, lambda: fp64_reference(lambda a, w, bb: a @ w + bb,
                                                                                  (row, wt, bias)), 1e-4)


def test_small_images_pack_panels_across_images():
    """N8 7 x 7 images, 49 pixels each: two panels of 32 per image would compute 64 columns for
    49, so the image loop joins the columns (392 of them, 13 panels, one partial) and the
    weights are the tile rows for all images at once; a 28 x 28 image (784 pixels, whole
    panels) keeps its image loop outside."""
    def tiled(shape):
        b = GraphBuilder()
        x, w = b.input(0, shape, F32), b.input(1, [64, shape[1], 3, 3], F32)
        conv = b.node("conv2d", (x, w), stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
        (k,) = _pipeline(build(b.graph([conv]))).kernels
        return k
    k = tiled([8, 32, 7, 7])
    panel_loops = [s for s in walk_stmts(k.body) if isinstance(s, For) and s.var == "jo"]
    assert panel_loops and all(s.hi == c(13) for s in panel_loops)
    outer = k.body[0]
    assert isinstance(outer, For) and outer.var != "i0"  # the image loop is not outermost
    k = tiled([8, 32, 28, 28])
    assert isinstance(k.body[0], For) and k.body[0].var == "i0"


def test_few_panels_share_the_l2_in_reduction_blocks():
    """A long reduction with few panels (128 tokens, K = 16384: four panels of 32) runs in
    blocks sized for all the panels together, since every row tile meets all of them: a
    quarter of a 2 MB L2 over 4 x 32 columns is KC = 1024 (one panel alone would get 4096).
    Each block's partial sums start from zero and join the total after it: a running sum
    over K = 4000 failed the accuracy rule (RMSE 7.2e-5 against eager's 2.2e-5), the
    two-level sum passes (1.3e-5)."""
    from polytile.transform.contraction_nest import match
    from polytile.transform.contraction_sizes import k_block
    t = resolve(pinned(**{"l2_bytes": 2 << 20, "vector_bytes": 64, "vector_registers": 32, "cores": 2}))
    b = GraphBuilder()
    x, w = b.input(0, [128, 16384], F32), b.input(1, [512, 16384], F32)
    p = build(b.graph([b.matmul(x, b.transpose(w, 0, 1))]))
    n = match(p.kernels[0])
    assert k_block(n, 16384, 32, t) == 4096 and k_block(n, 16384, 32, t, 4) == 1024
    a, wt = torch.randn(64, 4000), torch.randn(200, 4000)  # swapped: 2 panels of 64 tokens
    out, _ = _compile(lambda a, w: F.linear(a, w), (a, wt), target={"l2_bytes": 65536})
    assert_accurate(out, F.linear(a, wt), lambda: fp64_reference(lambda a, w: F.linear(a, w), (a, wt)), 1e-4)


def k_block_of(k: int) -> int:
    """KC of a 32-token swapped linear with reduction k (one panel) in a 512 KB L2."""
    from polytile.transform.contraction_nest import match
    from polytile.transform.contraction_sizes import k_block
    b = GraphBuilder()
    x, w = b.input(0, [32, k], F32), b.input(1, [96, k], F32)
    n = match(build(b.graph([b.matmul(x, b.transpose(w, 0, 1))])).kernels[0])
    return k_block(n, k, 32, resolve(pinned(**{"l2_bytes": 512 << 10})), 1)


def test_few_panels_block_when_x_is_streamed_per_panel():
    """128 tokens (four panels of 32), K = 3072: one panel fits in half of a 1 MB L2 but not
    all four, and the weight (the row operand of the swapped linear, 9 MB) does not fit in it:
    unblocked, every panel would stream the whole weight from memory. The reduction runs in
    blocks sized for the four panels together (KC 512), each row tile of the weight copied
    once per block for all of them. With 768 (all four panels fit) nothing is blocked. Both
    equal eager's."""
    from polytile.transform.contraction_nest import match
    from polytile.transform.contraction_sizes import k_block
    t = resolve(pinned(**{"l2_bytes": 1 << 20, "vector_bytes": 64, "vector_registers": 32, "cores": 2}))
    for k, n_out, kc in ((3072, 768, 512), (768, 3072, 0)):
        b = GraphBuilder()
        x, w = b.input(0, [128, k], F32), b.input(1, [n_out, k], F32)
        p = build(b.graph([b.matmul(x, b.transpose(w, 0, 1))]))
        assert k_block(match(p.kernels[0]), k, 32, t) == 0
        tiled = _pipeline(p, target={"l2_bytes": 1 << 20, "vector_bytes": 64, "vector_registers": 32, "cores": 2})
        blocks = [f for kk in tiled.kernels for f in walk_stmts(kk.body) if isinstance(f, For) and f.var == "kb"]
        assert bool(blocks) == bool(kc), k
        if kc:
            copies = [s for f in blocks for s in walk_stmts(f.body) if isinstance(s, Alloc) and s.name == "xrows"]
            assert copies and all(s.size % (kc + 16) == 0 for s in copies)  # (14 rows, and 768 % 14)
    torch.manual_seed(0)
    a, wt, bias = torch.randn(128, 3072), torch.randn(768, 3072) / 50, torch.randn(768)
    out, _ = _compile(F.linear, (a, wt, bias), target={"l2_bytes": 1 << 20})
    assert_accurate(out, F.linear(a, wt, bias), lambda: fp64_reference(F.linear, (a, wt, bias)), 1e-4)


def test_long_reduction_summed_in_chunks_passes_the_accuracy_rule():
    """K = 4000 in one register tile (no reduction blocks: the panel fits in the L2): the
    reduction runs in chunks of SUM_CHUNK whose partial sums join the tile's total; a single
    running sum had three times eager's RMSE and failed the rule."""
    torch.manual_seed(0)
    a, wt = torch.randn(64, 4000), torch.randn(200, 4000)
    out, _ = _compile(lambda a, w: F.linear(a, w), (a, wt), target={"l2_bytes": 2 << 20})
    assert_accurate(out, F.linear(a, wt), lambda: fp64_reference(lambda a, w: F.linear(a, w), (a, wt)), 1e-4)
    b = GraphBuilder()
    x, w = b.input(0, [64, 4000], F32), b.input(1, [200, 4000], F32)
    p = _pipeline(build(b.graph([b.matmul(x, b.transpose(w, 0, 1))])), target={"l2_bytes": 2 << 20})
    assert any(isinstance(s, For) and s.var == "rc" for kk in p.kernels for s in walk_stmts(kk.body))


def test_few_panels_split_the_rows_over_the_cores():
    """N1 C256 14 x 14 3x3: 196 pixels are 7 panels of 32 (the last of 4), which OpenMP's
    static schedule would share as 128 columns on one core and 68 on the other; instead the
    first 6 panels run whole (3 per core) and for the last one the 256 output channels are
    split in two parts (loop ``ih``, parallel), each core packing that panel and computing its
    half of the row tiles. The answer is the same as eager's, and isl still proves the parts
    independent (the loops stay parallel)."""
    from polytile.transform.tile_nests import row_split
    assert row_split([32] * 6 + [16], 1, 2, 256, 18) == 2
    assert row_split([32] * 6 + [16], 8, 2, 256, 18) == 1  # 56 panel tasks: shared evenly
    assert row_split([32] * 6 + [16], 1, 2, 64, 4) == 1  # too few rows to pack every panel twice
    assert row_split([32] * 8, 1, 2, 256, 18) == 1
    assert row_split([32] * 3, 1, 2, 200, 14) == 2
    b = GraphBuilder()
    x, w = b.input(0, [1, 256, 14, 14], F32), b.input(1, [256, 256, 3, 3], F32)
    conv = b.node("conv2d", (x, w), stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    (k,) = _pipeline(build(b.graph([conv])), target={"cores": 2}).kernels
    parts = [s for s in walk_stmts(k.body) if isinstance(s, For) and s.var == "ih"]
    assert len(parts) == 1 and parts[0].hi == c(2) and parts[0].parallel
    panels = [(s.lo, s.hi) for s in walk_stmts(k.body) if isinstance(s, For) and s.var == "jo"]
    assert panels == [(c(0), c(6)), (c(6), c(7))]  # whole panels first, then the split one
    assert [s.var for s in walk_stmts(parts[0].body) if isinstance(s, For)][0] == "jo"
    # 10 x 10: 100 pixels are 3 full panels and one of 4; the full ones that share evenly (2) run
    # whole, the third full one and the partial one are split (whole, they would share unevenly)
    b = GraphBuilder()
    x, w = b.input(0, [1, 256, 10, 10], F32), b.input(1, [256, 256, 3, 3], F32)
    conv = b.node("conv2d", (x, w), stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    (k,) = _pipeline(build(b.graph([conv])), target={"cores": 2}).kernels
    assert [(s.var, s.lo, s.hi) for s in walk_stmts(k.body) if isinstance(s, For) and s.var in ("jo", "ih")] == \
        [("jo", c(0), c(2)), ("ih", c(0), c(2)), ("jo", c(2), c(4))]
    torch.manual_seed(0)
    # (81 pixels: panels of 32, 32 and 17, and 200 rows: 14 tiles of 14 and 4 rows left over)
    for shape, ch in (([1, 256, 14, 14], 256), ([1, 100, 9, 9], 200), ([1, 64, 10, 10], 256)):
        a, wt = torch.randn(shape), torch.randn(ch, shape[1], 3, 3)
        out, _ = _compile(lambda a, w: F.conv2d(a, w, padding=1), (a, wt), target={"cores": 2}, threads=2)
        ref = F.conv2d(a, wt, padding=1)
        assert_accurate(out, ref, lambda: fp64_reference(lambda a, w: F.conv2d(a, w, padding=1), (a, wt)), 1e-4)


def test_row_operand_rows_in_one_l1_set_are_copied_apart():
    """A linear whose weight rows are 4 KB apart (K = 1024): all 14 rows of a register tile
    would map to one L1 set, so each tile copies its rows, a chunk of the reduction at a time,
    into ``xrows`` with rows a cache line further apart, and reads X from there. K = 1000
    (rows 4000 B apart, spread over the sets) keeps reading X in place. Both equal eager's."""
    from polytile.transform.tile_nests import aliased_rows
    from polytile.affine.ir import Var
    row = lambda k: Load("x", Op("add", (Op("mul", (Var("i"), c(k)), "int64"), Var("r")), "int64"), F32)  # noqa: E731
    z4 = resolve(pinned())  # 32 KB 8-way L1: a way spans 4 KB
    assert aliased_rows(row(1024), "i", Var("r"), 14, z4) and aliased_rows(row(3072), "i", Var("r"), 14, z4)
    assert aliased_rows(row(512), "i", Var("r"), 14, z4)  # 2 KB apart: two sets of seven rows
    assert not aliased_rows(row(768), "i", Var("r"), 14, z4) and not aliased_rows(row(1000), "i", Var("r"), 14, z4)
    assert not aliased_rows(row(1024), "i", Var("r"), 4, z4)
    # an L1 of 16 ways of 2 KB: rows 3 KB apart take two of its sets, seven rows in each
    wide = resolve(pinned(l1d_bytes=32 << 10, l1d_ways=16))
    assert aliased_rows(row(1024), "i", Var("r"), 14, wide) and aliased_rows(row(768), "i", Var("r"), 14, wide)
    torch.manual_seed(0)
    # 32 tokens: one panel of 2 vectors (AVX-512), the weight's 96 rows in 14-row tiles; with
    # K = 1024 the panel fits in the L2 and each row tile copies its rows whole, once, outside
    # the panel loop; K = 2560 with a smaller L2 runs in reduction blocks, each row tile
    # copying the block's columns of its rows once, outside the panel loop, inside the block's
    for k, l2, copied, hoisted in ((1024, 1 << 20, True, True), (1000, 1 << 20, False, False),
                                   (2560, 512 << 10, True, True)):
        b = GraphBuilder()
        x, w = b.input(0, [32, k], F32), b.input(1, [96, k], F32)
        p = _pipeline(build(b.graph([b.matmul(x, b.transpose(w, 0, 1))])),
                      target={"cores": 2, "vector_bytes": 64, "vector_registers": 32, "l2_bytes": l2})
        copies = [s for kk in p.kernels for s in walk_stmts(kk.body) if isinstance(s, Alloc) and s.name == "xrows"]
        in_panels = [s for kk in p.kernels for f in walk_stmts(kk.body) if isinstance(f, For) and f.var == "jo"
                     for s in walk_stmts(f.body) if isinstance(s, Alloc) and s.name == "xrows"]
        assert bool(copies) == copied and bool(copies and not in_panels) == hoisted, k
        blocks = [f for kk in p.kernels for f in walk_stmts(kk.body) if isinstance(f, For) and f.var == "kb"]
        in_blocks = [s for f in blocks for s in walk_stmts(f.body) if isinstance(s, Alloc) and s.name == "xrows"]
        assert bool(in_blocks) == (k == 2560)
        # (with blocks, a copy holds only the block's columns of the tile's rows)
        assert all(s.size % (k_block_of(k) + 16) == 0 for s in in_blocks)
        a, wt = torch.randn(32, k), torch.randn(96, k)
        for target in ({"l2_bytes": l2}, {"l2_bytes": l2, "vector_bytes": 32, "vector_registers": 16}):
            out, _ = _compile(F.linear, (a, wt), target=target)
            assert_accurate(out, F.linear(a, wt), lambda: fp64_reference(F.linear, (a, wt)), 1e-4)


def test_aliased_row_operand_of_per_panel_tiles_is_packed_once():
    """X @ W with X's rows 2 KB apart (K = 512: a 14-row tile's rows in two L1 sets) and W's 16
    panels packed one at a time in the panel loop: X is packed once per call into row tiles
    (``_packx``, [tile][R][mr]) instead of every row tile copying its rows into ``xrows`` again
    for every panel. K = 528 keeps reading X in place. Rows left over (130) and a tile of a few
    rows (37) included; all equal eager's."""
    tgt = {"cores": 2, "vector_bytes": 64, "vector_registers": 32, "l2_bytes": 1 << 20}
    for k, packed in ((512, True), (528, False)):
        b = GraphBuilder()
        x, w = b.input(0, [128, k], F32), b.input(1, [k, 512], F32)
        p = _pipeline(build(b.graph([b.matmul(x, w)])), target=tgt)
        names = [kk.name for kk in p.kernels]
        copies = [s for kk in p.kernels for s in walk_stmts(kk.body) if isinstance(s, Alloc) and s.name == "xrows"]
        assert any(nm.endswith("_packx") for nm in names) == packed and not copies, (k, names)
    torch.manual_seed(3)
    for m in (128, 130, 37):
        a, wt = torch.randn(m, 512), torch.randn(512, 512)
        for fn in (torch.matmul, F.linear):
            out, _ = _compile(fn, (a, wt), target={"l2_bytes": 1 << 20})
            assert_accurate(out, fn(a, wt), lambda: fp64_reference(fn, (a, wt)), 1e-4)


def test_row_tiles_prefetch_the_next_cached_panel_of_a_large_weight():
    """A linear whose weight is a parameter (its panels packed once and cached) and too large for
    whole panels in the L2 (K = 4096: blocks of the reduction) or with panels over a quarter of
    it (K = 3072): the row tiles of panel jo prefetch panel jo + 1's block from the cache
    buffer; K = 768 (147 KB panels) does not. The results equal eager's either way."""
    from polytile.affine.ir import Prefetch
    from polytile.transform.cache_static import mark_static_inputs

    tgt = {"cores": 2, "vector_bytes": 64, "vector_registers": 32, "l2_bytes": 1 << 20}
    for k, n, prefetched in ((4096, 1024, True), (3072, 768, True), (768, 3072, False)):
        b = GraphBuilder()
        x, w = b.input(0, [128, k], F32), b.input(1, [n, k], F32)
        p = _pipeline(mark_static_inputs(build(b.graph([b.matmul(x, b.transpose(w, 0, 1))])), {1}), target=tgt)
        cache = {bf.name for bf in p.buffers if bf.kind == "cache"}
        assert cache, k
        pfs = [s for kk in p.kernels if not kk.cached for s in walk_stmts(kk.body)
               if isinstance(s, Prefetch) and s.buf in cache]
        assert bool(pfs) == prefetched, k
    torch.manual_seed(4)
    # shapes that take the prefetch on an AVX-512 machine with a 1 MB L2 (the second one with a
    # partial last panel and rows left over)
    for m, k, n in ((64, 3072, 768), (100, 4096, 600)):
        lin = torch.nn.Linear(k, n).eval()
        a = torch.randn(m, k)
        with torch.no_grad():
            out, _ = _compile(lin, (a,), target={"l2_bytes": 1 << 20})
            assert_accurate(out, lin(a), lambda: fp64_reference(lin, (a,)), 1e-4)


def test_swapped_linear_epilogue_of_the_rows_runs_along_the_tile():
    """x @ w.T + b then erf, tiles writing the output along their rows: the value, which reads
    only the tile and the bias (per row of the tile), is computed into the tile first with the
    columns innermost (whole vectors), and the stores only move it. With a residual read along
    the columns (r[j, i]) the value stays in the store loop. Both equal eager's."""
    for residual in (False, True):
        b = GraphBuilder()
        x, w, bias = b.input(0, [64, 100], F32), b.input(1, [500, 100], F32), b.input(2, [500], F32)
        y = b.ew("erf", b.ew("add", b.matmul(x, b.transpose(w, 0, 1)), bias))
        if residual:
            y = b.ew("add", y, b.input(3, [64, 500], F32))
        p = _pipeline(build(b.graph([y])), target={"vector_bytes": 32, "vector_registers": 16})
        main = [k for k in p.kernels if not k.name.endswith(("_pack", "_out"))][0]
        into_tile = [s for s in walk_stmts(main.body) if isinstance(s, Store) and s.buf == "ctile"
                     and any(isinstance(e, Op) and e.fn == "erf" for e in walk_exprs(s.value))]
        assert bool(into_tile) == (not residual)
    fn = lambda a, w, bb, r: torch.erf(F.linear(a, w, bb)) + r  # noqa: E731
    fg = lambda a, w, bb: F.gelu(F.linear(a, w, bb))  # noqa: E731
    a, wt, bb, r = torch.randn(64, 100), torch.randn(500, 100) / 10, torch.randn(500), torch.randn(64, 500)
    out, _ = _compile(fn, (a, wt, bb, r))
    assert_accurate(out, fn(a, wt, bb, r), lambda: fp64_reference(fn, (a, wt, bb, r)), 1e-4)
    out, _ = _compile(fg, (a, wt, bb))
    assert_accurate(out, fg(a, wt, bb), lambda: fp64_reference(fg, (a, wt, bb)), 1e-4)


def test_im2col_rows_across_image_rows_are_masked_vector_copies():
    """A stride-1 convolution whose output is as wide as its input (14 x 14, padding 1): a panel
    of 32 pixels spans image rows, yet its source is contiguous in every panel row; the padding
    test becomes a lane mask per (kh, kw) and each row is vector loads kept under it
    (``keep_lanes``). The dropped lanes read the neighbouring pixels and channels, so inf and
    NaN there must not leak into the padding: against eager with both in the input."""
    b = GraphBuilder()
    x, w = b.input(0, [1, 64, 14, 14], F32), b.input(1, [64, 64, 3, 3], F32)
    conv = b.node("conv2d", (x, w), stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    p = _pipeline(build(b.graph([conv])), target={"cores": 2})
    ops = {e.fn for k in p.kernels for s in walk_stmts(k.body) for e in stmt_exprs(s) for e in walk_exprs(e)
           if isinstance(e, Op)}
    assert "keep_lanes" in ops
    torch.manual_seed(0)
    for shape, ch in (([1, 64, 14, 14], 64), ([2, 16, 9, 9], 20), ([1, 8, 10, 10], 8)):
        a, wt = torch.randn(shape), torch.randn(ch, shape[1], 3, 3)
        a[0, 0, 0, 0], a[-1, -1, -1, -1], a[0, 1, 5, 0] = math.inf, math.nan, -math.inf
        out, _ = _compile(lambda a, w: F.conv2d(a, w, padding=1), (a, wt), target={"cores": 2}, threads=2)
        ref = F.conv2d(a, wt, padding=1)
        assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.equal(torch.isinf(out), torch.isinf(ref))
        fin = torch.isfinite(ref)
        assert (out[fin] - ref[fin]).abs().max() < 1e-3


def test_strided_im2col_rows_over_image_rows_pick_each_rows_loads():
    """A stride-2 convolution, 56x56 -> 28x28: a panel of 32 pixels spans two or three output
    rows; the pixels of output row oh_of[0] + k read y0 + 2 jj + k * 56 (two input rows on), so
    each panel row is the even lanes of each segment's loads, each segment's lanes picked
    (``pick_lanes``) and the padding kept under the lane mask (``keep_lanes``). Against eager
    with inf and NaN beside the padding and in the rows skipped by the stride; a tiny input
    (5x5, stride 2, 3x3 output) takes the element loop for rows whose loads would leave it."""
    b = GraphBuilder()
    x, w = b.input(0, [1, 64, 56, 56], F32), b.input(1, [128, 64, 3, 3], F32)
    conv = b.node("conv2d", (x, w), stride=(2, 2), padding=(1, 1), dilation=(1, 1), groups=1)
    p = _pipeline(build(b.graph([conv])), target={"cores": 2, "vector_bytes": 64, "vector_registers": 32})
    ops = {e.fn for k in p.kernels for s in walk_stmts(k.body) for e in stmt_exprs(s) for e in walk_exprs(e)
           if isinstance(e, Op)}
    assert {"keep_lanes", "pick_lanes", "even_lanes"} <= ops
    segs = {s.name for k in p.kernels for s in walk_stmts(k.body) if isinstance(s, Alloc) and s.name.startswith("pseg")}
    assert segs == {"pseg1", "pseg2"}  # 32 pixels over rows of 28: up to three rows
    torch.manual_seed(0)
    for shape, ch, pad in (([1, 64, 56, 56], 128, 1), ([2, 16, 30, 30], 20, 1), ([1, 8, 5, 5], 8, 1),
                           ([1, 16, 40, 40], 16, 0)):
        a, wt = torch.randn(shape), torch.randn(ch, shape[1], 3, 3)
        a[0, 0, 0, 0], a[-1, -1, -1, -1], a[0, 1, 3, 0], a[0, 2, 1, 3] = math.inf, math.nan, -math.inf, math.nan
        fn = lambda a, w, pad=pad: F.conv2d(a, w, stride=2, padding=pad)  # noqa: E731
        for target in ({"cores": 2}, {"cores": 2, "vector_bytes": 32, "vector_registers": 16}):
            out, _ = _compile(fn, (a, wt), target=target, threads=2)
            ref = fn(a, wt)
            assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.equal(torch.isinf(out), torch.isinf(ref))
            fin = torch.isfinite(ref)
            assert (out[fin] - ref[fin]).abs().max() < 1e-3, (shape, target)
        a = torch.randn(shape)
        out, _ = _compile(fn, (a, wt), target={"cores": 2})
        assert_accurate(out, fn(a, wt), lambda: fp64_reference(fn, (a, wt)), 1e-4)


def test_implicit_gemm_blocks_all_panels_when_the_weight_is_streamed_per_panel():
    """A convolution with a long reduction (C464 3x3: K = 4176, a 32-pixel panel of it 534 KB,
    over half of a 1 MB L2) and panels enough for both cores (N5 7x7: 245 pixels, 8 panels):
    the reduction runs in blocks of whole input channels (KC a multiple of 9 = kh * kw), every
    panel's block packed (with the padding) and every row tile of the weight meeting all of
    them; the panels run over five image rows and two images, each image's lanes one run of
    masked loads. With two panels (N1 C512 7x7) or a short reduction (C128) nothing is
    blocked. All equal eager's, with inf and NaN beside the padding."""
    tgt = {"l2_bytes": 1 << 20, "vector_bytes": 64, "vector_registers": 32, "cores": 2}
    t = resolve(pinned(**tgt))
    for n_, ci, hw, blocked in ((5, 464, 7, True), (1, 512, 7, False), (5, 128, 7, False)):
        b = GraphBuilder()
        x, w = b.input(0, [n_, ci, hw, hw], F32), b.input(1, [40, ci, 3, 3], F32)
        conv = b.node("conv2d", (x, w), stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
        p = build(b.graph([conv]))
        tiled = _pipeline(p, target=tgt)
        blocks = [f for kk in tiled.kernels for f in walk_stmts(kk.body) if isinstance(f, For) and f.var == "kb"]
        assert bool(blocks) == blocked, (n_, ci, hw)
        if blocked:  # each block packs a range of input channels with all of (kh, kw)
            packs = [f for f in walk_stmts(blocks[0].body) if isinstance(f, For) and f.var == "rl"]
            assert packs and all(isinstance(f.hi, Const) for f in packs)
            kc = 9 * packs[0].hi.value
            assert 128 <= kc < ci * 9 and kc * 32 * 4 * 8 <= t.l2_bytes // 2, kc
            # 32-pixel panels over five image rows and two images (a stride-1 convolution as
            # wide as its input: one run of loads per image, ``masked_rows``)
            lanes = {s.name for s in walk_stmts(blocks[0].body) if isinstance(s, Alloc)}
            assert {"pmask", "pseg1"} <= lanes and "pseg2" not in lanes
    torch.manual_seed(0)
    fn = lambda a, w: F.conv2d(a, w, padding=1)  # noqa: E731
    a, wt = torch.randn(5, 464, 7, 7), torch.randn(40, 464, 3, 3) / 30
    a[0, 0, 0, 0], a[-1, -1, -1, -1], a[2, 100, 3, 0] = math.inf, math.nan, -math.inf
    out, _ = _compile(fn, (a, wt), target={"cores": 2, "l2_bytes": 1 << 20}, threads=2)
    ref = fn(a, wt)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.equal(torch.isinf(out), torch.isinf(ref))
    fin = torch.isfinite(ref)
    assert (out[fin] - ref[fin]).abs().max() < 1e-3
    a = torch.randn(5, 464, 7, 7)
    out, _ = _compile(fn, (a, wt), target={"cores": 2, "l2_bytes": 1 << 20}, threads=2)
    assert_accurate(out, fn(a, wt), lambda: fp64_reference(fn, (a, wt)), 1e-4)


def test_panels_over_many_rows_and_images_load_each_lane_at_its_offset():
    """Batched convolutions whose 32-pixel panels span image rows and images. Stride 1 as wide
    as the input (N4 C64 7x7, 3x3, padding 1): each image's lanes are one run of loads, kept
    under the padding mask (``masked_rows`` with images as segments); so for a grouped
    convolution of 8 channels per group. A 5x5 kernel with padding 1 (9x9 -> 7x7): the input
    rows are wider than the output's, so each lane's input offset and padding test are
    computed once per (kh, kw) and every channel is one load per lane at its offset
    (``offset_lanes``). A 1x1 convolution (no padding) takes the image segments alone. All
    against eager with inf and NaN beside the padding."""
    tgt = {"cores": 2, "vector_bytes": 64, "vector_registers": 32}
    torch.manual_seed(0)
    for shape, ks, groups, want in (([4, 64, 7, 7], 3, 1, {"pmask", "pseg1"}),
                                    ([4, 64, 9, 9], 5, 1, {"poff", "pok"}),
                                    ([4, 64, 7, 7], 3, 8, {"pmask", "pseg1"}),
                                    ([4, 64, 7, 7], 1, 1, {"pseg1"})):
        co = 64
        b = GraphBuilder()
        x, w = b.input(0, shape, F32), b.input(1, [co, shape[1] // groups, ks, ks], F32)
        pad = 0 if ks == 1 else 1
        conv = b.node("conv2d", (x, w), stride=(1, 1), padding=(pad, pad), dilation=(1, 1), groups=groups)
        p = _pipeline(build(b.graph([conv])), target=tgt)
        allocs = {s.name for k in p.kernels for s in walk_stmts(k.body) if isinstance(s, Alloc)}
        assert want <= allocs, (shape, ks, groups, allocs)
        assert pad or "pmask" not in allocs  # no padding: the image segments alone
        a, wt = torch.randn(shape), torch.randn(co, shape[1] // groups, ks, ks) / 10
        a[0, 0, 0, 0], a[-1, -1, -1, -1], a[1, 3, 0, 2], a[2, 5, 4, 0] = math.inf, math.nan, -math.inf, math.nan
        fn = lambda a, w, g=groups, pad=pad: F.conv2d(a, w, padding=pad, groups=g)  # noqa: E731
        out, _ = _compile(fn, (a, wt), target={"cores": 2}, threads=2)
        ref = fn(a, wt)
        assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.equal(torch.isinf(out), torch.isinf(ref))
        fin = torch.isfinite(ref)
        assert (out[fin] - ref[fin]).abs().max() < 1e-3, (shape, ks, groups)
        a = torch.randn(shape)
        out, _ = _compile(fn, (a, wt), target={"cores": 2}, threads=2)
        assert_accurate(out, fn(a, wt), lambda: fp64_reference(fn, (a, wt)), 1e-4)


@pytest.mark.parametrize("preset", NUMERIC)
@pytest.mark.parametrize("shape", [(1, 24, 56, 56, 7), (2, 16, 60, 50, 3), (1, 32, 14, 14, 3)], ids=["7x7", "3x3", "narrow"])
def test_depthwise_convolutions_match_eager(shape, preset):
    """Depthwise convolutions (7x7 as ConvNeXt's, 3x3 as MobileNet's, odd sizes, a narrow map
    that keeps its implicit padding), padding included, against eager on every machine
    description; infinities and NaN in the input spread as eager's do."""
    n, c, h, w, k = shape
    x, wt, b = torch.randn(n, c, h, w), torch.randn(c, 1, k, k), torch.randn(c)
    x[0, 1, 5, 7] = float("inf")
    x[0, 2, 9, 3] = float("nan")
    fn = lambda a, f, g: F.conv2d(a, f, g, padding=k // 2, groups=c)  # noqa: E731
    out, st = _compile(fn, (x, wt, b), target={"preset": preset})
    ref = fn(x, wt, b)
    assert st["ops_fallen_back"] == {}
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    fin = ref.isfinite()
    assert_accurate(out[fin], ref[fin], lambda: fp64_reference(fn, (x, wt, b))[fin], 1e-4)


def test_wide_depthwise_convolution_reads_a_padded_copy(tmp_path):
    """A depthwise convolution over rows of 56 pixels reads an explicitly padded copy of its
    input: its taps' pixel loops have constant bounds (no max/min per tap)."""
    x, wt = torch.randn(1, 32, 56, 56), torch.randn(32, 1, 7, 7)
    fn = lambda a, f: F.conv2d(a, f, padding=3, groups=32)  # noqa: E731
    out, _ = _compile(fn, (x, wt), dump_dir=str(tmp_path))
    assert_accurate(out, fn(x, wt), lambda: fp64_reference(fn, (x, wt)), 1e-4)
    src = next(tmp_path.rglob("*kernel.c")).read_text()
    assert "_pad(int pt_nthreads" in src
    conv = src[src.index("_conv2d(int pt_nthreads"):]
    conv = conv[:conv.index("\n}\n")]
    assert "_a > _b ? _a : _b" not in conv  # (no lower bound clipped to the image per tap)
