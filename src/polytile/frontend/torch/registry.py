"""The ATen -> graph IR lowering table: one rule per ATen op overload.

A rule is ``rule(ctx, *args, **kwargs)`` where tensor arguments arrive as graph nodes and
everything else as Python values; it returns a node, a tuple of nodes, or a Python value.
It raises ``Unsupported`` for cases it does not handle; the frontend then runs that op in ATen.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx

from .symbolic import shape_of
from ...dtypes import Unsupported, from_torch
from ...graph.builder import GraphBuilder

LOWERINGS: dict[Any, Callable] = {}


def lowers(*targets):
    def deco(fn):
        for t in targets:
            if t in LOWERINGS:
                raise ValueError(f"two lowering rules for {t}")
            LOWERINGS[t] = fn
        return fn
    return deco


class Ctx:
    """What a rule sees besides its arguments: the builder and the FX node's metadata."""

    def __init__(self, b: GraphBuilder, node):
        self.b = b
        self.node = node

    @property
    def val(self):
        v = self.node.meta.get("val")
        if v is None:
            raise Unsupported(f"{self.node.target}: no example value in node meta")
        return v

    @property
    def out_dtype(self) -> str:
        v = self.val
        if isinstance(v, (tuple, list)):
            v = v[0]
        return from_torch(v.dtype)

    def arg_dtype(self, *positions: int) -> str:
        """PyTorch's promoted dtype of the node's arguments at ``positions`` (``torch.result_type``:
        a 0-d tensor or a Python scalar only decides the category, not the width)."""
        vals = []
        for p in positions:
            a = self.node.args[p]
            vals.append(a.meta.get("val") if isinstance(a, fx.Node) else a)
            if vals[-1] is None:
                raise Unsupported(f"{self.node.target}: no example value for argument {p}")
        if len(vals) == 1:
            return from_torch(vals[0].dtype)
        return from_torch(torch.result_type(*vals))

    @property
    def out_shape(self) -> tuple[int, ...]:
        v = self.val
        if isinstance(v, (tuple, list)):
            v = v[0]
        return shape_of(v)  # (a symbolic size stays a Sym: int() would make dynamo specialize it)


def ensure_loaded() -> None:
    """Import the modules that fill the table."""
    from . import lower_backward, lower_elementwise, lower_nn, lower_quant, lower_reduce, lower_shape  # noqa: F401
