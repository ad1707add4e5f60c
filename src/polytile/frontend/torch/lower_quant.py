"""Lowering rules: the quantize/dequantize ops of PyTorch 2 export quantization
(``quantized_decomposed``, what ``convert_pt2e`` leaves around linear layers and
convolutions; with dynamic quantization, ``choose_qparams`` and the ops taking their
parameters as tensors), as their reference implementations compute them
(``torch.ao.quantization.fx._decomposed``): elementwise float32 arithmetic and casts.

A quantized linear layer is then ``dequantize(quantize(x)) @ dequantize(int8 weight).T``;
``graph.quantized`` rewrites such contractions to run on the integer values (int8 dot products
where the machine has them) and relies on the exact forms these rules build."""
from __future__ import annotations

import torch

from ...dtypes import Unsupported, from_torch
from ...graph import compose
from .registry import lowers

try:  # (registers torch.ops.quantized_decomposed)
    import torch.ao.quantization.fx._decomposed  # noqa: F401
    qd = torch.ops.quantized_decomposed
    _OPS = (qd.quantize_per_tensor.default, qd.dequantize_per_tensor.default, qd.dequantize_per_channel.default,
            qd.quantize_per_channel.default, qd.choose_qparams.tensor, qd.quantize_per_tensor.tensor,
            qd.dequantize_per_tensor.tensor)
except (ImportError, AttributeError):  # pragma: no cover - a torch without them
    _OPS = ()


def _float_args(scale, zero_point):
    if not isinstance(scale, (int, float)) or not isinstance(zero_point, int):
        raise Unsupported("quantization parameters given as tensors")


if _OPS:
    @lowers(qd.quantize_per_tensor.default)
    def quantize_per_tensor(ctx, x, scale, zero_point, quant_min, quant_max, dtype):
        """clamp(round(x * (1 / scale)) + zero_point, quant_min, quant_max) in float32 (round:
        half to even), then the integer type."""
        _float_args(scale, zero_point)
        b = ctx.b
        v = b.ew("round", b.ew("mul", b.cast(x, "float32"), 1.0 / scale))
        v = compose.clamp(b, b.ew("add", v, zero_point), b.scalar_or(quant_min, "float32"),
                          b.scalar_or(quant_max, "float32"))
        return b.cast(v, from_torch(dtype))

    @lowers(qd.dequantize_per_tensor.default)
    def dequantize_per_tensor(ctx, x, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
        """(x in the output type - zero_point) * scale."""
        _float_args(scale, zero_point)
        b = ctx.b
        return b.ew("mul", b.ew("sub", b.cast(x, from_torch(out_dtype or torch.float32)), zero_point), scale)

    def _per_channel(b, t, axis: int, ndim: int):
        shape = [1] * ndim
        shape[axis] = t.shape[0]
        return b.reshape(t, shape)

    @lowers(qd.dequantize_per_channel.default)
    def dequantize_per_channel(ctx, x, scales, zero_points, axis, quant_min, quant_max, dtype, *, out_dtype=None):
        """(x - zero_points[c]) * scales[c] along ``axis`` (integer difference, then the scales'
        type), in the output type."""
        b = ctx.b
        axis = axis % len(x.shape)
        v = x if zero_points is None else b.ew("sub", x, _per_channel(b, zero_points, axis, len(x.shape)))
        v = b.ew("mul", v, _per_channel(b, scales, axis, len(x.shape)))
        return b.cast(v, from_torch(out_dtype or torch.float32))

    @lowers(qd.quantize_per_channel.default)
    def quantize_per_channel(ctx, x, scales, zero_points, axis, quant_min, quant_max, dtype):
        """clamp(round(x * (1 / scales[c])) + zero_points[c], quant_min, quant_max) along ``axis``."""
        b = ctx.b
        axis = axis % len(x.shape)
        inv = b.ew("div", 1.0, _per_channel(b, scales, axis, len(x.shape)))
        v = b.ew("round", b.ew("mul", b.cast(x, "float32"), inv))
        v = b.ew("add", v, _per_channel(b, zero_points, axis, len(x.shape)))
        v = compose.clamp(b, v, b.scalar_or(quant_min, v.dtype), b.scalar_or(quant_max, v.dtype))
        return b.cast(v, from_torch(dtype))

    @lowers(qd.choose_qparams.tensor)
    def choose_qparams(ctx, x, quant_min, quant_max, eps, dtype):
        """Dynamic quantization's parameters of x per tensor, as ``determine_qparams`` computes
        them (affine): the range [min(x, 0), max(x, 0)] over quant_max - quant_min steps, at
        least eps, in float32; the zero point quant_min - round(min / scale), clamped. The
        scale as eager returns it (float64 of that float32 value), both of shape [1]."""
        b = ctx.b
        x = b.cast(x, "float32")
        lo = b.ew("minimum", b.reduce("reduce_min", x, None), 0.0)
        hi = b.ew("maximum", b.reduce("reduce_max", x, None), 0.0)
        scale = b.ew("maximum", b.ew("div", b.ew("sub", hi, lo), float(quant_max - quant_min)), b.full(eps, "float32"))
        zp = b.ew("sub", float(quant_min), b.node("round", [b.ew("div", lo, scale)]))
        zp = compose.clamp(b, zp, b.full(quant_min, "float32"), b.full(quant_max, "float32"))
        return b.reshape(b.cast(scale, "float64"), [1]), b.reshape(b.cast(zp, "int64"), [1])

    @lowers(qd.quantize_per_tensor.tensor)
    def quantize_per_tensor_tensor(ctx, x, scale, zero_point, quant_min, quant_max, dtype):
        """``quantize_per_tensor`` with one-element tensors for its parameters (dynamic
        quantization): the reciprocal of the scale in float64, then float32, as eager takes it
        from ``scale.item()``."""
        b = ctx.b
        inv = b.cast(b.ew("div", 1.0, b.cast(b.reshape(scale, []), "float64")), "float32")
        v = b.ew("add", b.node("round", [b.ew("mul", b.cast(x, "float32"), inv)]),
                 b.cast(b.reshape(zero_point, []), "float32"))
        v = compose.clamp(b, v, b.full(quant_min, "float32"), b.full(quant_max, "float32"))
        return b.cast(v, from_torch(dtype))

    @lowers(qd.dequantize_per_tensor.tensor)
    def dequantize_per_tensor_tensor(ctx, x, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
        """``dequantize_per_tensor`` with one-element tensors for its parameters."""
        b = ctx.b
        t = from_torch(out_dtype or torch.float32)
        return b.ew("mul", b.ew("sub", b.cast(x, t), b.cast(b.reshape(zero_point, []), t)),
                    b.cast(b.reshape(scale, []), t))
