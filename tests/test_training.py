"""Training through polytile: the backward ops are lowered (no ATen fallback) and gradients,
and the weights after optimizer steps, match eager."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import polytile
from accuracy import assert_accurate

aten = torch.ops.aten


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="polytile")


def _no_fallback():
    st = polytile.stats()
    assert st["ops_fallen_back"] == {} and st["graphs_compiled"] >= 1, st


# N C H W O k stride pad dilation groups
CONV_CASES = [(2, 3, 8, 8, 4, 3, 1, 1, 1, 1), (2, 4, 9, 7, 6, 3, 2, 1, 1, 2), (1, 4, 10, 10, 4, 3, 1, 1, 1, 4),
              (2, 3, 11, 11, 5, 5, 2, 2, 1, 1), (1, 6, 12, 12, 6, 3, 1, 2, 2, 3), (2, 8, 7, 7, 16, 1, 2, 0, 1, 1),
              (1, 3, 16, 16, 8, 7, 2, 3, 1, 1)]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c)))
def test_convolution_backward(case):
    N, C, H, W, O, k, s, p, d, g = case
    x, w = torch.randn(N, C, H, W), torch.randn(O, C // g, k, k)
    go = torch.randn_like(F.conv2d(x, w, None, s, p, d, g))

    def f(go, x, w):
        return aten.convolution_backward(go, x, w, [O], [s, s], [p, p], [d, d], False, [0, 0], g, [True, True, True])

    for a, r in zip(_compiled(f)(go, x, w), f(go, x, w)):
        torch.testing.assert_close(a, r, atol=1e-4, rtol=1e-4)
    _no_fallback()


def test_conv1d_backward_and_partial_output_mask():
    x, w = torch.randn(2, 4, 20), torch.randn(6, 2, 3)
    go = torch.randn_like(F.conv1d(x, w, None, 2, 1, 1, 2))

    def f(go, x, w):
        return aten.convolution_backward(go, x, w, None, [2], [1], [1], False, [0], 2, [False, True, False])

    out, ref = _compiled(f)(go, x, w), f(go, x, w)
    assert out[0] is None and out[2] is None
    torch.testing.assert_close(out[1], ref[1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("k,s,p,include_pad,ceil", [(2, 2, 0, True, False), (3, 2, 1, True, False),
                                                   (3, 2, 1, False, False), (3, 1, 1, False, False),
                                                   # ceil_mode: a last window past the input's end
                                                   (3, 2, 0, True, True), (2, 2, 1, False, True),
                                                   (3, 3, 1, True, True)])
def test_avg_pool_backward(k, s, p, include_pad, ceil):
    x = torch.randn(2, 3, 8, 10)
    go = torch.randn_like(F.avg_pool2d(x, k, s, p, ceil, include_pad))

    def f(go, x):
        return aten.avg_pool2d_backward(go, x, [k, k], [s, s], [p, p], ceil, include_pad, None)

    torch.testing.assert_close(_compiled(f)(go, x), f(go, x), atol=1e-5, rtol=1e-5)
    _no_fallback()


@pytest.mark.parametrize("causal,mask", [(False, None), (True, None), (False, "bool"), (False, "float")])
def test_attention_gradients(causal, mask):
    torch.manual_seed(0)
    q, k, v = [torch.randn(2, 3, 5, 8, requires_grad=True) for _ in range(3)]
    m = None if mask is None else (torch.rand(5, 5) > 0.3) | torch.eye(5, dtype=torch.bool) \
        if mask == "bool" else torch.randn(5, 5)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal)

    go = torch.randn(2, 3, 5, 8)
    out = _compiled(f)(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), go)
    ref = f(q, k, v)
    for a, r in zip((out, *grads), (ref, *torch.autograd.grad(ref, (q, k, v), go))):
        torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-5)
    _no_fallback()


def test_attention_logsumexp_output():
    """The CPU flash-attention op's second output is the logsumexp of each score row."""
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)

    def f(q, k, v):
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)

    (o, lse), (ro, rlse) = _compiled(f)(q, k, v), f(q, k, v)
    assert lse.shape == rlse.shape == (2, 4, 3)
    torch.testing.assert_close(o, ro, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, rlse, atol=1e-5, rtol=1e-5)


def _index_cases():
    def put(x, i, v):
        x = x.clone()
        x[:, i] = v
        return x

    def acc(x, i, j, v):
        x = x.clone()
        x[i, :, j] += v  # dims apart: the region's index dims go first
        return x

    return {
        "index_put_accumulate": (lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True),
                                 (torch.randn(10, 4), torch.tensor([1, 3, 1, -2, 1]), torch.randn(5, 4))),
        "index_put_middle_dim": (put, (torch.randn(3, 6, 2), torch.tensor([5, 0, 2]), torch.randn(3, 3, 2))),
        "index_put_dims_apart": (acc, (torch.randn(4, 3, 5), torch.tensor([0, 3, 0]), torch.tensor([4, -1, 4]),
                                       torch.randn(3, 3))),
        "scatter_add": (lambda x, i, s: x.scatter_add(1, i, s),
                        (torch.randn(3, 7), torch.randint(0, 7, (3, 5)), torch.randn(4, 6))),
        "scatter_value": (lambda x, i: x.scatter(1, i, 2.5), (torch.zeros(4, 5), torch.randint(0, 5, (3, 2)))),
        "embedding_backward": (lambda g, i: aten.embedding_dense_backward(g, i, 10, -1, False),
                               (torch.randn(2, 3, 5), torch.randint(0, 10, (2, 3)))),
    }


@pytest.mark.parametrize("name", list(_index_cases()))
def test_index_put_and_scatter(name):
    f, args = _index_cases()[name]
    torch.testing.assert_close(_compiled(f)(*args), f(*args), atol=1e-5, rtol=1e-5)
    _no_fallback()


def test_scatter_out_of_range_raises():
    f = _compiled(lambda x, i, s: x.scatter_add(0, i, s))
    with pytest.raises(Exception, match="index out of range|out of bounds"):
        f(torch.zeros(4), torch.tensor([1, 7]), torch.ones(2))


def _train(make, inputs, opt, steps=3, loss=lambda out: out.float().pow(2).mean()):
    """Train an eager and a compiled copy side by side; returns both models."""
    torch.manual_seed(0)
    m0 = make()
    m1 = copy.deepcopy(m0)
    cm = torch.compile(m1, backend="polytile")
    opts = [opt(m.parameters()) for m in (m0, m1)]
    for step in range(steps):
        args = inputs(step)
        for f, o in ((m0, opts[0]), (cm, opts[1])):
            o.zero_grad()
            loss(f(*args)).backward()
            o.step()
    return m0, m1


def _assert_same_weights(m0, m1, tol=1e-4):
    for (name, a), b in zip(m0.named_parameters(), m1.parameters()):
        torch.testing.assert_close(b, a, atol=tol, rtol=tol, msg=lambda m: f"{name}: {m}")


def test_cnn_with_adamw():
    # (no bias before the batch norm: its gradient is zero up to rounding, and AdamW's step
    # normalizes that rounding noise to the full learning rate)
    def make():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), nn.ReLU(), nn.AvgPool2d(2),
                             nn.Flatten(), nn.Linear(32, 10))

    g = torch.Generator().manual_seed(1)
    m0, m1 = _train(make, lambda s: (torch.randn(4, 3, 16, 16, generator=g),),
                    lambda p: torch.optim.AdamW(p, lr=1e-3))
    _assert_same_weights(m0, m1)
    for a, b in zip(m0.buffers(), m1.buffers()):  # batch-norm running statistics
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    _no_fallback()


def test_small_bert_trains_like_eager():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                  vocab_size=200, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    g = torch.Generator().manual_seed(2)
    ids = [torch.randint(0, 200, (2, 16), generator=g) for _ in range(3)]
    m0, m1 = _train(lambda: transformers.BertForMaskedLM(cfg).train(), lambda s: (ids[s],),
                    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), loss=lambda out: out.logits.pow(2).mean())
    _assert_same_weights(m0, m1)
    _no_fallback()
