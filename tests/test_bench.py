"""The model suite harness: the zoo reads models.csv, run_model checks and times a real model,
the report writes a table, a chart and raw results."""
from __future__ import annotations

import json
import os

import pytest
import torch

from polytile.bench import report, suite, zoo

CSV = zoo.default_models_csv()


def test_models_csv_is_read():
    if CSV is None:
        pytest.skip("shared/bench/models.csv is not next to this checkout")
    specs = zoo.read_models(CSV)
    assert len(specs) >= 30
    assert {s.suite for s in specs} == {"timm", "huggingface"}
    assert all(s.batch >= 1 for s in specs)


def test_report_files(tmp_path):
    rs = [suite.ModelResult("timm", "a", 1, status="pass", accuracy="pass", eager_ms=10.0, inductor_ms=8.0,
                            frozen_ms=6.0, polytile_ms=5.0, compile_s=1.0, rounds=3, gflop=0.4),
          suite.ModelResult("huggingface", "b", 1, status="fallback", accuracy="pass", eager_ms=10.0,
                            polytile_ms=20.0, fallbacks={"aten.flip.default": 1}, rounds=3),
          suite.ModelResult("timm", "c", 1, status="fail_compile", error="Boom: broken")]
    paths = report.write_report(rs, {"torch": "x", report.PEAK_KEY: 100.0}, str(tmp_path), "polytile bench models")
    md = open(paths["markdown"]).read()
    assert "pass rate 1/3" in md and "2.00x vs eager" in md and "1.60x vs Inductor" in md
    assert "1.20x vs Inductor with freezing" in md
    row_a = next(line for line in md.splitlines() if "| a " in line)
    # 0.4 GFLOP at 100 GFLOP/s is 4 ms: 80% of polytile's 5 ms, and 2x under Inductor's 8 ms at best
    assert "| 0.4 " in row_a and "| 80 " in row_a and "| 2.00 " in row_a
    assert "flip.default x1" in md and "Boom: broken" in md  # every failure has its cause
    data = json.load(open(paths["json"]))
    assert [r["name"] for r in data["results"]] == ["a", "b", "c"]
    assert os.path.getsize(paths["chart"]) > 1000


def test_inductor_frozen_compiles_with_freezing(monkeypatch):
    """The 'inductor frozen' system compiles the model again, with freezing=True (Inductor's
    freezing pass runs), even after plain Inductor compiled the same model: dynamo keeps
    compiled graphs on the model's code, and reused the plain compile for a backend with
    equal options."""
    import torch._inductor.compile_fx as cfx
    import torch._inductor.config as cfg

    frozen_compiles = []
    real = cfx.fw_compiler_freezing
    monkeypatch.setattr(cfx, "fw_compiler_freezing", lambda *a, **k: frozen_compiles.append(1) or real(*a, **k))
    torch._dynamo.reset()
    m, x = torch.nn.Linear(16, 8).eval(), torch.randn(4, 16)
    with torch.no_grad():
        torch.compile(m)(x)
        assert not frozen_compiles
        out = suite._inductor_frozen(m)(x)
        assert frozen_compiles and torch.allclose(out, m(x)) and cfg.freezing is False


def test_contraction_flops_counted():
    from polytile.bench.flops import contraction_gflop, peak_ms

    x, w = torch.randn(6, 7), torch.randn(5, 7)
    conv_x, conv_w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)

    def call():
        torch.nn.functional.linear(x, w)  # 2*6*5*7 = 420
        torch.nn.functional.conv2d(conv_x, conv_w)  # 2 * 4*6*6 outputs * 27 = 7776
        torch.relu(x)  # not a contraction

    assert contraction_gflop(call) * 1e9 == pytest.approx(420 + 7776)
    assert peak_ms(2.0, 100.0) == pytest.approx(20.0) and peak_ms(None, 100.0) is None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lcnet_050", "DistilBertForMaskedLM"])
def test_suite_on_small_models(name):
    if CSV is None:
        pytest.skip("shared/bench/models.csv is not next to this checkout")
    spec = next(s for s in zoo.read_models(CSV) if s.name == name)
    r = suite.run_model(spec, batch=1, threads=2, rounds=2, time_budget_s=10, inductor=False)
    assert r.status == "pass", (r.status, r.accuracy, r.error, r.fallbacks)
    assert r.eager_ms > 0 and r.polytile_ms > 0 and r.compile_s > 0 and r.kernels > 0 and r.gflop > 0


def test_build_in_a_half_type_converts_parameters_and_float_inputs():
    """``bench models --dtype bfloat16``: the model and its floating-point inputs in that type,
    integer inputs (token ids) unchanged."""
    w = zoo.build(zoo.ModelSpec("huggingface", "DistilBertForMaskedLM", 1), dtype=torch.bfloat16)
    assert {p.dtype for p in w.model.parameters()} == {torch.bfloat16}
    tensors = [v for v in (*w.args, *w.kwargs.values()) if isinstance(v, torch.Tensor)]
    assert tensors and all(t.dtype == torch.bfloat16 for t in tensors if t.is_floating_point())
    assert any(not t.is_floating_point() for t in tensors)


def test_quantized_accuracy_rule_pools_the_inputs():
    """``bench models --quantize``: a quantized model's error against the float model is pooled
    over several inputs, each varied within the model's own input's range and type: with two
    logits, one input's RMSE is luck (eager int8's moved 4x between inputs of GPT-2)."""
    from polytile.bench.quantize import close_to_reference, varied_inputs

    ids, mask, flag = torch.randint(3, 50, (2, 7)), torch.ones(2, 7, dtype=torch.long), torch.rand(2, 7) > 0.5
    w = zoo.Workload(zoo.ModelSpec("x", "y", 2), torch.nn.Identity(), (ids, torch.randn(2, 3) * 5 + 2),
                     {"attention_mask": mask, "flag": flag})
    samples = varied_inputs(w, 4)
    assert len(samples) == 5 and samples[0][0][0] is ids
    for args, kwargs in samples[1:]:
        assert args[0].dtype == ids.dtype and args[0].shape == ids.shape and 3 <= args[0].min() <= args[0].max() < 50
        assert args[1].dtype == torch.float32 and args[1].shape == (2, 3)
        assert torch.equal(kwargs["attention_mask"], mask) and kwargs["flag"] is flag
    assert not torch.equal(samples[1][0][0], samples[2][0][0])

    f = [torch.zeros(2) for _ in range(3)]
    ref = [torch.tensor([0.001, 0.0]), torch.tensor([0.02, 0.0]), torch.tensor([0.01, 0.0])]
    out = [torch.tensor([0.008, 0.0]), torch.tensor([0.01, 0.0]), torch.tensor([0.012, 0.0])]
    assert not close_to_reference(out[:1], ref[:1], f[:1])[0]  # one input: 8x eager's error
    assert close_to_reference(out, ref, f)[0]  # pooled: below eager's
    worse = [3 * o for o in out]
    ok, details = close_to_reference(worse, ref, f)
    assert not ok and "over 3 inputs" in details[0]
