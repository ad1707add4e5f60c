"""``polytile bench coverage``: list parsing, tiny models through the harness (in-process and in
a child interpreter), the classification of crashes and timeouts, and the report."""
from __future__ import annotations

import json
import os

import pytest

from polytile.bench import coverage

TINY_BERT = ('hf:BertForMaskedLM,1 {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, '
             '"intermediate_size": 64, "vocab_size": 128, "seq_len": 16}')
TINY_TIMM = 'timm:lcnet_050 {"input_size": [3, 32, 32]}'


pytest.importorskip("timm")
pytest.importorskip("transformers")


def _models_file(tmp_path, *lines) -> str:
    p = tmp_path / "models.txt"
    p.write_text("# a custom list\n" + "\n".join(lines) + "\n")
    return str(p)


def test_parse_lines():
    s = coverage.parse_line("AlbertForMaskedLM,8", "hf")
    assert (s.suite, s.name, s.list_batch) == ("hf", "AlbertForMaskedLM", 8)
    s = coverage.parse_line("adv_inception_v3 128", "timm")
    assert (s.suite, s.name, s.list_batch) == ("timm", "adv_inception_v3", 128)
    s = coverage.parse_line("mistralai/Mistral-7B-Instruct-v0.3, 8", "hf")
    assert (s.name, s.list_batch) == ("mistralai/Mistral-7B-Instruct-v0.3", 8)
    s = coverage.parse_line('torchbench:resnet18 {"input_size": [3, 64, 64]}', "hf")
    assert (s.suite, s.name, s.list_batch, s.overrides) == ("torchbench", "resnet18", None, {"input_size": [3, 64, 64]})
    assert coverage.parse_line("# comment", "hf") is None and coverage.parse_line("  ", "hf") is None


def test_pytorch2_lists():
    d = coverage.default_lists_dir()
    if d is None:
        pytest.skip("shared/bench/pytorch2 is not next to this checkout")
    hf, timm, tb = (coverage.read_suite(d, s) for s in coverage.SUITES)
    names = {s: [x.name for x in v] for s, v in (("hf", hf), ("timm", timm), ("tb", tb))}
    # HF: the GPU and CPU lists, not the TorchBench lists at the end of the same file
    assert "AlbertForMaskedLM" in names["hf"] and "BigBird" in names["hf"] and "resnet50" not in names["hf"]
    assert len(names["hf"]) == len(set(names["hf"])) >= 50
    # TIMM: the current, CPU and historical 61-model sections, deduplicated
    assert "mobilevit_s" in names["timm"] and "tinynet_a" in names["timm"] and "botnet26t_256" in names["timm"]
    assert len(names["timm"]) == len(set(names["timm"])) >= 60
    assert "resnet50" in names["tb"] and "BERT_pytorch" in names["tb"] and "resnet152" in names["tb"]
    assert [s.name for s in coverage.select(timm, limit=3)] == names["timm"][:3]
    pytest.importorskip("torchvision")
    assert coverage.precheck(next(s for s in tb if s.name == "BERT_pytorch"))  # not a torchvision model
    assert coverage.precheck(next(s for s in tb if s.name == "resnet50")) is None
    assert coverage.precheck(next(s for s in hf if "/" in s.name))  # a Hub checkpoint id


def test_tiny_models_in_process(tmp_path):
    specs = coverage.collect("all", [], None, None, _models_file(tmp_path, TINY_BERT, TINY_TIMM,
                                                                     "torchbench:not_a_torchvision_model"))
    out = tmp_path / "out"
    results = coverage.run(specs, {"threads": 2}, str(out), "test", isolate=False, echo=None)
    by = {r["name"]: r for r in results}
    for name in ("BertForMaskedLM", "lcnet_050"):
        r = by[name]
        assert r["status"] in ("pass", "fallback"), (name, r["status"], r["error"], r["accuracy"])
        assert r["accuracy"] == "pass" and r["compile_s"] > 0 and r["eager_s"] is not None
        assert (r["status"] == "pass") == (not r["fallbacks"])
    assert by["not_a_torchvision_model"]["status"] == "not_buildable"
    data = json.load(open(out / "results.json"))
    assert [r["name"] for r in data["results"]] == [s.name for s in specs]
    md = open(out / "report.md").read()
    n_pass = sum(r["status"] == "pass" for r in results)
    assert f"pass rate {n_pass}/2 " in md and "1 not_buildable" in md and "| lcnet_050 " in md


def test_crash_is_classified_with_polytile_frames(tmp_path, monkeypatch):
    from polytile.frontend.torch import compile as ptc

    def boom(*a, **k):
        raise ValueError("injected failure")

    monkeypatch.setattr(ptc, "compile_aten_graph", boom)
    spec = coverage.parse_line(TINY_BERT, "hf")
    r = coverage.run_one(spec, {"threads": 2})
    assert r["status"] == "crash" and r["phase"] == "compile"
    assert r["crash"]["type"] == "ValueError" and "injected failure" in r["crash"]["message"]
    assert any("polytile/frontend/torch/backend.py" in f for f in r["crash"]["polytile_frames"])
    md = coverage.markdown([r], {}, "test", {})
    assert "## Crashes and timeouts" in md and "injected failure" in md and "backend.py" in md
    assert "pass rate 0/1" in md


def test_eager_failure_is_not_polytiles(tmp_path):
    spec = coverage.parse_line('timm:lcnet_050 {"input_size": [5, 32, 32]}', "timm")  # 5 channels: conv fails
    r = coverage.run_one(spec, {"threads": 2})
    assert r["status"] == "fail_eager" and "channels" in r["error"]
    assert "pass rate n/a" in coverage.summary([r])


def test_timeout_and_faulthandler_frames(tmp_path):
    spec = coverage.parse_line(TINY_BERT, "hf")
    r = coverage.run_isolated(spec, {"threads": 2}, timeout=2.0, log_dir=str(tmp_path))
    assert r["status"] == "timeout" and "no result after 2 s" in r["error"]
    root = os.path.dirname(coverage._polytile_dir())
    dump = (f"Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n"
            f'  File "{root}/polytile/runtime/kernel.py", line 12 in call\n'
            f'  File "/usr/lib/python3/site.py", line 3 in other\n'
            f'  File "{root}/polytile/frontend/torch/compile.py", line 40 in run\n\n')
    assert coverage._faulthandler_frames(dump) == ["polytile/frontend/torch/compile.py:40 in run",
                                                   "polytile/runtime/kernel.py:12 in call"]


@pytest.mark.slow
def test_tiny_model_in_a_child_interpreter(tmp_path):
    spec = coverage.parse_line(TINY_BERT, "hf")
    r = coverage.run_isolated(spec, {"threads": 2}, timeout=300, log_dir=str(tmp_path))
    assert r["status"] in ("pass", "fallback") and r["final"], r
    assert os.path.exists(r["log"])


def test_a_parameter_outside_the_loss_has_no_gradient_or_a_zero_one():
    """Eager leaves a parameter outside the loss without a gradient; a compiled graph that also
    returns the unused output gives it zeros: the same. A nonzero one, or one missing with
    nonzero on the other side, still differs."""
    import torch

    from polytile.accuracy import check_accuracy, matching_gradients

    g = torch.ones(3)
    res, ref = matching_gradients({"a": g, "pooler": torch.zeros(2)}, {"a": g})
    assert set(res) == set(ref) == {"a"} and check_accuracy(res, ref, None, 1e-3)[0]
    res, ref = matching_gradients({"a": g, "pooler": torch.full((2,), 1e-3)}, {"a": g})
    assert not check_accuracy(res, ref, None, 1e-3)[0]
    res, ref = matching_gradients({"a": g}, {"a": g, "b": torch.ones(2)})
    assert not check_accuracy(res, ref, None, 1e-3)[0]


def test_timm_models_without_stochastic_depth_build_for_training():
    """Training builds ask timm for drop_path_rate=0; models that have no such argument (DPN,
    ConvMixer, Inception-v3) are built without it, not reported unbuildable."""
    import importlib

    import torch

    from polytile.bench.coverage.lists import Spec

    build = importlib.import_module("polytile.bench.coverage.build")
    with torch.device("meta"):
        assert type(build._timm_model(Spec(suite="timm", name="convmixer_768_32"), True)).__name__ == "ConvMixer"
