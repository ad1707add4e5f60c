"""Loop-invariant divisors become one reciprocal before the loop (transform/hoist.py), and
only when that is safe."""
from __future__ import annotations

import torch

import polytile  # noqa: F401  (registers the backend)
from polytile.affine.ir import (Buffer, For, If, Kernel, Let, Load, Op, Program, Store, Var, c, stmt_exprs, walk_exprs,
                               walk_stmts)
from polytile.transform.hoist import hoist_divisors

from accuracy import assert_accurate, fp64_reference

F32 = "float32"


def _prog(body):
    bufs = (Buffer("in0", F32, 64, "input", 0), Buffer("in1", F32, 8, "input", 1),
            Buffer("out0", F32, 64, "output", 0))
    return Program(bufs, (Kernel("k", tuple(body)),))


def _ld(buf, idx):
    return Load(buf, idx, F32)


def _div(a, b):
    return Op("div", (a, b), F32)


def _divs(p):
    return [x for s in walk_stmts(p.kernels[0].body) for e in stmt_exprs(s) for x in walk_exprs(e)
            if isinstance(x, Op) and x.fn == "div"]


def test_invariant_divisor_becomes_a_reciprocal_before_the_loop():
    i, j = Var("i"), Var("j")
    inner = For("j", c(0), c(8), (Store("out0", Op("add", (Op("mul", (i, c(8)), "int64"), j), "int64"),
                                        _div(_ld("in0", j), _ld("in1", i))),))
    p = hoist_divisors(_prog([For("i", c(0), c(8), (inner,), parallel=True)]))
    outer = p.kernels[0].body[0]
    let = outer.body[0]
    assert isinstance(let, Let) and let.value.fn == "div" and let.value.args[1] == _ld("in1", i)
    assert [d.args[0].value for d in _divs(p)] == [1.0]  # the only division left is the reciprocal


def test_divisor_that_changes_in_the_loop_stays():
    j = Var("j")
    # the divisor's buffer is written inside the loop
    body = For("j", c(0), c(8), (Store("out0", j, _div(_ld("in0", j), _ld("out0", c(0)))),))
    assert hoist_divisors(_prog([body])) == _prog([body])
    # the divisor reads the loop variable
    body = For("j", c(0), c(8), (Store("out0", j, _div(_ld("in0", j), _ld("in1", j))),))
    assert hoist_divisors(_prog([body])) == _prog([body])


def test_guarded_divisor_stays():
    j = Var("j")
    guarded = If(Op("lt", (j, c(4)), "bool"), (Store("out0", j, _div(_ld("in0", j), _ld("in1", c(0)))),))
    body = For("j", c(0), c(8), (guarded,))
    assert hoist_divisors(_prog([body])) == _prog([body])


def test_softmax_and_layer_norm_match_eager():
    x = torch.randn(6, 50, 77)

    def fn(x):
        return torch.softmax(x, -1), torch.nn.functional.layer_norm(x, (77,)), x / x.sum(-1, keepdim=True)

    torch._dynamo.reset()
    out = torch.compile(fn, backend="polytile", options={"fallback": False})(x)
    for o, r, k in zip(out, fn(x), range(3)):
        assert_accurate(o, r, lambda k=k: fp64_reference(fn, (x,))[k], 1e-5)
