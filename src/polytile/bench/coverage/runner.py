"""One model in this process: build, eager, compile with polytile, accuracy, classification
(and, with ``inductor``, Inductor's compile time and the speedups)."""
from __future__ import annotations

import collections
import copy
import logging
import os
import shutil
import tempfile
import time
import traceback
from typing import Any, Callable

from .build import NotBuildable, Workload, build, count_parameters, default_batch
from .lists import Spec

TOL_INFERENCE = 1e-3
TOL_TRAIN = 1e-2


def _short(e: BaseException, n: int = 500) -> str:
    msg = str(e).strip()
    return f"{type(e).__name__}: {msg}"[:n]


def _polytile_dir() -> str:
    import polytile

    return os.path.dirname(os.path.abspath(polytile.__file__))


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions it wraps: dynamo's ``inner_exception`` (BackendCompilerFailed
    is raised ``from None``), else ``__cause__``, else ``__context__``."""
    out: list[BaseException] = []
    x: BaseException | None = e
    while x is not None and all(x is not y for y in out):
        out.append(x)
        inner = getattr(x, "inner_exception", None)
        if isinstance(inner, BaseException):
            x = inner
        elif x.__cause__ is not None:
            x = x.__cause__
        else:
            x = None if x.__suppress_context__ else x.__context__
    return out


def _frame_text(fs: traceback.FrameSummary, root: str) -> str:
    path = os.path.relpath(fs.filename, os.path.dirname(root))
    return f"{path}:{fs.lineno} in {fs.name}: {(fs.line or '').strip()}"[:240]


def crash_info(e: BaseException, n_frames: int = 6) -> dict:
    """Type and message of the innermost exception of ``e``'s chain (dynamo wraps a backend's
    exception in BackendCompilerFailed), and the last ``n_frames`` frames inside polytile."""
    root = _polytile_dir()
    chain = _chain(e)
    inner = chain[-1]
    frames: list[str] = []
    for x in reversed(chain):  # innermost first: the first exception with frames in polytile
        tb = traceback.extract_tb(x.__traceback__)
        mine = [fs for fs in tb if os.path.abspath(fs.filename).startswith(root + os.sep)]
        if mine:
            frames = [_frame_text(fs, root) for fs in mine[-n_frames:]]
            break
    return {"type": type(inner).__name__, "message": str(inner).strip()[:1500],
            "outer": type(e).__name__ if inner is not e else "", "polytile_frames": frames}


class _LogCapture(logging.Handler):
    """polytile's warnings (ops run in ATen and why, graphs whose compilation failed)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        msg = record.getMessage().strip().splitlines()
        if msg and len(self.messages) < 60:
            self.messages.append(" ".join(msg[:2])[:400])


def _first_tensor(out):
    from ..train import _first_tensor as ft

    return ft(out)


def _grads(model) -> dict:
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _train_step(w: Workload, model, call=None) -> dict:
    """zero_grad, forward, loss = mean square of the first output tensor, backward; the loss
    and the gradients."""
    model.zero_grad(set_to_none=True)
    loss = _first_tensor(w(model if call is None else call)).float().pow(2).mean()
    loss.backward()
    return {"loss": loss.detach(), "grads": _grads(model)}


def _to64(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x.double() if x.is_floating_point() else x
    if isinstance(x, (list, tuple)):
        return type(x)(_to64(v) for v in x)
    if isinstance(x, dict):
        return {k: _to64(v) for k, v in x.items()}
    return x


def _fp64_train(w: Workload, init) -> dict:
    m = copy.deepcopy(init).double()
    w64 = Workload(m, _to64(w.args), _to64(w.kwargs), w.batch)
    return _train_step(w64, m)


def _safe_thunk(f: Callable[[], Any], notes: list[str]) -> Callable[[], Any]:
    """The fp64 reference, or None (a failing leaf then fails) when it cannot be computed."""
    def thunk():
        try:
            return f()
        except Exception as e:
            notes.append("fp64 reference failed: " + _short(e, 200))
            return None
    return thunk


def _graph_breaks() -> tuple[int, list[str]]:
    try:
        from torch._dynamo.utils import counters

        gb = counters.get("graph_break", {})
        return int(sum(gb.values())), [str(k)[:200] for k, _ in collections.Counter(gb).most_common(5)]
    except Exception:
        return 0, []


def run_one(spec: Spec, cfg: dict, progress: Callable[[dict], None] | None = None) -> dict:
    """Build, run eager, compile with polytile, check, classify one model in this process.

    ``cfg``: threads, batch (None: ``default_batch``), train, inductor, rounds, max_bytes,
    cache_dir (polytile's kernel cache; None: a fresh temporary one). ``progress(result)`` is
    called at the start of every phase with the result so far."""
    import torch

    import polytile
    from ...accuracy import check_accuracy, fp64_reference, matching_gradients
    from ...benchmarking import time_side_by_side

    train = bool(cfg.get("train"))
    threads = int(cfg.get("threads", 2))
    torch.set_num_threads(threads)
    batch = cfg.get("batch") or default_batch(spec, train)
    r: dict = {"suite": spec.suite, "name": spec.name, "batch": batch, "mode": "train" if train else "inference",
               "status": None, "phase": "start", "error": "", "crash": None, "accuracy": "",
               "fallbacks": {}, "graphs_failed": 0, "graphs_compiled": 0, "kernels": 0, "eager_runs": 0,
               "graph_breaks": 0, "graph_break_reasons": [], "warnings": [], "notes": [],
               "params_m": None, "eager_s": None, "compile_s": None, "inductor_compile_s": None,
               "eager_ms": None, "polytile_ms": None, "inductor_ms": None,
               "speedup_eager": None, "speedup_inductor": None, "inductor_error": ""}
    t_start = time.perf_counter()

    def phase(p: str) -> None:
        r["phase"] = p
        r["elapsed_s"] = round(time.perf_counter() - t_start, 2)
        if progress:
            progress(r)

    def done(status: str) -> dict:
        r["status"] = status
        r["elapsed_s"] = round(time.perf_counter() - t_start, 2)
        r["final"] = True
        if progress:
            progress(r)
        return r

    own_cache = None
    cache_dir = cfg.get("cache_dir")
    if not cache_dir:
        own_cache = cache_dir = tempfile.mkdtemp(prefix="polytile-cov-cache-")
    capture = _LogCapture()
    logging.getLogger("polytile").addHandler(capture)
    try:
        phase("build")
        try:
            n = count_parameters(spec, train)
            if n is not None:
                r["params_m"] = round(n / 1e6, 2)
                need = n * 4 * (6 if train else 4)  # model, fp64 copy (2x), derived weights / grads
                if cfg.get("max_bytes") and need > cfg["max_bytes"]:
                    r["error"] = (f"{n / 1e6:.0f}M parameters: about {need / 1e9:.1f} GB needed, budget "
                                  f"{cfg['max_bytes'] / 1e9:.1f} GB (--max-gb)")
                    return done("too_large")
            w = build(spec, batch, train=train)
        except NotBuildable as e:
            r["error"] = str(e)
            return done("not_buildable")
        except Exception as e:
            r["error"] = "building the model: " + _short(e)
            return done("not_buildable")
        if r["params_m"] is None:
            r["params_m"] = round(sum(p.numel() for p in w.model.parameters()) / 1e6, 2)
        model = w.model
        init = copy.deepcopy(model) if train else None
        options = {"threads": threads, "cache_dir": cache_dir, **(cfg.get("options") or {})}
        tol = TOL_TRAIN if train else TOL_INFERENCE
        grad_ctx = torch.enable_grad if train else torch.no_grad
        with grad_ctx():
            phase("eager")
            try:
                t0 = time.perf_counter()
                ref = _train_step(w, model) if train else w()
                r["eager_s"] = round(time.perf_counter() - t0, 3)
            except Exception as e:
                r["error"] = _short(e)
                return done("fail_eager")
            phase("compile")
            torch._dynamo.reset()
            polytile.reset_stats()
            mine = copy.deepcopy(init) if train else model
            try:
                compiled = torch.compile(mine, backend="polytile", options=options)
                t0 = time.perf_counter()
                out = _train_step(w, mine, compiled) if train else w(compiled)
                r["compile_s"] = round(time.perf_counter() - t0, 3)
                crashed = None
            except Exception as e:
                crashed = e
            st = polytile.stats()
            r["fallbacks"] = st["ops_fallen_back"]
            for k in ("graphs_failed", "graphs_compiled", "eager_runs"):
                r[k] = st.get(k, 0)
            r["kernels"] = st.get("kernels_generated", 0)
            r["graph_breaks"], r["graph_break_reasons"] = _graph_breaks()
            r["warnings"] = list(dict.fromkeys(capture.messages))
            if crashed is not None:
                r["crash"] = crash_info(crashed)
                r["error"] = f"{r['crash']['type']}: {r['crash']['message'][:300]}"
                return done("crash")
            phase("accuracy")
            notes: list[str] = []
            if train:
                thunk = _safe_thunk(lambda: _fp64_train(w, init), notes)
            else:
                thunk = _safe_thunk(lambda: fp64_reference(model, w.inputs), notes)
            if train:
                out["grads"], ref["grads"] = matching_gradients(out["grads"], ref["grads"])
            try:
                ok, details = check_accuracy(out, ref, thunk, tol)
            except Exception as e:
                ok, details = False, ["comparing the outputs failed: " + _short(e, 300)]
            r["notes"] += notes
            r["accuracy"] = "pass" if ok else "; ".join(details)[:1500]
            status = ("pass" if not r["fallbacks"] else "fallback") if ok else "fail_accuracy"
            if cfg.get("inductor"):
                phase("inductor")
                _inductor(r, w, model, init, compiled, mine, train, int(cfg.get("rounds", 3)), time_side_by_side)
            return done(status)
    finally:
        logging.getLogger("polytile").removeHandler(capture)
        if own_cache:
            shutil.rmtree(own_cache, ignore_errors=True)


def _inductor(r: dict, w: Workload, model, init, compiled, mine, train: bool, rounds: int, timer) -> None:
    """Inductor's cold compile time (dynamo reset, no FX-graph / autograd cache), then eager,
    polytile and Inductor timed alternately (median of ``rounds`` calls after one warm-up)."""
    import torch

    import polytile

    try:
        torch._inductor.config.fx_graph_cache = False
        torch._functorch.config.enable_autograd_cache = False
    except Exception:
        pass
    torch._dynamo.reset()
    theirs = copy.deepcopy(init) if train else model
    try:
        ind = torch.compile(theirs)
        t0 = time.perf_counter()
        _train_step(w, theirs, ind) if train else w(ind)
        r["inductor_compile_s"] = round(time.perf_counter() - t0, 3)
    except Exception as e:
        r["inductor_error"] = _short(e, 300)
        ind = None
    if train:
        fns = {"eager": lambda: _train_step(w, model), "polytile": lambda: _train_step(w, mine, compiled)}
        if ind is not None:
            fns["inductor"] = lambda: _train_step(w, theirs, ind)
    else:
        fns = {"eager": lambda: w(), "polytile": lambda: w(compiled)}
        if ind is not None:
            fns["inductor"] = lambda: w(ind)
    try:
        fns["polytile"]()  # dynamo was reset: polytile compiles again here (warm kernel cache)
        before = polytile.stats()["graphs_compiled"]
        t = timer(fns, warmup=1, rounds=max(1, rounds))
        if polytile.stats()["graphs_compiled"] != before:
            r["notes"].append("polytile recompiled during timing")
    except Exception as e:
        r["notes"].append("timing failed: " + _short(e, 300))
        return
    r["eager_ms"], r["polytile_ms"] = round(t["eager"] * 1e3, 3), round(t["polytile"] * 1e3, 3)
    r["inductor_ms"] = round(t["inductor"] * 1e3, 3) if "inductor" in t else None
    r["speedup_eager"] = round(t["eager"] / t["polytile"], 3)
    if "inductor" in t:
        r["speedup_inductor"] = round(t["inductor"] / t["polytile"], 3)
