"""Every machine description of ``machines.NUMERIC`` (64-, 32- and 16-byte vectors, 16 and 32
registers, L2 sizes from 256 KiB to 2 MiB) compiled and run on this host against eager: the
register tiles, cache blocks, packing and attention tiles each description gets must compute
the same function. The default run takes every description over every case class, a case
each; ``slow`` runs the whole cross product."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import polytile

from accuracy import assert_accurate, fp64_reference
from machines import NUMERIC


def _mm(m, n, k, at=False):
    a = torch.randn(k, m).t() if at else torch.randn(m, k)
    return torch.mm, (a, torch.randn(k, n))


def _conv(c, k, hw, ks, stride, groups=1):
    fn = lambda x, w: F.conv2d(x, w, stride=stride, padding=ks // 2, groups=groups)  # noqa: E731
    return fn, (torch.randn(2, c, hw, hw), torch.randn(k, c // groups, ks, ks))


def _attn(L, S, D, causal=False, heads=4, kv_heads=4):
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,  # noqa: E731
                                                        enable_gqa=heads != kv_heads)
    return fn, (torch.randn(1, heads, L, D), torch.randn(1, kv_heads, S, D), torch.randn(1, kv_heads, S, D))


def _norms():
    def fn(x, w, b):
        y = F.layer_norm(x, (x.shape[-1],), w, b)
        return torch.softmax(F.gelu(y) * 3, -1), y.exp().sum(-1)
    x = torch.randn(6, 33, 70)
    x[0, 0, :3] = torch.tensor([float("inf"), float("nan"), -0.0])
    return fn, (x, torch.randn(70), torch.randn(70))


def _cnn():
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 24, 3, 2, 1), torch.nn.BatchNorm2d(24), torch.nn.ReLU(),
                            torch.nn.Conv2d(24, 24, 3, 1, 1, groups=24), torch.nn.Conv2d(24, 40, 1),
                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(40, 10)).eval()
    return m, (torch.randn(2, 3, 33, 33),)


def _encoder():
    m = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval()
    return m, (torch.randn(2, 37, 64),)


CASES = {
    "gemm": [lambda: _mm(97, 101, 103), lambda: _mm(7, 13, 5), lambda: _mm(300, 1, 64), lambda: _mm(35, 257, 300, True),
             lambda: _mm(64, 1031, 16), lambda: _mm(5, 80, 3000), lambda: _mm(200, 96, 130)],
    "conv": [lambda: _conv(16, 32, 17, 3, 1), lambda: _conv(8, 16, 21, 5, 2), lambda: _conv(32, 48, 14, 1, 2),
             lambda: _conv(24, 24, 15, 3, 1, groups=24), lambda: _conv(32, 32, 9, 3, 1, groups=4)],
    "attention": [lambda: _attn(1, 300, 32), lambda: _attn(70, 70, 32, causal=True),
                  lambda: _attn(40, 90, 64, heads=8, kv_heads=2), lambda: _attn(100, 100, 16)],
    "norms": [_norms],
    "model": [_cnn, _encoder],
}


def _check(machine, make):
    torch.manual_seed(0)
    fn, args = make()
    torch._dynamo.reset()
    polytile.reset_stats()
    with torch.no_grad():
        out = torch.compile(fn, backend="polytile", options={"fallback": False, "machine": {"preset": machine}})(*args)
        ref = fn(*args)
    assert polytile.stats()["graphs_compiled"] >= 1
    assert_accurate(out, ref, lambda: fp64_reference(fn, args), 1e-4)


def _default_cases():
    # every description meets every case class, with a different case of the class each
    out = []
    for m, machine in enumerate(NUMERIC):
        for kind, makes in CASES.items():
            out.append((machine, kind, (m * 3) % len(makes)))
    return out


@pytest.mark.parametrize("machine,kind,i", _default_cases(), ids=lambda v: str(v))
def test_each_machine_computes_eagers_function(machine, kind, i):
    _check(machine, CASES[kind][i])


ALL = [(m, k, i) for m, (k, makes) in itertools.product(NUMERIC, CASES.items()) for i in range(len(makes))]


@pytest.mark.slow
@pytest.mark.parametrize("machine,kind,i", [c for c in ALL if c not in _default_cases()], ids=lambda v: str(v))
def test_each_machine_on_every_case(machine, kind, i):
    _check(machine, CASES[kind][i])
