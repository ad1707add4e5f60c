"""The ``flash`` form of the Triton renderer: the online-softmax attention nest (as the GPU
backend builds it, ``backends.gpu.attention``) run as FlashAttention runs it.

Each program takes ``bm`` query rows; it walks the keys ``bn`` at a time: the scores of the
block are one ``tl.dot`` of the query tile with a key tile, the score steps (scale, masks,
causal) apply to that block in registers, the running maximum and sum are updated for the
block, and the probabilities meet the value tile in a second ``tl.dot``. The scores never
reach memory. With a causal step ``j <= l + offset``, key blocks past the tile's last row's
diagonal are not visited. The nest's expressions (the q, k, v reads, whatever fusion put into
them, the score steps and the store of the output) are rendered from the affine program; the
per-key update becomes the per-block one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..affine.ir import Alloc, Assign, Const, Expr, For, Kernel, Let, Op, Program, Store, Var, walk_exprs
from .triton_kernel import KernelPlan, Renderer, RenderedKernel, decompose, finish, outer_band, total


@dataclass(frozen=True)
class FlashShape:
    batch: tuple[For, ...]
    row: For          # the query rows (l)
    keys: For         # the keys (j)
    depth: For        # the q.k reduction (d)
    q: Expr           # q[.., l, d]
    k: Expr           # k^T[.., d, j]
    score: Let        # x = steps(sc)
    v: Expr           # v[.., j, e]
    value_loop: For   # the loop over e inside the key loop
    out: For          # for e: out[.., l, e] = f(acc[e], s)
    acc: str
    names: dict       # role -> local variable name (sc, m, s)


def _const_loop(f) -> bool:
    return isinstance(f, For) and isinstance(f.lo, Const) and isinstance(f.hi, Const)


def flash_shape(k: Kernel) -> FlashShape | None:
    band, inner = outer_band(k.body)
    if not band or len(inner) != 6:
        return None
    lm, ls, alloc, init, keys, out = inner
    if not (isinstance(lm, Let) and isinstance(ls, Let) and isinstance(alloc, Alloc) and _const_loop(init)
            and _const_loop(keys) and not keys.parallel and _const_loop(out) and out.parallel):
        return None
    body = keys.body
    if len(body) != 9 or not all(isinstance(x, t) for x, t in zip(body, (Let, For, Let, Let, Let, Let, Assign, For, Assign))):
        return None
    lsc, depth, score, _, _, _, upd_s, vloop, upd_m = body
    if not (_const_loop(depth) and len(depth.body) == 1 and isinstance(depth.body[0], Assign)
            and depth.body[0].name == lsc.name and upd_s.name == ls.name and upd_m.name == lm.name):
        return None
    dot = depth.body[0].value
    if not (isinstance(dot, Op) and dot.fn == "add" and isinstance(dot.args[1], Op) and dot.args[1].fn == "mul"):
        return None
    q, kk = dot.args[1].args
    if not (_const_loop(vloop) and len(vloop.body) == 1 and isinstance(vloop.body[0], Store)
            and vloop.body[0].buf == alloc.name):
        return None
    upd = vloop.body[0].value  # acc[e] * corr + p * v
    if not (isinstance(upd, Op) and upd.fn == "add" and all(isinstance(a, Op) and a.fn == "mul" for a in upd.args)):
        return None
    v = upd.args[1].args[1]
    row = band[-1]
    if row.var in _vars(kk) or row.var in _vars(v) or keys.var in _vars(q):
        return None
    return FlashShape(tuple(band[:-1]), row, keys, depth, q, kk, score, v, vloop, out, alloc.name,
                      {"sc": lsc.name, "m": lm.name, "s": ls.name})


def _vars(e: Expr) -> set[str]:
    return {x.name for x in walk_exprs(e) if isinstance(x, Var)}


def causal_offset(f: FlashShape) -> int | None:
    """``offset`` when the score steps keep only keys ``j <= l + offset`` (a causal mask)."""
    l, j = f.row.var, f.keys.var
    for x in walk_exprs(f.score.value):
        fill = x.args[2] if isinstance(x, Op) and x.fn == "where" else None
        if isinstance(fill, Const) and fill.value == -math.inf and isinstance(x.args[0], Op) and x.args[0].fn == "le":
            a, b = x.args[0].args
            if isinstance(a, Var) and a.name == j:
                if isinstance(b, Var) and b.name == l:
                    return 0
                if isinstance(b, Op) and b.fn == "add" and isinstance(b.args[0], Var) and b.args[0].name == l \
                        and isinstance(b.args[1], Const):
                    return int(b.args[1].value)
    return None


def _pow2(n: int, least: int = 16) -> int:
    p = least
    while p < n:
        p *= 2
    return p


def render_flash(prog: Program, k: Kernel, plan: KernelPlan) -> RenderedKernel:
    f = flash_shape(k)
    if f is None:
        raise ValueError(f"{k.name} is not the attention nest")
    ext = lambda x: x.hi.value - x.lo.value  # noqa: E731
    L, S, D, Dv = ext(f.row), ext(f.keys), ext(f.depth), ext(f.out)
    tiles = -(-L // plan.bm)
    nb = total(f.batch)
    r = Renderer(prog, k, "[BM, 1]", "zq", "0")
    r.regs = {f.acc: "cols"}
    lines = [
        "    pid = tl.program_id(0).to(tl.int64)",
        f"    pb = pid // {tiles}",
        f"    pt = pid % {tiles}",
    ]
    r.names.update(decompose(lines, "    ", "pb", f.batch, "v_"))
    l, j, d, e = f.row.var, f.keys.var, f.depth.var, f.out.var
    lines += [
        f"    v_{l} = {f.row.lo.value} + pt * BM + tl.arange(0, BM).to(tl.int64)[:, None]",
        f"    ml = v_{l} < {f.row.hi.value}",
        "    zq = tl.zeros([BM, DP], tl.int64)",
        "    dq = tl.arange(0, DP).to(tl.int64)[None, :]",
    ]
    r.lines, r.pad = lines, "    "
    r.lane_vars |= {l}
    r.names.update({l: f"v_{l}", d: "dq"})
    r.cse = {}
    qx = r.ex(f.q, f"ml & (dq < {D})")
    lines += [
        f"    tq = tl.where(ml & (dq < {D}), {qx}, 0.0)",
        "    m_i = tl.full([BM, 1], -INF, tl.float32)",
        "    s_i = tl.zeros([BM, 1], tl.float32)",
        f"    r_{f.acc} = tl.zeros([BM, DVP], tl.float32)",
        "    ev = tl.arange(0, DVP).to(tl.int64)[None, :]",
    ]
    off = causal_offset(f)
    hi = str(S) if off is None else f"tl.minimum({S}, {f.row.lo.value} + pt * BM + BM + {off})"
    lines += [f"    for j0 in range({f.keys.lo.value}, {hi}, BN):",
              "        dk = tl.arange(0, DP).to(tl.int64)[:, None]",
              "        jk = j0 + tl.arange(0, BN).to(tl.int64)[None, :]",
              "        zk = tl.zeros([DP, BN], tl.int64)"]
    r.pad = "        "
    r.names.update({d: "dk", j: "jk"})
    r.zero = "zk"
    r.cse = {}
    kx = r.ex(f.k, f"(dk < {D}) & (jk < {S})")
    lines += [f"        tk = tl.where((dk < {D}) & (jk < {S}), {kx}, 0.0)",
              f"        sc = tl.dot(tq, tk, input_precision=\"{plan.precision}\")",
              "        zs = tl.zeros([BM, BN], tl.int64)",
              f"        ms = ml & (jk < {S})"]
    r.zero = "zs"
    r.names[f.names["sc"]] = "sc"
    r.lets[f.names["sc"]] = "float32"
    r.cse = {}
    x = r.ex(f.score.value, "ms")
    lines += [
        f"        x = tl.where(jk < {S}, {x}, -INF)",
        "        mn = pt_maximum_f(m_i, tl.reduce(x, 1, pt_maximum_f, keep_dims=True))",
        "        corr = tl.where(mn == -INF, 1.0, tl.exp(m_i - mn))",
        "        p = tl.where(mn == -INF, 0.0, tl.exp(x - mn))",
        "        s_i = s_i * corr + tl.sum(p, 1, keep_dims=True)",
        "        jv = j0 + tl.arange(0, BN).to(tl.int64)[:, None]",
        "        zv = tl.zeros([BN, DVP], tl.int64)",
    ]
    r.names.update({j: "jv", e: "ev"})
    r.zero = "zv"
    r.cse = {}
    vx = r.ex(f.v, f"(jv < {S}) & (ev < {Dv})")
    lines += [f"        tv = tl.where((jv < {S}) & (ev < {Dv}), {vx}, 0.0)",
              f"        r_{f.acc} = r_{f.acc} * corr + tl.dot(p, tv, input_precision=\"{plan.precision}\")",
              "        m_i = mn",
              "    zo = tl.zeros([BM, DVP], tl.int64)",
              f"    mo = ml & (ev < {Dv})"]
    r.pad, r.zero = "    ", "zo"
    r.names.update({e: "ev", f.names["s"]: "s_i"})
    r.lets[f.names["s"]] = "float32"
    r.cse = {}
    r.stmts(f.out.body, "mo", "    ")
    consts = {"BM": plan.bm, "BN": plan.bn, "DP": _pow2(D), "DVP": _pow2(Dv)}
    return finish(prog, k, r, plan, max(1, nb * tiles), {}, [f"{c}: tl.constexpr" for c in consts], consts)
