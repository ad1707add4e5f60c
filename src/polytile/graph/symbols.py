"""Symbolic sizes: a dimension that is a polynomial in named size symbols (dynamo's SymInts).

A ``Sym`` behaves as an int where the answer does not depend on the symbols' values: sums and
products with ints and other ``Sym``s, equality (as polynomials), and comparisons that the
symbols' lower bounds decide (dynamo proves every dynamic size >= 2, so ``s == 1`` and
``max(s, 1)`` are known). Anything else (``range(s)``, ``int(s)``, a comparison that depends on
the values) raises ``SymbolicSize``, an ``Unsupported``: the code that needed a number does not
take symbolic sizes, and the frontend runs those ops another way. Results that are constant
are plain ints, so static shapes never hold a ``Sym``.

Symbols become parameters of the affine program (``affine.ir.size_expr``: ``Var("sz_<name>")``)
and arguments of the generated code, bound from the inputs' shapes at each call
(``runtime.loader``)."""
from __future__ import annotations

import math
from typing import Mapping

from ..dtypes import Unsupported

Monomial = tuple[str, ...]  # sorted symbol names (repeats for powers); () is the constant term


class SymbolicSize(Unsupported):
    """A symbolic size was used where a number is needed."""


class Sym:
    __slots__ = ("terms", "lower")

    def __init__(self, terms: Mapping[Monomial, int], lower: Mapping[str, int] | None = None):
        object.__setattr__(self, "terms", tuple(sorted((m, k) for m, k in terms.items() if k)))
        object.__setattr__(self, "lower", dict(lower or {}))

    def __setattr__(self, *a):
        raise AttributeError("Sym is immutable")

    @staticmethod
    def symbol(name: str, lower: int = 2) -> "Sym":
        return Sym({(name,): 1}, {name: lower})

    # -- normal form ----------------------------------------------------------------------
    @staticmethod
    def make(terms: dict, lower: dict) -> "int | Sym":
        terms = {m: k for m, k in terms.items() if k}
        if all(m == () for m in terms):
            return terms.get((), 0)
        return Sym(terms, lower)

    def _parts(self) -> tuple[dict, dict]:
        return dict(self.terms), self.lower

    @staticmethod
    def _of(x) -> tuple[dict, dict]:
        if isinstance(x, Sym):
            return x._parts()
        if isinstance(x, bool) or not isinstance(x, int):
            raise SymbolicSize(f"symbolic size combined with {x!r}")
        return {(): x}, {}

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(s for m, _ in self.terms for s in m)

    # -- arithmetic -----------------------------------------------------------------------
    def __add__(self, other):
        if not isinstance(other, (int, Sym)):
            return NotImplemented
        a, la = self._parts()
        b, lb = Sym._of(other)
        for m, k in b.items():
            a[m] = a.get(m, 0) + k
        return Sym.make(a, {**la, **lb})

    __radd__ = __add__

    def __neg__(self):
        return Sym.make({m: -k for m, k in self.terms}, self.lower)

    def __sub__(self, other):
        if not isinstance(other, (int, Sym)):
            return NotImplemented
        return self + (-other)

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, other):
        if not isinstance(other, (int, Sym)):
            return NotImplemented
        a, la = self._parts()
        b, lb = Sym._of(other)
        out: dict = {}
        for ma, ka in a.items():
            for mb, kb in b.items():
                m = tuple(sorted(ma + mb))
                out[m] = out.get(m, 0) + ka * kb
        return Sym.make(out, {**la, **lb})

    __rmul__ = __mul__

    def __floordiv__(self, other):
        """Exact when every term divides by ``other`` (a positive int, or a monomial with a
        positive coefficient: ``(768*s) // (64*s)`` is 12, a view's reshape of a symbolic
        dim); else unknown."""
        if isinstance(other, int) and other > 0 and all(k % other == 0 for _, k in self.terms):
            return Sym.make({m: k // other for m, k in self.terms}, self.lower)
        if isinstance(other, Sym) and len(other.terms) == 1 and other.terms[0][1] > 0:
            (dm, dk), = other.terms
            out = {}
            for m, k in self.terms:
                rest = list(m)
                for s in dm:
                    if s not in rest:
                        raise SymbolicSize(f"({self}) // ({other})")
                    rest.remove(s)
                if k % dk:
                    raise SymbolicSize(f"({self}) // ({other})")
                out[tuple(rest)] = k // dk
            return Sym.make(out, self.lower)
        raise SymbolicSize(f"({self}) // {other}")

    def __mod__(self, other):
        if isinstance(other, int) and other > 0 and all(k % other == 0 for m, k in self.terms if m):
            return dict(self.terms).get((), 0) % other
        raise SymbolicSize(f"({self}) % {other}")

    # -- comparisons ----------------------------------------------------------------------
    def bounds(self) -> tuple[float, float]:
        """(lowest, highest) value over every binding of the symbols at or above their lower bounds."""
        lo, hi = 0.0, 0.0
        for m, k in self.terms:
            if not m:
                lo, hi = lo + k, hi + k
                continue
            least = math.prod(self.lower.get(s, 2) for s in m)
            if k > 0:
                lo, hi = lo + k * least, math.inf
            else:
                lo, hi = -math.inf, hi + k * least
        return lo, hi

    def _sign(self, other) -> tuple[float, float]:
        d = self - other
        return (d, d) if isinstance(d, int) else d.bounds()

    def __eq__(self, other):
        if isinstance(other, (int, Sym)) and not isinstance(other, bool):
            d = self - other
            return isinstance(d, int) and d == 0
        return NotImplemented

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def __hash__(self):
        return hash(self.terms)

    def _decide(self, other, test, what: str) -> bool:
        lo, hi = self._sign(other)
        if test(lo) and test(hi):
            return True
        if not test(lo) and not test(hi):
            return False
        raise SymbolicSize(f"{self} {what} {other} depends on the sizes")

    def __lt__(self, other):
        return self._decide(other, lambda v: v < 0, "<")

    def __le__(self, other):
        return self._decide(other, lambda v: v <= 0, "<=")

    def __gt__(self, other):
        return self._decide(other, lambda v: v > 0, ">")

    def __ge__(self, other):
        return self._decide(other, lambda v: v >= 0, ">=")

    def __bool__(self):
        return self != 0 and self._decide(0, lambda v: v != 0 and v == v, "!=")

    def __int__(self):
        raise SymbolicSize(f"the size {self} is needed as a number")

    __index__ = __int__

    def __float__(self):
        raise SymbolicSize(f"the size {self} is needed as a number")

    # -- values ---------------------------------------------------------------------------
    def eval(self, env: Mapping[str, int]) -> int:
        return sum(k * math.prod(env[s] for s in m) for m, k in self.terms)

    def __repr__(self):
        parts = []
        for m, k in self.terms:
            mono = "*".join(m)
            parts.append(str(k) if not m else mono if k == 1 else f"{k}*{mono}")
        return " + ".join(parts).replace("+ -", "- ") or "0"

    __str__ = __repr__


def is_symbolic(*xs) -> bool:
    """Whether any of ``xs`` (sizes, shapes, nested tuples/lists) holds a ``Sym``."""
    for x in xs:
        if isinstance(x, Sym):
            return True
        if isinstance(x, (tuple, list)) and is_symbolic(*x):
            return True
    return False


def at_least(x, n) -> bool:
    """For a cost model's decision: ``x >= n`` where the symbols' lower bounds decide it, else
    True (a symbolic size is one that grows: a prompt, a KV cache, a batch)."""
    try:
        return bool(x >= n)
    except SymbolicSize:
        return True


def symbols_of(*xs) -> frozenset[str]:
    out: set[str] = set()
    for x in xs:
        if isinstance(x, Sym):
            out |= x.symbols
        elif isinstance(x, (tuple, list)):
            out |= symbols_of(*x)
    return frozenset(out)


def evaluate(x, env: Mapping[str, int]):
    """``x`` (a size, or a nested tuple/list of them) with the symbols bound by ``env``."""
    if isinstance(x, Sym):
        return x.eval(env)
    if isinstance(x, (tuple, list)):
        return type(x)(evaluate(v, env) for v in x)
    return x


def solve(dims, values, env: dict[str, int]) -> bool:
    """Bind the symbols that a dim determines alone (``a*s + b`` with ``s`` its only unknown)
    from the matching actual sizes into ``env``; False when a dim contradicts ``env`` or an
    actual size is not of that form. Dims left undetermined stay unbound."""
    pending = [(d, int(v)) for d, v in zip(dims, values)]
    progress = True
    while pending and progress:
        progress = False
        rest = []
        for d, v in pending:
            if not isinstance(d, Sym):
                if d != v:
                    return False
                continue
            unknown = d.symbols - env.keys()
            if not unknown:
                if d.eval(env) != v:
                    return False
                continue
            if len(unknown) == 1:
                (s,) = unknown
                lin = [(m, k) for m, k in d.terms if s in m]
                if all(m.count(s) == 1 for m, _ in lin):
                    a = sum(k * math.prod(env[x] for x in m if x != s) for m, k in lin)
                    b = sum(k * math.prod(env[x] for x in m) for m, k in d.terms if s not in m)
                    if a == 0 or (v - b) % a:
                        return False
                    val = (v - b) // a
                    if val < d.lower.get(s, 2):
                        return False
                    env[s] = val
                    progress = True
                    continue
            rest.append((d, v))
        pending = rest
    return not pending
