"""The Backend seam (issue 28): the target-neutral modules import no backend, the compiler
dispatches through the backend that ``Options.target`` or the inputs' device picks, and a second
backend plugs in without touching graph IR, affine construction or fusion."""
from __future__ import annotations

import ast
import pathlib

import pytest
import torch
import torch.nn.functional as F

import polytile
from polytile.backends import BACKENDS, Backend, register, select
from polytile.backends.cpu import CPUBackend
from polytile.dtypes import Unsupported

SRC = pathlib.Path(polytile.__file__).parent
# target-neutral: graph IR, affine IR and its construction, the shared passes
NEUTRAL = (["graph", "affine"]
           + [f"transform/{m}.py" for m in ("dead", "parallelize", "fuse_producers", "fuse_epilogues", "fuse_loops",
                                           "fusion_util", "fusion_cost", "pipeline")])
BACKEND_PACKAGES = ("polytile.backends", "polytile.codegen", "polytile.runtime")


def _imports(path: pathlib.Path) -> set[str]:
    """Absolute module names ``path`` imports (relative imports resolved), also the ones
    inside functions and under TYPE_CHECKING."""
    pkg = ".".join(("polytile",) + path.relative_to(SRC).parent.parts)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = pkg.rsplit(".", node.level - 1)[0] if node.level else ""
            mod = ".".join(x for x in (base, node.module or "") if x)
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def test_target_neutral_modules_import_no_backend():
    files = [p for n in NEUTRAL for p in ((SRC / n).rglob("*.py") if (SRC / n).is_dir() else [SRC / n])]
    assert len(files) >= 15
    bad = {str(p.relative_to(SRC)): sorted(m for m in _imports(p) if m.startswith(BACKEND_PACKAGES))
           for p in files}
    assert not {k: v for k, v in bad.items() if v}


def test_the_default_backend_follows_the_inputs_device():
    assert select(None, "cpu").name == "cpu"
    with pytest.raises(Unsupported, match="no backend for"):
        select(None, "meta")
    with pytest.raises(Unsupported, match="runs on cpu"):
        select("cpu", "cuda")
    with pytest.raises(ValueError, match="targets are"):
        select("tpu", "cpu")


class _Recording(CPUBackend):
    """The CPU backend under another name, without register tiling, counting its calls."""

    name = "test-untiled-cpu"

    def __init__(self):
        self.calls = []

    def passes(self, machine, options):
        self.calls.append("passes")
        return [(n, f) for n, f in super().passes(machine, options) if n != "tile_contractions"]

    def emit(self, prog, request):
        self.calls.append("emit")
        assert request.machine.vector_bytes == 16  # the machine description of Options.machine
        return super().emit(prog, request)


def test_a_second_backend_plugs_in():
    rec = register(_Recording())
    try:
        x, w, b = torch.randn(20, 48), torch.randn(32, 48), torch.randn(32)
        fn = lambda x, w, b: torch.softmax(F.linear(x, w, b), -1)  # noqa: E731
        out = torch.compile(fn, backend="polytile", options={"target": rec.name, "machine": {"vector_bytes": 16},
                                                             "fallback": False})(x, w, b)
        torch.testing.assert_close(out, fn(x, w, b), rtol=1e-5, atol=1e-6)
        assert rec.calls == ["passes", "emit"]
    finally:
        BACKENDS.pop(rec.name)


def test_backend_is_abstract():
    with pytest.raises(TypeError):
        Backend()


def test_a_graph_on_a_device_without_backend_runs_through_aten(caplog):
    x = torch.randn(4, 4, device="meta")  # a device no backend takes: one clear warning
    with caplog.at_level("WARNING", logger="polytile"):
        out = torch.compile(lambda t: (t * 2).relu(), backend="polytile")(x)
    assert out.device.type == "meta" and out.shape == (4, 4)
    assert "no backend for meta tensors" in caplog.text


def test_transform_functions_take_at_most_eight_parameters():
    """Decisions travel in plan records (``transform.contraction_plan``), not long argument lists."""
    long = []
    for path in (SRC / "transform").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                if len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) > 8:
                    long.append(f"{path.name}:{node.name}")
    assert not long


def test_static_schedule_is_libgomps():
    from polytile.transform.contraction_plan import static_schedule

    assert static_schedule([1] * 5, 2) == 3  # 3 + 2: the first thread takes the extra iteration
    assert static_schedule([5, 1, 1, 1], 2) == 6
    assert static_schedule([2, 2, 2, 2, 2, 2, 2, 2, 2, 2], 4) == 6  # 3, 3, 2, 2 (not 3, 3, 3, 1)
    assert static_schedule([4], 2) == 4 and static_schedule([], 2) == 0


def test_every_module_imports():
    """A module moved or renamed leaves no stale import behind (the benchmarks included)."""
    import importlib
    import pkgutil

    failed = {}
    for m in pkgutil.walk_packages(polytile.__path__, "polytile."):
        try:
            importlib.import_module(m.name)
        except Exception as e:  # noqa: BLE001 (reported below)
            failed[m.name] = repr(e)
    assert not failed
