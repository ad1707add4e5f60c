"""Parametric graphs over a symbolic number of rows: the runs of kernels holding a matmul run in
static blocks of rows, scheduled as static graphs are, the rows left in one padded block
(``transform.row_blocks``). Every size must give eager's results, at and around the block
sizes (8, 4 and 2 register tiles' rows: 112, 56 and 28 on the pinned machine), for every machine
description; rows must stay independent (a non-finite value in one row stays in it)."""
from __future__ import annotations

import pytest
import torch

import polytile
from polytile.accuracy import assert_accurate
from polytile.graph.symbols import Sym

from machines import NUMERIC, pinned

SIZES = (2, 3, 13, 27, 28, 29, 56, 57, 111, 112, 113, 150, 251)


class _Block(torch.nn.Module):
    """A transformer MLP block: layer norm, linear, GELU, linear, residual."""

    def __init__(self, d=24, h=40):
        super().__init__()
        self.ln, self.a, self.b = torch.nn.LayerNorm(d), torch.nn.Linear(d, h), torch.nn.Linear(h, d)

    def forward(self, x):
        return x + self.b(torch.nn.functional.gelu(self.a(self.ln(x))))


def _check(f, m, x):
    with torch.no_grad():
        assert_accurate(f(x), m(x), lambda: m.double()(x.double()), 1e-5)
        m.float()


@pytest.mark.parametrize("preset", NUMERIC)
def test_rows_in_blocks_give_eager_results_at_every_size(preset):
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = _Block().eval()
    f = torch.compile(m, backend="polytile", dynamic=True,
                      options={"max_specializations": 0, "fallback": False, "machine": {"preset": preset}})
    st0 = polytile.stats()
    for n in SIZES:
        x = torch.randn(n, 24)
        x[n // 2, 3] = float("inf")  # its row becomes non-finite; the others must not
        _check(f, m, x)
    st = polytile.stats()
    assert st["parametric_graphs"] - st0["parametric_graphs"] == 1
    assert st["graphs_compiled"] - st0["graphs_compiled"] == 1
    assert st["eager_runs"] == st0["eager_runs"]


def test_blocks_structure_on_the_pinned_machine(tmp_path):
    """Zen 4 (14-row register tiles): 112-row blocks, then the rows left in one padded block of
    28, 56 or 112 rows (the smallest that holds them), all in one run of kernels; the weights'
    panels packed once per call, outside the blocks; no plain matmul nest left."""
    torch._dynamo.reset()
    m = _Block(64, 256).eval()
    f = torch.compile(m, backend="polytile", dynamic=True,
                      options={"max_specializations": 0, "machine": pinned(), "dump_dir": str(tmp_path)})
    _check(f, m, torch.randn(37, 64))
    (src,) = [p.read_text() for p in tmp_path.rglob("*kernel.c")]
    lines = [line for line in src.split("int pt_entry")[1].splitlines() if line.startswith("  k") and "(nthreads" in line]
    calls = [line.split("(")[0].strip() for line in lines]
    packs = [c for c in calls if "_pack_" in c]
    runs = [c for c in calls if c not in packs]
    assert len(runs) == 2 and runs[0].endswith("_rows112") and runs[1].endswith("_rows_left")
    assert packs and calls.index(packs[-1]) < calls.index(runs[0])
    left = lines[calls.index(runs[1])]
    assert all(f"pad{n}" in left for n in (28, 56, 112))


def test_cached_weight_panels_follow_weight_updates():
    """With ``cache_weights``, the panels packed from the weights are kept between calls of a
    parametric graph too, and made again when a weight changes in place."""
    torch._dynamo.reset()
    torch.manual_seed(1)
    m = _Block().eval()
    f = torch.compile(m, backend="polytile", dynamic=True,
                      options={"max_specializations": 0, "cache_weights": True, "fallback": False})
    refreshes = polytile.stats().get("cache_refreshes", 0)
    for n in (5, 40, 130):
        _check(f, m, torch.randn(n, 24))
    assert polytile.stats().get("cache_refreshes", 0) - refreshes == 1
    with torch.no_grad():
        m.a.weight.mul_(-2.0)
    for n in (6, 131):
        _check(f, m, torch.randn(n, 24))
    assert polytile.stats().get("cache_refreshes", 0) - refreshes == 2


class _Mixed(torch.nn.Module):
    """Rows from an embedding (indices in the rows: the padded rows must hold valid ones), a
    linear layer, then a softmax across the rows (not row-separable) and another linear."""

    def __init__(self):
        super().__init__()
        self.emb, self.a, self.b = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, ids):
        h = self.a(self.emb(ids))
        return self.b(torch.softmax(h, 0) * h)


def test_rows_that_mix_rows_run_unblocked_and_indices_stay_in_range():
    torch._dynamo.reset()
    torch.manual_seed(2)
    m = _Mixed().eval()
    f = torch.compile(m, backend="polytile", dynamic=True, options={"max_specializations": 0, "fallback": False})
    for n in (2, 29, 113):
        ids = torch.randint(0, 50, (n,))
        ids[-1] = 49
        with torch.no_grad():
            assert_accurate(f(ids), m(ids), lambda: m.double()(ids), 1e-5)
            m.float()


def test_sizes_divide_by_monomials():
    s, b = Sym.symbol("s"), Sym.symbol("b")
    assert (768 * s) // (64 * s) == 12 and (768 * s * b) // s == 768 * b and (64 * s + 128 * s * b) // (64 * s) == 1 + 2 * b


def test_rows_of_a_concatenation_written_in_and_out_of_blocks():
    """A concatenation whose parts come from a blocked run (a linear layer), from a scan over
    the rows (not row-separable) and from an elementwise map: every size gives eager's result."""
    torch._dynamo.reset()
    torch.manual_seed(3)
    lin = torch.nn.Linear(16, 24).eval()

    def f(x):
        return torch.cat([torch.cumsum(x, 0), torch.relu(lin(x)), x * 2], 1)

    g = torch.compile(f, backend="polytile", dynamic=True, options={"max_specializations": 0, "fallback": False})
    for n in (2, 29, 115):
        x = torch.randn(n, 16)
        with torch.no_grad():
            assert_accurate(g(x), f(x), lambda: torch.cat([torch.cumsum(x.double(), 0), torch.relu(
                lin.double()(x.double())), x.double() * 2], 1), 1e-5)
            lin.float()
