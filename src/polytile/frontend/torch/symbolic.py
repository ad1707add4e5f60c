"""Dynamo's symbolic sizes (SymInts over sympy expressions) as ``graph.symbols.Sym``."""
from __future__ import annotations

import contextlib
import contextvars

import torch

from ...graph.symbols import Sym, SymbolicSize, is_symbolic, solve

# symbol name -> the size it equals, for the graph being compiled (see ``assumed_equal``)
_SUBST: contextvars.ContextVar[dict] = contextvars.ContextVar("polytile_subst", default={})


def _from_sympy(e, lower: dict[str, int]):
    import sympy

    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        sub = _SUBST.get().get(e.name)
        return sub if sub is not None else Sym.symbol(e.name, lower.get(e.name, 2))
    if isinstance(e, sympy.Add):
        out = 0
        for a in e.args:
            out = out + _from_sympy(a, lower)
        return out
    if isinstance(e, sympy.Mul):
        out = 1
        for a in e.args:
            out = out * _from_sympy(a, lower)
        return out
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        base = _from_sympy(e.base, lower)
        out = 1
        for _ in range(int(e.exp)):
            out = out * base
        return out
    raise SymbolicSize(f"symbolic size {e} is not a polynomial of sizes")


def to_size(v):
    """An int or a ``Sym`` for a size that may be a SymInt."""
    if isinstance(v, torch.SymInt):
        expr = v.node.expr
        lower = {s.name: 2 for s in expr.free_symbols}
        try:
            env = v.node.shape_env
            for s in expr.free_symbols:
                vr = env.var_to_range.get(s)
                if vr is not None and vr.lower > 2:
                    lower[s.name] = int(vr.lower)
        except Exception:
            pass
        return _from_sympy(expr, lower)
    if isinstance(v, (torch.SymFloat, torch.SymBool)):
        raise SymbolicSize(f"symbolic {type(v).__name__} {v}")
    return int(v)


def op_name(node) -> str:
    """The ATen op name of an FX node (``addmm`` for ``aten.addmm.default``), or ''."""
    return getattr(getattr(node.target, "_overloadpacket", None), "__name__", "")


# contractions: with a symbolic size, their parametric code is slow (its loops are not tiled
# yet), so such graphs get per-size versions first (``Options.max_specializations``)
CONTRACTIONS = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution")
# static ops worth a static segment of their own in a graph with symbolic sizes: the static
# pipeline tiles, packs and fuses them (the parametric one does not yet)
HEAVY = CONTRACTIONS + ("_scaled_dot_product_flash_attention_for_cpu", "native_layer_norm", "_softmax")


# ops whose operands' sizes must agree where dynamo may have given them different symbols
# (SDPA's meta function does not check that keys and values have one length): (op name,
# [(arg position, dim), ...] groups that are equal)
_EQUAL_DIMS = {
    "_scaled_dot_product_flash_attention_for_cpu": [((1, -2), (2, -2)), ((0, -1), (1, -1))],
    "_scaled_dot_product_flash_attention": [((1, -2), (2, -2)), ((0, -1), (1, -1))],
    "_scaled_dot_product_efficient_attention": [((1, -2), (2, -2)), ((0, -1), (1, -1))],
    "bmm": [((0, -1), (1, -2))],
    "mm": [((0, -1), (1, -2))],
}


@contextlib.contextmanager
def assumed_equal(gm: torch.fx.GraphModule):
    """While compiling ``gm``: a symbol that an op requires to equal another size is replaced
    by that size (``s31`` by ``s55`` when keys have length s55 and values s31). The symbols of
    the inputs are then solved against the replaced sizes at each call, so a call where they
    differ does not fit the compiled code (it runs in ATen, which reports the error as eager
    does)."""
    subst: dict[str, object] = {}
    token = _SUBST.set(subst)
    try:
        for n in gm.graph.nodes:
            for group in _EQUAL_DIMS.get(op_name(n), ()):
                vals = [n.args[a].meta.get("val") if a < len(n.args) and isinstance(n.args[a], torch.fx.Node)
                        else None for a, _ in group]
                if any(not isinstance(v, torch.Tensor) for v in vals):
                    continue
                try:
                    first, second = (to_size(v.shape[d]) for v, (_, d) in zip(vals, group))
                except (IndexError, SymbolicSize):
                    continue
                if first == second or not isinstance(second, Sym):
                    continue
                terms = dict(second.terms)
                if len(second.symbols) == 1 and len(terms) <= 2 and terms.get(tuple(second.symbols), 0) == 1:
                    (sym,) = second.symbols
                    subst[sym] = first - (second - Sym.symbol(sym))  # second = sym + c  ->  sym = first - c
        yield subst
    finally:
        _SUBST.reset(token)


def shape_of(t: torch.Tensor) -> tuple:
    return tuple(to_size(s) for s in t.shape)


def strides_of(t: torch.Tensor) -> tuple:
    return tuple(to_size(s) for s in t.stride())


def is_sym_value(v) -> bool:
    """A SymInt (or SymFloat/SymBool) scalar, or a tensor with a symbolic size or stride."""
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(v, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride()))
    if isinstance(v, (list, tuple)):
        return any(is_sym_value(x) for x in v)
    return False


def bind_placeholders(templates: list, args) -> dict[str, int]:
    """The values of the symbols at a call, from the graph's inputs: ``templates`` holds per
    placeholder a ``Sym`` (a size argument), a tuple of sizes (a tensor's shape) or None."""
    env: dict[str, int] = {}
    dims, vals = [], []
    for tpl, a in zip(templates, args):
        if tpl is None:
            continue
        if isinstance(tpl, tuple):
            if isinstance(a, torch.Tensor) and a.dim() == len(tpl):
                dims += tpl
                vals += a.shape
        elif isinstance(a, int):
            dims.append(tpl)
            vals.append(a)
    if not solve(dims, vals, env):
        from ...runtime.loader import InputMismatchError

        raise InputMismatchError(f"polytile: the inputs' sizes do not fit the compiled symbolic sizes ({env})")
    return env


__all__ = ["to_size", "shape_of", "strides_of", "is_sym_value", "bind_placeholders", "is_symbolic"]
