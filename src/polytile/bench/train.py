"""The model suite in training mode: per model, a forward and backward step through polytile
against eager (gradients by the accuracy rule, then the weights after a few SGD-with-momentum
steps), and the step time of eager, Inductor and polytile side by side.

Dropout is off (every probability 0) so that the systems compute the same function; batch
norm runs in train mode. The loss is the mean square of the first output, as PyTorch's dynamo
benchmarks reduce outputs to a scalar. A step is zero_grad + forward + backward (the optimizer,
the same eager code for every system, is left out of the timing)."""
from __future__ import annotations

import copy
import gc
import time

import torch

from ..accuracy import check_accuracy, matching_gradients
from . import zoo
from .suite import ModelResult, _short, time_systems

TOL = 1e-2  # PyTorch's dynamo benchmarks' training tolerance
STEPS = 3  # optimizer steps before the weights are compared


def _first_tensor(out):
    if hasattr(out, "logits") and out.logits is not None:
        return out.logits
    if isinstance(out, dict):
        return next(v for v in out.values() if isinstance(v, torch.Tensor))
    if isinstance(out, (tuple, list)):
        return _first_tensor(out[0])
    return out


def loss_of(out) -> torch.Tensor:
    return _first_tensor(out).float().pow(2).mean()


def _grads(model) -> dict:
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _step(w: zoo.Workload, model, call=None) -> None:
    model.zero_grad(set_to_none=True)
    loss_of(w(model if call is None else call)).backward()


def _fp64_grads(w: zoo.Workload, model):
    m = copy.deepcopy(model).double()
    cast = lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
    m.zero_grad(set_to_none=True)
    loss_of(m(*[cast(a) for a in w.args], **{k: cast(v) for k, v in w.kwargs.items()})).backward()
    return _grads(m)


def run_train_model(spec: zoo.ModelSpec, *, batch: int | None = None, threads: int = 2, rounds: int = 10,
                    time_budget_s: float = 60.0, inductor: bool = True, options: dict | None = None) -> ModelResult:
    import polytile

    res = ModelResult(spec.suite, spec.name, batch or spec.batch)
    torch._dynamo.reset()
    polytile.reset_stats()
    try:
        w = zoo.build(spec, batch, dropout=False)
        w.model.train()
        start = copy.deepcopy(w.model.state_dict())
        t0 = time.perf_counter()
        _step(w, w.model)
        eager_once = time.perf_counter() - t0
    except Exception as e:
        res.status, res.error = "fail_eager", _short(e)
        return res
    mine = copy.deepcopy(w.model)
    mine.load_state_dict(start)
    w.model.load_state_dict(start)
    try:
        compiled = torch.compile(mine, backend="polytile", options={"threads": threads, **(options or {})})
        t0 = time.perf_counter()
        _step(w, mine, compiled)
        res.compile_s = time.perf_counter() - t0
    except Exception as e:
        res.status, res.error = "fail_compile", _short(e)
        res.fallbacks = polytile.stats()["ops_fallen_back"]
        return res
    st = polytile.stats()
    res.fallbacks, res.kernels = st["ops_fallen_back"], st["kernels_generated"]
    _step(w, w.model)
    ok, details = check_accuracy(*matching_gradients(_grads(mine), _grads(w.model)), lambda: _fp64_grads(w, w.model),
                                 TOL)
    if ok:  # a few optimizer steps, then the weights
        opts = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for m in (w.model, mine)]
        for _ in range(STEPS):
            for m, call, o in ((w.model, None, opts[0]), (mine, compiled, opts[1])):
                _step(w, m, call)
                o.step()
        ok, wd = check_accuracy(dict(mine.named_parameters()), dict(w.model.named_parameters()), None, TOL)
        details += [f"after {STEPS} SGD steps: {d}" for d in wd]
    res.accuracy = "pass" if ok else "FAIL: " + "; ".join(details)[:400]
    fns = {"eager": lambda: _step(w, w.model), "polytile": lambda: _step(w, mine, compiled)}
    if inductor:
        try:
            theirs = copy.deepcopy(w.model)
            ind = torch.compile(theirs)
            t0 = time.perf_counter()
            _step(w, theirs, ind)
            res.inductor_compile_s = time.perf_counter() - t0
            fns["inductor"] = lambda: _step(w, theirs, ind)
        except Exception as e:
            res.error = "inductor failed: " + _short(e)
    time_systems(res, fns, eager_once, rounds, time_budget_s)
    res.status = "pass" if ok and not res.fallbacks else ("fail_accuracy" if not ok else "fallback")
    del w, mine
    gc.collect()
    return res
