"""Affine IR: loop nests over static iteration domains with (mostly) affine accesses.

Semantics follow MLIR's affine dialect: ``For`` loops with bounds that are affine in the
enclosing induction variables (floordiv/mod by constants allowed), ``Load``/``Store`` on
flat buffers with an index expression, ``If`` on conditions. A ``Load`` index that contains
another ``Load`` is an indirect (non-affine) access; analyses treat it conservatively.
All nodes are immutable; passes build new trees.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from ..dtypes import LOW

INDEX = "int64"


# ---------------------------------------------------------------- scalar expressions
@dataclass(frozen=True, eq=False)
class Const:
    value: Any
    dtype: str

    # equality by representation: -0.0 and 0.0 (equal as floats) are different constants
    # (x / -0.0 is not x / 0.0), and NaN equals NaN (memos of kernels holding one still hit)
    def _key(self):
        v = self.value
        return self.dtype, type(v), repr(v) if isinstance(v, float) else v

    def __eq__(self, other):
        return isinstance(other, Const) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())


@dataclass(frozen=True)
class Var:
    name: str
    dtype: str = INDEX


@dataclass(frozen=True)
class Load:
    """Element ``index`` of ``buf``; with a vector dtype, ``lanes`` consecutive elements from there."""

    buf: str
    index: "Expr"
    dtype: str


@dataclass(frozen=True)
class Op:
    """A scalar function (the elementwise op names of graph.ops, plus ``cast``)."""

    fn: str
    args: tuple["Expr", ...]
    dtype: str


Expr = Const | Var | Load | Op


def vector_type(dtype: str, lanes: int) -> str:
    """The dtype of a vector of ``lanes`` elements (MLIR's vector<8xf32> is "float32x8")."""
    return f"{dtype}x{lanes}"


def lanes(dtype: str) -> int:
    """Elements in a value of this dtype (1 for scalars)."""
    head, _, n = dtype.rpartition("x")
    return int(n) if head and n.isdigit() else 1


def element_type(dtype: str) -> str:
    return dtype.rpartition("x")[0] if lanes(dtype) > 1 else dtype


def in_register(e: Expr) -> Op:
    """``e`` (a vector) kept in a register where it is used: rendered as the C prelude's PT_REG, so
    that the C compiler does not fold its load into each instruction that reads it."""
    return Op("in_register", (e,), e.dtype)


PAIR = "bf16pair"  # two consecutive bfloat16 elements as one 32-bit element, indexed in pairs
# (a bfloat16 dot-product operand, ``transform.bf16_pairs``); read through ``pair_bits``
QUAD_U8, QUAD_I8 = "u8quad", "i8quad"  # four consecutive uint8 / int8 elements as one, likewise
# (an int8 dot-product operand, ``transform.int8_quads``)
GROUPS = {PAIR: ("bfloat16", 2), QUAD_U8: ("uint8", 4), QUAD_I8: ("int8", 4)}  # element, count


def converted_read(e: Expr) -> bool:
    """Whether ``e`` is a load read through a conversion (``widening``, or a group's bits)."""
    return widening(e) or (isinstance(e, Op) and e.fn == "pair_bits" and isinstance(e.args[0], Load))


def element_index(ld: Load) -> Expr:
    """The index of a load's first element in its buffer's elements."""
    g = GROUPS.get(element_type(ld.dtype))
    return mul(ld.index, c(g[1])) if g else ld.index


# types whose values float32 holds exactly: half types, and the 8-bit integers of quantized
# tensors (``graph.quantized``); contractions read them in place, converting as they read
WIDENS = (*LOW, "int8", "uint8")


def widened(e: Expr) -> Expr:
    """``e`` as float32 where it is of a type ``WIDENS`` names (exact: a contraction's operand,
    a value kept in a float32 temp); ``e`` itself otherwise."""
    return Op("cast", (e,), "float32") if e.dtype in WIDENS else e


def widening(e: Expr) -> bool:
    """Whether ``e`` is a load of a narrow element (``WIDENS``) read as float32 (a contraction's
    operand in bfloat16 or int8: converted where it is read, no float32 copy of the tensor)."""
    return (isinstance(e, Op) and e.fn == "cast" and element_type(e.dtype) == "float32"
            and isinstance(e.args[0], Load) and element_type(e.args[0].dtype) in WIDENS)


def load_of(e: Expr) -> Expr:
    """The load a widening read (``widening``) converts; ``e`` itself otherwise."""
    return e.args[0] if converted_read(e) else e


def reread(e: Expr, ld: Load) -> Expr:
    """``e`` (a load, or a widening read of one) reading ``ld`` instead."""
    return Op(e.fn, (ld,), e.dtype) if converted_read(e) else ld


def as_vector(e: Expr, n: int) -> Expr:
    """``e`` (a load, or a widening read of one) as the vector of its ``n`` consecutive elements."""
    if isinstance(e, Op) and (converted_read(e) or e.fn in ("pair_of", "quad_of")):
        return Op(e.fn, tuple(as_vector(a, n) for a in e.args), vector_type(element_type(e.dtype), n))
    assert isinstance(e, Load), e
    return replace(e, dtype=vector_type(element_type(e.dtype), n))


SIZE_PREFIX = "sz_"  # size symbols (``graph.symbols``) are index variables named sz_<symbol>


def size_expr(x) -> Expr:
    """A size (an int, or a ``graph.symbols.Sym``: a polynomial in size symbols) as an index
    expression over the size parameters ``Var("sz_<symbol>")``."""
    terms = getattr(x, "terms", None)
    if terms is None:
        return c(x)
    e: Expr = c(0)
    for mono, k in terms:
        t: Expr = c(k)
        for s in mono:
            t = mul(t, Var(SIZE_PREFIX + s))
        e = add(e, t)
    return e


def size_params(exprs) -> frozenset[str]:
    """The size parameters (``Var("sz_...")`` names) that the expressions mention."""
    return frozenset(x.name for e in exprs for x in walk_exprs(e)
                     if isinstance(x, Var) and x.name.startswith(SIZE_PREFIX))


def c(v: int) -> Expr:
    """The index constant v (small ones shared: constants are immutable); a symbolic size is
    its expression (``size_expr``)."""
    if type(v) is not int:
        if hasattr(v, "terms"):
            return size_expr(v)
        v = int(v)
    k = _SMALL.get(v)
    if k is None:
        k = Const(v, INDEX)
        if -256 <= v < 4096:
            _SMALL[v] = k
    return k


_SMALL: dict[int, Const] = {}


def add(a: Expr, b: Expr) -> Expr:
    if isinstance(a, Const) and a.value == 0:
        return b
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and isinstance(b, Const) and a.dtype == b.dtype == INDEX:
        return c(a.value + b.value)
    return Op("add", (a, b), a.dtype)


def mul(a: Expr, b: Expr) -> Expr:
    if isinstance(b, Const) and b.value == 1:
        return a
    if isinstance(a, Const) and a.value == 1:
        return b
    if isinstance(a, Const) and a.value == 0 or isinstance(b, Const) and b.value == 0:
        return c(0) if a.dtype == INDEX else Const(0, a.dtype)
    if isinstance(a, Const) and isinstance(b, Const) and a.dtype == b.dtype == INDEX:
        return c(a.value * b.value)
    return Op("mul", (a, b), a.dtype)


def linear(terms: list[tuple[Expr, int]], offset: int = 0) -> Expr:
    """offset + sum(coef * e) as an index expression, dropping zero terms."""
    e: Expr = c(offset)
    for x, k in terms:
        if k != 0:
            e = add(e, mul(x, c(k)) if k != 1 else x)
    return e


# ---------------------------------------------------------------- statements
@dataclass(frozen=True)
class For:
    var: str
    lo: Expr
    hi: Expr  # exclusive
    body: tuple["Stmt", ...]
    parallel: bool = False  # no loop-carried dependence (checked with isl)
    # >0: this loop and the perfectly nested loops under it, this many in all, are shared among
    # the target's parallel workers (set by a backend's pass: OpenMP threads on the CPU)
    workers: int = 0
    # with ``workers``: shared only when this holds at run time (a band whose work depends on
    # symbolic sizes); None: always
    workers_if: "Expr | None" = None
    # with ``workers`` on a loop that is not parallel: the local arrays (name, size) it only adds
    # into; each worker adds into its own zeroed copy and the copies are added into the array
    # at the end (OpenMP's array reduction): the loop's other accesses must not conflict
    reduce_arrays: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Store:
    buf: str
    index: Expr
    value: Expr


@dataclass(frozen=True)
class Let:
    """Declare a local scalar (an accumulator or a temporary)."""

    name: str
    dtype: str
    value: Expr


@dataclass(frozen=True)
class Assign:
    name: str
    value: Expr


@dataclass(frozen=True)
class If:
    cond: Expr
    then: tuple["Stmt", ...]
    orelse: tuple["Stmt", ...] = ()


@dataclass(frozen=True)
class Fail:
    """Report a run-time error (e.g. an index out of range) to the caller with ``code``."""

    code: int


@dataclass(frozen=True)
class Alloc:
    """A kernel-local array (memref.alloca): private to the loop iteration that declares it."""

    name: str
    dtype: str
    size: int


@dataclass(frozen=True)
class Prefetch:
    """A hint that ``buf[index]`` will be read soon (``__builtin_prefetch``): no access, no
    effect on the program's meaning. ``index`` may lie past the buffer's end (prefetches of
    any address are harmless), so analyses must not treat it as a read."""

    buf: str
    index: Expr
    locality: int = 1  # 0-3 as in __builtin_prefetch: 1 = to the L2 on x86
    write: bool = False  # fetched for writing (prefetchw)


Stmt = For | Store | Let | Assign | If | Fail | Alloc | Prefetch


@dataclass(frozen=True)
class Buffer:
    name: str
    dtype: str
    size: int  # elements (a ``graph.symbols.Sym`` in a program with symbolic sizes)
    kind: str  # input | output | temp | cache (a temp kept between calls, see ``cache_static``)
    index: int = -1  # position among the inputs / outputs
    static: bool = False  # an input that is a parameter or buffer (``TensorSpec.static``)


@dataclass(frozen=True)
class Kernel:
    name: str
    body: tuple[Stmt, ...]
    origin: str = ""  # the graph op(s) it came from, for dumps and error messages
    contraction: bool = False  # a matmul or convolution nest (epilogues fuse at its store)
    cached: bool = False  # reads parameters and caches only: run when those change (``cache_static``)


@dataclass(frozen=True)
class Program:
    buffers: tuple[Buffer, ...]
    kernels: tuple[Kernel, ...]
    symbols: tuple[str, ...] = ()  # size symbols of a program with symbolic sizes (``Var("sz_<name>")``)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)


# ---------------------------------------------------------------- traversal helpers
def walk_exprs(e: Expr) -> Iterator[Expr]:
    yield e
    if isinstance(e, Load):
        yield from walk_exprs(e.index)
    elif isinstance(e, Op):
        for a in e.args:
            yield from walk_exprs(a)


def stmt_exprs(s: Stmt) -> Iterator[Expr]:
    if isinstance(s, For):
        yield s.lo
        yield s.hi
        if s.workers_if is not None:
            yield s.workers_if
    elif isinstance(s, Store):
        yield s.index
        yield s.value
    elif isinstance(s, (Let, Assign)):
        yield s.value
    elif isinstance(s, If):
        yield s.cond
    elif isinstance(s, Prefetch):
        yield s.index


def walk_stmts(body: tuple[Stmt, ...]) -> Iterator[Stmt]:
    for s in body:
        yield s
        if isinstance(s, For):
            yield from walk_stmts(s.body)
        elif isinstance(s, If):
            yield from walk_stmts(s.then)
            yield from walk_stmts(s.orelse)


def local_arrays(body: tuple[Stmt, ...]) -> dict[str, Alloc]:
    return {s.name: s for s in walk_stmts(body) if isinstance(s, Alloc)}


def buffers_used(k: Kernel) -> tuple[frozenset[str], frozenset[str]]:
    """(read, written) names of the program buffers a kernel uses (local arrays excluded).
    Kept on the (immutable) kernel after the first call: the fusion passes ask for every
    kernel again after each change."""
    done = k.__dict__.get("_buffers_used")
    if done is not None:
        return done
    reads, writes = set(), set()
    local = local_arrays(k.body)
    for s in walk_stmts(k.body):
        if isinstance(s, Store):
            writes.add(s.buf)
        for e in stmt_exprs(s):
            for x in walk_exprs(e):
                if isinstance(x, Load):
                    reads.add(x.buf)
    done = (frozenset(reads - set(local)), frozenset(writes - set(local)))
    object.__setattr__(k, "_buffers_used", done)
    return done


def kernel_size_params(k: Kernel) -> list[str]:
    """The size parameters (``sz_<symbol>``) a kernel's body mentions, in name order."""
    return sorted(size_params(e for s in walk_stmts(k.body) for e in stmt_exprs(s)))


def is_affine(e: Expr, ivs: frozenset[str] | set[str]) -> bool:
    """True when e is an affine function of ``ivs`` (floordiv/mod by positive constants allowed)."""
    if isinstance(e, Const):
        return e.dtype == INDEX
    if isinstance(e, Var):
        return e.name in ivs
    if isinstance(e, Load):
        return False
    if e.fn == "add" or e.fn == "sub":
        return all(is_affine(a, ivs) for a in e.args)
    if e.fn == "mul":
        a, b = e.args
        return (isinstance(a, Const) and is_affine(b, ivs)) or (isinstance(b, Const) and is_affine(a, ivs))
    if e.fn in ("floordiv", "remainder"):
        a, b = e.args
        return isinstance(b, Const) and b.value > 0 and is_affine(a, ivs)
    return False


def trip_count(f: For) -> int | None:
    if isinstance(f.lo, Const) and isinstance(f.hi, Const):
        return max(0, f.hi.value - f.lo.value)
    return None


def with_body(f: For, body: tuple[Stmt, ...]) -> For:
    return replace(f, body=tuple(body))


# ---------------------------------------------------------------- renaming
def _rename_expr(e: Expr, m: dict[str, str]) -> Expr:
    if isinstance(e, Load):
        return Load(m.get(e.buf, e.buf), _rename_expr(e.index, m), e.dtype)
    if isinstance(e, Op):
        return Op(e.fn, tuple(_rename_expr(a, m) for a in e.args), e.dtype)
    return e


def rename_buffers(body: tuple[Stmt, ...], m: dict[str, str]) -> tuple[Stmt, ...]:
    """The same statements with buffer names mapped through ``m``."""
    out = []
    for s in body:
        if isinstance(s, For):
            s = replace(s, lo=_rename_expr(s.lo, m), hi=_rename_expr(s.hi, m), body=rename_buffers(s.body, m))
        elif isinstance(s, Store):
            s = Store(m.get(s.buf, s.buf), _rename_expr(s.index, m), _rename_expr(s.value, m))
        elif isinstance(s, (Let, Assign)):
            s = replace(s, value=_rename_expr(s.value, m))
        elif isinstance(s, If):
            s = If(_rename_expr(s.cond, m), rename_buffers(s.then, m), rename_buffers(s.orelse, m))
        elif isinstance(s, Prefetch):
            s = replace(s, buf=m.get(s.buf, s.buf), index=_rename_expr(s.index, m))
        out.append(s)
    return tuple(out)


def structure_key(body: tuple[Stmt, ...]) -> tuple[tuple, list[str]]:
    """(a hashable key of ``body``'s structure with its program buffers (not its local arrays)
    numbered by first appearance, those buffers' names in that order): bodies that differ only
    in which buffers they touch get equal keys. One walk building tuples, no renamed copy of
    the body (``rename_buffers`` makes one where it is needed: a kernel function's body)."""
    local = local_arrays(body)
    names: dict[str, int] = {}

    def buf(n: str):
        if n in local:
            return n
        return names.setdefault(n, len(names))

    def ex(e: Expr) -> tuple:
        if isinstance(e, Load):
            return ("L", buf(e.buf), ex(e.index), e.dtype)
        if isinstance(e, Op):
            return ("O", e.fn, e.dtype, tuple(ex(a) for a in e.args))
        if isinstance(e, Const):
            return ("C", e._key())
        return ("V", e.name, e.dtype)

    def st(b: tuple[Stmt, ...]) -> tuple:
        out = []
        for x in b:
            if isinstance(x, For):
                out.append(("F", x.var, ex(x.lo), ex(x.hi), x.parallel, x.workers,
                            None if x.workers_if is None else ex(x.workers_if), x.reduce_arrays, st(x.body)))
            elif isinstance(x, Store):
                out.append(("S", ex(x.index), ex(x.value), buf(x.buf)))
            elif isinstance(x, Let):
                out.append(("=", x.name, x.dtype, ex(x.value)))
            elif isinstance(x, Assign):
                out.append(("+", x.name, ex(x.value)))
            elif isinstance(x, If):
                out.append(("I", ex(x.cond), st(x.then), st(x.orelse)))
            elif isinstance(x, Prefetch):
                out.append(("P", ex(x.index), buf(x.buf), x.locality, x.write))
            else:  # Alloc, Fail: no program buffer in them
                out.append(x)
        return tuple(out)

    key = st(body)
    return key, list(names)


