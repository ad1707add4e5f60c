"""Target-neutral pieces of the attention op's lowering (each backend builds its own nest)."""
from __future__ import annotations

import math

from ..graph.ir import Node
from .ir import INDEX, Alloc, Assign, Const, Expr, For, Let, Load, Op, Store, Var, add, c, mul

F32 = "float32"
NEG_INF = Const(-math.inf, F32)


def _f(fn: str, *args: Expr, dtype: str = F32) -> Op:
    return Op(fn, tuple(args), dtype)


def score_step(b, step: tuple, s: Expr, masks: list[Node], bvars: list[Var], row: Expr, key: Expr) -> Expr:
    """One step of the chain from q.k to the softmax input (see graph.attention)."""
    fn = step[0]
    if fn == "causal":
        return _f("where", Op("le", (key, add(row, c(step[2]))), "bool"), s, NEG_INF)
    if fn in ("keep", "drop"):
        m = masks[step[1]]
        cond = b.read(m, b.bcast(m.shape, bvars + [row, key]))
        fillc = Const(step[2], F32)
        return _f("where", cond, s, fillc) if fn == "keep" else _f("where", cond, fillc, s)
    if step[1] == "c":
        other: Expr = Const(step[2], F32)
    else:
        m = masks[step[2]]
        other = b.read(m, b.bcast(m.shape, bvars + [row, key]))
    return _f(fn, s, other)


def _operands(n: Node):
    """(q, kt, v, masks, batch dims, their loop variables, the variables that index K and V:
    the head divided by the group size under grouped-query attention) of attention node ``n``."""
    q, kt, v, *masks = n.inputs
    bd = list(n.shape[:-2])
    bvars = [Var(f"i{k}") for k in range(len(bd))]
    G = n.attr("kv_group", 1)
    kvvars = bvars if G == 1 else bvars[:-1] + [Op("floordiv", (bvars[-1], c(G)), INDEX)]
    return q, kt, v, masks, bd, bvars, kvvars


def online_softmax_nest(b, n: Node) -> list:
    """The attention op ``n`` as one online-softmax nest per query row, key by key (any sizes,
    symbolic ones included): the GPU backend's lowering, and the CPU's for symbolic sizes."""
    q, kt, v, masks, bd, bvars, kvvars = _operands(n)
    Dv = n.shape[-1]
    D, S = kt.shape[-2:]
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
    return _rows(b, n, bd, bvars, (), (For("j", c(0), c(S), key),))


def key_blocked_nest(b, n: Node, block: int) -> list:
    """The attention op ``n`` as one online-softmax nest per query row over blocks of ``block``
    keys (any sizes, symbolic ones included): the scores of a block go to a local row, whose max,
    exponentials and sum are loops over the block, and the output row is rescaled once per
    block instead of once per key; the last block is partial (its loops end at the key count)."""
    q, kt, v, masks, bd, bvars, kvvars = _operands(n)
    Dv = n.shape[-1]
    D, S = kt.shape[-2:]
    l, jb, jj, d, e = Var("l"), Var("jb"), Var("jj"), Var("d"), Var("e")
    m, s, sc, x, mx, mn, corr, p, bs = (Var(name, F32) for name in ("m", "s", "sc", "x", "mx", "mn", "corr", "p",
                                                                    "bs"))
    key = add(mul(jb, c(block)), jj)
    x_of = sc
    for step in n.attr("steps"):
        x_of = score_step(b, step, x_of, masks, bvars, l, key)
    both_inf = _f("eq", mn, NEG_INF, dtype="bool")  # every key so far masked: nothing to rescale
    acc, row_s = Load("acc", e, F32), Load("srow", jj, F32)
    in_block = Op("minimum", (c(block), Op("sub", (c(S), mul(jb, c(block))), INDEX)), INDEX)
    keys = (
        Let("mx", F32, NEG_INF),
        For("jj", c(0), in_block, (
            Let("sc", F32, Const(0.0, F32)),
            For("d", c(0), c(D), (Assign("sc", _f("add", sc, _f("mul", b.read(q, bvars + [l, d]),
                                                                b.read(kt, kvvars + [d, key])))),)),
            Let("x", F32, x_of),
            Store("srow", jj, x),
            Assign("mx", _f("maximum", mx, x)),
        )),
        Let("mn", F32, _f("maximum", m, mx)),
        Let("corr", F32, _f("where", both_inf, Const(1.0, F32), _f("exp", _f("sub", m, mn)))),
        Let("bs", F32, Const(0.0, F32)),
        For("jj", c(0), in_block, (
            Let("p", F32, _f("where", both_inf, Const(0.0, F32), _f("exp", _f("sub", row_s, mn)))),
            Store("srow", jj, p),
            Assign("bs", _f("add", bs, p)),
        )),
        Assign("s", _f("add", _f("mul", s, corr), bs)),
        For("e", c(0), c(Dv), (Store("acc", e, _f("mul", acc, corr)),), parallel=True),
        For("jj", c(0), in_block, (
            For("e", c(0), c(Dv), (Store("acc", e, _f("add", acc, _f("mul", row_s, b.read(v, kvvars + [key, e])))),),
                parallel=True),
        )),
        Assign("m", mn),
    )
    blocks: Expr = Op("floordiv", (add(c(S), c(block - 1)), c(block)), INDEX)
    for step in n.attr("steps"):  # causal: no block past the row's last key (none before its first)
        if step[0] == "causal":
            last = Op("floordiv", (add(l, c(step[2] + block)), c(block)), INDEX)
            blocks = Op("minimum", (blocks, last), INDEX)
    return _rows(b, n, bd, bvars, (Alloc("srow", F32, block),), (For("jb", c(0), blocks, keys),))


def _rows(b, n: Node, bd: list, bvars: list[Var], local: tuple, keys: tuple) -> list:
    """The nest over the batch dims and query rows l around ``keys`` (the loops over the keys,
    updating the running max m, sum s and output row acc): its state set up, and the output
    row written as acc / s (0 or NaN where no key was left, as the graph asks)."""
    L, Dv = n.shape[-2:]
    l, e, s = Var("l"), Var("e"), Var("s", F32)
    acc = Load("acc", e, F32)
    fill = Const(0.0 if n.attr("zero_empty") else math.nan, F32)
    row = (
        Let("m", F32, NEG_INF),
        Let("s", F32, Const(0.0, F32)),
        Alloc("acc", F32, Dv),
        *local,
        For("e", c(0), c(Dv), (Store("acc", e, Const(0.0, F32)),), parallel=True),
        *keys,
        For("e", c(0), c(Dv), (b.store(n, bvars + [l, e], _f("where", _f("eq", s, Const(0.0, F32), dtype="bool"), fill,
                                                             _f("div", acc, s))),), parallel=True),
    )
    nest = [For("l", c(0), c(L), row, parallel=True)]
    for var, size in reversed(list(zip(bvars, bd))):
        nest = [For(var.name, c(0), c(size), tuple(nest), parallel=True)]
    return nest
