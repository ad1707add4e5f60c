"""Whole models through ``torch.compile(backend="polytile")`` against eager PyTorch.

Each model must (1) pass the DESIGN.md accuracy rule (tests/accuracy.py) with tol 1e-3,
(2) be compiled by polytile (graphs compiled, ops compiled) and (3) run no op through ATen
(``ops_fallen_back == {}``). Models are built from configs with random weights (never
downloaded) under fixed seeds.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn

import polytile
from accuracy import assert_accurate, check_accuracy, fp64_reference

TOL = 1e-3


def _run(model, args=(), kwargs=None, options=None):
    """Compile ``model``, run compiled and eager once under no_grad; returns (out, ref, stats)."""
    kwargs = kwargs or {}
    compiled = torch.compile(model, backend="polytile", options=options)
    with torch.no_grad():
        out = compiled(*args, **kwargs)
        ref = model(*args, **kwargs)
    return compiled, out, ref, polytile.stats()


def _fp64(model, args=(), kwargs=None):
    if kwargs:
        assert not args
        return lambda: fp64_reference(model, kwargs)
    return lambda: fp64_reference(model, tuple(args))


def _assert_compiled_without_fallback(st):
    assert st["graphs_compiled"] >= 1, st
    assert st["ops_compiled"] > 0, st
    assert st["kernels_generated"] > 0, st
    assert st["ops_fallen_back"] == {}, f"ops ran in ATen: {st['ops_fallen_back']}"


def _check_again(compiled, model, make_args):
    """A second call with fresh input data (same shapes) must still match eager."""
    args = make_args()
    with torch.no_grad():
        out, ref = compiled(*args), model(*args)
    assert_accurate(out, ref, _fp64(model, args), TOL)


# ------------------------------------------------------------------ the accuracy rule itself
class TestAccuracyRule:
    """The checker must be able to fail: exercise both sides of every branch of the rule."""

    def test_identical_and_allclose_pass_without_fp64(self):
        x = torch.randn(50, 50)

        def boom():
            raise AssertionError("fp64 reference must not be computed when allclose passes")

        assert check_accuracy(x, x.clone(), boom, 1e-3) == (True, [])
        assert check_accuracy(x + 1e-5, x, boom, 1e-3)[0]

    def test_fp64_rule_multiplier(self):
        g = torch.Generator().manual_seed(1)
        ref64 = torch.randn(100, 100, dtype=torch.float64, generator=g)
        noise = torch.randn(100, 100, dtype=torch.float64, generator=g)
        eager = (ref64 + 1e-2 * noise).float()
        better = (ref64 + 1.5e-2 * noise).float()  # 1.5x the eager error: passes (m = 2)
        worse = (ref64 + 2.6e-2 * noise).float()  # 2.6x: fails (m = 2)
        assert not torch.allclose(better, eager, atol=TOL, rtol=TOL)
        ok, details = check_accuracy(better, eager, ref64, TOL)
        assert ok, details
        ok, details = check_accuracy(worse, eager, ref64, TOL)
        assert not ok and "RMSE" in details[0] and "out" in details[0]

    def test_tiny_tensors_get_multiplier_3(self):
        g = torch.Generator().manual_seed(2)
        ref64 = torch.randn(10, 10, dtype=torch.float64, generator=g)  # 100 elements: tiny
        noise = torch.randn(10, 10, dtype=torch.float64, generator=g)
        eager = (ref64 + 1e-2 * noise).float()
        assert check_accuracy((ref64 + 2.6e-2 * noise).float(), eager, ref64, TOL)[0]
        assert not check_accuracy((ref64 + 3.5e-2 * noise).float(), eager, ref64, TOL)[0]

    def test_not_allclose_without_reference_fails(self):
        x = torch.randn(4, 4)
        ok, details = check_accuracy(x + 1, x, None, TOL)
        assert not ok and details

    def test_nested_structures(self):
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        a, b = torch.randn(3, 3), torch.randn(2)
        ref = {"x": (a, [b, 3]), "y": None}
        assert check_accuracy({"x": (a.clone(), [b.clone(), 3]), "y": None}, ref, None, TOL)[0]
        ok, details = check_accuracy({"x": (a.clone(), [b + 1, 3]), "y": None}, ref, None, TOL)
        assert not ok and any("['x'][1][0]" in d for d in details), details
        assert not check_accuracy({"x": (a, [b, 4]), "y": None}, ref, None, TOL)[0]
        assert not check_accuracy({"x": (a, [b, 3])}, ref, None, TOL)[0]  # missing key
        assert not check_accuracy({"x": (a, [b]), "y": None}, ref, None, TOL)[0]  # length
        mo = BaseModelOutputWithPooling(last_hidden_state=a, pooler_output=b)
        assert check_accuracy(BaseModelOutputWithPooling(last_hidden_state=a.clone(), pooler_output=b.clone()),
                              mo, None, TOL)[0]
        ok, details = check_accuracy(BaseModelOutputWithPooling(last_hidden_state=a, pooler_output=b * 2),
                                     mo, None, TOL)
        assert not ok and any("pooler_output" in d for d in details), details
        # the fp64 reference is looked up with the same path
        ok, details = check_accuracy(
            {"x": (a + 2e-3, [b, 3]), "y": None}, {"x": (a, [b, 3]), "y": None},
            lambda: {"x": ((a + 2e-3).double(), [b.double(), 3]), "y": None}, TOL)
        assert ok, details

    def test_exact_for_integers_dtype_and_shape(self):
        i = torch.arange(10)
        assert check_accuracy(i.clone(), i, None, TOL)[0]
        assert not check_accuracy(i + (i == 3), i, None, TOL)[0]  # off by one in one element
        assert not check_accuracy(i.float(), i, None, TOL)[0]  # dtype
        assert not check_accuracy(torch.zeros(2, 3), torch.zeros(3, 2), None, TOL)[0]  # shape
        nan = torch.tensor([1.0, float("nan")])
        assert check_accuracy(nan.clone(), nan, None, TOL)[0]
        assert not check_accuracy(torch.tensor([1.0, 2.0]), nan, None, TOL)[0]

    def test_special_values_must_match_before_the_rmse(self):
        """NaN and infinity positions (and signs) are compared exactly; one NaN in both results no
        longer hides a wrong finite element, and a NaN where eager has none fails."""
        nan, inf = float("nan"), float("inf")
        ref = torch.tensor([1.0, nan, inf, -inf, 2.0] * 300)
        ref64 = lambda: ref.double()  # noqa: E731
        assert check_accuracy(ref.clone(), ref, ref64, TOL)[0]
        wrong = ref.clone()
        wrong[4] = 7.0  # a finite element far off, beside the NaN
        ok, details = check_accuracy(wrong, ref, ref64, TOL)
        assert not ok and "RMSE" in details[0], details
        for k, v in ((0, nan), (2, -inf), (1, 0.0), (3, inf)):
            bad = ref.clone()
            bad[k] = v
            ok, details = check_accuracy(bad, ref, ref64, TOL)
            assert not ok and "NaN or infinite" in details[0], (k, details)

    def test_fp64_reference(self):
        m = nn.Sequential(nn.Linear(4, 3), nn.Tanh()).eval()
        x = torch.randn(2, 4)
        r = fp64_reference(m, (x,))
        assert r.dtype == torch.float64
        assert next(m.parameters()).dtype == torch.float32  # the model itself is untouched
        assert x.dtype == torch.float32
        torch.testing.assert_close(r.float(), m(x).detach(), atol=1e-6, rtol=1e-6)

        class KW(nn.Module):
            def forward(self, a, idx):
                return {"s": a.sum(-1), "g": a[idx]}

        out = fp64_reference(KW(), {"a": x, "idx": torch.tensor([1, 0])})
        assert out["s"].dtype == torch.float64 and out["g"].shape == (2, 4)


# ------------------------------------------------------------------ models
def test_mlp():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.GELU(),
                          nn.Linear(128, 10)).eval()
    x = torch.randn(16, 64)
    compiled, out, ref, st = _run(model, (x,))
    assert_accurate(out, ref, _fp64(model, (x,)), TOL)
    _assert_compiled_without_fallback(st)
    _check_again(compiled, model, lambda: (torch.randn(16, 64),))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, stride=1, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


def _randomize_bn(model):
    """Non-trivial running statistics, so batch norm is not an identity in eval mode."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return model


def test_small_cnn():
    model = _randomize_bn(SmallCNN()).eval()
    x = torch.randn(2, 3, 32, 32)
    compiled, out, ref, st = _run(model, (x,))
    assert out.shape == (2, 10)
    assert_accurate(out, ref, _fp64(model, (x,)), TOL)
    _assert_compiled_without_fallback(st)
    _check_again(compiled, model, lambda: (torch.randn(2, 3, 32, 32),))


def _fx_dumps(root) -> str:
    text = []
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith("fx_graph.txt"):
                with open(os.path.join(d, f)) as fh:
                    text.append(fh.read())
    return "\n".join(text)


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
def test_transformer_encoder_layer(batch_first, tmp_path):
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0,
                                       batch_first=batch_first).eval()
    shape = (2, 12, 64) if batch_first else (12, 2, 64)
    x = torch.randn(*shape)
    compiled, out, ref, st = _run(layer, (x,), options={"dump_dir": str(tmp_path)})
    assert_accurate(out, ref, _fp64(layer, (x,)), TOL)
    _assert_compiled_without_fallback(st)
    if batch_first:
        # eval + no_grad + batch_first takes PyTorch's fast path: the fused op must reach
        # polytile (and, by the assertion above, be compiled rather than fall back)
        assert "_transformer_encoder_layer_fwd" in _fx_dumps(tmp_path)
    _check_again(compiled, layer, lambda: (torch.randn(*shape),))


def test_transformer_encoder_layer_padding_mask():
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                       batch_first=True).eval()
    x = torch.randn(2, 8, 32)
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[1, 5:] = True  # the last 3 tokens of the second sequence are padding
    _, out, ref, st = _run(layer, (x,), {"src_key_padding_mask": mask})
    assert_accurate(out, ref, lambda: fp64_reference(layer, (x.double(), None, mask)), TOL)
    _assert_compiled_without_fallback(st)


# ------------------------------------------------------------------ HF BERT (small config)
@pytest.fixture(scope="module")
def bert_run():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    torch._dynamo.reset()
    polytile.reset_stats()
    cfg = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    model = BertModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0  # padding at the end of the second sequence
    kwargs = {"input_ids": ids, "attention_mask": mask}
    _, out, ref, st = _run(model, (), kwargs)
    return model, kwargs, out, ref, st


def test_bert_small_accuracy(bert_run):
    model, kwargs, out, ref, st = bert_run
    assert type(out) is type(ref)
    assert set(out.keys()) == {"last_hidden_state", "pooler_output"}
    assert out["last_hidden_state"].shape == (2, 16, 128)
    assert_accurate(out, ref, _fp64(model, (), kwargs), TOL)
    assert st["graphs_compiled"] >= 1 and st["ops_compiled"] > 0, st


def test_bert_small_no_fallback(bert_run):
    *_, st = bert_run
    _assert_compiled_without_fallback(st)


# ------------------------------------------------------------------ timm resnet18
def test_timm_resnet18():
    timm = pytest.importorskip("timm")
    model = _randomize_bn(timm.create_model("resnet18", pretrained=False)).eval()
    x = torch.randn(1, 3, 224, 224)
    _, out, ref, st = _run(model, (x,))
    assert out.shape == (1, 1000)
    assert_accurate(out, ref, _fp64(model, (x,)), TOL)
    _assert_compiled_without_fallback(st)
