"""Lowering rules of the backward ops that AOTAutograd's core-ATen decompositions leave:
convolution and pooling gradients, built from the forward ops (a gradient of a convolution is
a convolution)."""
from __future__ import annotations

import math

import torch

from ...dtypes import Unsupported
from ...graph.ops import window_out
from .lower_nn import _pair, scores
from .registry import lowers

aten = torch.ops.aten


def _dilate(b, x, s: tuple[int, int]):
    """x [N, C, H, W] with s-1 zeros between neighbouring pixels: [N, C, (H-1)*sh+1, (W-1)*sw+1]."""
    if tuple(s) == (1, 1):
        return x
    N, C, H, W = x.shape
    x6 = b.reshape(x, [N, C, H, 1, W, 1])
    if s[0] > 1:
        x6 = b.concat([x6, b.full(0, x.dtype, [N, C, H, s[0] - 1, W, 1])], 3)
    if s[1] > 1:
        x6 = b.concat([x6, b.full(0, x.dtype, [N, C, H, s[0], W, s[1] - 1])], 5)
    x = b.reshape(x6, [N, C, H * s[0], W * s[1]])
    return b.slice(b.slice(x, 2, 0, (H - 1) * s[0] + 1), 3, 0, (W - 1) * s[1] + 1)


def grad_input(b, go, w, in_hw, stride, padding, dilation, groups, extra=None):
    """d(conv)/d(input): the gradient dilated by the stride, convolved with the weight flipped
    in space and transposed per group (input and output channels swapped). ``extra``: the input
    rows and columns after the last window (a transposed convolution's output padding); by
    default those the forward convolution left over."""
    O, Cg, KH, KW = w.shape
    g = groups
    wt = b.reshape(w, [g, O // g, Cg, KH, KW])
    wt = b.reshape(b.materialize(b.flip(b.permute(wt, [0, 2, 1, 3, 4]), [3, 4])), [g * Cg, O // g, KH, KW])
    x = _dilate(b, go, stride)
    lo, hi = [], []
    for d, (n, k, s, p, dl) in enumerate(zip(in_hw, (KH, KW), stride, padding, dilation)):
        edge = dl * (k - 1) - p
        if edge < 0:
            raise Unsupported("convolution gradient with padding wider than the kernel")
        after = (n + 2 * p - dl * (k - 1) - 1) % s if extra is None else extra[d]
        lo.append(edge)
        hi.append(edge + after)
    return b.node("conv2d", [x, wt], stride=(1, 1), padding=tuple(lo), padding_hi=tuple(hi),
                  dilation=tuple(dilation), groups=g)


def _grad_weight(b, go, x, kernel, stride, padding, dilation, groups):
    """d(conv)/d(weight) of a strided or 1x1 convolution as a GEMM per group: the gradient
    [O/g, N*OH*OW] times the input's windows [N*OH*OW, C/g*KH*KW] (a strided view of the padded
    input, copied into rows). Stride-1 kernels, and groups of few channels (depthwise), convolve
    instead (``_grad_weight_conv``): faster for them, slower for strided ones."""
    N, C, H, W = x.shape
    O, (OH, OW), g, (KH, KW) = go.shape[1], go.shape[2:], groups, kernel
    Cg = C // g
    if Cg * KH * KW < 16 or (max(stride) == 1 and KH * KW > 1):
        return _grad_weight_conv(b, go, x, kernel, stride, padding, dilation, groups)
    (ph, pw), (sh, sw), (dh, dw) = padding, stride, dilation
    xp = b.node("pad", [x], pads=((0, 0), (0, 0), (ph, ph), (pw, pw)), value=0.0) if ph or pw else b.materialize(x)
    Hp, Wp = H + 2 * ph, W + 2 * pw
    win = b.as_strided(xp, [N, g, Cg, KH, KW, OH, OW],
                       [C * Hp * Wp, Cg * Hp * Wp, Hp * Wp, dh * Wp, dw, sh * Wp, sw])
    cols = b.reshape(b.permute(win, [1, 0, 5, 6, 2, 3, 4]), [g, N * OH * OW, Cg * KH * KW])
    gr = b.reshape(b.permute(b.reshape(go, [N, g, O // g, OH, OW]), [1, 2, 0, 3, 4]), [g, O // g, N * OH * OW])
    return b.reshape(b.matmul(gr, cols), [O, Cg, KH, KW])


def _grad_weight_conv(b, go, x, kernel, stride, padding, dilation, groups):
    """d(conv)/d(weight): per group, the input (channels as the batch, the batch as channels)
    convolved with the gradient (stride and dilation swap roles)."""
    N, C, H, W = x.shape
    O = go.shape[1]
    g = groups
    xp = b.reshape(b.permute(b.reshape(x, [N, g, C // g, H, W]), [2, 1, 0, 3, 4]), [C // g, g * N, H, W])
    gp = b.reshape(b.permute(b.reshape(go, [N, g, O // g, *go.shape[2:]]), [1, 2, 0, 3, 4]),
                   [O, N, *go.shape[2:]])
    y = b.node("conv2d", [b.materialize(xp), b.materialize(gp)], stride=tuple(dilation), padding=tuple(padding),
               dilation=tuple(stride), groups=g)  # [C/g, O, KH', KW'] with KH' >= KH
    y = b.slice(b.slice(y, 2, 0, kernel[0]), 3, 0, kernel[1])
    return b.permute(y, [1, 0, 2, 3])


@lowers(aten.convolution_backward.default)
def convolution_backward(ctx, go, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding,
                         groups, output_mask):
    b = ctx.b
    if transposed:
        raise Unsupported("gradient of a transposed convolution")
    nd = len(x.shape) - 2
    if nd == 1:  # conv1d as conv2d with H = 1
        outs = convolution_backward(ctx, b.unsqueeze(go, 2), b.unsqueeze(x, 2), b.unsqueeze(w, 2), bias_sizes,
                                    [1, *stride], [0, *padding], [1, *dilation], False, None, groups, output_mask)
        return tuple(None if o is None else b.squeeze(o, [2]) if k < 2 else o for k, o in enumerate(outs))
    if nd != 2:
        raise Unsupported(f"conv{nd}d gradient")
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    gi = gw = gb = None
    if output_mask[0]:
        gi = grad_input(b, go, w, x.shape[2:], stride, padding, dilation, int(groups))
    if output_mask[1]:
        gw = _grad_weight(b, go, x, w.shape[2:], stride, padding, dilation, int(groups))
    if output_mask[2]:
        gb = b.reduce("reduce_sum", go, [0, 2, 3])
    return gi, gw, gb


@lowers(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(ctx, go, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """Each input pixel gathers the gradients of the windows that cover it, divided by their
    divisors: the gradient scaled per window, then the transposed convolution of a ones kernel
    (a depthwise gradient-of-convolution)."""
    b = ctx.b
    x4, go4 = (x, go) if len(x.shape) == 4 else (b.unsqueeze(x, 0), b.unsqueeze(go, 0))
    N, C, H, W = x4.shape
    k, s, p = _pair(kernel_size), _pair(stride or kernel_size), _pair(padding)
    OH, OW = go4.shape[2:]
    if (OH, OW) != (window_out(H, k[0], s[0], p[0], 1, bool(ceil_mode)),
                    window_out(W, k[1], s[1], p[1], 1, bool(ceil_mode))):
        raise Unsupported("avg_pool2d gradient: unexpected output size")
    ones = b.full(1.0, x.dtype, [1, 1, H, W])

    def pool_of_ones(**kw):
        return b.node("pool2d", [ones], mode="avg", kernel=k, stride=s, padding=p, dilation=(1, 1),
                      ceil_mode=bool(ceil_mode), **kw)

    if divisor_override:
        scaled = b.ew("div", go4, float(divisor_override))
    elif ceil_mode:
        # a last window past the input's end has a divisor of its own (as the forward pool
        # computes it): 1 / divisor = (the pool of ones) / (the count of its real pixels)
        real = pool_of_ones(count_include_pad=True, divisor=1)
        mean = pool_of_ones(count_include_pad=bool(count_include_pad), divisor=None)
        scaled = b.ew("mul", go4, b.ew("div", mean, real))
    elif count_include_pad:
        scaled = b.ew("div", go4, float(k[0] * k[1]))
    else:  # the window's count of real pixels: the same pool of ones
        scaled = b.ew("div", go4, pool_of_ones(count_include_pad=True, divisor=1))
    w = b.full(1.0, x.dtype, [C, 1, *k])
    # the rows and columns after the last window (none when, with ceil_mode, it ends past the
    # input: the gradient is then computed that far and cut to the input)
    reach = [(o - 1) * st + kk - 2 * pp for o, st, kk, pp in zip((OH, OW), s, k, p)]
    extra = tuple(max(0, n - r) for n, r in zip((H, W), reach))
    gi = grad_input(b, scaled, b.materialize(w), (H, W), s, p, (1, 1), C, extra=extra)
    if reach[0] > H:
        gi = b.slice(gi, 2, 0, H)
    if reach[1] > W:
        gi = b.slice(gi, 3, 0, W)
    return gi if len(x.shape) == 4 else b.squeeze(gi, [0])


@lowers(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(ctx, go, x):
    b = ctx.b
    (H, W), (OH, OW) = x.shape[-2:], go.shape[-2:]
    if H % OH or W % OW:
        raise Unsupported("adaptive_avg_pool2d gradient with an input size not divisible by the output size")
    k = (H // OH, W // OW)
    return avg_pool2d_backward(ctx, go, x, k, k, 0, False, True, None)


@lowers(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def sdpa_flash_cpu_backward(ctx, go, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None):
    """Attention's gradients from the probabilities recomputed with the saved logsumexp:
    dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = dS K * scale, dK = dS^T Q * scale."""
    b = ctx.b
    if dropout_p:
        raise Unsupported("attention gradient with dropout")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise Unsupported("attention gradient with broadcast heads")
    sc = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    lse = b.unsqueeze(lse, -1)
    p = b.ew("exp", b.ew("sub", scores(b, q, k, attn_mask, is_causal, scale), lse))
    p = b.where(b.node("isinf", [lse]), 0.0, p)  # a row with every key masked: no gradient
    dv = b.matmul(b.transpose(p, -2, -1), go)
    dp = b.matmul(go, b.transpose(v, -2, -1))
    rows = b.reduce("reduce_sum", b.ew("mul", go, out), [-1], True)
    ds = b.ew("mul", p, b.ew("sub", dp, rows))
    dq = b.ew("mul", b.matmul(ds, k), sc)
    dk = b.ew("mul", b.matmul(b.transpose(ds, -2, -1), q), sc)
    return dq, dk, dv
