"""The attention op as the GPU backend builds it: one online-softmax nest per query row.

    for batch..., l (parallel):
        m = -inf; s = 0; acc[e] = 0
        for j in keys:
            sc = sum_d q[l, d] * kt[d, j]; x = steps(sc)   (scale, masks, causal)
            mn = max(m, x); corr = exp(m - mn); p = exp(x - mn)
            s = s * corr + p; acc[e] = acc[e] * corr + p * v[j, e]; m = mn
        out[l, e] = acc[e] / s   (rows with every key masked: 0 or NaN, as eager)

The nest states the computation key by key; the Triton renderer's ``flash`` form
(``codegen.triton_flash``) runs it as tiles of query rows against blocks of keys with two
``tl.dot`` per block, the scores never leaving registers. Any other form (after fusion
changed the nest) still computes it, row by row.

The nest itself is target-neutral (``affine.attention.online_softmax_nest``).
"""
from __future__ import annotations

from ...affine.attention import online_softmax_nest as lower_attention

__all__ = ["lower_attention"]
