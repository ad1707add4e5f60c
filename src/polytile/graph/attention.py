"""Graph rewrite: attention (two matmuls around a softmax) becomes one ``attention`` node.

What it matches, whichever frontend path produced it (``scaled_dot_product_attention``
decomposed by AOTAutograd, or written out as in HF/timm models):

    S  = view?(matmul(Q, Kt))            scores, [G, L, S] viewed as [*, L, S]
    S' = steps(S)                        any chain of: * or / a scalar, + or - a tensor
                                         (additive mask), where(mask, S, fill) or
                                         where(mask, fill, S) (boolean mask)
    P  = exp(S' - max(S')) / sum(...)    softmax over the last axis
    P  = where(all(S' == -inf), 0, P)?   SDPA's guard for rows with every key masked
    O  = matmul(view?(P), V)

into ``attention(Q, Kt, V, masks...)`` with the steps as an attribute; its lowering
(the CPU backend's ``backends.cpu.attention``) is the online-softmax nest that never stores the score matrix.
A mask the program computes from indices alone (``is_causal``) is evaluated here; when it
keeps exactly the keys j <= i + offset it becomes a ``causal`` step, so the lowering can skip
key tiles that are entirely masked. Nothing is rewritten when an intermediate (scores,
probabilities) has another user, e.g. a model that also returns its attention weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .builder import GraphBuilder, contiguous_strides
from .const_eval import evaluate
from .ir import Graph, Node


@dataclass
class _Match:
    q: Node
    kt: Node
    v: Node
    steps: list[tuple]  # (fn, scalar or mask node, fill of keep/drop), from the scores outwards
    zero_empty: bool
    score_shape: tuple[int, ...]
    inner: set[int]


def _is_reshape_view(n: Node) -> bool:
    """A view that only regroups the dims of a whole materialized node (same element order)."""
    return (n.op == "view" and n.attr("offset") == 0 and n.inputs[0].op != "view"
            and n.numel == n.inputs[0].numel and tuple(n.attr("strides")) == contiguous_strides(n.shape))


def _scalar(n: Node):
    if n.op == "full" and n.numel == 1 and n.dtype.startswith("float"):
        return float(n.attr("value"))
    return None


def _last_axis_reduce(n: Node, op: str, x: Node) -> bool:
    r = len(x.shape) - 1
    return n.op == op and n.inputs[0] is x and tuple(n.attr("axes")) == (r,) and n.attr("keepdim")


def _softmax(p: Node) -> tuple[Node, set[int]] | None:
    """x and the softmax nodes if p = exp(x - max(x)) / sum(exp(x - max(x)))."""
    if p.op != "div":
        return None
    e, z = p.inputs
    if e.op != "exp" or not _last_axis_reduce(z, "reduce_sum", e):
        return None
    d = e.inputs[0]
    if d.op != "sub":
        return None
    x, m = d.inputs
    if not _last_axis_reduce(m, "reduce_max", x):
        return None
    return x, {p.id, e.id, z.id, d.id, m.id}


def _guard(p: Node, x: Node) -> tuple[Node, set[int]] | None:
    """(P, guard nodes) if p = where(not any(x != -inf), 0, P)."""
    if p.op != "where" or p.inputs[1].op != "full" or p.inputs[1].attr("value") != 0:
        return None
    c = p.inputs[0]
    if c.op != "logical_not":
        return None
    r = c.inputs[0]
    if r.op != "reduce_max" or tuple(r.attr("axes")) != (len(x.shape) - 1,) or not r.attr("keepdim"):
        return None
    nn = r.inputs[0]
    if nn.op != "logical_not" or nn.inputs[0].op != "eq":
        return None
    eq = nn.inputs[0]
    if eq.inputs[0] is not x or _scalar(eq.inputs[1]) != -math.inf:
        return None
    return p.inputs[2], {p.id, p.inputs[1].id, c.id, r.id, nn.id, eq.id}


def _match(mm2: Node, users: dict[int, list[Node]], outputs: set[int]) -> _Match | None:
    pv, v = mm2.inputs
    inner: set[int] = set()
    p = pv
    if _is_reshape_view(pv):
        p, inner = pv.inputs[0], {pv.id}
    zero_empty = False
    sm = _softmax(p)
    if sm is None and p.op == "where":
        # find x through the guard's own reference to it
        cand = p.inputs[2]
        sm = _softmax(cand)
        if sm is None:
            return None
        g = _guard(p, sm[0])
        if g is None:
            return None
        zero_empty = True
        inner |= g[1]
        p = cand
    if sm is None:
        return None
    x, nodes = sm
    inner |= nodes
    steps: list[tuple] = []
    chain = x
    for _ in range(8):
        if chain.op == "matmul" or (_is_reshape_view(chain) and chain.inputs[0].op == "matmul"):
            break
        inner.add(chain.id)
        if chain.op in ("add", "mul", "sub", "div"):
            a, b = chain.inputs
            if _leads_to_matmul(b) and chain.op in ("add", "mul") and not _leads_to_matmul(a):
                a, b = b, a
            if not _leads_to_matmul(a) or a.shape != chain.shape:
                return None
            s = _scalar(b)
            steps.append((chain.op, b if s is None else s, None))
            chain = a
        elif chain.op == "where":
            c, a, b = chain.inputs
            if _leads_to_matmul(a) and a.shape == chain.shape and _scalar(b) is not None:
                steps.append(("keep", c, _scalar(b)))
                chain = a
            elif _leads_to_matmul(b) and b.shape == chain.shape and _scalar(a) is not None:
                steps.append(("drop", c, _scalar(a)))
                chain = b
            else:
                return None
        else:
            return None
    else:
        return None
    mm1 = chain
    if chain.op == "view":
        inner.add(chain.id)
        mm1 = chain.inputs[0]
    inner.add(mm1.id)
    q, kt = mm1.inputs
    G, L, S = mm1.shape[:-2], mm1.shape[-2], mm1.shape[-1]
    if (x.dtype != "float32" or q.shape[:-2] != G or kt.shape[:-2] != G or v.shape[:-2] != G
            or pv.shape != mm1.shape or v.shape[-2] != S or math.prod(x.shape[:-2]) != math.prod(G)
            or x.shape[-2:] != (L, S)):
        return None
    for i in inner:  # every intermediate is used only inside the pattern
        if i in outputs or any(u.id not in inner and u is not mm2 for u in users.get(i, [])):
            return None
    steps.reverse()  # applied from the scores outwards
    return _Match(q, kt, v, steps, zero_empty, x.shape, inner)


def _leads_to_matmul(n: Node, depth: int = 8) -> bool:
    """n is a matmul (or a reshape of one), possibly behind a chain of score steps."""
    if n.op == "matmul" or (_is_reshape_view(n) and n.inputs[0].op == "matmul"):
        return True
    if depth == 0:
        return False
    if n.op in ("add", "mul", "sub", "div"):
        return any(_leads_to_matmul(i, depth - 1) for i in n.inputs)
    if n.op == "where":
        return any(_leads_to_matmul(i, depth - 1) for i in n.inputs[1:])
    return False


def causal_offset(mask: Node, kind: str, fill=None) -> int | None:
    """offset if the constant ``mask`` keeps exactly the keys j <= i + offset of every row."""
    a = evaluate(mask)
    if a is None and kind in ("keep", "drop") and fill == -math.inf:  # symbolic sizes: from its form
        return _compared_indices(mask, kind == "keep")
    if a is None or a.ndim < 2:
        return None
    a = a.reshape(-1, *a.shape[-2:])
    if any(not np.array_equal(a[0], a[k]) for k in range(1, a.shape[0])):
        return None
    a = a[0]
    if kind == "add":
        if not np.all((a == 0) | (a == -np.inf)):
            return None
        keep = a == 0
    elif kind == "keep" and fill == -math.inf:
        keep = a.astype(bool)
    elif kind == "drop" and fill == -math.inf:
        keep = ~a.astype(bool)
    else:
        return None
    L, S = keep.shape
    if L == 1 and S == 1:
        return None
    off = int(np.argmin(keep[0])) - 1 if not keep[0].all() else S - 1
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    return off if np.array_equal(keep, j <= i + off) else None


def _compared_indices(mask: Node, keep: bool) -> int | None:
    """offset when ``mask`` (any sizes, symbolic ones included) is a comparison of the key index
    j (an iota along the last axis) with the query index i (an iota along the one before) that
    keeps exactly j <= i + offset (``keep``; else it marks the keys dropped)."""
    fn = mask.op if keep else {"gt": "le", "ge": "lt", "lt": "ge", "le": "gt"}.get(mask.op)
    if fn not in ("le", "lt", "ge", "gt") or len(mask.inputs) != 2:
        return None
    a, b = (_index_start(x) for x in mask.inputs)
    if a is None or b is None:
        return None
    (axis_a, start_a), (axis_b, start_b) = a, b
    if fn in ("ge", "gt"):  # b <= a, b < a: the same comparison the other way round
        (axis_a, start_a), (axis_b, start_b) = (axis_b, start_b), (axis_a, start_a)
        fn = "le" if fn == "ge" else "lt"
    if (axis_a, axis_b) != (-1, -2):  # the key index must be the smaller side
        return None
    off = start_b - start_a  # j + start_a <= i + start_b
    return off if fn == "le" else off - 1


def _index_start(x: Node) -> tuple[int, int] | None:
    """(axis, start) when ``x`` is an iota of step 1 (plus a constant) laid along one of the last
    two axes (-1 or -2) of a view with every other axis of size 1."""
    start = 0
    if x.op == "add" and x.inputs[1].op == "full" and isinstance(x.inputs[1].attr("value"), int):
        start, x = x.inputs[1].attr("value"), x.inputs[0]
    if x.op != "view" or x.attr("offset") != 0 or x.inputs[0].op != "iota":
        return None
    it = x.inputs[0]
    if it.attr("step") != 1 or not isinstance(it.attr("start"), int) or len(x.shape) < 2:
        return None
    along = [k for k, n in enumerate(x.shape) if n != 1]
    if len(along) != 1 or x.attr("strides")[along[0]] != 1 or along[0] - len(x.shape) not in (-1, -2):
        return None
    return along[0] - len(x.shape), start + it.attr("start")


def fuse_attention(g: Graph) -> Graph:
    """Rewrite every attention pattern of ``g`` into one ``attention`` node."""
    users = g.users()
    outputs = {o.id for o in g.outputs}
    matches = {}
    for n in g.nodes:
        if n.op == "matmul":
            m = _match(n, users, outputs)
            if m is not None:
                matches[n.id] = m
    if not matches:
        return g
    b = GraphBuilder()
    b.inputs = list(g.inputs)
    new: dict[int, Node] = {n.id: n for n in g.inputs}
    dropped = set().union(*(m.inner for m in matches.values()))
    for n in g.nodes:
        if n.op == "input" or n.id in dropped:
            continue
        if n.id in matches:
            new[n.id] = _rewrite(b, matches[n.id], new, n, n.id in outputs)
            continue
        ins = [new[i.id] for i in n.inputs]
        if all(a is i for a, i in zip(ins, n.inputs)):
            new[n.id] = n
        elif n.op == "view" and ins[0].op == "view":
            # views are index maps into a materialized base: the rewritten input is a plain
            # reshape of the attention node, whose element order the old view already assumes
            base = ins[0].inputs[0]
            assert ins[0].attr("offset") == 0 and ins[0].attr("strides") == contiguous_strides(ins[0].shape)
            new[n.id] = b.node("view", (base,), **dict(n.attrs))
        else:
            new[n.id] = b.node(n.op, ins, **dict(n.attrs))
    return b.graph([new[o.id] for o in g.outputs])


def _rewrite(b: GraphBuilder, m: _Match, new: dict[int, Node], mm2: Node, is_output: bool) -> Node:
    bd = list(m.score_shape[:-2])
    L, S = m.score_shape[-2:]
    q = b.reshape(new[m.q.id], bd + [L, m.q.shape[-1]])
    kt = b.reshape(new[m.kt.id], bd + [m.kt.shape[-2], S])
    v = b.reshape(new[m.v.id], bd + [S, m.v.shape[-1]])
    group = 1
    kg, vg = _ungrouped(b, kt), _ungrouped(b, v)
    if kg is not None and vg is not None and kg[1] == vg[1]:
        (kt, group), (v, _) = kg, vg
    masks: list[Node] = []
    steps: list[tuple] = []  # the node's attribute: masks by their position among its inputs
    for fn, operand, fill in m.steps:
        if isinstance(operand, float):
            steps.append((fn, "c", operand))
            continue
        off = causal_offset(operand, fn, fill) if fn in ("add", "keep", "drop") else None
        if off is not None:
            steps.append(("causal", "c", off))
            continue
        masks.append(new[operand.id])
        steps.append((fn, len(masks) - 1, fill) if fn in ("keep", "drop") else (fn, "m", len(masks) - 1))
    att = b.node("attention", [q, kt, v, *masks], steps=tuple(steps), zero_empty=m.zero_empty,
                 **({"kv_group": group} if group > 1 else {}))
    out = b.reshape(att, list(mm2.shape))
    if is_output and out.op == "view":
        out = b.node("identity", (out,))
    return out


def _ungrouped(b: GraphBuilder, x: Node) -> tuple[Node, int] | None:
    """(y, G) when ``x`` ([..., H, r1, r2]) is a view of a copy (``identity``) of an expand that
    repeats each of KH heads G times, H = KH * G (grouped-query attention: ``repeat_kv``,
    ``enable_gqa``): y views the expand's source with KH heads, x's head h being y's head
    h // G. The attention then reads K and V where they are, not a copy per query head."""
    if x.op != "view" or x.attr("offset") != 0 or len(x.shape) < 3 or x.inputs[0].op != "identity":
        return None
    e = x.inputs[0].inputs[0]
    if e.op != "view" or len(e.shape) != len(x.shape) + 1:
        return None
    es, est = list(e.shape), list(e.attr("strides"))
    rep = [k for k in range(1, len(es)) if est[k] == 0 and es[k] > 1]
    if len(rep) != 1:
        return None
    a, G = rep[0], es[rep[0]]
    istr = contiguous_strides(e.shape)  # the copy is contiguous in the expand's shape
    xs, xst = list(x.shape), list(x.attr("strides"))
    head = len(xs) - 3
    if xs[head] != es[a - 1] * G or xst[head] != istr[a]:
        return None
    shape, strides, used = [], [], {a - 1, a}
    for k, (n, st) in enumerate(zip(xs, xst)):
        if k == head:
            shape.append(es[a - 1])
            strides.append(est[a - 1])
            continue
        if n == 1:
            shape.append(1)
            strides.append(0)
            continue
        dims = [d for d in range(len(es)) if d not in used and istr[d] == st and es[d] == n]
        if len(dims) != 1:
            return None
        used.add(dims[0])
        shape.append(n)
        strides.append(est[dims[0]])
    if any(es[d] != 1 for d in range(len(es)) if d not in used):
        return None
    return b.as_strided(e.inputs[0], shape, strides, e.attr("offset")), G
