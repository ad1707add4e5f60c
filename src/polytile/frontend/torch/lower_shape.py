"""Lowering rules: views (folded into strided index maps), concatenation, padding, indexing."""
from __future__ import annotations

import torch

from ...dtypes import Unsupported
from ...graph.ir import Node
from .registry import lowers

aten = torch.ops.aten


@lowers(aten._assert_tensor_metadata.default)
def assert_tensor_metadata(ctx, x, size=None, stride=None, dtype=None, *, device=None, layout=None):
    """A check that ``torch.export`` puts before a ``.to(dtype)``: the trace made it on the
    example inputs and the guards keep the types and shapes, so it computes nothing. One the
    traced value does not meet is left to ATen, which raises the error."""
    v = ctx.node.args[0].meta.get("val")
    if not isinstance(v, torch.Tensor) or (dtype is not None and v.dtype != dtype) or (
            size is not None and tuple(v.shape) != tuple(size)):
        raise Unsupported("tensor metadata differs from the traced value")
    return None


@lowers(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(ctx, x, shape):
    return ctx.b.reshape(x, list(shape))


@lowers(aten.permute.default)
def permute(ctx, x, dims):
    return ctx.b.permute(x, list(dims))


@lowers(aten.transpose.int)
def transpose(ctx, x, a, c):
    return ctx.b.transpose(x, a, c)


@lowers(aten.t.default)
def t(ctx, x):
    return ctx.b.transpose(x, 0, 1) if len(x.shape) == 2 else x


@lowers(aten.expand.default)
def expand(ctx, x, shape, implicit=False):
    return ctx.b.expand(x, list(shape))


@lowers(aten.slice.Tensor)
def slice_(ctx, x, dim=0, start=None, end=None, step=1):
    n = x.shape[dim]
    if end is None or (isinstance(end, int) and end >= 2**62):  # to the end (of a size that may be symbolic)
        end = n
    return ctx.b.slice(x, dim, 0 if start is None else start, end if end is n else min(end, n), step)


@lowers(aten.narrow.default)
def narrow(ctx, x, dim, start, length):
    return ctx.b.slice(x, dim, start, start + length)


@lowers(aten.select.int)
def select(ctx, x, dim, index):
    return ctx.b.select(x, dim, index)


@lowers(aten.unsqueeze.default)
def unsqueeze(ctx, x, dim):
    return ctx.b.unsqueeze(x, dim)


@lowers(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def squeeze(ctx, x, dim=None):
    return ctx.b.squeeze(x, None if dim is None else ([dim] if isinstance(dim, int) else list(dim)))


@lowers(aten.as_strided.default)
def as_strided(ctx, x, size, stride, storage_offset=None):
    """``storage_offset`` counts from the start of x's storage, but the graph holds that storage
    only from its IR base on: x starts ``off_in_base`` into the base and ``val.storage_offset()``
    into the storage. A view reaching outside the base cannot be compiled."""
    val = ctx.node.args[0].meta.get("val")
    if val is None:
        raise Unsupported("as_strided: no example value for its input")
    base, _, _, off_in_base = ctx.b.strided(x)
    if storage_offset is None:  # ATen: the input's own storage offset
        storage_offset = val.storage_offset()
    start = storage_offset - val.storage_offset() + off_in_base
    last = start + sum((n - 1) * st for n, st in zip(size, stride)) if all(size) else start
    if start < 0 or last >= max(base.numel, 1) or any(st < 0 for st in stride):
        raise Unsupported("as_strided reaching outside the storage the graph sees")
    return ctx.b.as_strided(x, list(size), list(stride), start)


@lowers(aten.as_strided_scatter.default)
def as_strided_scatter(ctx, x, src, size, stride, storage_offset=None):
    """x with the elements of its as_strided(size, stride, storage_offset) view set to src: an
    index_put on x's elements in memory order, at the view's positions (offset plus the sum of
    iota times stride over the view's dims). For a contiguous x starting its storage (the
    functionalized graphs' bases), whose memory order is its element order."""
    b = ctx.b
    val = ctx.node.args[0].meta.get("val")
    if val is None or not val.is_contiguous() or val.storage_offset() != 0:
        raise Unsupported("as_strided_scatter into a tensor that is not a contiguous storage of its own")
    off = 0 if storage_offset is None else int(storage_offset)
    n = max(1, x.numel)
    last = off + sum((k - 1) * st for k, st in zip(size, stride)) if all(size) else off
    if off < 0 or last >= n or any(st < 0 for st in stride) or not all(size):
        raise Unsupported("as_strided_scatter reaching outside its input")
    idx = b.full(off, "int64")
    for d, (k, st) in enumerate(zip(size, stride)):
        step = b.ew("mul", b.iota(k, "int64"), b.full(int(st), "int64"))
        idx = b.ew("add", idx, b.reshape(step, [1] * d + [k] + [1] * (len(size) - d - 1)))
    count = 1
    for k in size:
        count *= k
    idx = b.reshape(b.expand(idx, list(size)), [count])
    vals = b.reshape(b.cast(src, x.dtype), [count])
    flat = b.reshape(x, [n])
    return b.reshape(b.node("index_put", [flat, vals, idx], dims=(0,), accumulate=False, wrap=False), list(x.shape))


@lowers(aten.split.Tensor)
def split(ctx, x, split_size, dim=0):
    n = x.shape[dim]
    return tuple(ctx.b.slice(x, dim, s, min(s + split_size, n)) for s in range(0, max(n, 1), split_size))


@lowers(aten.split_with_sizes.default)
def split_with_sizes(ctx, x, sizes, dim=0):
    out, s = [], 0
    for k in sizes:
        out.append(ctx.b.slice(x, dim, s, s + k))
        s += k
    return tuple(out)


@lowers(aten.unbind.int)
def unbind(ctx, x, dim=0):
    return tuple(ctx.b.select(x, dim, k) for k in range(x.shape[dim]))


@lowers(aten.cat.default)
def cat(ctx, xs, dim=0):
    dt = ctx.out_dtype
    xs = [ctx.b.cast(x, dt) for x in xs if not (len(x.shape) == 1 and x.shape[0] == 0)]
    if not xs:
        return ctx.b.full(0, dt, ctx.out_shape)
    return ctx.b.concat(xs, dim)


@lowers(aten.stack.default)
def stack(ctx, xs, dim=0):
    return ctx.b.concat([ctx.b.unsqueeze(x, dim) for x in xs], dim)


@lowers(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, x, pad, value=0):
    pads = [(0, 0)] * len(x.shape)
    for k in range(len(pad) // 2):
        pads[len(x.shape) - 1 - k] = (pad[2 * k], pad[2 * k + 1])
    return ctx.b.node("pad", [x], pads=tuple(pads), value=ctx.b.full(value, x.dtype).attr("value"))


@lowers(aten.index_select.default)
def index_select(ctx, x, dim, index):
    if not index.shape:  # a 0-d index keeps the dim (size 1)
        index = ctx.b.reshape(index, [1])
    if not x.shape:  # a 0-d input is a 1-element dim 0; the result stays 0-d
        return ctx.b.reshape(ctx.b.node("gather", [ctx.b.reshape(x, [1]), index], axis=0), [])
    return ctx.b.node("gather", [x, index], axis=dim % len(x.shape))


@lowers(aten.embedding.default)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return ctx.b.node("gather", [weight, indices], axis=0)


@lowers(aten.gather.default)
def gather(ctx, x, dim, index, sparse_grad=False):
    if not x.shape:  # a 0-d input is a 1-element dim 0; the result has the index's shape
        flat = ctx.b.reshape(index, [index.numel])
        return ctx.b.reshape(ctx.b.node("take_along", [ctx.b.reshape(x, [1]), flat], axis=0), list(index.shape))
    return ctx.b.node("take_along", [x, index], axis=dim % len(x.shape))


@lowers(aten.index.Tensor)
def index(ctx, x, indices):
    """x[..., i0, ..., i1, ...]: advanced indexing with integer index tensors (None: a full dim).
    Negative indices count from the end, as in Python (index_select / embedding raise instead)."""
    given = [(k, i) for k, i in enumerate(indices) if i is not None]
    if not given or any(not isinstance(i, Node) or i.dtype in ("bool", "uint8") for _, i in given):
        raise Unsupported("aten.index with a boolean (mask) index")
    if len(given) == 1:
        k, idx = given[0]
        return ctx.b.node("gather", [x, idx], axis=k, wrap=True)
    return ctx.b.node("index_nd", [x] + [i for _, i in given], dims=tuple(k for k, _ in given), wrap=True)


@lowers(aten.index_put.default)
def index_put(ctx, x, indices, values, accumulate=False):
    """x with x[..., i0, ..., i1, ...] set to values (accumulate: increased by them)."""
    b = ctx.b
    given = [(k, i) for k, i in enumerate(indices) if i is not None]
    if len(given) == 1 and isinstance(given[0][1], Node) and given[0][1].dtype == "bool":
        return _masked_put(ctx, x, given[0], values, accumulate)
    if not given or any(not isinstance(i, Node) or i.dtype in ("bool", "uint8") for _, i in given):
        raise Unsupported("aten.index_put with a boolean (mask) index")
    if accumulate and x.dtype == "bool":
        raise Unsupported("index_put accumulating booleans")
    values = b.cast(values, x.dtype) if isinstance(values, Node) else b.full(values, x.dtype)
    return b.node("index_put", [x, values] + [i for _, i in given], dims=tuple(k for k, _ in given),
                  accumulate=bool(accumulate), wrap=True)


def _masked_put(ctx, x, given, values, accumulate):
    """x[mask] = v (or += v) with one value for every selected element: a select, mask
    broadcast over the dims after the ones it covers."""
    b = ctx.b
    k, mask = given
    trailing = list(x.shape[k + len(mask.shape):])
    if tuple(mask.shape) != tuple(x.shape[k:k + len(mask.shape)]):
        raise Unsupported("index_put with a boolean mask of another shape than the dims it covers")
    if not isinstance(values, Node):
        values = b.full(values, x.dtype)
    vshape = list(values.shape)
    while vshape and vshape[0] == 1 and len(vshape) > len(trailing):
        vshape.pop(0)
    if len(vshape) > len(trailing) or any(v not in (1, t) for v, t in zip(vshape[::-1], trailing[::-1])):
        raise Unsupported("index_put with a boolean mask and values per selected element (data-dependent shape)")
    m = b.reshape(mask, [1] * k + list(mask.shape) + [1] * len(trailing))
    v = b.reshape(b.cast(values, x.dtype), vshape)
    return b.where(m, b.ew("add", x, v) if accumulate else v, x)


@lowers(aten.slice_scatter.default)
def slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    """x with x[..., start:end:step, ...] = src: the untouched parts and src concatenated
    (step 1), else an index_put along the dim."""
    b = ctx.b
    dim %= len(x.shape)
    n = x.shape[dim]
    start = 0 if start is None else (start + n if start < 0 else start)
    end = n if end is None else min(n, end + n if end < 0 else end)
    src = b.cast(src, x.dtype)
    if step == 1:
        parts = [b.slice(x, dim, 0, start), src, b.slice(x, dim, end, n)]
        return b.materialize(b.concat([p for p in parts if p.shape[dim] > 0], dim))
    r = len(x.shape)
    idx = b.ew("add", b.ew("mul", b.iota(src.shape[dim], "int64"), step), start)
    return b.node("index_put", [x, src, idx], dims=(dim,), accumulate=False, wrap=False)


@lowers(aten.flip.default)
def flip(ctx, x, dims):
    return ctx.b.flip(x, dims)


@lowers(aten.unfold.default)
def unfold(ctx, x, dim, size, step):
    """Windows of ``size`` every ``step`` along ``dim`` as a new last dim: a view."""
    b = ctx.b
    if not x.shape:
        return b.reshape(x, [1])
    _, xs, st, _ = b.strided(x)
    dim %= len(xs)
    shape, strides = list(xs), list(st)
    shape[dim] = (xs[dim] - size) // step + 1
    strides[dim] = st[dim] * step
    return b._view(x, shape + [size], strides + [st[dim]])


def _scatter(ctx, x, dim, index, src, accumulate):
    """x[..., index[i], ...] (+)= src[i] for every position i of index: an index_put with index on
    ``dim`` and the position itself on every other dim."""
    b = ctx.b
    if not x.shape:  # a 0-d tensor: a 1-element dim 0
        one = [b.reshape(t, [1]) if isinstance(t, Node) else t for t in (x, index, src)]
        return b.reshape(_scatter(ctx, one[0], 0, one[1], one[2], accumulate), [])
    if len(index.shape) != len(x.shape):
        raise Unsupported("scatter with an index of another rank")
    dim %= len(x.shape)
    r = len(x.shape)
    inds = [index if d == dim else b.reshape(b.iota(n, "int64"), [n if k == d else 1 for k in range(r)])
            for d, n in enumerate(index.shape)]
    if isinstance(src, Node):
        for d, n in enumerate(index.shape):
            if src.shape[d] != n:
                src = b.slice(src, d, 0, n)
        src = b.cast(src, x.dtype)
    else:
        src = b.full(src, x.dtype)
    return b.node("index_put", [x, src] + inds, dims=tuple(range(r)), accumulate=accumulate, wrap=False)


@lowers(aten.scatter_add.default)
def scatter_add(ctx, x, dim, index, src):
    return _scatter(ctx, x, dim, index, src, True)


@lowers(aten.scatter.src, aten.scatter.value)
def scatter(ctx, x, dim, index, src):
    return _scatter(ctx, x, dim, index, src, False)


@lowers(aten.repeat.default)
def repeat(ctx, x, repeats):
    b = ctx.b
    lead = len(repeats) - len(x.shape)
    x = b.reshape(x, [1] * lead + list(x.shape))
    # [s0, s1] x [r0, r1] -> expand to [r0, s0, r1, s1] then reshape
    inter, out = [], []
    for s, r in zip(x.shape, repeats):
        inter += [r, s]
        out.append(s * r)
    y = b.reshape(x, [v for s in x.shape for v in (1, s)])
    return b.reshape(b.materialize(b.expand(y, inter)), out)


def _tri(ctx, x, diagonal, upper):
    b = ctx.b
    r, c = x.shape[-2:]
    rows = b.reshape(b.iota(r, "int64"), [r, 1])
    cols = b.reshape(b.iota(c, "int64"), [1, c])
    d = b.ew("sub", cols, rows)
    keep = b.ew("ge" if upper else "le", d, int(diagonal))
    return b.where(keep, x, 0, dtype=x.dtype)


@lowers(aten.triu.default)
def triu(ctx, x, diagonal=0):
    return _tri(ctx, x, diagonal, True)


@lowers(aten.tril.default)
def tril(ctx, x, diagonal=0):
    return _tri(ctx, x, diagonal, False)
