"""The PyTorch frontend: backend registration, options, ATen fallback, graph breaks, dumps."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import polytile
from polytile.options import Options

VALID_OPTIONS = ("dump_dir", "cache_dir", "threads", "cc", "cflags", "fallback", "verify", "parallel_min_work")


def _chain_of_causes(e: BaseException):
    seen = []
    while e is not None and e not in seen:
        seen.append(e)
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
    return seen


# ------------------------------------------------------------------ registration
def test_backend_string_after_import():
    assert "polytile" in torch._dynamo.list_backends()

    def fn(x, y):
        return torch.sigmoid(x @ y) * 3 - y.sum()

    c = torch.compile(fn, backend="polytile")
    x, y = torch.randn(6, 6), torch.randn(6, 6)
    torch.testing.assert_close(c(x, y), fn(x, y), atol=1e-5, rtol=1e-5)
    st = polytile.stats()
    assert st["graphs_compiled"] == 1 and st["ops_compiled"] > 0 and st["ops_fallen_back"] == {}, st


def test_entry_point_metadata():
    from importlib.metadata import entry_points

    eps = {ep.name: ep for ep in entry_points(group="torch_dynamo_backends")}
    assert "polytile" in eps, sorted(eps)
    assert eps["polytile"].load() is polytile.frontend.torch.backend.polytile_backend


_FRESH = textwrap.dedent("""
    import sys
    from importlib.metadata import entry_points
    import torch
    assert "polytile" in [ep.name for ep in entry_points(group="torch_dynamo_backends")]
    assert "polytile" not in sys.modules

    def fn(x):
        return torch.relu(x) * 2 + 1

    c = torch.compile(fn, backend="polytile")
    x = torch.randn(5, 7)
    torch.testing.assert_close(c(x), fn(x))
    import polytile
    st = polytile.stats()
    assert st["graphs_compiled"] >= 1 and st["ops_fallen_back"] == {}, st
    print("FRESH-OK")
""")


def test_entry_point_in_fresh_process(tmp_path):
    env = dict(os.environ, POLYTILE_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True, timeout=300,
                       cwd=str(tmp_path), env=env)
    assert r.returncode == 0 and "FRESH-OK" in r.stdout, r.stderr[-3000:]


# ------------------------------------------------------------------ options
def _sources(cache_dir) -> list[str]:
    out = []
    for f in sorted(os.listdir(cache_dir)):
        if f.endswith(".c"):
            with open(os.path.join(cache_dir, f)) as fh:
                out.append(fh.read())
    return out


def test_options_pass_through(tmp_path):
    def fn(x):
        return torch.tanh(x) + 1

    x = torch.randn(256, 256)
    one, two = tmp_path / "one", tmp_path / "two"
    c1 = torch.compile(fn, backend="polytile", options={"threads": 1, "cache_dir": str(one)})
    torch.testing.assert_close(c1(x), fn(x))
    torch._dynamo.reset()
    c2 = torch.compile(fn, backend="polytile",
                       options={"threads": 2, "cache_dir": str(two), "parallel_min_work": 1})
    torch.testing.assert_close(c2(x), fn(x))
    # cache_dir reached the compiler: each run wrote its kernels where it was told to
    src1, src2 = _sources(one), _sources(two)
    assert len(src1) == 1 and len(src2) == 1
    # threads reached the pass pipeline: one thread means no OpenMP loop
    assert "omp parallel" not in src1[0]
    assert "omp parallel" in src2[0]


def test_threads_option_validated():
    with pytest.raises(ValueError, match="threads"):
        Options.from_dict({"threads": 0})


def _assert_names_valid_options(e: BaseException):
    errs = [x for x in _chain_of_causes(e) if isinstance(x, ValueError)]
    assert errs, f"no ValueError in {_chain_of_causes(e)!r}"
    msg = str(errs[0])
    assert "bogus_option" in msg, msg
    for name in VALID_OPTIONS:
        assert name in msg, (name, msg)


def test_unknown_option_torch_compile():
    c = torch.compile(lambda x: x + 1, backend="polytile", options={"bogus_option": 1})
    with pytest.raises(Exception) as ei:
        c(torch.randn(3))
    _assert_names_valid_options(ei.value)


def test_unknown_option_direct():
    with pytest.raises(ValueError) as ei:
        Options.from_dict({"bogus_option": 1, "threads": 1})
    _assert_names_valid_options(ei.value)
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(3)
    gm = make_fx(lambda a: (a + 1,))(x)
    with pytest.raises(ValueError) as ei:
        polytile.compile_graph(gm, [x], {"bogus_option": True})
    _assert_names_valid_options(ei.value)


# ------------------------------------------------------------------ fallback to ATen
def _cummax_model(x):
    y = torch.relu(x) * 2.0
    z, _ = torch.cummax(y, dim=1)  # no polytile lowering: runs in ATen
    return torch.tanh(z) + x


def _topk_model(x):
    v, i = torch.topk(torch.exp(x), 3, dim=-1)
    return v * 2, i + 1


def _sort_model(x):
    s, i = torch.sort(x - 1, dim=0)
    return s.abs(), i


FALLBACK_CASES = {
    "cummax": (_cummax_model, "aten.cummax.default"),
    "topk": (_topk_model, "aten.topk.default"),
    "sort": (_sort_model, "aten.sort.default"),
}


def _no_rule(op_name: str) -> bool:
    from polytile.frontend.torch.registry import LOWERINGS, ensure_loaded

    ensure_loaded()
    return all(str(t) != op_name for t in LOWERINGS)


@pytest.mark.parametrize("case", list(FALLBACK_CASES))
def test_fallback_runs_op_in_aten(case):
    fn, op = FALLBACK_CASES[case]
    if not _no_rule(op):
        pytest.skip(f"{op} has a lowering now; pick another op without one")
    x = torch.randn(6, 9)
    c = torch.compile(fn, backend="polytile")
    out, ref = c(x), fn(x)
    out, ref = (out, ref) if isinstance(ref, tuple) else ((out,), (ref,))
    for a, b in zip(out, ref):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    st = polytile.stats()
    assert st["ops_fallen_back"] == {op: 1}, st
    assert st["ops_compiled"] > 0 and st["graphs_compiled"] >= 1, st
    x2 = torch.randn(6, 9)  # the mixed native/ATen graph is reusable
    out2, ref2 = c(x2), fn(x2)
    torch.testing.assert_close(out2, ref2, atol=1e-5, rtol=1e-5)


def test_fallback_disabled_raises():
    c = torch.compile(_cummax_model, backend="polytile", options={"fallback": False})
    with pytest.raises(Exception) as ei:
        c(torch.randn(6, 9))
    assert any("cummax" in str(x) for x in _chain_of_causes(ei.value)), repr(ei.value)
    assert polytile.stats()["ops_fallen_back"] == {}


def test_exported_modules_metadata_checks_compute_nothing():
    """An exported module checks a tensor's type before each ``.to(dtype)``
    (``_assert_tensor_metadata``, in every PT2E-quantized model): compiled with no fallback,
    in one graph, with the module's results."""
    class ToAndBack(torch.nn.Module):
        def forward(self, x):
            return (x.to(torch.float64) * 3).to(torch.float32) + 1

    x = torch.randn(4, 5)
    m = torch.export.export(ToAndBack(), (x,)).module()
    assert any("_assert_tensor_metadata" in str(n.target) for n in m.graph.nodes)
    c = torch.compile(m, backend="polytile", options={"fallback": False})
    for x in (x, torch.tensor([[float("inf"), float("nan"), -0.0, 1e30, -1e-30]] * 4)):
        out = c(x)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, m(x), equal_nan=True)
    st = polytile.stats()
    assert st["ops_fallen_back"] == {} and st["graphs_compiled"] == 1, st


# ------------------------------------------------------------------ graph breaks
class GraphBreaks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = torch.relu(self.lin(x))
        print("polytile-test: graph break here")
        if y.sum() > 2.0:  # data-dependent python branch
            return torch.sigmoid(y) * 2
        return y - torch.tanh(x)


def test_graph_breaks(capsys):
    m = GraphBreaks().eval()
    c = torch.compile(m, backend="polytile")
    big, small = torch.ones(4, 8) * 3, torch.full((4, 8), -3.0)
    with torch.no_grad():
        if m(big).sum() > 2:
            torch.testing.assert_close(c(big), torch.sigmoid(torch.relu(m.lin(big))) * 2)
        for x in (big, small, torch.randn(4, 8)):
            torch.testing.assert_close(c(x), m(x), atol=1e-5, rtol=1e-5)
    assert "graph break here" in capsys.readouterr().out
    st = polytile.stats()
    assert st["graphs_compiled"] >= 2, st  # the pieces around the break were compiled
    assert st["ops_fallen_back"] == {}, st


# ------------------------------------------------------------------ dumps
def test_dump_dir(tmp_path):
    from polytile.compiler import passes_for
    from polytile.options import Options

    PASSES = passes_for(Options())

    def fn(x, w):
        return torch.relu(x @ w).sum(-1)

    c = torch.compile(fn, backend="polytile", options={"dump_dir": str(tmp_path)})
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    torch.testing.assert_close(c(x, w), fn(x, w), atol=1e-5, rtol=1e-5)
    files = sorted(os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs)
    assert files, "nothing dumped"
    names = [os.path.basename(f) for f in files]
    numbered = [re.match(r"(\d+)_(.+)$", n) for n in names]
    assert all(numbered), names
    stages = [m.group(2) for m in sorted(numbered, key=lambda m: int(m.group(1)))]
    assert len({int(m.group(1)) for m in numbered}) == len(numbered)  # numbers are unique

    def pos(stage):
        assert stage in stages, (stage, stages)
        return stages.index(stage)

    # graph IR, the affine IR as built and after every pass of the pipeline, then the C source
    order = ["graph.txt", "affine_build.mlir"] + [f"affine_{p}.mlir" for p, _ in PASSES] + ["kernel.c"]
    positions = [pos(s) for s in order]
    assert positions == sorted(positions), list(zip(order, positions))

    def read(stage):
        (path,) = [f for f in files if re.fullmatch(rf"\d+_{re.escape(stage)}", os.path.basename(f))]
        with open(tmp_path / path) as fh:
            return fh.read()

    assert "matmul" in read("graph.txt")
    for p, _ in PASSES:
        text = read(f"affine_{p}.mlir")
        assert "affine.for" in text or "affine.parallel" in text, p
        assert "affine.load" in text and "affine.store" in text, p
    csrc = read("kernel.c")
    assert "pt_entry" in csrc
    kernels = sorted(set(re.findall(r"\bvoid\s+(k\d+_\w+)\s*\(", csrc)))
    assert kernels and len(kernels) == polytile.stats()["kernels_generated"], (kernels, csrc[:2000])
    entry = csrc[csrc.index("pt_entry("):]
    for k in kernels:  # every kernel is defined (has a body) and is called from the entry point
        assert re.search(rf"\bvoid\s+{k}\s*\([^;{{]*\)\s*{{", csrc), k
        assert re.search(rf"\b{k}\(", entry), k
