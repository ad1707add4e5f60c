"""Unit tests of the affine layer: the isl parallelism check, the verifier, the printer, the
static memory plan, and the strided-view arithmetic of the graph builder."""
from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from polytile.affine.ir import (Assign, Buffer, Const, For, If, Kernel, Let, Load, Op, Program, Store, Var, c,
                                walk_stmts)
from polytile.affine.printer import format_program
from polytile.affine.verify import VerifyError, verify_program
from polytile.dtypes import ITEMSIZE
from polytile.graph.builder import reshape_strides
from polytile.runtime import memory_plan
from polytile.runtime.memory_plan import plan_memory
from polytile.transform.parallelize import check_parallel

F32 = "float32"
N = 16


def _i(name="i"):
    return Var(name)


def ld(buf, idx, dtype=F32):
    return Load(buf, idx, dtype)


def add(a, b):
    return Op("add", (a, b), a.dtype)


def mul(a, b):
    return Op("mul", (a, b), a.dtype)


def sub(a, b):
    return Op("sub", (a, b), a.dtype)


def prog(*kernels, bufs=None):
    bufs = bufs or (Buffer("in0", F32, N, "input", 0), Buffer("idx", "int64", N, "input", 1),
                    Buffer("out0", F32, N, "output", 0), Buffer("out1", F32, N * N, "output", 1))
    return Program(tuple(bufs), tuple(Kernel(f"k{k}", tuple(body)) for k, body in enumerate(kernels)))


def loop(var, lo, hi, *body, parallel=True):
    return For(var, c(lo), c(hi), tuple(body), parallel=parallel)


def parallel_marks(p: Program) -> dict[str, bool]:
    """Loop variable -> parallel flag, over the whole program (loop variables are unique here)."""
    return {s.var: s.parallel for k in p.kernels for s in walk_stmts(k.body) if isinstance(s, For)}


# ------------------------------------------------------------------ isl parallelism check
class TestCheckParallel:
    def test_independent_iterations_stay_parallel(self):
        p = prog([loop("i", 0, N, Store("out0", _i(), mul(ld("in0", _i()), Const(2.0, F32))))])
        verify_program(p)
        assert parallel_marks(check_parallel(p)) == {"i": True}

    def test_prefix_sum_is_not_parallel(self):
        # out[i] = out[i-1] + in[i]: iteration i reads what iteration i-1 wrote
        body = Store("out0", _i(), add(ld("out0", add(_i(), c(-1))), ld("in0", _i())))
        p = prog([Store("out0", c(0), ld("in0", c(0))), loop("i", 1, N, body)])
        verify_program(p)
        assert parallel_marks(check_parallel(p)) == {"i": False}

    def test_store_to_fixed_location_is_not_parallel(self):
        p = prog([loop("i", 0, N, Store("out0", c(0), ld("in0", _i())))])
        assert parallel_marks(check_parallel(p)) == {"i": False}

    def test_read_after_write_of_other_iteration(self):
        # out[i] = in[i]; then a read of out[15 - i] in the same iteration: iteration i reads
        # what iteration 15 - i writes
        p = prog([loop("i", 0, N, Store("out0", _i(), ld("in0", _i())),
                       Store("out1", _i(), ld("out0", sub(c(N - 1), _i()))))])
        assert parallel_marks(check_parallel(p)) == {"i": False}

    def test_disjoint_halves_stay_parallel(self):
        # out[i] = out[i + 8] for i < 8: reads the upper half, writes the lower half
        half = N // 2
        p = prog([loop("i", 0, half, Store("out0", _i(), ld("out0", add(_i(), c(half)))))])
        assert parallel_marks(check_parallel(p)) == {"i": True}

    def test_guarded_single_writer_stays_parallel(self):
        # only iteration 0 stores to out[0]: no two iterations touch the same element
        guard = Op("lt", (_i(), c(1)), "bool")
        p = prog([loop("i", 0, N, If(guard, (Store("out0", c(0), ld("in0", _i())),)))])
        verify_program(p)
        assert parallel_marks(check_parallel(p)) == {"i": True}

    def test_indirect_store_is_not_parallel(self):
        # out[idx[i]] = in[i]: the index is data, so any two iterations may collide
        p = prog([loop("i", 0, N, Store("out0", ld("idx", _i(), "int64"), ld("in0", _i())))])
        assert parallel_marks(check_parallel(p)) == {"i": False}

    def test_indirect_read_stays_parallel(self):
        # out[i] = in[idx[i]]: reads may go anywhere, but nothing read is written
        p = prog([loop("i", 0, N, Store("out0", _i(), ld("in0", ld("idx", _i(), "int64"))))])
        assert parallel_marks(check_parallel(p)) == {"i": True}

    def test_per_loop_in_a_nest(self):
        # out1[i, j] = out1[i, j - 1] + in[j]: j carries a dependence, i does not
        ij = add(mul(_i("i"), c(N)), _i("j"))
        body = Store("out1", ij, add(ld("out1", add(ij, c(-1))), ld("in0", _i("j"))))
        p = prog([loop("i", 0, N, loop("j", 1, N, body))])
        assert parallel_marks(check_parallel(p)) == {"i": True, "j": False}
        # and the transposed nest: i carries, j does not
        ji = add(mul(_i("j"), c(N)), _i("i"))
        body = Store("out1", ji, add(ld("out1", add(ji, c(-1))), ld("in0", _i("j"))))
        p = prog([loop("j", 0, N, loop("i", 1, N, body))])
        assert parallel_marks(check_parallel(p)) == {"j": True, "i": False}

    def test_diagonal_dependence(self):
        # out1[i, j] = out1[i - 1, j + 1]: carried by the outer loop i; the inner j is parallel
        ij = add(mul(_i("i"), c(N)), _i("j"))
        src = add(mul(add(_i("i"), c(-1)), c(N)), add(_i("j"), c(1)))
        p = prog([loop("i", 1, N, loop("j", 0, N - 1, Store("out1", ij, ld("out1", src))))])
        assert parallel_marks(check_parallel(p)) == {"i": False, "j": True}

    def test_never_adds_parallel_and_keeps_the_rest(self):
        p = prog([loop("i", 0, N, Store("out0", _i(), ld("in0", _i())), parallel=False)])
        q = check_parallel(p)
        assert parallel_marks(q) == {"i": False}
        assert q.buffers == p.buffers
        assert [k.name for k in q.kernels] == [k.name for k in p.kernels]
        # a program that is already right is returned unchanged (structurally)
        p2 = prog([loop("i", 0, N, Store("out0", _i(), ld("in0", _i())))])
        assert check_parallel(p2) == p2

    def test_floordiv_mod_access(self):
        # out1[(i floordiv 4) * 16 + (i mod 4)] = in[i mod 16]: injective in i -> parallel
        idx = add(mul(Op("floordiv", (_i(), c(4)), "int64"), c(N)), Op("remainder", (_i(), c(4)), "int64"))
        p = prog([loop("i", 0, 4 * N, Store("out1", idx, ld("in0", Op("remainder", (_i(), c(N)), "int64"))))],
                 bufs=(Buffer("in0", F32, N, "input", 0), Buffer("out1", F32, N * N * 4, "output", 0)))
        assert parallel_marks(check_parallel(p)) == {"i": True}
        # i floordiv 2 is not injective: two iterations store to the same element
        idx2 = Op("floordiv", (_i(), c(2)), "int64")
        p = prog([loop("i", 0, N, Store("out0", idx2, ld("in0", _i())))])
        assert parallel_marks(check_parallel(p)) == {"i": False}


# ------------------------------------------------------------------ verifier
def _good_reduction():
    """out0[i] = sum_r in[r] * i, with the accumulator declared inside the parallel loop."""
    inner = loop("r", 0, N, Assign("acc", add(Var("acc", F32), ld("in0", _i("r")))), parallel=False)
    return prog([loop("i", 0, N, Let("acc", F32, Const(0.0, F32)), inner, Store("out0", _i(), Var("acc", F32)))])


class TestVerify:
    def test_accepts_valid_programs(self):
        verify_program(_good_reduction())
        verify_program(prog([loop("i", 0, N, Store("out0", _i(), ld("in0", _i())))]))

    def test_store_to_input(self):
        p = prog([loop("i", 0, N, Store("in0", _i(), Const(1.0, F32)))])
        with pytest.raises(VerifyError, match="input"):
            verify_program(p)

    def test_store_to_unknown_buffer(self):
        p = prog([loop("i", 0, N, Store("nope", _i(), Const(1.0, F32)))])
        with pytest.raises(VerifyError, match="nope"):
            verify_program(p)

    def test_load_from_unknown_buffer(self):
        p = prog([loop("i", 0, N, Store("out0", _i(), ld("nope", _i())))])
        with pytest.raises(VerifyError, match="nope"):
            verify_program(p)

    def test_unbound_variable(self):
        p = prog([loop("i", 0, N, Store("out0", _i("k"), ld("in0", _i())))])
        with pytest.raises(VerifyError, match="unbound"):
            verify_program(p)
        # an induction variable used after its loop is unbound too
        p = prog([loop("i", 0, N, Store("out0", _i(), ld("in0", _i()))), Store("out0", _i(), Const(0.0, F32))])
        with pytest.raises(VerifyError, match="unbound"):
            verify_program(p)

    def test_store_dtype_mismatch(self):
        p = prog([loop("i", 0, N, Store("out0", _i(), Const(1.0, "float64")))])
        with pytest.raises(VerifyError, match="float64"):
            verify_program(p)

    def test_load_dtype_mismatch(self):
        p = prog([loop("i", 0, N, Store("out0", _i(), Load("in0", _i(), "float64")))])
        with pytest.raises(VerifyError):
            verify_program(p)

    def test_let_and_assign_dtype_mismatch(self):
        p = prog([loop("i", 0, N, Let("t", F32, Const(1, "int64")), Store("out0", _i(), Var("t", F32)))])
        with pytest.raises(VerifyError):
            verify_program(p)
        p = prog([loop("i", 0, N, Let("t", F32, Const(1.0, F32)), Assign("t", Const(2, "int64")),
                       Store("out0", _i(), Var("t", F32)))])
        with pytest.raises(VerifyError):
            verify_program(p)

    def test_non_index_load_subscript(self):
        p = prog([loop("i", 0, N, Store("out0", _i(), ld("in0", Const(1.0, F32))))])
        with pytest.raises(VerifyError, match="index"):
            verify_program(p)

    def test_non_index_store_subscript(self):
        p = prog([loop("i", 0, N, Store("out0", Const(1.0, F32), ld("in0", _i())))])
        with pytest.raises(VerifyError):
            verify_program(p)

    def test_non_bool_condition(self):
        p = prog([loop("i", 0, N, If(_i(), (Store("out0", _i(), ld("in0", _i())),)))])
        with pytest.raises(VerifyError, match="condition"):
            verify_program(p)

    def test_accumulator_declared_outside_parallel_loop(self):
        # the scalar reduction loop wrongly marked parallel: a race on acc
        inner = loop("r", 0, N, Assign("acc", add(Var("acc", F32), ld("in0", _i("r")))), parallel=True)
        p = prog([loop("i", 0, N, Let("acc", F32, Const(0.0, F32)), inner, Store("out0", _i(), Var("acc", F32)),
                       parallel=False)])
        with pytest.raises(VerifyError, match="parallel"):
            verify_program(p)
        # the same with the Let hoisted out of the parallel outer loop
        inner = loop("r", 0, N, Assign("acc", add(Var("acc", F32), ld("in0", _i("r")))), parallel=False)
        p = prog([Let("acc", F32, Const(0.0, F32)),
                  loop("i", 0, N, Assign("acc", Const(0.0, F32)), inner, Store("out0", _i(), Var("acc", F32)))])
        with pytest.raises(VerifyError, match="parallel"):
            verify_program(p)

    def test_shadowed_loop_variable(self):
        p = prog([loop("i", 0, N, loop("i", 0, N, Store("out0", _i(), ld("in0", _i()))))])
        with pytest.raises(VerifyError, match="shadows"):
            verify_program(p)

    def test_duplicate_buffers(self):
        p = prog([loop("i", 0, N, Store("out0", _i(), ld("in0", _i())))],
                 bufs=(Buffer("in0", F32, N, "input", 0), Buffer("out0", F32, N, "output", 0),
                       Buffer("out0", F32, N, "temp")))
        with pytest.raises(VerifyError, match="duplicate"):
            verify_program(p)


# ------------------------------------------------------------------ printer
def test_printer():
    p = _good_reduction()
    guard = Op("lt", (_i("j"), c(3)), "bool")
    p = replace(p, kernels=p.kernels + (Kernel("k9", (loop("j", 0, 4, If(guard, (Store(
        "out0", _i("j"), ld("in0", _i("j"))),)), parallel=False),), origin="%7:relu[4]"),))
    text = format_program(p)
    for needle in ("affine.parallel %i = 0 to 16", "affine.for %r = 0 to 16", "affine.for %j = 0 to 4",
                   "affine.load %in0[%r]", "affine.store", "%out0[%i]", "affine.if", "%7:relu[4]",
                   "memref %in0 : float32[16]", "memref %out1 : float32[256]"):
        assert needle in text, (needle, text)
    # nesting is visible through indentation: the inner loop is indented deeper than the outer
    lines = text.splitlines()
    outer = next(ln for ln in lines if "%i = 0" in ln)
    inner = next(ln for ln in lines if "%r = 0" in ln)
    assert len(inner) - len(inner.lstrip()) > len(outer) - len(outer.lstrip())
    # the printed form of a program that passed through check_parallel reflects its marks
    seq = format_program(check_parallel(prog([loop("q", 0, N, Store("out0", c(0), ld("in0", _i("q"))))])))
    assert "affine.for %q" in seq and "affine.parallel" not in seq


# ------------------------------------------------------------------ memory plan
def _kernel_touching(name, reads, writes, dtypes=None):
    """A kernel that stores to each of ``writes`` the sum of one element of each of ``reads``."""
    dtypes = dtypes or {}
    body = []
    for w in writes:
        v = Const(0.0, F32)
        for r in reads:
            x = Load(r, c(0), dtypes.get(r, F32))
            v = add(v, x if x.dtype == F32 else Op("cast", (x,), F32))
        wdt = dtypes.get(w, F32)
        body.append(Store(w, c(0), v if wdt == F32 else Op("cast", (v,), wdt)))
    return Kernel(name, tuple(body))


def _check_plan(bufs, kernels):
    p = Program(tuple(bufs), tuple(kernels))
    verify_program(p)
    plan = plan_memory(p)
    temps = {b.name: b for b in bufs if b.kind == "temp"}
    assert set(plan.offsets) == set(temps)
    # liveness by kernel position, computed here independently
    live: dict[str, tuple[int, int]] = {}
    for k, kern in enumerate(kernels):
        names = {s.buf for s in walk_stmts(kern.body) if isinstance(s, Store)}
        names |= {x.buf for s in walk_stmts(kern.body) if isinstance(s, Store) for x in _loads(s.value)}
        for n in names:
            lo, hi = live.get(n, (k, k))
            live[n] = (min(lo, k), max(hi, k))
    extent = {n: (plan.offsets[n], plan.offsets[n] + b.size * ITEMSIZE[b.dtype]) for n, b in temps.items()}
    for n, (o, e) in extent.items():
        assert o >= 0 and e <= plan.arena_bytes, (n, o, e, plan)
        assert o % memory_plan.ALIGN == 0, (n, o)
    names = sorted(temps)
    for a in names:
        for b in names:
            if a >= b or a not in live or b not in live:
                continue
            (fa, la), (fb, lb) = live[a], live[b]
            if la < fb or lb < fa:
                continue  # never live at the same time: may share memory
            (oa, ea), (ob, eb) = extent[a], extent[b]
            assert ea <= ob or eb <= oa, f"{a} {extent[a]} and {b} {extent[b]} overlap while both live"
    assert plan.arena_bytes <= plan.temp_bytes
    return plan


def _loads(e):
    if isinstance(e, Load):
        yield e
        yield from _loads(e.index)
    elif isinstance(e, Op):
        for a in e.args:
            yield from _loads(a)


def test_memory_plan_chain_reuses():
    # in -> t0 -> t1 -> t2 -> t3 -> out: t0 and t2 (and t1 and t3) can share
    bufs = [Buffer("in0", F32, 4, "input", 0), Buffer("out0", F32, 4, "output", 0)]
    bufs += [Buffer(f"t{k}", F32, 1000, "temp") for k in range(4)]
    chain = ["in0", "t0", "t1", "t2", "t3", "out0"]
    kernels = [_kernel_touching(f"k{k}", [chain[k]], [chain[k + 1]]) for k in range(5)]
    plan = _check_plan(bufs, kernels)
    assert plan.arena_bytes < plan.temp_bytes
    assert plan.arena_bytes <= 2 * 4032  # two live 4000-byte temps at a time, 64-byte aligned


def test_memory_plan_diamond():
    #      t0
    #     /  \
    #   t1    t2     t1 and t2 are live together, and t0 with both
    #     \  /
    #      out
    bufs = [Buffer("in0", F32, 4, "input", 0), Buffer("out0", F32, 4, "output", 0),
            Buffer("t0", F32, 100, "temp"), Buffer("t1", F32, 300, "temp"), Buffer("t2", "float64", 50, "temp")]
    dt = {b.name: b.dtype for b in bufs}
    kernels = [_kernel_touching("k0", ["in0"], ["t0"], dt), _kernel_touching("k1", ["t0"], ["t1"], dt),
               _kernel_touching("k2", ["t0"], ["t2"], dt), _kernel_touching("k3", ["t1", "t2"], ["out0"], dt)]
    plan = _check_plan(bufs, kernels)
    assert plan.arena_bytes >= 400 + 1200 + 400  # all three are live during k2


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_memory_plan_random_dags(data):
    n = data.draw(st.integers(1, 9), label="temps")
    sizes = data.draw(st.lists(st.integers(1, 300), min_size=n, max_size=n), label="sizes")
    dtypes = data.draw(st.lists(st.sampled_from(["float32", "float64", "int8", "bool", "int64"]),
                                min_size=n, max_size=n), label="dtypes")
    bufs = [Buffer("in0", F32, 4, "input", 0), Buffer("out0", F32, 4, "output", 0)]
    bufs += [Buffer(f"t{k}", dt, s, "temp") for k, (s, dt) in enumerate(zip(sizes, dtypes))]
    dt = {b.name: b.dtype for b in bufs}
    kernels = []
    for k in range(n):
        preds = data.draw(st.lists(st.integers(0, k - 1), max_size=3, unique=True), label=f"preds{k}") if k else []
        kernels.append(_kernel_touching(f"k{k}", ["in0"] + [f"t{j}" for j in preds], [f"t{k}"], dt))
    last = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True), label="outputs")
    kernels.append(_kernel_touching("kout", [f"t{j}" for j in last], ["out0"], dt))
    _check_plan(bufs, kernels)


# ------------------------------------------------------------------ reshape_strides vs torch.view
def _factorizations(numel: int, rnd: random.Random, max_rank: int = 5) -> list[int]:
    """A random shape with ``numel`` elements (ones sprinkled in)."""
    primes, m, p = [], numel, 2
    while m > 1:
        while m % p == 0:
            primes.append(p)
            m //= p
        p += 1
    rank = rnd.randint(1, max_rank)
    dims = [1] * rank
    for q in primes:
        dims[rnd.randrange(rank)] *= q
    return dims


@st.composite
def strided_tensor(draw):
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4), label="shape")
    t = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    # permute
    perm = draw(st.permutations(range(len(shape))), label="perm")
    t = t.permute(*perm)
    # slice some dims with a step
    for d in range(t.dim()):
        if t.shape[d] > 1 and draw(st.booleans(), label=f"slice{d}"):
            start = draw(st.integers(0, t.shape[d] - 1))
            step = draw(st.integers(1, 2))
            t = t.narrow(d, start, t.shape[d] - start)[(slice(None),) * d + (slice(None, None, step),)]
    # expand some size-1 dims
    sizes = list(t.shape)
    for d in range(t.dim()):
        if sizes[d] == 1 and draw(st.booleans(), label=f"expand{d}"):
            sizes[d] = draw(st.integers(1, 3))
    t = t.expand(*sizes)
    # sometimes insert a unit dim
    if draw(st.booleans(), label="unsqueeze"):
        t = t.unsqueeze(draw(st.integers(0, t.dim())))
    return t


@settings(max_examples=400, deadline=None)
@given(strided_tensor(), st.integers(0, 2**31 - 1))
def test_reshape_strides_matches_torch_view(t, seed):
    numel = t.numel()
    assume(numel > 0)
    rnd = random.Random(seed)
    new_shape = _factorizations(numel, rnd)
    got = reshape_strides(tuple(t.shape), tuple(t.stride()), tuple(new_shape))
    try:
        v = t.view(new_shape)
    except RuntimeError:
        assert got is None, (tuple(t.shape), t.stride(), new_shape, got)
        return
    assert got is not None, (tuple(t.shape), t.stride(), new_shape, v.stride())
    want = v.stride()
    # strides of size-1 dims never address anything; every other stride must agree
    for n, g, w in zip(new_shape, got, want):
        if n != 1:
            assert g == w, (tuple(t.shape), t.stride(), new_shape, got, want)
    # and the view addresses the same elements as torch's
    again = torch.as_strided(t, new_shape, got, t.storage_offset())
    assert torch.equal(again, v)


@pytest.mark.parametrize("old,strides,new", [
    ((2, 3), (3, 1), (6,)), ((2, 3), (1, 2), (6,)), ((4, 1, 3), (3, 3, 1), (2, 2, 3)),
    ((3, 4), (0, 1), (3, 2, 2)), ((3, 4), (0, 1), (12,)), ((2, 0, 3), (0, 3, 1), (0, 6)),
])
def test_reshape_strides_examples(old, strides, new):
    if 0 in old:
        t = torch.empty(old)
        strides = t.stride()
    else:
        t = torch.as_strided(torch.arange(100.0), old, strides)
    got = reshape_strides(old, tuple(strides), new)
    try:
        v = t.view(new)
    except RuntimeError:
        assert got is None
        return
    assert got is not None and len(got) == len(new)
    if t.numel():
        assert torch.equal(torch.as_strided(t, new, got, t.storage_offset()), v)
