"""The model suite: per model, eager vs polytile (accuracy, fallbacks, compile time) and
eager / Inductor / polytile timed side by side. A failing model is recorded and the run goes on."""
from __future__ import annotations

import gc
import platform
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..accuracy import check_accuracy, fp64_reference
from ..benchmarking import time_side_by_side
from . import zoo
from .flops import contraction_gflop
from .quantize import close_to_reference, int8_pt2e, varied_inputs

TOL = 1e-3  # DESIGN.md: HF/TIMM inference in fp32
QUANTIZED_SAMPLES = 5  # inputs besides the model's own over which a quantized model's error is pooled


@dataclass
class ModelResult:
    suite: str
    name: str
    batch: int
    status: str = "not run"  # pass | fail_accuracy | fail_compile | fail_eager | fallback
    accuracy: str = ""
    eager_ms: float | None = None
    inductor_ms: float | None = None
    polytile_ms: float | None = None
    compile_s: float | None = None
    inductor_compile_s: float | None = None  # Inductor's first call, in the same process
    frozen_ms: float | None = None  # Inductor with freezing=True (inference): its best CPU mode
    frozen_compile_s: float | None = None
    fallbacks: dict = field(default_factory=dict)
    kernels: int = 0
    rounds: int = 0
    gflop: float | None = None  # contraction work of one call (bench/flops.py)
    error: str = ""

    @property
    def speedup_eager(self) -> float | None:
        return self.eager_ms / self.polytile_ms if self.eager_ms and self.polytile_ms else None

    @property
    def speedup_inductor(self) -> float | None:
        return self.inductor_ms / self.polytile_ms if self.inductor_ms and self.polytile_ms else None

    @property
    def speedup_frozen(self) -> float | None:
        return self.frozen_ms / self.polytile_ms if self.frozen_ms and self.polytile_ms else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["speedup_eager"], d["speedup_inductor"] = self.speedup_eager, self.speedup_inductor
        d["speedup_frozen"] = self.speedup_frozen
        return d


def _short(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".strip().splitlines()
    return " ".join(msg[:3])[:400]


def time_systems(res: ModelResult, fns: dict, eager_once: float, rounds: int, time_budget_s: float) -> None:
    """Time ``fns`` (eager, polytile, maybe inductor) side by side into ``res``: as many rounds
    as the budget allows, judging from one eager call's seconds (``eager_once``)."""
    per_round = eager_once * len(fns) * 1.5
    r = max(1, min(rounds, int(time_budget_s / max(per_round, 1e-6))))
    t = time_side_by_side(fns, warmup=1 if r < rounds else 2, rounds=r)
    res.rounds = r
    res.eager_ms, res.polytile_ms = t["eager"] * 1e3, t["polytile"] * 1e3
    res.inductor_ms = t["inductor"] * 1e3 if "inductor" in t else None
    res.frozen_ms = t["inductor_frozen"] * 1e3 if "inductor_frozen" in t else None


def run_model(spec: zoo.ModelSpec, *, batch: int | None = None, threads: int = 2, rounds: int = 10,
              time_budget_s: float = 60.0, inductor: bool = True, options: dict | None = None,
              dtype: torch.dtype | None = None, quantize: str | None = None) -> ModelResult:
    import polytile

    res = ModelResult(spec.suite, spec.name, batch or spec.batch)
    torch._dynamo.reset()
    polytile.reset_stats()
    try:
        w = zoo.build(spec, batch, dtype=dtype)
        float_outs, samples = [], []
        if quantize == "int8":
            samples = varied_inputs(w, QUANTIZED_SAMPLES)
            with torch.no_grad():
                float_outs = [w.model(*a, **k) for a, k in samples]
            w = int8_pt2e(w)
    except Exception as e:
        res.status, res.error = "fail_eager", "building the model: " + _short(e)
        return res
    with torch.no_grad():
        try:
            t0 = time.perf_counter()
            ref = w()
            eager_once = time.perf_counter() - t0
        except Exception as e:
            res.status, res.error = "fail_eager", _short(e)
            return res
        res.gflop = contraction_gflop(w)
        try:
            compiled = torch.compile(w.model, backend="polytile", options={"threads": threads, **(options or {})})
            t0 = time.perf_counter()
            out = w(compiled)
            res.compile_s = time.perf_counter() - t0
        except Exception as e:
            res.status, res.error = "fail_compile", _short(e)
            res.fallbacks = polytile.stats()["ops_fallen_back"]
            return res
        st = polytile.stats()
        res.fallbacks, res.kernels = st["ops_fallen_back"], st["kernels_generated"]
        if quantize:
            with torch.no_grad():
                refs = [ref] + [w.model(*a, **k) for a, k in samples[1:]]
                outs = [out] + [compiled(*a, **k) for a, k in samples[1:]]
        ok, details = close_to_reference(outs, refs, float_outs) if quantize else \
            check_accuracy(out, ref, lambda: fp64_reference(w.model, w.kwargs or w.args), TOL)
        res.accuracy = "pass" if ok else "FAIL: " + "; ".join(details)[:400]
        fns = {"eager": lambda: w(), "polytile": lambda: w(compiled)}
        if inductor:
            try:
                ind = torch.compile(w.model)
                t0 = time.perf_counter()
                w(ind)
                res.inductor_compile_s = time.perf_counter() - t0
                fns["inductor"] = lambda: w(ind)
            except Exception as e:
                res.error = "inductor failed: " + _short(e)
            try:
                frozen = _inductor_frozen(w.model)
                t0 = time.perf_counter()
                w(frozen)
                res.frozen_compile_s = time.perf_counter() - t0
                fns["inductor_frozen"] = lambda: w(frozen)
            except Exception as e:
                res.error = (res.error + "; " if res.error else "") + "inductor freezing failed: " + _short(e)
        time_systems(res, fns, eager_once, rounds, time_budget_s)
    res.status = "pass" if ok and not res.fallbacks else ("fail_accuracy" if not ok else "fallback")
    del w
    gc.collect()
    return res


def _inductor_frozen(model):
    """``model`` compiled by Inductor with ``freezing=True`` (parameters folded as constants and
    weights prepacked: its best CPU inference mode; for PT2E int8 models its oneDNN int8
    kernels). The option makes it a backend of its own: dynamo keeps its compiled graphs on the
    model's code, and reused the plain Inductor compile of the same model for a backend with
    equal options (the freezing flag is not part of its guards). The global flag is set while
    dynamo traces too (the first call and any recompile): it decides there whether parameters
    become constants. A context switch per call, microseconds."""
    import torch._inductor.config as cfg

    compiled = torch.compile(model, options={"freezing": True})

    def call(*args, **kwargs):
        with cfg.patch(freezing=True):
            return compiled(*args, **kwargs)

    return call


def environment() -> dict[str, Any]:
    import polytile

    env = {"polytile": polytile.__version__, "torch": torch.__version__, "python": platform.python_version(),
           "machine": platform.machine(), "threads": torch.get_num_threads()}
    try:
        with open("/proc/cpuinfo") as f:
            env["cpu"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        import timm
        import transformers

        env["timm"], env["transformers"] = timm.__version__, transformers.__version__
    except ImportError:
        pass
    from ..runtime.cc import compiler_version
    from ..options import Options

    env["cc"] = compiler_version(Options().cc).splitlines()[0]
    return env


def run_suite(specs: list[zoo.ModelSpec], *, batch: int | None = None, threads: int = 2, rounds: int = 10,
              time_budget_s: float = 60.0, inductor: bool = True, progress: bool = True,
              on_result=None, options: dict | None = None, train: bool = False,
              dtype: torch.dtype | None = None, quantize: str | None = None) -> list[ModelResult]:
    """Every model of ``specs`` through ``run_model`` (or, with ``train``, ``train.run_train_model``);
    ``dtype``: models and inputs in that floating-point type; ``quantize="int8"``: the models
    quantized by PyTorch 2 export quantization (``bench.quantize``; both inference only)."""
    if (dtype is not None or quantize) and train:
        raise ValueError("polytile bench: --dtype and --quantize are for inference (not with --train)")
    from .train import run_train_model

    run = run_train_model if train else run_model
    torch.set_num_threads(threads)
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    bar = tqdm(total=len(specs), unit="model") if (progress and tqdm) else None
    results = []
    for spec in specs:
        if bar:
            bar.set_description(spec.name)
        try:
            r = run(spec, batch=batch, threads=threads, rounds=rounds, time_budget_s=time_budget_s,
                    inductor=inductor, options=options, **({"dtype": dtype} if dtype is not None else {}),
                    **({"quantize": quantize} if quantize else {}))
        except Exception as e:  # never stop the suite
            r = ModelResult(spec.suite, spec.name, batch or spec.batch, status="fail_compile",
                            error=_short(e) + " | " + traceback.format_exc(limit=2).replace("\n", " ")[-200:])
        results.append(r)
        if on_result:
            on_result(results)
        if bar:
            bar.update(1)
            bar.set_postfix(status=r.status)
    if bar:
        bar.close()
    return results
