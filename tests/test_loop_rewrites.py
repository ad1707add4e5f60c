"""Loop coalescing (transform/coalesce.py), index-set splitting of selects
(transform/bounds.py) and range-aware div/mod simplification (affine/linear.py): the rewritten
IR has the expected shape, the cases they must not touch stay as they are, and compiled
programs that go through them match eager."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import polytile
import pytest

from polytile.affine.ir import (INDEX, Buffer, Const, For, If, Kernel, Let, Load, Op, Program, Store, Var, add, c, mul,
                               walk_exprs, walk_stmts)
from polytile.affine.linear import linear_form, simplify_divmod
from polytile.transform.bounds import conditions_to_bounds
from polytile.transform.coalesce import coalesce_loops

from accuracy import assert_accurate, fp64_reference
from machines import pinned

F32 = "float32"


def _prog(body, n_in=64):
    bufs = (Buffer("in0", F32, n_in, "input", 0), Buffer("out0", F32, 64, "output", 0))
    return Program(bufs, (Kernel("k", tuple(body)),))


def _lin(**coefs):
    e = c(coefs.pop("const", 0))
    for v, k in coefs.items():
        e = Op("add", (e, Op("mul", (Var(v), c(k)), INDEX)), INDEX)
    return e


def _loops(p):
    return [s for s in walk_stmts(p.kernels[0].body) if isinstance(s, For)]


def _sum_rows(index):
    """out[i] = sum over (r0, r1) of in0[index], two sequential reduction loops of 8."""
    from polytile.affine.ir import Assign, Let

    acc = Var("acc", F32)
    red = For("r0", c(0), c(8), (For("r1", c(0), c(8), (
        Assign("acc", Op("add", (acc, Load("in0", index, F32)), F32)),)),))
    return For("i", c(0), c(4), (Let("acc", F32, Const(0.0, F32)), red, Store("out0", Var("i"), acc)),
               parallel=True)


def test_contiguous_reduction_loops_merge_into_one():
    p = coalesce_loops(_prog([_sum_rows(_lin(i=64, r0=8, r1=1))], n_in=256))
    loops = _loops(p)
    assert [f.var for f in loops] == ["i", "r0r1"]
    merged = loops[1]
    assert merged.hi == c(64)
    load = next(x for s in walk_stmts(merged.body) for x in walk_exprs(s.value) if isinstance(x, Load))
    assert linear_form(load.index) == ({"i": 64, "r0r1": 1}, 0)


def test_loops_that_do_not_walk_one_range_stay():
    for index in (_lin(i=64, r0=1, r1=8),      # transposed: r1 is the outer stride
                  _lin(i=64, r0=16, r1=1),     # rows 16 apart, 8 used: a gap
                  Op("floordiv", (_lin(r0=8, r1=1), c(3)), INDEX)):  # not linear
        p = _prog([_sum_rows(index)], n_in=256)
        assert coalesce_loops(p) == p


def test_select_loop_splits_into_fill_copy_fill():
    # out[j] = in0[j - 3] where 3 <= j < 40, else 0
    j = Var("j")
    cond = Op("logical_and", (Op("ge", (j, c(3)), "bool"), Op("lt", (j, c(40)), "bool")), "bool")
    val = Op("where", (cond, Load("in0", Op("sub", (j, c(3)), INDEX), F32), Const(0.0, F32)), F32)
    p = conditions_to_bounds(_prog([For("j", c(0), c(64), (Store("out0", j, val),), parallel=True)]))
    loops = _loops(p)
    assert len(loops) == 3
    assert [type(f.body[0].value).__name__ for f in loops] == ["Const", "Load", "Const"]
    # evaluate the bounds: the pieces cover [0, 64) once, in order
    def ev(e):
        if isinstance(e, Const):
            return e.value
        a = [ev(x) for x in e.args]
        return {"maximum": max, "minimum": min, "add": lambda x, y: x + y}[e.fn](*a) if e.fn != "floordiv" \
            else a[0] // a[1]
    spans = [(ev(f.lo), ev(f.hi)) for f in loops]
    assert spans == [(0, 3), (3, 40), (40, 64)]


def test_divmod_simplifies_only_within_one_step():
    flat = _lin(jo=32, jj=1)
    fd = Op("floordiv", (flat, c(32)), INDEX)
    md = Op("remainder", (flat, c(32)), INDEX)
    assert linear_form(simplify_divmod(fd, {"jj": (0, 32)})) == ({"jo": 1}, 0)
    assert linear_form(simplify_divmod(md, {"jj": (0, 32)})) == ({"jj": 1}, 0)
    # jj over two rows of 16: (32 jo + jj) // 16 is 2 jo or 2 jo + 1
    assert simplify_divmod(Op("floordiv", (flat, c(16)), INDEX), {"jj": (0, 32)}) == \
        Op("floordiv", (flat, c(16)), INDEX)
    assert simplify_divmod(fd, {}) == fd  # jj's range unknown


def _compile(fn, args, **opts):
    torch._dynamo.reset()
    polytile.reset_stats()
    return torch.compile(fn, backend="polytile", options={"fallback": False, **opts})(*args)


def test_global_average_pool_reduces_in_one_loop(tmp_path):
    x, b = torch.randn(4, 40, 7, 7), torch.randn(40, 1, 1)

    def fn(x, b):
        return torch.relu(x + b).mean((2, 3))

    out = _compile(fn, (x, b), dump_dir=str(tmp_path), machine=pinned())
    assert_accurate(out, fn(x, b), lambda: fp64_reference(fn, (x, b)), 1e-5)
    src = next(tmp_path.rglob("*kernel.c")).read_text()
    assert "< INT64_C(49); ++" in src  # the 7 x 7 pixels of a channel in one loop


def test_sum_over_channels_strips_the_whole_image(tmp_path):
    """A reduction over the channels of an NCHW image (an int8 convolution's zero-point
    correction, a channel mean): its rows and columns are one range of pixels, cut into strips
    of the whole image rather than a full and a partial strip per 56-pixel row (the reduction
    runs innermost of the strip loop, as vectors along the pixels); and it matches eager."""
    x = torch.randn(1, 64, 56, 56)

    def fn(x):
        return torch.relu(x).sum(1, keepdim=True)

    out = _compile(fn, (x,), dump_dir=str(tmp_path), machine=pinned())
    assert_accurate(out, fn(x), lambda: fp64_reference(fn, (x,)), 1e-5)
    src = next(tmp_path.rglob("*kernel.c")).read_text()
    assert "INT64_C(3136)" in src and "< INT64_C(56); ++" not in src


def test_padded_image_pack_is_split_not_selected(tmp_path):
    # a 3-channel NHWC image, 3x3 padding 1: its im2col pack walks panels of one output row
    x = torch.randn(4, 32, 32, 3)
    w = torch.randn(32, 3, 3, 3)

    def fn(x, w):
        return F.conv2d(x.permute(0, 3, 1, 2), w, padding=1)

    out = _compile(fn, (x, w), dump_dir=str(tmp_path), machine=pinned())  # (its panels: the machine's)
    assert_accurate(out, fn(x, w), lambda: fp64_reference(fn, (x, w)), 1e-4)
    src = next(tmp_path.rglob("*kernel.c")).read_text()
    pack = src[src.index("_pack(int pt_nthreads"):]
    pack = pack[:pack.index("\n}\n")]
    assert "pt_floordiv_i" not in pack and "pt_mod_i" not in pack


def test_kernels_writing_only_unread_temps_are_dropped():
    from polytile.transform.dead import drop_dead_kernels

    i = Var("i")
    bufs = (Buffer("in0", F32, 8, "input", 0), Buffer("t1", F32, 8, "temp"), Buffer("t2", F32, 8, "temp"),
            Buffer("out0", F32, 8, "output", 0))

    def k(name, dst, src):
        return Kernel(name, (For("i", c(0), c(8), (Store(dst, i, Load(src, i, F32)),), parallel=True),))

    # t2 <- in0 (read by nobody), t1 <- in0 (read by the output's kernel), out0 <- t1
    p = Program(bufs, (k("k0", "t2", "in0"), k("k1", "t1", "in0"), k("k2", "out0", "t1")))
    q = drop_dead_kernels(p)
    assert [x.name for x in q.kernels] == ["k1", "k2"]
    assert "t2" not in {b.name for b in q.buffers} and "t1" in {b.name for b in q.buffers}
    # a chain that ends in an unread temp goes entirely; kernels writing outputs always stay
    p = Program(bufs, (k("k0", "t1", "in0"), k("k1", "t2", "t1"), k("k2", "out0", "in0")))
    assert [x.name for x in drop_dead_kernels(p).kernels] == ["k2"]


def test_split_select_tests_on_outer_loops_pick_the_middle_loop():
    # out[4r + j] = (r >= 1 and j >= 2) ? in0[j] : 0 inside a loop over r: the test on r
    # chooses between a copy and a fill for j in [2, 4); j < 2 is a fill
    r, j = Var("r"), Var("j")
    cond = Op("logical_and", (Op("ge", (r, c(1)), "bool"), Op("ge", (j, c(2)), "bool")), "bool")
    val = Op("where", (cond, Load("in0", j, F32), Const(0.0, F32)), F32)
    inner = For("j", c(0), c(4), (Store("out0", _lin(r=4, j=1), val),))
    p = conditions_to_bounds(_prog([For("r", c(0), c(4), (inner,), parallel=True)]))
    outer = p.kernels[0].body[0]
    kinds = [type(s).__name__ for s in outer.body]
    assert kinds == ["For", "If"]
    test = outer.body[1]
    assert isinstance(test.then[0].body[0].value, Load) and isinstance(test.orelse[0].body[0].value, Const)


# ---------------------------------------------------------------- tile_transposes
def _copy(n_rows, n_cols, index, store=None):
    """out0[i * n_cols + j] = in0[index] + 1 over i < n_rows, j < n_cols."""
    n = n_rows * n_cols
    st = Store("out0", store or _lin(i=n_cols, j=1), Op("add", (Load("in0", index, F32), Const(1.0, F32)), F32))
    body = [For("i", c(0), c(n_rows), (For("j", c(0), c(n_cols), (st,)),), parallel=True)]
    bufs = (Buffer("in0", F32, n, "input", 0), Buffer("out0", F32, n, "output", 0))
    return Program(bufs, (Kernel("k", tuple(body)),))


def test_transposing_copy_is_tiled_in_cache_line_blocks():
    from polytile.transform.tile_transposes import tile_transposes
    p = tile_transposes(_copy(64, 32, _lin(i=1, j=64)))  # out[i][j] = in[j][i] + 1
    loops = [(f.var, f.hi.value) for f in _loops(p)]
    assert loops == [("i_b", 4), ("j_b", 2), ("i_t", 16), ("j_t", 16)]
    assert _loops(p)[0].parallel
    st = next(s for s in walk_stmts(p.kernels[0].body) if isinstance(s, Store))
    x = torch.arange(64 * 32, dtype=torch.float32)
    env = {}
    for ib in range(4):  # the tiled nest visits every (i, j) exactly once, reading in[j][i]
        for jb in range(2):
            for it in range(16):
                for jt in range(16):
                    i, j = ib * 16 + it, jb * 16 + jt
                    vals = {"i_b": ib, "j_b": jb, "i_t": it, "j_t": jt}
                    sf, lf = linear_form(st.index), linear_form(st.value.args[0].index)
                    at = sum(k * vals[v] for v, k in sf[0].items()) + sf[1]
                    src = sum(k * vals[v] for v, k in lf[0].items()) + lf[1]
                    assert at == i * 32 + j and src == j * 64 + i
                    env[at] = x[src].item()
    assert len(env) == 64 * 32


def test_transpose_with_partial_blocks():
    """Trip counts that 16 does not divide: the last block of each tiled loop is shorter."""
    from polytile.transform.tile_transposes import tile_transposes
    p = tile_transposes(_copy(60, 40, _lin(i=1, j=60)))
    loops = _loops(p)
    assert [(f.var, f.hi.value if isinstance(f.hi, Const) else "min") for f in loops] == \
        [("i_b", 4), ("j_b", 3), ("i_t", "min"), ("j_t", "min")]
    fn = lambda x: x.t().contiguous() + 1  # noqa: E731
    for shape in ((60, 40), (30522 // 100, 37), (17, 129)):
        x = torch.randn(*shape)
        torch._dynamo.reset()
        out = torch.compile(fn, backend="polytile", options={"fallback": False})(x)
        assert torch.equal(out, fn(x))


def test_copies_that_need_no_tiling_stay_as_they_are():
    from polytile.transform.tile_transposes import tile_transposes
    for p in (_copy(64, 32, _lin(i=32, j=1)),  # contiguous read
              _copy(64, 8, _lin(i=1, j=64)),  # fewer columns than a block
              _copy(64, 32, _lin(i=1, j=64), store=_lin(i=1, j=64))):  # the store is strided along j
        assert tile_transposes(p) == p


def test_transposes_compiled_match_eager():
    cases = [(lambda x: x.t().contiguous() * 2, torch.randn(256, 128)),
             (lambda x, w: torch.einsum("ibnd,hnd->ibh", x, w), (torch.randn(32, 1, 4, 16), torch.randn(96, 4, 16))),
             (lambda x: x.permute(0, 2, 1).contiguous() + 1, torch.randn(3, 48, 32)),
             (lambda x: x.t().contiguous() + 1, torch.randn(100, 7))]
    for fn, args in cases:
        args = args if isinstance(args, tuple) else (args,)
        torch._dynamo.reset()
        out = torch.compile(fn, backend="polytile", options={"fallback": False})(*args)
        assert_accurate(out, fn(*args), lambda: fp64_reference(fn, args), 1e-4)


def test_interleave_stages_transpose_a_block():
    """The shuffle masks of affine.transpose, applied stage by stage as the C renderer does
    (lanes 0..n-1 from the first vector, n..2n-1 from the second), turn rows into columns."""
    from polytile.affine.transpose import interleave_mask
    for n in (4, 8, 16):
        rows = [[r * n + k for k in range(n)] for r in range(n)]
        h = n // 2
        while h >= 1:
            new = list(rows)
            for i in range(n):
                if (i // h) % 2 == 0:
                    both = rows[i] + rows[i + h]
                    new[i] = [both[m] for m in interleave_mask(n, h, False)]
                    new[i + h] = [both[m] for m in interleave_mask(n, h, True)]
            rows, h = new, h // 2
        assert rows == [[r * n + k for r in range(n)] for k in range(n)]


@pytest.mark.parametrize("vector_bytes", [64, 32, 16])
def test_pure_transposing_copies_transposed_in_registers(vector_bytes):
    """Whole blocks of a pure copy go through vector loads, interleave shuffles and vector
    stores (partial blocks keep the element loops); bit-exact against eager."""
    from polytile.transform.tile_transposes import tile_transposes
    vw = vector_bytes // 4
    st = Store("out0", _lin(i=60, j=1), Load("in0", _lin(i=1, j=60), F32))  # out[i][j] = in[j][i]
    p = Program((Buffer("in0", F32, 60 * 40, "input", 0), Buffer("out0", F32, 60 * 40, "output", 0)),
                (Kernel("k", (For("i", c(0), c(60), (For("j", c(0), c(40), (st,)),), parallel=True),)),))
    q = tile_transposes(p, vw)
    ops = {e.fn for s in walk_stmts(q.kernels[0].body) if isinstance(s, Let)
           for e in walk_exprs(s.value) if isinstance(e, Op)}
    assert {f"interleave_lo{vw // 2}", "interleave_hi1"} <= ops
    assert any(isinstance(s, If) for s in walk_stmts(q.kernels[0].body))  # 60 x 40: partial blocks
    cases = [(lambda x: x.t().contiguous(), torch.randn(64, 48)),
             (lambda x: x.t().contiguous(), torch.randn(61, 35)),
             (lambda x: x.permute(2, 1, 0).contiguous(), torch.randn(40, 3, 33)),
             (lambda x: x.permute(0, 2, 1).contiguous(), torch.randn(2, 50, 20))]
    for fn, x in cases:
        torch._dynamo.reset()
        out = torch.compile(fn, backend="polytile",
                            options={"fallback": False, "machine": pinned(vector_bytes=vector_bytes)})(x)
        assert torch.equal(out, fn(x))


@pytest.mark.parametrize("s,ok", [(192, True), (191, False)])
def test_quotient_and_remainder_that_rebuild_the_dividend_are_linear(s, ok):
    """(i // 197) * (197 s) + (i % 197) * s + r is i s + r (a flat row index split into two
    coordinates and flattened again); with another multiple of the quotient it is not linear."""
    i, r = Var("i", "int64"), Var("r", "int64")
    q, m = Op("floordiv", (i, c(197)), "int64"), Op("remainder", (i, c(197)), "int64")
    e = add(add(mul(q, c(197 * 192)), mul(m, c(s))), r)
    assert linear_form(e) == (({"i": 192, "r": 1}, 0) if ok else None)
    assert linear_form(add(mul(q, c(197 * 192)), mul(add(i, mul(q, c(-197))), c(192)))) == ({"i": 192}, 0)
