"""Lowering rules: contractions, convolution, pooling, normalization, fused attention layers."""
from __future__ import annotations

import math

import torch

from ...dtypes import LOW, Unsupported
from ...graph import compose
from .registry import lowers

aten = torch.ops.aten


def _pair(v, default=None):
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return (v, v)
    v = tuple(v)
    return v * 2 if len(v) == 1 else v


@lowers(aten.mm.default, aten.bmm.default)
def mm(ctx, a, c):
    return ctx.b.matmul(a, c)


@lowers(aten.dot.default)
def dot(ctx, a, c):
    return ctx.b.reshape(ctx.b.matmul(ctx.b.unsqueeze(a, 0), ctx.b.unsqueeze(c, 1)), [])


@lowers(aten.addmm.default, aten.baddbmm.default)
def addmm(ctx, bias, a, c, beta=1, alpha=1):
    b = ctx.b
    y = b.matmul(a, c)
    if alpha != 1:
        y = b.ew("mul", y, alpha)
    if beta == 0:
        return y
    return b.ew("add", b.ew("mul", bias, beta) if beta != 1 else bias, y)


@lowers(aten.convolution.default)
def convolution(ctx, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    b = ctx.b
    nd = len(x.shape) - 2
    if transposed:
        return _transposed(ctx, x, w, bias, stride, padding, dilation, output_padding, groups)
    if nd == 1:  # conv1d as conv2d with H = 1
        y = convolution(ctx, b.unsqueeze(x, 2), b.unsqueeze(w, 2), None, [1] + list(stride),
                        [0] + list(padding), [1] + list(dilation), False, None, groups)
        y = b.squeeze(y, [2])
    elif nd == 2:
        y = b.node("conv2d", [x, w], stride=_pair(stride), padding=_pair(padding),
                   dilation=_pair(dilation), groups=int(groups))
    else:
        raise Unsupported(f"conv{nd}d")
    if bias is not None:
        y = b.ew("add", y, b.reshape(bias, [bias.shape[0]] + [1] * nd))
    return y


def _transposed(ctx, x, w, bias, stride, padding, dilation, output_padding, groups):
    """A transposed convolution is the input gradient of the convolution whose weight it takes."""
    from .lower_backward import grad_input

    b = ctx.b
    nd = len(x.shape) - 2
    if nd == 1:
        y = _transposed(ctx, b.unsqueeze(x, 2), b.unsqueeze(w, 2), None, [1, *stride], [0, *padding],
                        [1, *dilation], [0, *output_padding], groups)
        y = b.squeeze(y, [2])
    elif nd == 2:
        s, p, d, op = _pair(stride), _pair(padding), _pair(dilation), _pair(output_padding)
        hw = [(n - 1) * st - 2 * pp + dd * (k - 1) + o + 1
              for n, st, pp, dd, k, o in zip(x.shape[2:], s, p, d, w.shape[2:], op)]
        y = grad_input(b, x, w, hw, s, p, d, int(groups), extra=op)
    else:
        raise Unsupported(f"transposed conv{nd}d")
    if bias is not None:
        y = b.ew("add", y, b.reshape(bias, [bias.shape[0]] + [1] * nd))
    return y


def _batched4(b, x):
    return (b.unsqueeze(x, 0), True) if len(x.shape) == 3 else (x, False)


@lowers(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    b = ctx.b
    x4, un = _batched4(b, x)
    attrs = dict(kernel=_pair(kernel_size), stride=_pair(stride, kernel_size), padding=_pair(padding),
                 dilation=_pair(dilation), ceil_mode=bool(ceil_mode), count_include_pad=False, divisor=None)
    v = b.node("pool2d", [x4], mode="max", **attrs)
    i = b.node("pool2d", [x4], mode="argmax", **attrs)
    return (b.squeeze(v, [0]), b.squeeze(i, [0])) if un else (v, i)


@lowers(aten.avg_pool2d.default)
def avg_pool2d(ctx, x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    b = ctx.b
    x4, un = _batched4(b, x)
    y = b.node("pool2d", [x4], mode="avg", kernel=_pair(kernel_size), stride=_pair(stride, kernel_size),
               padding=_pair(padding), dilation=(1, 1), ceil_mode=bool(ceil_mode),
               count_include_pad=bool(count_include_pad), divisor=divisor_override)
    return b.squeeze(y, [0]) if un else y


@lowers(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(ctx, x, output_size):
    (h, w), (oh, ow) = x.shape[-2:], _pair(output_size)
    if h % oh or w % ow:
        raise Unsupported("adaptive_max_pool2d with an input size not divisible by the output size")
    k = (h // oh, w // ow)
    return max_pool2d_with_indices(ctx, x, k, k)


@lowers(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(ctx, x, output_size):
    return ctx.b.node("adaptive_avg_pool2d", [x], out=_pair(output_size))


@lowers(aten.native_layer_norm.default)
def native_layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    return compose.layer_norm(ctx.b, x, len(normalized_shape), weight, bias, eps)


@lowers(aten._native_batch_norm_legit_no_training.default)
def batch_norm_no_training(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    b = ctx.b
    y = compose.batch_norm_eval(b, x, weight, bias, running_mean, running_var, eps)
    return y, b.full(0, x.dtype, (0,)), b.full(0, x.dtype, (0,))


@lowers(aten.native_batch_norm.default, aten._native_batch_norm_legit.default)
def native_batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training:
        raise Unsupported("batch norm in training mode (mutates running stats)")
    return batch_norm_no_training(ctx, x, weight, bias, running_mean, running_var, momentum, eps)


@lowers(aten.native_group_norm.default)
def native_group_norm(ctx, x, weight, bias, N, C, HxW, group, eps):
    b = ctx.b
    xg = b.reshape(x, [N, group, -1])
    _, m, rstd = compose.layer_norm(b, xg, 1, None, None, eps)
    y = b.reshape(b.ew("mul", b.ew("sub", xg, m), rstd), list(x.shape))
    r = len(x.shape)
    if weight is not None:
        y = b.ew("mul", y, compose.channel(b, weight, r))
    if bias is not None:
        y = b.ew("add", y, compose.channel(b, bias, r))
    return y, b.reshape(m, [N, group]), b.reshape(rstd, [N, group])


# ---------------------------------------------------------------- attention layers
def scores(b, q, k, mask=None, causal=False, scale=None):
    """q k^T * scale with the causal mask and ``mask`` applied, over [..., L, D] tensors."""
    d = q.shape[-1]
    s = b.ew("mul", b.matmul(q, b.transpose(k, -2, -1)), scale if scale is not None else 1 / math.sqrt(d))
    if causal:
        L, S = q.shape[-2], k.shape[-2]
        rows = b.reshape(b.iota(L, "int64"), [L, 1])
        cols = b.reshape(b.iota(S, "int64"), [1, S])
        s = b.where(b.ew("le", cols, rows), s, float("-inf"))
    if mask is not None:
        s = b.where(mask, s, float("-inf")) if mask.dtype == "bool" else b.ew("add", s, mask)
    return s


def _attention(b, q, k, v, mask=None, causal=False, scale=None, safe=False):
    """softmax(q k^T * scale + mask) v over [..., L, D] tensors; returns (out, probs, scores).
    ``safe``: a row whose every key is masked gets zeros (SDPA's kernels), not NaN."""
    s = scores(b, q, k, mask, causal, scale)
    p = compose.softmax(b, s, -1)
    if safe:  # where(not any(s != -inf), 0, p): the form graph.attention folds into its kernel
        kept = b.reduce("reduce_max", b.node("logical_not", [b.ew("eq", s, float("-inf"))]), [-1], True)
        p = b.where(b.node("logical_not", [kept]), 0.0, p)
    return b.matmul(p, v), p, s


def repeat_kv_heads(b, q, kv):
    """Grouped-query attention: each key/value head serves ``Hq / Hkv`` consecutive query heads
    ([B, Hkv, S, D] -> [B, Hq, S, D], as eager's repeat_interleave)."""
    if len(q.shape) < 3 or q.shape[-3] == kv.shape[-3]:
        return kv
    hq, hkv = q.shape[-3], kv.shape[-3]
    if hkv == 1 or hq % hkv:
        if hkv == 1:
            return kv
        raise Unsupported(f"attention with {hq} query heads and {hkv} key/value heads")
    lead, (S, D) = list(kv.shape[:-3]), kv.shape[-2:]
    x = b.expand(b.unsqueeze(kv, -3), lead + [hkv, hq // hkv, S, D])
    return b.reshape(x, lead + [hq, S, D])


@lowers(aten._scaled_dot_product_flash_attention_for_cpu.default)
def sdpa_flash_cpu(ctx, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """(out, logsumexp of the scores per query row): the second output is what the backward op
    reads (torch's own decomposition returns the probabilities there, which only inference may
    ignore). Unused, the logsumexp is dead code and the attention stays one fused kernel."""
    b = ctx.b
    if dropout_p:
        raise Unsupported("attention with dropout")
    k, v = repeat_kv_heads(b, q, k), repeat_kv_heads(b, q, v)
    out, _, s = _attention(b, q, k, v, attn_mask, is_causal, scale, safe=True)
    if s.dtype in LOW:  # (eager's logsumexp of half-precision attention is float32)
        s = b.cast(s, "float32")
    m = b.reduce("reduce_max", s, [-1], True)
    m = b.where(b.node("isinf", [m]), 0.0, m)  # a row of -inf only: no inf - inf
    lse = b.ew("add", b.ew("log", b.reduce("reduce_sum", b.ew("exp", b.ew("sub", s, m)), [-1], True)), m)
    return out, b.squeeze(lse, [-1])


def _outputs_used(ctx) -> set[int]:
    import operator

    return {u.args[1] for u in ctx.node.users if u.target is operator.getitem}


@lowers(aten._scaled_dot_product_flash_attention.default)
def sdpa_flash_cuda(ctx, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """SDPA's FlashAttention op of CUDA tensors: (out, logsumexp[B, H, L], then the sequence
    lengths and RNG state its backward reads, which only inference may leave undefined)."""
    if _outputs_used(ctx) - {0, 1}:
        raise Unsupported("the CUDA flash attention op's RNG and length outputs are used (training)")
    out, lse = sdpa_flash_cpu(ctx, q, k, v, dropout_p, is_causal, scale=scale)
    return (out, lse) + (None,) * 7


@lowers(aten._scaled_dot_product_efficient_attention.default)
def sdpa_efficient_cuda(ctx, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *,
                        scale=None):
    """SDPA's memory-efficient op of CUDA tensors (an additive ``attn_bias`` allowed): its output
    only; its logsumexp (padded to 32 rows) and RNG outputs serve the backward op."""
    if _outputs_used(ctx) - {0}:
        raise Unsupported("the CUDA efficient attention op's logsumexp or RNG outputs are used (training)")
    out, _ = sdpa_flash_cpu(ctx, q, k, v, dropout_p, is_causal, attn_mask=attn_bias, scale=scale)
    return (out, None, None, None)


def _mha(b, query, key, value, E, H, w_in, b_in, w_out, b_out, mask=None):
    """nn.MultiheadAttention with batch-first [B, L, E] inputs; returns (out, probs[B,H,L,S])."""
    D = E // H

    def proj(x, part):
        w = b.slice(w_in, 0, part * E, (part + 1) * E)
        bias = b.slice(b_in, 0, part * E, (part + 1) * E) if b_in is not None else None
        y = compose.linear(b, x, w, bias)
        return b.permute(b.reshape(y, [x.shape[0], x.shape[1], H, D]), [0, 2, 1, 3])

    q, k, v = proj(query, 0), proj(key, 1), proj(value, 2)
    o, p, _ = _attention(b, q, k, v, mask)
    o = b.reshape(b.permute(o, [0, 2, 1, 3]), [query.shape[0], query.shape[1], E])
    return compose.linear(b, o, w_out, b_out), p


def _mask_for(b, mask, mask_type, B, L):
    if mask is None:
        return None
    if mask_type == 1 or (len(mask.shape) == 2 and mask.shape == (B, L) and B != L):
        # key padding mask [B, S]: True means "ignore"
        m = b.reshape(mask, [B, 1, 1, mask.shape[1]])
    else:
        m = mask
    if m.dtype == "bool":
        return b.ew("logical_not", m)  # _attention keeps True positions
    return m


@lowers(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer(ctx, src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                              use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                              ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    b = ctx.b
    if len(src.shape) != 3:
        raise Unsupported("_transformer_encoder_layer_fwd on a nested or unbatched input")
    B, L, _ = src.shape
    m = _mask_for(b, mask, mask_type, B, L)

    def sa(x):
        return _mha(b, x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, m)[0]

    def ff(x):
        h = compose.linear(b, x, ffn_weight_1, ffn_bias_1)
        h = compose.gelu(b, h) if use_gelu else b.ew("relu", h)
        return compose.linear(b, h, ffn_weight_2, ffn_bias_2)

    def ln(x, w, bias):
        return compose.layer_norm(b, x, 1, w, bias, eps)[0]

    x = src
    if norm_first:
        x = b.ew("add", x, sa(ln(x, norm_weight_1, norm_bias_1)))
        x = b.ew("add", x, ff(ln(x, norm_weight_2, norm_bias_2)))
    else:
        x = ln(b.ew("add", x, sa(x)), norm_weight_1, norm_bias_1)
        x = ln(b.ew("add", x, ff(x)), norm_weight_2, norm_bias_2)
    return x


@lowers(aten._native_multi_head_attention.default)
def native_mha(ctx, query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
               mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    b = ctx.b
    if len(query.shape) != 3:
        raise Unsupported("_native_multi_head_attention on an unbatched input")
    m = _mask_for(b, mask, mask_type, query.shape[0], key.shape[1])
    out, p = _mha(b, query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, m)
    if not need_weights:
        return out, b.full(0, out.dtype, (0,))
    return out, compose.mean(b, p, [1]) if average_attn_weights else p
