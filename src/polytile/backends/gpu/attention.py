"""The attention op as the GPU backend builds it: one online-softmax nest per query row.

    for batch..., l (parallel):
        m = -inf; s = 0; acc[e] = 0
        for j in keys:
            sc = sum_d q[l, d] * kt[d, j]; x = steps(sc)   (scale, masks, causal)
            mn = max(m, x); corr = exp(m - mn); p = exp(x - mn)
            s = s * corr + p; acc[e] = acc[e] * corr + p * v[j, e]; m = mn
        out[l, e] = acc[e] / s   (rows with every key masked: 0 or NaN, as eager)

The nest states the computation key by key; the Triton renderer's ``flash`` form
(``codegen.triton_flash``) runs it as tiles of query rows against blocks of keys with two
``tl.dot`` per block, the scores never leaving registers. Any other form (after fusion
changed the nest) still computes it, row by row.
"""
from __future__ import annotations

import math

from ...affine.attention import score_step
from ...affine.ir import INDEX, Alloc, Assign, Const, For, Let, Load, Op, Store, Var, c
from ...graph.ir import Node

F32 = "float32"


def _f(fn, *args, dtype=F32):
    return Op(fn, tuple(args), dtype)


def lower_attention(b, n: Node) -> list:
    q, kt, v, *masks = n.inputs
    bd = list(n.shape[:-2])
    L, Dv = n.shape[-2:]
    D, S = kt.shape[-2:]
    bvars = [Var(f"i{k}") for k in range(len(bd))]
    G = n.attr("kv_group", 1)
    kvvars = bvars if G == 1 else bvars[:-1] + [Op("floordiv", (bvars[-1], c(G)), INDEX)]
    l, j, d, e = Var("l"), Var("j"), Var("d"), Var("e")
    m, s, sc, x, mn, corr, p = (Var(name, F32) for name in ("m", "s", "sc", "x", "mn", "corr", "p"))
    x_of = sc
    for step in n.attr("steps"):
        x_of = score_step(b, step, x_of, masks, bvars, l, j)
    neg_inf = Const(-math.inf, F32)
    both_inf = _f("eq", mn, neg_inf, dtype="bool")  # every key so far masked: nothing to rescale
    acc = Load("acc", e, F32)
    key = (
        Let("sc", F32, Const(0.0, F32)),
        For("d", c(0), c(D), (Assign("sc", _f("add", sc, _f("mul", b.read(q, bvars + [l, d]),
                                                            b.read(kt, kvvars + [d, j])))),)),
        Let("x", F32, x_of),
        Let("mn", F32, _f("maximum", m, x)),
        Let("corr", F32, _f("where", both_inf, Const(1.0, F32), _f("exp", _f("sub", m, mn)))),
        Let("p", F32, _f("where", both_inf, Const(0.0, F32), _f("exp", _f("sub", x, mn)))),
        Assign("s", _f("add", _f("mul", s, corr), p)),
        For("e", c(0), c(Dv), (Store("acc", e, _f("add", _f("mul", acc, corr), _f("mul", p, b.read(v, kvvars + [j, e])))),),
            parallel=True),
        Assign("m", mn),
    )
    fill = Const(0.0 if n.attr("zero_empty") else math.nan, F32)
    row = (
        Let("m", F32, neg_inf),
        Let("s", F32, Const(0.0, F32)),
        Alloc("acc", F32, Dv),
        For("e", c(0), c(Dv), (Store("acc", e, Const(0.0, F32)),), parallel=True),
        For("j", c(0), c(S), key),
        For("e", c(0), c(Dv), (b.store(n, bvars + [l, e], _f("where", _f("eq", s, Const(0.0, F32), dtype="bool"), fill,
                                                             _f("div", acc, s))),), parallel=True),
    )
    nest = [For("l", c(0), c(L), row, parallel=True)]
    for var, size in reversed(list(zip(bvars, bd))):
        nest = [For(var.name, c(0), c(size), tuple(nest), parallel=True)]
    return nest
