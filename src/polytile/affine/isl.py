"""The only islpy glue: affine expressions, iteration domains and access relations as isl objects."""
from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from functools import lru_cache

import islpy as isl

from .. import counters

from .ir import INDEX, SIZE_PREFIX, size_expr, lanes, Alloc, Const, Expr, For, If, Load, Op, Stmt, Store, Var, stmt_exprs, walk_exprs

_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "="}

# isl's own operation count allowed to one query (a dependence test, a slice): sets with many
# floor divisions (views that split and merge dims, as window-attention reshapes) can make a
# query take minutes; past the budget the query answers conservatively (a dependence, no slice)
# and the nest stays as it is. Queries of the dev models need well under a tenth of it.
MAX_OPERATIONS = 2_000_000
log = logging.getLogger("polytile")
_warned = [False]


def bounded(conservative):
    """Run an isl query within ``MAX_OPERATIONS``; past it, return ``conservative``."""
    def deco(fn):
        @functools.wraps(fn)
        def run(*args):
            ctx = isl.DEFAULT_CONTEXT
            ctx.set_max_operations(MAX_OPERATIONS)
            ctx.reset_operations()
            try:
                return fn(*args)
            except isl.Error as e:
                if "maximal number of operations" not in str(e):
                    raise
                counters.bump("isl_gave_up")
                if not _warned[0]:
                    _warned[0] = True
                    log.warning("polytile: an isl query (%s) exceeded its budget; the nest it was asked "
                                "for is left unfused or sequential (polytile.stats()['isl_gave_up'] counts "
                                "such queries)", fn.__name__)
                return conservative
            finally:
                ctx.set_max_operations(0)
        return run
    return deco


def aff(e: Expr) -> str | None:
    """isl syntax for an affine index expression, or None when it is not affine."""
    if isinstance(e, Const):
        return str(int(e.value)) if e.dtype == INDEX else None
    if isinstance(e, Var):
        return e.name if e.dtype == INDEX else None
    if isinstance(e, Load) or e.dtype != INDEX:
        return None
    args = [aff(a) for a in e.args]
    if any(a is None for a in args):
        return None
    if e.fn in ("add", "sub"):
        return f"({args[0]} {'+' if e.fn == 'add' else '-'} {args[1]})"
    if e.fn == "mul" and (isinstance(e.args[0], Const) or isinstance(e.args[1], Const)):
        return f"({args[0]} * {args[1]})"
    if e.fn in ("floordiv", "remainder") and isinstance(e.args[1], Const) and e.args[1].value > 0:
        return f"floor({args[0]}/{args[1]})" if e.fn == "floordiv" else f"({args[0]} mod {args[1]})"
    return None


def index_aff(e: Expr, ivs: tuple[str, ...]) -> str | None:
    """``aff(e)`` when e is affine in the loop variables ``ivs`` only (a scalar such as a loaded
    index makes the access indirect: None)."""
    if any(isinstance(x, Var) and x.name not in ivs and not x.name.startswith(SIZE_PREFIX) for x in walk_exprs(e)):
        return None
    return aff(e)


def cond(e: Expr, ivs: tuple[str, ...] | None = None) -> list[str]:
    """Affine constraints implied by a condition (a conjunction); non-affine parts (and, given
    ``ivs``, parts on other variables than those) are dropped."""
    if isinstance(e, Op) and e.fn == "logical_and":
        return cond(e.args[0], ivs) + cond(e.args[1], ivs)
    if isinstance(e, Op) and e.fn in _CMP:
        pick = aff if ivs is None else (lambda x: index_aff(x, ivs))
        a, b = pick(e.args[0]), pick(e.args[1])
        if a is not None and b is not None:
            return [f"{a} {_CMP[e.fn]} {b}"]
    return []


def loop_constraints(f: For) -> tuple[str, ...]:
    """The affine bounds of a loop as constraints on its variable: a ``maximum`` lower bound or
    a ``minimum`` upper bound (strip-mined loops) gives one constraint per argument;
    non-affine bounds are dropped."""
    def parts(e: Expr, fn: str) -> list[str]:
        if isinstance(e, Op) and e.fn == fn:
            return [x for a in e.args for x in parts(a, fn)]
        a = aff(e)
        return [a] if a is not None else []

    return tuple(f"{f.var} >= {lo}" for lo in parts(f.lo, "maximum")) + \
        tuple(f"{f.var} < {hi}" for hi in parts(f.hi, "minimum"))


@dataclass(frozen=True)
class Access:
    buf: str
    write: bool
    ivs: tuple[str, ...]  # enclosing loop variables, outermost first
    loops: tuple[int, ...]  # id() of the enclosing For statements
    constraints: tuple[str, ...]  # the statement's domain
    index: str | None  # affine index, or None (indirect: any element)
    size: int
    private_below: int = -1  # local array declared inside this many loops (-1: a program buffer)
    lanes: int = 1  # a vector access touches [index, index + lanes)


def accesses(body: tuple[Stmt, ...], sizes: dict[str, int]) -> list[Access]:
    """Every load and store under ``body`` with its iteration domain."""
    out: list[Access] = []
    sizes = dict(sizes)
    depth_of: dict[str, int] = {}

    def visit(stmts, ivs, cons, loops=()):
        for s in stmts:
            if isinstance(s, Alloc):
                sizes[s.name] = s.size
                depth_of[s.name] = len(loops)
                continue
            if isinstance(s, For):
                visit(s.body, ivs + (s.var,), cons + loop_constraints(s), loops + (id(s),))
                continue
            for e in stmt_exprs(s):
                for x in walk_exprs(e):
                    if isinstance(x, Load):
                        out.append(Access(x.buf, False, ivs, loops, cons, index_aff(x.index, ivs), sizes[x.buf],
                                          depth_of.get(x.buf, -1), lanes(x.dtype)))
            if isinstance(s, Store):
                out.append(Access(s.buf, True, ivs, loops, cons, index_aff(s.index, ivs), sizes[s.buf],
                                  depth_of.get(s.buf, -1), lanes(s.value.dtype)))
            if isinstance(s, If):
                visit(s.then, ivs, cons + tuple(cond(s.cond, ivs)), loops)
                visit(s.orelse, ivs, cons, loops)

    visit(body, (), ())
    return out


_PARAM = re.compile(r"\b" + SIZE_PREFIX + r"\w+")


def with_params(text: str) -> str:
    """An isl set or map in ``text`` with the size parameters it mentions (``sz_<symbol>``,
    see ``graph.symbols``) declared: non-negative, otherwise unknown, so that every answer
    holds for every size."""
    names = sorted(set(_PARAM.findall(text)))
    if not names:
        return text
    head, _, rest = text.partition("{")
    inner, _, tail = rest.rpartition("}")
    body, colon, cons = inner.partition(":")
    extra = " and ".join(f"{n} >= 0" for n in names)
    inner = f"{body}: {cons} and {extra}" if colon else f"{body}: {extra}"
    return f"[{', '.join(names)}] -> {head}{{{inner}}}{tail}"


def _size_bound(size) -> str | None:
    """isl syntax for a buffer's size: an int, or an affine ``Sym`` (None: not affine)."""
    if isinstance(size, int):
        return str(max(size, 1))
    e = aff(size_expr(size))
    return e


def relation(a: Access, keep: int) -> isl.Map:
    """{ [first `keep` ivs] -> [element] } touched by access ``a`` (inner ivs projected out)."""
    outer, inner = a.ivs[:keep], a.ivs[keep:]
    bound = _size_bound(a.size)
    cons = list(a.constraints) + [f"0 <= o < {bound}" if bound is not None else "0 <= o"]
    if a.index is not None and a.lanes > 1:
        cons.append(f"o >= {a.index} and o < {a.index} + {a.lanes}")
    elif a.index is not None:
        cons.append(f"o = {a.index}")
    body = " and ".join(cons)
    if inner:
        body = f"exists ({', '.join(inner)} : {body})"
    return isl.Map(with_params(f"{{ [{', '.join(outer)}] -> [o] : {body} }}"))


@bounded(True)
def carried_dependence(accs: list[Access], depth: int) -> bool:
    """Whether two different iterations of loop ``depth`` (same outer iterations) touch the same
    element where at least one of them writes it."""
    keep = depth + 1
    names_a = [f"a{k}" for k in range(keep)]
    names_b = [f"b{k}" for k in range(keep)]
    same_outer = [f"{x} = {y}" for x, y in zip(names_a[:-1], names_b[:-1])]
    differ = f"({names_a[-1]} < {names_b[-1]} or {names_a[-1]} > {names_b[-1]})"
    pairs = isl.Map(f"{{ [{', '.join(names_a)}] -> [{', '.join(names_b)}] : "
                    f"{' and '.join(same_outer + [differ])} }}")
    accs = [a for a in accs if a.private_below <= depth]  # arrays declared inside are private
    bufs = {a.buf for a in accs if a.write}
    for buf in bufs:
        writes = [relation(a, keep) for a in accs if a.buf == buf and a.write]
        every = [relation(a, keep) for a in accs if a.buf == buf]
        for w in writes:
            for x in every:
                if not w.apply_range(x.reverse()).intersect(pairs).is_empty():
                    return True
    return False


def footprint(accs: list[Access], write: bool) -> dict[str, isl.Set]:
    """Per buffer, the set of elements read (or written) by these accesses."""
    out: dict[str, isl.Set] = {}
    for a in accs:
        if a.write != write:
            continue
        s = relation(a, 0).range()
        out[a.buf] = out[a.buf].union(s) if a.buf in out else s
    return out


# ---------------------------------------------------------------- slices (fusion)
def iteration_map(a: Access) -> isl.Map:
    """{ [every enclosing iv] -> [element] } of one access, on its iteration domain."""
    return relation(a, len(a.ivs))


@lru_cache(maxsize=16384)
@bounded(None)
def point_slice(read: Access, write: Access) -> tuple[Expr, ...] | None:
    """The slice of a producer needed by one consumer iteration, when it is a single point:
    for each producer loop variable, a quasi-affine expression of the consumer's loop
    variables giving the producer iteration that wrote the element this read sees.
    None when the read is not affine, some element read is never written by ``write``, or
    the element was written by several iterations."""
    if read.index is None or write.index is None:
        return None
    rd, wr = iteration_map(read), iteration_map(write)
    m = rd.apply_range(wr.reverse())
    if not m.is_single_valued() or not m.domain().is_equal(rd.domain()):
        return None
    return _pma_exprs(isl.PwMultiAff.from_map(m), read.ivs)


@lru_cache(maxsize=16384)
@bounded(None)
def point_slice_map(write: Access, read: Access) -> tuple[Expr, ...] | None:
    """The consumer iteration that reads what one producer iteration writes (store-site
    fusion of an epilogue), when that is a bijection between the producer's writes and the
    consumer's iterations: for each consumer loop variable, an expression of the producer's."""
    if read.index is None or write.index is None:
        return None
    if _has_divs(read.index) or _has_divs(write.index):
        # inverting an index with floor divisions (a view that splits and merges dims, as a
        # window partition) makes isl enumerate cases: seconds to minutes a query, and none of
        # the dev models' queries of that kind had a bijection to find
        return None
    rd, wr = iteration_map(read), iteration_map(write)
    m = wr.apply_range(rd.reverse())  # producer iteration -> consumer iteration
    if not (m.is_single_valued() and m.is_injective() and rd.reverse().is_single_valued()
            and wr.reverse().is_single_valued()):
        return None
    if not (m.domain().is_equal(wr.domain()) and m.range().is_equal(rd.domain())):
        return None
    return _pma_exprs(isl.PwMultiAff.from_map(m), write.ivs)


@bounded(False)
def _has_divs(index: str) -> bool:
    return "floor(" in index or " mod " in index


def outer_deps_equal(accs_p: list[Access], accs_c: list[Access], depth: int) -> bool:
    """Whether every dependence between two nests (same element, one of them writing) joins
    iterations with equal values of their first ``depth`` loop variables: the condition for
    fusing them at that depth with those loops kept parallel."""
    glob_p = [a for a in accs_p if a.private_below < 0]
    glob_c = [a for a in accs_c if a.private_below < 0]
    for a in glob_p:
        for b in glob_c:
            if a.buf != b.buf or not (a.write or b.write):
                continue
            rel = relation(a, depth).apply_range(relation(b, depth).reverse())
            if rel.is_empty():
                continue
            ident = isl.Map.identity(rel.get_space()).intersect_domain(rel.domain())
            if not rel.is_subset(ident):
                return False
    return True


def _pma_exprs(pma: isl.PwMultiAff, names: tuple[str, ...]) -> tuple[Expr, ...] | None:
    out = []
    for k in range(pma.dim(isl.dim_type.out)):
        pieces = pma.get_pw_aff(k).coalesce().get_pieces()
        if len(pieces) != 1:
            return None
        out.append(_aff_expr(pieces[0][1], names))
    return tuple(out)


def _val(v: isl.Val):
    from fractions import Fraction

    return Fraction(v.get_num_si(), v.get_den_val().to_python())


def _aff_expr(a: isl.Aff, names: tuple[str, ...]) -> Expr:
    """An isl quasi-affine function as an index expression (floor divisions become floordiv)."""
    from math import lcm

    from .ir import add, c, mul

    terms: list[tuple[Expr, object]] = []
    for i, n in enumerate(names):
        k = _val(a.get_coefficient_val(isl.dim_type.in_, i))
        if k:
            terms.append((Var(n), k))
    for j in range(a.dim(isl.dim_type.div)):
        k = _val(a.get_coefficient_val(isl.dim_type.div, j))
        if k:
            terms.append((_aff_expr(a.get_div(j), names), k))  # a div is the floor of a rational aff
    const = _val(a.get_constant_val())
    den = lcm(const.denominator, *(k.denominator for _, k in terms))
    e: Expr = c(int(const * den))
    for x, k in terms:
        e = add(e, mul(x, c(int(k * den))))
    return e if den == 1 else Op("floordiv", (e, c(den)), INDEX)

