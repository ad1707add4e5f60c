"""The JAX primitive -> graph IR lowering table: one rule per primitive, keyed by its name.

A rule is ``rule(ctx, *operands, **params)``: array operands arrive as graph nodes (literals
as ``full`` nodes), the equation's params as keyword arguments. It returns a node, or a tuple
of nodes for a primitive with several results. It raises ``Unsupported`` for cases it does not
handle; the frontend then runs that equation through JAX.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...dtypes import ALL, Unsupported
from ...graph.builder import GraphBuilder

LOWERINGS: dict[str, Callable] = {}


def lowers(*names: str):
    """Register ``fn`` as the rule of the primitives called ``names`` (``Primitive.name``)."""
    def deco(fn):
        for n in names:
            if n in LOWERINGS:
                raise ValueError(f"two lowering rules for jax primitive {n}")
            LOWERINGS[n] = fn
        return fn
    return deco


def ir_dtype(dtype) -> str:
    """The graph IR's name of a numpy / jax dtype; ``Unsupported`` for the others (bf16, f16, uint32...)."""
    try:
        name = np.dtype(dtype).name
    except TypeError:  # extended dtypes (PRNG keys, float0)
        name = str(dtype)
    if name not in ALL:
        raise Unsupported(f"dtype {name} is not supported by polytile yet")
    return name


class Ctx:
    """What a rule sees besides its operands: the builder and the equation's result types."""

    def __init__(self, b: GraphBuilder, prim_name: str, out_avals):
        self.b = b
        self.prim = prim_name
        self.out_avals = out_avals

    @property
    def out_dtype(self) -> str:
        return ir_dtype(self.out_avals[0].dtype)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.out_avals[0].shape)


def ensure_loaded() -> None:
    """Import the modules that fill the table."""
    from . import lower_contract, lower_elementwise, lower_index, lower_reduce, lower_shape  # noqa: F401
