"""A closed jaxpr -> one flat list of equations, with call primitives inlined.

``jit``/``pjit``, ``closed_call``, ``core_call``, ``remat``/``checkpoint``, ``custom_jvp_call`` and
``custom_vjp_call`` only wrap a sub-jaxpr for the forward computation: their body is spliced into
the caller (renamed, so a body called twice gets fresh values each time). Every value gets an
integer key; literals stay literals (``Lit``).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from jax.extend import core as jcore


@dataclass(frozen=True)
class Lit:
    """A literal operand (a scalar, usually) of known abstract value."""
    val: Any
    aval: Any


@dataclass
class FlatEqn:
    prim: Any  # jax Primitive
    params: dict
    ins: list  # int key | Lit
    outs: list[int]
    eqn: Any  # the original JaxprEqn (for fallback binding and messages)

    @property
    def name(self) -> str:
        return self.prim.name


@dataclass
class FlatJaxpr:
    in_keys: list[int]
    consts: dict[int, Any]  # key -> constant array (closed-over values of the jaxpr and its callees)
    eqns: list[FlatEqn]
    out_refs: list  # int key | Lit
    avals: dict[int, Any] = field(default_factory=dict)  # key -> abstract value


def _closed(j):
    """(jaxpr, consts) of a Jaxpr or ClosedJaxpr param, else None."""
    if isinstance(j, jcore.ClosedJaxpr):
        return j.jaxpr, list(j.consts)
    if isinstance(j, jcore.Jaxpr):
        return j, []
    return None


def _body(eqn):
    """The inlinable sub-jaxpr of a call-like equation, else None."""
    name = eqn.primitive.name
    p = eqn.params
    if name in ("jit", "pjit", "remat", "checkpoint", "remat2"):
        sub = _closed(p.get("jaxpr"))
    elif name in ("closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"):
        sub = _closed(p.get("call_jaxpr", p.get("fun_jaxpr")))
    else:
        return None
    if sub is None or len(sub[0].constvars) != len(sub[1]) or len(sub[0].invars) != len(eqn.invars) \
            or len(sub[0].outvars) != len(eqn.outvars):
        return None
    return sub


INLINED = ("jit", "pjit", "remat", "checkpoint", "remat2", "closed_call", "core_call", "custom_jvp_call",
           "custom_vjp_call", "custom_vjp_call_jaxpr")


def flatten(closed) -> FlatJaxpr:
    """Flatten a ``ClosedJaxpr`` (what ``jax.make_jaxpr`` returns)."""
    keys = itertools.count()
    flat = FlatJaxpr([], {}, [], [])

    def fresh(aval) -> int:
        k = next(keys)
        flat.avals[k] = aval
        return k

    def walk(invars, eqns, outvars, in_refs: list) -> list:
        env: dict = dict(zip(invars, in_refs))

        def ref(v):
            if isinstance(v, jcore.Literal):
                return Lit(v.val, v.aval)
            return env[v]

        for eqn in eqns:
            ins = [ref(v) for v in eqn.invars]
            sub = _body(eqn)
            if sub is not None:
                sj, consts = sub
                const_refs = []
                for c, v in zip(consts, sj.constvars):
                    k = fresh(v.aval)
                    flat.consts[k] = c
                    const_refs.append(k)
                outs = walk(list(sj.constvars) + list(sj.invars), sj.eqns, sj.outvars, const_refs + ins)
            else:
                outs = [fresh(v.aval) for v in eqn.outvars]
                flat.eqns.append(FlatEqn(eqn.primitive, dict(eqn.params), ins, outs, eqn))
            for v, r in zip(eqn.outvars, outs):
                if not isinstance(v, jcore.DropVar):
                    env[v] = r
        return [ref(v) for v in outvars]

    jaxpr, consts = closed.jaxpr, list(closed.consts)
    const_refs = []
    for c, v in zip(consts, jaxpr.constvars):
        k = fresh(v.aval)
        flat.consts[k] = c
        const_refs.append(k)
    flat.in_keys = [fresh(v.aval) for v in jaxpr.invars]
    flat.out_refs = walk(list(jaxpr.constvars) + list(jaxpr.invars), jaxpr.eqns, jaxpr.outvars,
                         const_refs + flat.in_keys)
    return flat
