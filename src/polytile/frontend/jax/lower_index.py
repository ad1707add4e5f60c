"""Lowering rules: indexing (``gather`` in the form ``jnp.take`` / ``x[ids]`` / embeddings produce)."""
from __future__ import annotations

import math

from ...dtypes import Unsupported, is_float
from .registry import lowers


@lowers("gather")
def gather(ctx, x, idx, dimension_numbers, slice_sizes, mode=None, fill_value=None, indices_are_sorted=False,
           unique_indices=False, **params):
    """Whole slices along one axis ``a`` picked by an index array: x[:a] + idx.shape + x[a+1:].

    Index modes: ``clip`` clamps; ``fill`` (jnp.take's default) gives ``fill_value`` (NaN for
    floats) for an index outside [0, n); ``promise_in_bounds`` is taken at its word (an index out
    of range still stops the kernel with an error instead of reading outside)."""
    b = ctx.b
    dn = dimension_numbers
    if getattr(dn, "operand_batching_dims", ()) or getattr(dn, "start_indices_batching_dims", ()):
        raise Unsupported("gather with batching dims")
    smap, collapsed = tuple(dn.start_index_map), tuple(dn.collapsed_slice_dims)
    if len(smap) != 1 or collapsed != smap or idx.shape[-1:] != (1,):
        raise Unsupported(f"gather form {dn}")
    (a,) = smap
    r, nb = len(x.shape), len(idx.shape) - 1
    if tuple(slice_sizes) != tuple(1 if d == a else s for d, s in enumerate(x.shape)):
        raise Unsupported("gather of partial slices")
    if tuple(dn.offset_dims) != tuple(range(a)) + tuple(range(a + nb, nb + r - 1)):
        raise Unsupported("gather with the slice dims in another order")
    ind = b.reshape(idx, list(idx.shape[:-1]))
    n = x.shape[a]
    kind = str(mode).rsplit(".", 1)[-1].lower() if mode is not None else "fill_or_drop"
    if "clip" in kind:
        return b.node("gather", [x, b.ew("minimum", b.ew("maximum", ind, 0), n - 1)], axis=a)
    if "promise" in kind:
        return b.node("gather", [x, ind], axis=a)
    if "fill" not in kind:
        raise Unsupported(f"gather mode {mode}")
    ok = b.ew("logical_and", b.ew("ge", ind, 0, dtype=ind.dtype), b.ew("lt", ind, n, dtype=ind.dtype))
    y = b.node("gather", [x, b.where(ok, ind, 0, dtype=ind.dtype)], axis=a)
    fill = fill_value if fill_value is not None else (math.nan if is_float(x.dtype) else 0)
    okb = b.reshape(ok, [1] * a + list(ok.shape) + [1] * (r - 1 - a))
    return b.where(okb, y, fill, dtype=x.dtype)
