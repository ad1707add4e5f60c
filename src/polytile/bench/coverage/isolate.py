"""Every model in its own interpreter (``python -m polytile.bench.coverage --one ...``) with a
wall-clock limit; the child process; the suite loop."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Callable

from .build import default_batch, precheck
from .lists import Spec
from .report import environment, write_report
from .runner import _polytile_dir, _short, crash_info, run_one

_FH_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')


def _faulthandler_frames(text: str, n: int = 6) -> list[str]:
    """Where the interpreter was at the last faulthandler dump in ``text`` (a fatal signal, or
    the stack dump shortly before a timeout): the frames inside polytile of the last thread
    block that has any (the main thread is listed last), innermost last; else the innermost
    frames of the last block, marked as outside polytile."""
    k = max(text.rfind("Fatal Python error"), text.rfind("Timeout ("))
    if k < 0:
        return []
    root = _polytile_dir()
    blocks: list[list[tuple[str, str, str]]] = []
    for line in text[k:].splitlines()[1:]:
        if line.startswith(("Thread ", "Current thread ")):
            blocks.append([])
            continue
        m = _FH_FRAME.match(line)
        if m and blocks:
            blocks[-1].append(m.groups())
    blocks = [b for b in blocks if b]
    if not blocks:
        return []

    def fmt(fr):
        f, line, name = fr
        f = os.path.relpath(f, os.path.dirname(root)) if os.path.abspath(f).startswith(root + os.sep) else f
        return f"{f}:{line} in {name}"

    for b in reversed(blocks):
        mine = [fr for fr in b if os.path.abspath(fr[0]).startswith(root + os.sep)]
        if mine:  # faulthandler lists the most recent call first
            return [fmt(fr) for fr in reversed(mine[:n])]
    return ["(outside polytile) " + fmt(fr) for fr in reversed(blocks[-1][:n])]


def _base_result(spec: Spec, cfg: dict) -> dict:
    return {"suite": spec.suite, "name": spec.name, "batch": cfg.get("batch") or default_batch(spec, bool(cfg.get("train"))),
            "mode": "train" if cfg.get("train") else "inference", "status": None, "phase": "start", "error": "",
            "crash": None, "fallbacks": {}, "graphs_failed": 0, "warnings": [], "notes": []}


def _safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s)


def run_isolated(spec: Spec, cfg: dict, timeout: float, log_dir: str | None = None) -> dict:
    """``run_one`` in a fresh interpreter with a wall-clock limit; a hang or a dead interpreter
    is recorded as a result."""
    tmp = tempfile.mkdtemp(prefix="polytile-cov-")
    result_path = os.path.join(tmp, "result.json")
    cfg = dict(cfg, cache_dir=os.path.join(tmp, "polytile-cache"), timeout=timeout)
    env = dict(os.environ)
    threads = str(cfg.get("threads", 2))
    env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor-cache"), OMP_NUM_THREADS=threads,
               POLYTILE_THREADS=threads, PYTHONFAULTHANDLER="1", TOKENIZERS_PARALLELISM="false")
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        log_path = os.path.join(log_dir, f"{spec.suite}-{_safe_name(spec.name)}.log")
    else:
        log_path = os.path.join(tmp, "log.txt")
    cmd = [sys.executable, "-m", "polytile.bench.coverage", "--one", json.dumps(asdict(spec)),
           "--cfg", json.dumps(cfg), "--result", result_path]
    t0 = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as logf:
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            rc = p.wait()
    wall = time.perf_counter() - t0
    try:
        with open(result_path) as f:
            r = json.load(f)
    except (OSError, ValueError):
        r = _base_result(spec, cfg)
    try:
        with open(log_path, errors="replace") as f:
            log_text = f.read()
    except OSError:
        log_text = ""
    r["wall_s"] = round(wall, 1)
    r["log"] = log_path if log_dir else ""
    if not r.get("final"):
        phase = r.get("phase", "start")
        frames = _faulthandler_frames(log_text)
        if timed_out:
            r["status"] = "timeout"
            r["error"] = f"no result after {timeout:g} s (in phase {phase})"
            r["crash"] = {"type": "timeout", "message": r["error"], "outer": "", "polytile_frames": frames}
        else:
            sig = ""
            if rc < 0:
                try:
                    sig = signal.Signals(-rc).name
                except ValueError:
                    sig = f"signal {-rc}"
            why = f"the interpreter died ({sig or f'exit code {rc}'}) in phase {phase}"
            tail = " | ".join(line.strip() for line in log_text.strip().splitlines()[-4:])[:600]
            if phase in ("start", "build"):
                r["status"], r["error"] = "not_buildable", f"{why}: {tail}"
            elif phase == "eager":
                r["status"], r["error"] = "fail_eager", f"{why}: {tail}"
            else:
                r["status"], r["error"] = "crash", why
                r["crash"] = {"type": sig or f"exit {rc}", "message": f"{why}; log tail: {tail}", "outer": "",
                              "polytile_frames": frames}
    shutil.rmtree(tmp, ignore_errors=True)
    return r


def _child(spec_json: str, cfg_json: str, result_path: str) -> int:
    import faulthandler

    spec = Spec(**json.loads(spec_json))
    cfg = json.loads(cfg_json)
    faulthandler.enable()
    timeout = float(cfg.get("timeout") or 0)
    if timeout > 30:  # where a hang is: a stack dump shortly before the parent kills us
        faulthandler.dump_traceback_later(timeout - min(15.0, timeout * 0.05), exit=False)

    def save(r: dict) -> None:
        tmp = result_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(r, f, default=str)
        os.replace(tmp, result_path)

    try:
        r = run_one(spec, cfg, progress=save)
    except BaseException as e:  # a bug in the harness itself
        r = _base_result(spec, cfg)
        r.update(status="crash", final=True, error="harness: " + _short(e), crash=crash_info(e))
        save(r)
    print(f"coverage child: {spec.suite} {spec.name}: {r['status']}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (OpenMP / compiled-kernel unloading at exit)


def run(specs: list[Spec], cfg: dict, out_dir: str, command: str, *, isolate: bool = True,
        timeout: float = 600.0, echo: Callable[[str], None] | None = print) -> list[dict]:
    """Every spec through ``run_one`` (each in its own interpreter when ``isolate``); the report
    is rewritten after each model."""
    cfg = dict(cfg, timeout=timeout)
    env = environment(cfg)
    results: list[dict] = []
    write_report(results, env, out_dir, command, cfg)
    for k, spec in enumerate(specs, 1):
        reason = precheck(spec)
        if reason:  # known without starting an interpreter
            r = _base_result(spec, cfg)
            r.update(status="not_buildable", error=reason, final=True, wall_s=0.0)
        elif isolate:
            r = run_isolated(spec, cfg, timeout, log_dir=os.path.join(out_dir, "logs"))
        else:
            t0 = time.perf_counter()
            try:
                r = run_one(spec, cfg)
            except Exception as e:
                r = _base_result(spec, cfg)
                r.update(status="crash", error="harness: " + _short(e), crash=crash_info(e))
            r["wall_s"] = round(time.perf_counter() - t0, 1)
        results.append(r)
        write_report(results, env, out_dir, command, cfg)
        if echo:
            fb = r.get("fallbacks") or {}
            extra = f"compile {r['compile_s']:.1f} s, " if r.get("compile_s") is not None else ""
            extra += f"{sum(fb.values())} fallbacks over {len(fb)} ops" if fb else ""
            if r["status"] not in ("pass", "fallback") and r.get("error"):
                extra = (extra + "; " if extra else "") + r["error"][:160].replace("\n", " ")
            echo(f"[{k}/{len(specs)}] {spec.suite} {spec.name}: {r['status']} ({extra.strip(', ')}) "
                 f"{r.get('wall_s', 0):.0f} s")
    return results
