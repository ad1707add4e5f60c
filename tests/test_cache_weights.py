"""Values computed from parameters alone kept between calls (``Options.cache_weights``): the
weight panels of the register tiles and weight copies are computed once, then again only when
a parameter changes in place or is replaced; the results always match eager."""
from __future__ import annotations

import pytest
import torch

import polytile
from polytile.affine.ir import Buffer, For, Kernel, Load, Program, Store, Var, c
from polytile.transform.cache_static import cache_static_kernels, mark_static_inputs

from machines import pinned

# opt-in: a write through ``.data`` is not seen. The tests count the kernels cached, which the
# register tiles of the machine decide: the pinned one
ON = {"cache_weights": True, "machine": pinned()}


def test_by_default_a_write_through_data_is_seen():
    """The cache is off by default: a weight changed through ``.data`` (EMA, pruning and
    weight-loading code) bypasses the version counter, and is still read as it is."""
    torch.manual_seed(0)
    m = Conv1D(96, 400)
    x = torch.randn(40, 96)
    cm = torch.compile(m, backend="polytile")
    _check(cm, m, x)
    m.weight.data.mul_(2)
    _check(cm, m, x)
    assert polytile.stats()["cached_kernels"] == 0


class Conv1D(torch.nn.Module):
    """GPT-2's projection: x @ W + b with W stored [in, out] (its panels are packed from rows
    that lie far apart, the case the cache is for)."""

    def __init__(self, k: int, n: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(k, n) * 0.05)
        self.bias = torch.nn.Parameter(torch.randn(n))

    def forward(self, x):
        return torch.relu(torch.addmm(self.bias, x, self.weight))


def _check(compiled, model, x):
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


def _refreshes() -> int:
    return polytile.stats()["cache_refreshes"]


def test_weight_panels_are_packed_once_and_again_after_each_update():
    torch.manual_seed(0)
    m = Conv1D(96, 400)  # 8 full panels of 48 columns and a partial one
    x = torch.randn(40, 96)
    cm = torch.compile(m, backend="polytile", options=ON)
    polytile.reset_stats()
    for _ in range(3):
        _check(cm, m, x)
    st = polytile.stats()
    assert st["cached_kernels"] >= 1 and st["cache_bytes"] >= 96 * 400 * 4
    assert _refreshes() == 1  # three calls, the panels packed once
    with torch.no_grad():
        m.weight.mul_(-1.5)  # in place: the version counter moves
    _check(cm, m, x)
    assert _refreshes() == 2
    m.load_state_dict({"weight": torch.randn(96, 400), "bias": torch.randn(400)})
    _check(cm, m, x)
    _check(cm, m, x)
    assert _refreshes() == 3
    with torch.no_grad():
        m.weight[5:7].zero_()  # through a view: the same version counter
    _check(cm, m, x)
    m.weight = torch.nn.Parameter(torch.randn(96, 400))  # another tensor altogether
    _check(cm, m, x)
    assert _refreshes() == 5


def test_training_steps_see_each_optimizer_update():
    # the optimizer updates the weights in place between steps: every forward packs them anew,
    # and the gradients (the backward graph has no cached inputs) match eager's
    torch.manual_seed(4)
    m = Conv1D(96, 400)
    ref = Conv1D(96, 400)
    ref.load_state_dict(m.state_dict())
    cm = torch.compile(m, backend="polytile", options=ON)
    opts = [torch.optim.SGD(mod.parameters(), lr=0.1) for mod in (m, ref)]
    polytile.reset_stats()
    for step in range(3):
        x = torch.randn(40, 96)
        outs = [cm(x), ref(x)]
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
        for o, opt in zip(outs, opts):
            opt.zero_grad()
            o.square().sum().backward()
        torch.testing.assert_close(m.weight.grad, ref.weight.grad, rtol=1e-3, atol=1e-3)
        for opt in opts:
            opt.step()
    assert polytile.stats()["cache_refreshes"] == 3


def test_blocked_reduction_reads_each_block_of_the_cached_panels():
    # an L2 of 128 KB makes the 48-column panels of K = 700 too long for it: the reduction runs
    # in blocks, each reading its rows of the cached panels (fails if a block's offset is wrong)
    torch.manual_seed(1)
    m = Conv1D(700, 500)
    x = torch.randn(30, 700)
    cm = torch.compile(m, backend="polytile", options={**ON, "machine": pinned(l2_bytes=128 * 1024)})
    polytile.reset_stats()
    _check(cm, m, x)
    assert polytile.stats()["cache_refreshes"] == 1
    with torch.no_grad():
        m.weight.add_(torch.randn(700, 500))
    _check(cm, m, x)


def test_a_value_of_a_weight_alone_is_cached_and_off_means_every_call():
    class T(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(64, 48))

        def forward(self, x):
            return x @ (self.w * 2).t()  # the scaled weight reads only the weight

    torch.manual_seed(2)
    x = torch.randn(8, 48)
    for on in (True, False):
        m = T()
        cm = torch.compile(m, backend="polytile", options={"cache_weights": on})
        polytile.reset_stats()
        _check(cm, m, x)
        with torch.no_grad():
            m.w.mul_(3)
        _check(cm, m, x)
        st = polytile.stats()
        assert (st["cached_kernels"] > 0) == on and st["cache_refreshes"] == (2 if on else 0)


def test_parameters_made_in_inference_mode_are_recomputed_every_call():
    # inference tensors have no version counter: nothing can tell an in-place update, so the
    # cached kernels run on every call
    torch.manual_seed(3)
    with torch.inference_mode():
        m = Conv1D(64, 400)
        x = torch.randn(20, 64)
        cm = torch.compile(m, backend="polytile", options=ON)
        polytile.reset_stats()
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
        m.weight.mul_(2)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
        assert polytile.stats()["cached_kernels"] == 1 and polytile.stats()["cache_refreshes"] == 2


@pytest.mark.parametrize("m,k,n,layout", [(128, 300, 1000, "nk"), (50, 256, 97, "nk"), (130, 512, 400, "kn"),
                                           (7, 300, 500, "kn"), (64, 1100, 130, "nk"), (49, 2000, 448, "kn")])
def test_linear_layers_with_cached_weights_match_eager(m, k, n, layout):
    # weights [out, in] (nn.Linear: kept the column operand, its transposed panels cached) and
    # [in, out]; partial panels, rows left over, a reduction long enough to be blocked
    torch.manual_seed(m + k + n)
    lin = torch.nn.Linear(k, n) if layout == "nk" else Conv1D(k, n)
    x = torch.randn(m, k)
    cm = torch.compile(lin, backend="polytile", options=ON)
    polytile.reset_stats()
    _check(cm, lin, x)
    # (7 rows: too few for a register tile, the weight is read as it is, nothing to cache)
    assert polytile.stats()["cached_kernels"] == (0 if m < 8 else 1)
    with torch.no_grad():
        lin.weight.mul_(0.5)
    _check(cm, lin, x)


def _prog(kernels, static=(0,)):
    bufs = (Buffer("in0", "float32", 8, "input", 0), Buffer("in1", "float32", 8, "input", 1),
            Buffer("t0", "float32", 8, "temp"), Buffer("t1", "float32", 8, "temp"),
            Buffer("out0", "float32", 8, "output", 0))
    return mark_static_inputs(Program(bufs, tuple(kernels)), set(static))


def _copy(name, src, dst, extra=None):
    val = Load(src, Var("i"), "float32")
    if extra:
        from polytile.affine.ir import Op
        val = Op("add", (val, Load(extra, Var("i"), "float32")), "float32")
    return Kernel(name, (For("i", c(0), c(8), (Store(dst, Var("i"), val),)),))


def test_only_kernels_reading_parameters_alone_into_their_own_temps_are_cached():
    p = cache_static_kernels(_prog([_copy("a", "in0", "t0"), _copy("b", "t0", "t1"), _copy("c", "t1", "out0", "in1")]))
    assert [k.cached for k in p.kernels] == [True, True, False]
    assert {b.name for b in p.buffers if b.kind == "cache"} == {"t0", "t1"}
    # a temp another (uncached) kernel also writes is not a cached value, nor what reads it
    p = cache_static_kernels(_prog([_copy("a", "in0", "t0"), _copy("x", "in1", "t0"), _copy("b", "t0", "t1"),
                                    _copy("c", "t1", "out0")]))
    assert not any(k.cached for k in p.kernels)
    # reading a non-parameter input, or writing an output, is never cached
    p = cache_static_kernels(_prog([_copy("a", "in1", "t0"), _copy("b", "in0", "out0", "t0")]))
    assert not any(k.cached for k in p.kernels)
    p = cache_static_kernels(_prog([_copy("a", "in0", "out0")]))
    assert not any(k.cached for k in p.kernels)


def test_instances_sharing_a_graph_keep_their_own_cached_panels():
    # two instances of one module share a compiled graph (their parameters are its inputs):
    # alternating them computes each one's panels once, not on every call; a fifth instance
    # takes the memory of the least recently used one, and a dropped instance's memory is reused
    from polytile.runtime.weight_cache import MAX_SETS

    torch.manual_seed(5)
    mods = [Conv1D(96, 400) for _ in range(MAX_SETS + 1)]
    x = torch.randn(40, 96)
    cms = [torch.compile(m, backend="polytile", options=ON) for m in mods]
    polytile.reset_stats()
    for _ in range(3):
        for m, cm in zip(mods[:2], cms[:2]):
            _check(cm, m, x)
    assert polytile.stats()["graphs_compiled"] <= 1  # (0: dynamo reused an earlier test's graph)
    assert _refreshes() == 2
    for m, cm in zip(mods, cms):  # five groups, four sets: the first is dropped for the fifth
        _check(cm, m, x)
    assert _refreshes() == 2 + (MAX_SETS - 2) + 1
    _check(cms[1], mods[1], x)  # still held
    assert _refreshes() == MAX_SETS + 1
    _check(cms[0], mods[0], x)  # was dropped: computed again (and correct)
    assert _refreshes() == MAX_SETS + 2
    with torch.no_grad():
        mods[1].weight.mul_(2)  # an update of one instance moves only its own set
    _check(cms[1], mods[1], x)
    _check(cms[0], mods[0], x)
    assert _refreshes() == MAX_SETS + 3


def test_cache_sets_reuse_the_memory_of_freed_parameters():
    from polytile.runtime.weight_cache import CacheSets

    sets = CacheSets(256, max_sets=2)
    a, b = torch.randn(8), torch.randn(8)
    buf_a, stale = sets.select((a,))
    assert stale
    sets.done()
    assert sets.select((a,)) == (buf_a, False)
    buf_b, stale = sets.select((b,))
    assert stale and buf_b.data_ptr() != buf_a.data_ptr()
    sets.done()
    del a  # its set can never match again: the next new group takes its memory
    c = torch.randn(8)
    buf_c, stale = sets.select((c,))
    assert stale and buf_c.data_ptr() == buf_a.data_ptr() and len(sets) == 2
    sets.done()
    assert sets.select((b,)) == (buf_b, False)
    b.add_(1)  # a version bump: computed again into the same memory
    assert sets.select((b,)) == (buf_b, True)
