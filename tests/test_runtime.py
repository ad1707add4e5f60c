"""Runtime behaviour of compiled graphs: input checks, strided inputs, run-time errors, the
on-disk cache and the static memory plan."""
from __future__ import annotations

import os
import stat

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import polytile
from polytile.runtime.cache import UnsafeCacheDir
from polytile.runtime.loader import InputMismatchError, KernelRuntimeError


def compile_fn(fn, *example, **options):
    """make_fx ``fn`` to an ATen graph and compile it with ``polytile.compile_graph``."""
    gm = make_fx(fn)(*example)
    return polytile.compile_graph(gm, list(example), options or None)


def _natives(compiled):
    """The NativeGraph objects inside a ``compile_graph`` callable (one per compiled segment)."""
    return [s.native for s in compiled.steps if getattr(s, "native", None) is not None]


def _f(x, y):
    return (torch.relu(x) + y * 2,)


def _run_child(code: str, *argv: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)


_META_CHILD = r"""
import sys, torch, polytile
from torch.fx.experimental.proxy_tensor import make_fx
from polytile.runtime.loader import InputMismatchError
f = lambda x, y: (torch.relu(x) + y * 2,)
x, y = torch.randn(4, 5), torch.randn(4, 5)
g = polytile.compile_graph(make_fx(f)(x, y), [x, y], {"cache_dir": sys.argv[1]})
try:
    g(torch.empty(4, 5, device="meta"), y)
except InputMismatchError as e:
    assert "meta" in str(e), str(e)
    print("META-OK")
"""


# ------------------------------------------------------------------ (a) bad inputs
@pytest.fixture(scope="module")
def g():
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    return compile_fn(_f, x, y)


class TestBadInputs:
    def test_good_call(self, g):
        x, y = torch.randn(4, 5), torch.randn(4, 5)
        (out,) = g(x, y)
        torch.testing.assert_close(out, _f(x, y)[0])

    def test_wrong_dtype(self, g):
        with pytest.raises(InputMismatchError) as ei:
            g(torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5))
        msg = str(ei.value)
        assert "float64" in msg and "float32" in msg, msg

    def test_wrong_shape(self, g):
        with pytest.raises(InputMismatchError) as ei:
            g(torch.randn(4, 5), torch.randn(4, 6))
        msg = str(ei.value)
        assert "[4, 6]" in msg and "[4, 5]" in msg, msg

    def test_wrong_rank(self, g):
        with pytest.raises(InputMismatchError, match=r"\[20\]"):
            g(torch.randn(20), torch.randn(4, 5))

    def test_non_tensor(self, g):
        with pytest.raises(InputMismatchError) as ei:
            g(torch.randn(4, 5), 3.0)
        assert "float" in str(ei.value) and "tensor" in str(ei.value), str(ei.value)

    def test_wrong_device(self, tmp_path):
        # run in a child process: the failure mode is a crash of the whole interpreter
        r = _run_child(_META_CHILD, str(tmp_path / "cache"))
        assert r.returncode == 0 and "META-OK" in r.stdout, (r.returncode, r.stderr[-2000:])

    def test_other_layout_is_copied_into_the_compiled_one(self, g):
        # compiled for a contiguous input: a transposed one is not read as if contiguous but
        # copied into the compiled layout first
        xt, y = torch.randn(5, 4).t(), torch.randn(4, 5)
        torch.testing.assert_close(g(xt, y)[0], _f(xt, y)[0])
        assert _natives(g)[0].relayouts == 1 and polytile.stats()["input_relayouts"] == 1

    @pytest.mark.parametrize("n", [1, 3, 0])
    def test_wrong_number_of_inputs(self, g, n):
        args = [torch.randn(4, 5) for _ in range(n)]
        with pytest.raises(InputMismatchError, match=r"2 inputs"):
            g(*args)

    def test_error_names_the_call_position(self):
        def f(unused, x, y):
            return (x * y,)

        x = torch.randn(4, 5)
        g = compile_fn(f, x, x.clone(), x.clone())  # distinct tensors: make_fx dedupes aliases
        with pytest.raises(InputMismatchError, match=r"input 1\b"):
            g(x, x.double(), x)

    def test_bad_call_leaves_graph_usable(self, g):
        with pytest.raises(InputMismatchError):
            g(torch.randn(4, 5).double(), torch.randn(4, 5))
        x, y = torch.randn(4, 5), torch.randn(4, 5)
        torch.testing.assert_close(g(x, y)[0], _f(x, y)[0])


# ------------------------------------------------------------------ (b) strided inputs
def _strided_cases():
    base = torch.randn(12, 10)
    return {
        "transposed": lambda: torch.randn(8, 8).t(),
        "sliced_step": lambda: torch.randn(16, 20)[1::2, 3:19:2],
        "expanded": lambda: torch.randn(1, 8).expand(8, 8),
        "expanded_col": lambda: torch.randn(8, 1).expand(8, 8),
        "offset_view": lambda: base[2:10, 1:9],
    }


def _g(x, y):
    return (torch.exp(x) * y + x.sum(0),)


@pytest.mark.parametrize("case", list(_strided_cases()))
def test_noncontiguous_inputs_compile_graph(case):
    make = _strided_cases()[case]
    x, y = make(), torch.randn(8, 8)
    assert not x.is_contiguous()
    g = compile_fn(_g, x, y)
    torch.testing.assert_close(g(x, y)[0], _g(x, y)[0], atol=1e-5, rtol=1e-5)
    x2 = make()  # same layout, new data
    torch.testing.assert_close(g(x2, y)[0], _g(x2, y)[0], atol=1e-5, rtol=1e-5)
    assert polytile.stats()["ops_fallen_back"] == {}


def test_noncontiguous_inputs_torch_compile():
    def fn(a, b):
        return torch.tanh(a) @ b + a.mean(-1, keepdim=True)

    c = torch.compile(fn, backend="polytile")
    b = torch.randn(8, 6)
    cases = [torch.randn(8, 8), torch.randn(8, 8).t(), torch.randn(16, 24)[::2, 4:20:2],
             torch.randn(8, 1).expand(8, 8)]
    for a in cases:
        torch.testing.assert_close(c(a, b), fn(a, b), atol=1e-5, rtol=1e-5)
    # b non-contiguous too
    bt = torch.randn(6, 8).t()
    torch.testing.assert_close(c(cases[1], bt), fn(cases[1], bt), atol=1e-5, rtol=1e-5)
    st = polytile.stats()
    assert st["graphs_compiled"] >= 1 and st["ops_fallen_back"] == {}, st


@pytest.mark.parametrize("case", list(_strided_cases()))
def test_inputs_in_another_layout_than_compiled(case):
    """A graph compiled for one layout takes every other layout of the same values: copied into
    the compiled layout where that layout can be written, else (a compiled expanded input, whose
    values the kernels read once) run through ATen for that call; never an error."""
    make = _strided_cases()[case]
    x, y = make(), torch.randn(8, 8)
    g = compile_fn(_g, x, y)
    for other in [torch.randn(8, 8), torch.randn(8, 8).t(), torch.randn(8, 16)[:, ::2],
                  torch.randn(8, 1).expand(8, 8), torch.randn(1, 8).expand(8, 8)]:
        torch.testing.assert_close(g(other, y)[0], _g(other, y)[0], atol=1e-5, rtol=1e-5)
    st = polytile.stats()
    assert st["input_relayouts"] + st["eager_runs"] >= 3, st
    assert st["eager_runs"] == 0 or case.startswith("expanded"), st


def test_outputs_have_eager_strides():
    """A graph output leaves with the strides eager gives it (AOTAutograd compiles the backward
    graph for those): a transposed or channels-last result is written in its memory order, an
    expanded one is computed once along its broadcast dims and expanded."""
    def f(x, y):
        return (torch.relu(x).t(), (x + 1).unsqueeze(0).permute(0, 2, 1) * 2, y.contiguous(memory_format=torch.channels_last) + 1, x * 3,
                (x[:1] * 2).expand(4, 5), torch.zeros(3, 1).expand(3, 4), (x.t() + 1)[:, None].expand(5, 2, 6))

    x, y = torch.randn(6, 5), torch.randn(2, 3, 4, 5)
    g = compile_fn(f, x, y)
    outs, ref = g(x, y), f(x, y)
    for o, r in zip(outs, ref):
        torch.testing.assert_close(o, r)
        assert o.stride() == r.stride(), (o.stride(), r.stride())


def test_training_a_cnn_matches_eager():
    """SGD with momentum over a small CNN (conv-BN-ReLU-maxpool-conv-ReLU-avgpool-linear,
    cross-entropy): the forward graph's saved activations reach the backward graph in the
    layout it was compiled for, and the weights follow eager's."""
    import copy

    import torch.nn as nn

    def make():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(16, 10))

    m0 = make()
    m1 = copy.deepcopy(m0)
    cm = torch.compile(m1, backend="polytile")
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (m0, m1)]
    for _ in range(4):
        x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
        for f, o in ((m0, opts[0]), (cm, opts[1])):
            o.zero_grad()
            F.cross_entropy(f(x), y).backward()
            o.step()
    for (name, a), b in zip(m0.named_parameters(), m1.parameters()):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4, msg=name)
    for a, b in zip(m0.buffers(), m1.buffers()):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    assert polytile.stats()["graphs_compiled"] >= 2


def test_channels_last_conv_input():
    conv = torch.nn.Conv2d(3, 4, 3, padding=1).eval()
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    c = torch.compile(conv, backend="polytile")
    with torch.no_grad():
        torch.testing.assert_close(c(x), conv(x), atol=1e-5, rtol=1e-5)
    assert polytile.stats()["graphs_compiled"] >= 1


# ------------------------------------------------------------------ (c) run-time index errors
def _emb(w, i):
    return (F.embedding(i, w),)


def _isel(w, i):
    return (torch.index_select(w, 0, i),)


def _isel1(w, i):
    return (torch.index_select(w, 1, i),)


def _gather(w, i):
    return (torch.gather(w, 0, i.unsqueeze(1).expand(-1, w.shape[1])),)


INDEX_OPS = {"embedding": _emb, "index_select": _isel, "index_select_dim1": _isel1, "gather": _gather}


@pytest.mark.parametrize("op", list(INDEX_OPS))
def test_index_out_of_range_raises(op):
    fn = INDEX_OPS[op]
    w = torch.randn(10, 10)
    good = torch.tensor([1, 9, 0, 4])
    g = compile_fn(fn, w, good)
    torch.testing.assert_close(g(w, good)[0], fn(w, good)[0])
    for bad in (torch.tensor([1, 10, 0, 4]), torch.tensor([0, 0, 0, 1 << 40])):
        with pytest.raises(KernelRuntimeError, match="index out of range"):
            g(w, bad)
    # the error flag does not stick: the next good call works
    other = torch.tensor([3, 3, 2, 8])
    torch.testing.assert_close(g(w, other)[0], fn(w, other)[0])


@pytest.mark.parametrize("op", ["embedding", "index_select", "gather"])
def test_negative_index_raises_like_eager(op):
    fn = INDEX_OPS[op]
    w = torch.randn(10, 10)
    bad = torch.tensor([-1, 0, 2, 3])
    with pytest.raises((IndexError, RuntimeError)):
        fn(w, bad)  # eager refuses it
    g = compile_fn(fn, w, torch.tensor([1, 2, 3, 4]))
    with pytest.raises(KernelRuntimeError):
        g(w, bad)


def test_index_error_through_torch_compile():
    emb = torch.nn.Embedding(10, 4)
    c = torch.compile(emb, backend="polytile")
    ok = torch.tensor([[1, 2], [9, 0]])
    with torch.no_grad():
        torch.testing.assert_close(c(ok), emb(ok))
        with pytest.raises(KernelRuntimeError):
            c(torch.tensor([[1, 2], [10, 0]]))
        torch.testing.assert_close(c(ok), emb(ok))
    assert polytile.stats()["ops_fallen_back"] == {}


# ------------------------------------------------------------------ (d) the cache
def test_cache_miss_then_hit(tmp_path):
    cache = tmp_path / "cache"
    x, y = torch.randn(6, 7), torch.randn(6, 7)
    g1 = compile_fn(_f, x, y, cache_dir=str(cache))
    st = polytile.stats()
    assert (st["cache_misses"], st["cache_hits"]) == (1, 0), st
    g2 = compile_fn(_f, x, y, cache_dir=str(cache))
    st = polytile.stats()
    assert (st["cache_misses"], st["cache_hits"]) == (1, 1), st
    assert _natives(g1)[0].so_path == _natives(g2)[0].so_path
    torch.testing.assert_close(g2(x, y)[0], g1(x, y)[0])
    torch.testing.assert_close(g2(x, y)[0], _f(x, y)[0])
    # no temporary files are left behind
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]


_CHILD = r"""
import sys, json, torch, polytile
from torch.fx.experimental.proxy_tensor import make_fx
torch.manual_seed(0)
x, y = torch.randn(64, 33), torch.randn(64, 33)
f = lambda x, y: (torch.relu(x) * y + x.sum(1, keepdim=True),)
g = polytile.compile_graph(make_fx(f)(x, y), [x, y], {"cache_dir": sys.argv[1], "fallback": False})
ok = torch.allclose(g(x, y)[0], f(x, y)[0], atol=1e-5, rtol=1e-5)
st = polytile.stats()
print(json.dumps({"ok": ok, "hits": st["cache_hits"], "misses": st["cache_misses"]}))
"""


def _children(cache, n):
    import json
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(cache)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(n)]
    out = []
    for p in procs:
        so, se = p.communicate(timeout=300)
        assert p.returncode == 0, se[-3000:]
        out.append(json.loads(so.strip().splitlines()[-1]))
    return out


def test_cache_shared_across_processes(tmp_path):
    """Two processes compiling the same graph at once both succeed (atomic writes); a third one
    finds the kernel in the cache."""
    cache = tmp_path / "cache"
    first = _children(cache, 2)
    assert all(r["ok"] for r in first), first
    assert sum(r["misses"] + r["hits"] for r in first) == 2, first
    assert len([p for p in cache.iterdir() if p.suffix == ".so"]) == 1
    (third,) = _children(cache, 1)
    assert third == {"ok": True, "hits": 1, "misses": 0}, third


def test_cache_key_depends_on_graph(tmp_path):
    cache = str(tmp_path / "cache")
    x = torch.randn(6, 7)
    compile_fn(lambda a: (a + 1,), x, cache_dir=cache)
    compile_fn(lambda a: (a + 2,), x, cache_dir=cache)
    compile_fn(lambda a: (a + 1,), torch.randn(6, 8), cache_dir=cache)
    st = polytile.stats()
    assert (st["cache_misses"], st["cache_hits"]) == (3, 0), st


def test_cache_dir_created_private(tmp_path):
    cache = tmp_path / "cache"
    x, y = torch.randn(6, 7), torch.randn(6, 7)
    g = compile_fn(_f, x, y, cache_dir=str(cache))
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert os.stat(cache).st_uid == os.getuid()
    assert any(p.suffix == ".so" for p in cache.iterdir())
    torch.testing.assert_close(g(x, y)[0], _f(x, y)[0])
    assert polytile.stats()["cache_misses"] == 1


def test_nested_cache_dir_created_private(tmp_path):
    cache = tmp_path / "a" / "b" / "cache"
    x = torch.randn(3)
    g = compile_fn(lambda a: (a * 3,), x, cache_dir=str(cache))
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    torch.testing.assert_close(g(x)[0], x * 3)


@pytest.fixture
def unsafe_dir(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    yield d
    os.chmod(d, 0o700)


def test_world_writable_cache_dir_refused(unsafe_dir):
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    with pytest.raises(UnsafeCacheDir, match="writable"):
        compile_fn(_f, x, y, cache_dir=str(unsafe_dir), fallback=False)
    assert not [p for p in unsafe_dir.iterdir() if p.suffix == ".so"]


def test_group_writable_cache_dir_refused(tmp_path):
    d = tmp_path / "grp"
    d.mkdir()
    os.chmod(d, 0o770)
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    with pytest.raises(UnsafeCacheDir):
        compile_fn(_f, x, y, cache_dir=str(d), fallback=False)


def test_unsafe_cache_dir_with_fallback_does_not_crash(unsafe_dir):
    def fn(a, b):
        return torch.sigmoid(a) * b - 1

    c = torch.compile(fn, backend="polytile", options={"cache_dir": str(unsafe_dir), "fallback": True})
    a, b = torch.randn(5, 5), torch.randn(5, 5)
    torch.testing.assert_close(c(a, b), fn(a, b))
    torch.testing.assert_close(c(b, a), fn(b, a))
    st = polytile.stats()
    assert st["graphs_compiled"] == 0, st  # nothing was compiled or loaded from that directory
    assert st["ops_fallen_back"], st
    assert not [p for p in unsafe_dir.iterdir() if p.suffix in (".so", ".c")]


# ------------------------------------------------------------------ (e) memory plan
def _chain(x, w1, w2, w3, w4):
    h = torch.relu(x @ w1)
    h = torch.tanh(h @ w2)
    h = torch.relu(h @ w3)
    return (h @ w4 + 1.0,)


def test_memory_plan_shares_arena():
    x, *ws = [torch.randn(32, 32) for _ in range(5)]
    g = compile_fn(_chain, x, *ws)
    (ng,) = _natives(g)
    plan = ng.memory_plan
    assert len(plan.offsets) >= 3, plan  # a chain: at least 3 intermediates
    assert plan.temp_bytes > 0
    assert plan.arena_bytes < plan.temp_bytes, plan  # intermediates reuse arena space
    assert ng.arena_bytes == plan.arena_bytes
    torch.testing.assert_close(g(x, *ws)[0], _chain(x, *ws)[0], atol=1e-4, rtol=1e-4)


def test_repeated_calls_are_stable():
    x, *ws = [torch.randn(32, 32) for _ in range(5)]
    g = compile_fn(_chain, x, *ws)
    (ng,) = _natives(g)
    first = g(x, *ws)[0].clone()
    arena_ptr = ng.arena.data_ptr()
    expected = _chain(x, *ws)[0]
    torch.testing.assert_close(first, expected, atol=1e-4, rtol=1e-4)
    x2 = torch.randn(32, 32)
    for _ in range(3):
        out = g(x, *ws)[0]
        assert torch.equal(out, first)  # bit-identical on every call
        torch.testing.assert_close(g(x2, *ws)[0], _chain(x2, *ws)[0], atol=1e-4, rtol=1e-4)
    assert ng.arena.data_ptr() == arena_ptr  # the arena is allocated once
    # outputs are fresh tensors, not views of the arena or of each other
    a, b = g(x, *ws)[0], g(x, *ws)[0]
    assert a.data_ptr() != b.data_ptr()
    a.zero_()
    assert torch.equal(g(x, *ws)[0], first)


def _big(x, w):
    return (torch.relu(x @ w) + 1.0,)


def test_large_outputs_reuse_dropped_blocks_only():
    """Outputs of 256 KB and more reuse the memory of a previous call's output once that output
    (and every view of it) is gone, and never while anything still reads it."""
    x, w = torch.randn(256, 64), torch.randn(64, 512)  # a 512 KB output
    g = compile_fn(_big, x, w)
    (ng,) = _natives(g)
    pool = ng.output_pool
    assert pool is not None
    want = _big(x, w)[0]
    first = g(x, w)[0]
    torch.testing.assert_close(first, want)
    assert first.is_contiguous() and first.shape == want.shape and first.dtype == want.dtype
    ptr = first.data_ptr()
    keep_view = first[3:5]  # a view keeps the block alive after the tensor itself is dropped
    del first
    x2 = torch.randn(256, 64)
    second = g(x2, w)[0]
    assert second.data_ptr() != ptr and pool.reused == 0
    torch.testing.assert_close(keep_view, want[3:5])  # untouched by the second call
    arr = second.numpy()  # so does a numpy array on it
    del second
    third = g(x, w)[0]
    torch.testing.assert_close(third, want)
    torch.testing.assert_close(torch.from_numpy(arr), _big(x2, w)[0])
    del keep_view
    fourth = g(x2, w)[0]  # the first call's block is free now
    assert fourth.data_ptr() == ptr and pool.reused == 1
    torch.testing.assert_close(fourth, _big(x2, w)[0])
    torch.testing.assert_close(third, want)
    del arr, third, fourth
    assert pool.free_bytes <= pool.keep_bytes


def test_small_outputs_and_reuse_off_use_fresh_tensors():
    x, w = torch.randn(256, 64), torch.randn(64, 512)
    g = compile_fn(_big, x, w, reuse_outputs=False)
    (ng,) = _natives(g)
    assert ng.output_pool is None
    a = g(x, w)[0]
    a.resize_(600, 512)  # an ordinary torch tensor, resizable
    torch.testing.assert_close(a[:256], _big(x, w)[0])
    g_small = compile_fn(_big, torch.randn(4, 8), torch.randn(8, 16))
    assert _natives(g_small)[0].output_pool is None


def test_profile_times_every_kernel_call():
    import torch.nn.functional as F

    torch._dynamo.reset()

    def fn(x, w):
        return torch.softmax(F.relu(x @ w), -1)

    x, w = torch.randn(64, 48), torch.randn(48, 40)
    f = torch.compile(fn, backend="polytile", options={"profile": True, "fallback": False})
    torch.testing.assert_close(f(x, w), fn(x, w))
    polytile.profile(reset=True)  # drop the first (compiling) call
    f(x, w)
    f(x, w)
    rows = polytile.profile()
    assert rows and all(r["calls"] == 2 and r["ms"] > 0 for r in rows)
    assert any("matmul" in r["kernel"] for r in rows)
    assert rows == sorted(rows, key=lambda r: -r["ms"])
    text = polytile.format_profile(rows)
    assert "total over" in text and rows[0]["kernel"][:40] in text
    polytile.profile(reset=True)
    assert polytile.profile() == []


def test_boxed_entry_matches_positional():
    """The list-of-arguments entry AOTAutograd calls gives the same fresh outputs, and checks its
    argument count."""
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    g = compile_fn(_f, x, y)
    (out,) = g.boxed([x, y])
    torch.testing.assert_close(out, _f(x, y)[0])
    assert out.is_contiguous() and out.data_ptr() != g.boxed([x, y])[0].data_ptr()
    with pytest.raises(InputMismatchError):
        g.boxed([x])


def test_concurrent_calls_from_threads():
    """Calls from several Python threads share one arena and one argument vector: each call
    still gets its own inputs' result."""
    import threading

    x0 = torch.randn(64, 64)
    ws = [torch.randn(64, 64) for _ in range(4)]
    g = compile_fn(_chain, x0, *ws)
    xs = [torch.randn(64, 64) for _ in range(4)]
    want = [_chain(x, *ws)[0] for x in xs]
    bad = []

    def work(k):
        for _ in range(25):
            got = g(xs[k], *ws)[0]
            if not torch.allclose(got, want[k], atol=1e-4, rtol=1e-4):
                bad.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_views_of_inputs_leave_as_views():
    """A graph output that is a view of an input is that view of the caller's tensor (eager
    returns an alias; a saved transposed weight must not be copied per use)."""
    def f(x, y):
        return (x.t(), x[1:, ::2], x, y + 1)

    x, y = torch.randn(6, 8), torch.randn(3)
    g = compile_fn(f, x, y)
    outs, ref = g(x, y), f(x, y)
    for o, r in zip(outs[:3], ref[:3]):
        assert o.data_ptr() == r.data_ptr() and o.stride() == r.stride() and torch.equal(o, r)
    torch.testing.assert_close(outs[3], ref[3])


def test_a_sum_of_large_temporaries_is_not_fused_into_its_end():
    """add(add(add(g1, g2), g3), ...) of 16 MiB temporaries: recomputing the sums in the last
    kernel would keep every g alive at once (a gradient summed over shared layers)."""
    def f(a, *b):
        return ((a @ b[0]) + (a @ b[1]) + (a @ b[2]) + (a @ b[3]) + (a @ b[4]) + (a @ b[5]),)

    a = torch.randn(64, 2)
    bs = [torch.randn(2, 65536) for _ in range(6)]
    g = compile_fn(f, a, *bs)
    torch.testing.assert_close(g(a, *bs)[0], f(a, *bs)[0], atol=1e-4, rtol=1e-4)
    big = 64 * 65536 * 4
    assert _natives(g)[0].memory_plan.arena_bytes <= 3 * big, _natives(g)[0].memory_plan.arena_bytes
