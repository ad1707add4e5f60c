"""The report: summary line, ``report.md`` and ``results.json``, the environment recorded."""
from __future__ import annotations

import collections
import json
import os

from .runner import TOL_INFERENCE, TOL_TRAIN

STATUSES = ("pass", "fallback", "fail_accuracy", "crash", "timeout", "fail_eager", "not_buildable", "too_large")
NOT_POLYTILE = ("fail_eager", "not_buildable", "too_large")  # left out of the pass rate


def summary(results: list[dict]) -> str:
    counts = collections.Counter(r["status"] for r in results)
    denom = len(results) - sum(counts[s] for s in NOT_POLYTILE)
    rate = f"{counts['pass']}/{denom} = {100 * counts['pass'] / denom:.0f}%" if denom else "n/a"
    parts = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])
    return f"{len(results)} models: {parts}; pass rate {rate} (pass / (all - fail_eager - not_buildable - too_large))"


def _f(x, spec=".1f") -> str:
    return "-" if x is None else format(x, spec)


def fallback_table(results: list[dict]) -> list[tuple[str, int, int, list[str]]]:
    """op -> (models, calls, model names), most models first."""
    models: dict[str, list[str]] = collections.defaultdict(list)
    calls: collections.Counter = collections.Counter()
    for r in results:
        for op, n in (r.get("fallbacks") or {}).items():
            models[op].append(r["name"])
            calls[op] += n
    return sorted(((op, len(ms), calls[op], ms) for op, ms in models.items()), key=lambda t: (-t[1], -t[2], t[0]))


def markdown(results: list[dict], env: dict, command: str, cfg: dict) -> str:
    from ...benchmarking import format_table

    inductor = bool(cfg.get("inductor"))
    rows = []
    for r in results:
        fb = r.get("fallbacks") or {}
        row = [r["suite"], r["name"], r.get("batch", "-"), r["status"], _f(r.get("params_m"), ".3g"),
               _f(r.get("compile_s")), sum(fb.values()), len(fb), r.get("graphs_failed", 0),
               r.get("graph_breaks", 0)]
        if inductor:
            row += [_f(r.get("inductor_compile_s")), _f(r.get("eager_ms")), _f(r.get("polytile_ms")),
                    _f(r.get("inductor_ms")), _f(r.get("speedup_eager"), ".2f"), _f(r.get("speedup_inductor"), ".2f")]
        row.append(_f(r.get("wall_s")))
        rows.append(row)
    headers = ["suite", "model", "batch", "status", "params M", "polytile compile s", "fallback calls",
               "fallback ops", "graphs failed", "graph breaks"]
    if inductor:
        headers += ["inductor compile s", "eager ms", "polytile ms", "inductor ms", "vs eager", "vs inductor"]
    headers.append("wall s")
    out = ["# polytile model coverage (PyTorch 2 benchmark lists)", f"Command: `{command}`",
           "Environment:\n" + "\n".join(f"- {k}: {v}" for k, v in env.items()),
           "**" + summary(results) + "**",
           ("Mode: training (dropout off; one forward and backward, loss = mean square of the first output; "
            f"loss and gradients vs eager by the accuracy rule, tol {TOL_TRAIN})." if cfg.get("train") else
            f"Mode: inference (torch.no_grad, eval; outputs vs eager by the accuracy rule, tol {TOL_INFERENCE}).")
           + " Each model runs in its own interpreter with a fresh polytile kernel cache (and Inductor cache): "
             "`polytile compile s` is the cold first call through torch.compile."
           + (f" Times are medians of {cfg.get('rounds', 3)} alternating calls after one warm-up." if inductor else ""),
           format_table(headers, rows)]
    crashes = [r for r in results if r["status"] in ("crash", "timeout")]
    if crashes:
        lines = []
        for r in crashes:
            c = r.get("crash") or {}
            head = f"- **{r['suite']} {r['name']}** ({r['status']}, phase {r.get('phase', '?')}): "
            head += f"{c.get('type', '')}: {(c.get('message') or r.get('error', ''))[:400]}".replace("\n", " ")
            if c.get("outer"):
                head += f" (raised as {c['outer']})"
            lines.append(head)
            frames = c.get("polytile_frames") or []
            lines += [f"    - `{fr}`" for fr in frames] or ["    - (no frame inside polytile)"]
        out.append("## Crashes and timeouts\n\n" + "\n".join(lines))
    acc = [r for r in results if r["status"] == "fail_accuracy"]
    if acc:
        out.append("## Accuracy failures\n\n" + "\n".join(f"- **{r['suite']} {r['name']}**: {r['accuracy'][:600]}"
                                                        for r in acc))
    table = fallback_table(results)
    if table:
        out.append("## Fallbacks by op\n\n" + format_table(
            ["op", "models", "calls", "which"],
            [[op, m, c, ", ".join(ms[:6]) + (" ..." if len(ms) > 6 else "")] for op, m, c, ms in table]))
    warned: dict[str, list[str]] = collections.defaultdict(list)
    for r in results:
        for w in r.get("warnings") or []:
            warned[w].append(r["name"])
    if warned:
        out.append("## polytile warnings (why ops ran in ATen, failed graph compilations)\n\n" + "\n".join(
            f"- {w} ({len(ms)} model{'s' if len(ms) > 1 else ''}: {', '.join(ms[:5])})"
            for w, ms in sorted(warned.items(), key=lambda kv: -len(kv[1]))))
    other = [r for r in results if r["status"] in NOT_POLYTILE]
    if other:
        out.append("## Not run by polytile (eager failures, not buildable offline, too large)\n\n" + "\n".join(
            f"- {r['suite']} {r['name']} ({r['status']}): {r.get('error', '')[:300]}" for r in other))
    notes = [r for r in results if r.get("notes") or r.get("inductor_error")]
    if notes:
        out.append("## Notes\n\n" + "\n".join(
            f"- {r['name']}: {'; '.join(r.get('notes') or [])} {r.get('inductor_error') or ''}".rstrip() for r in notes))
    return "\n\n".join(out) + "\n"


def write_report(results: list[dict], env: dict, out_dir: str, command: str, cfg: dict) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"markdown": os.path.join(out_dir, "report.md"), "json": os.path.join(out_dir, "results.json")}
    for key, text in (("markdown", markdown(results, env, command, cfg)),
                      ("json", json.dumps({"environment": env, "command": command, "config": cfg,
                                           "summary": summary(results), "results": results}, indent=1, default=str))):
        tmp = paths[key] + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, paths[key])
    return paths


def environment(cfg: dict) -> dict:
    from ..suite import environment as env0

    env = env0()
    env["threads"] = cfg.get("threads", 2)
    env["mode"] = "training" if cfg.get("train") else "inference"
    try:
        import torchvision

        env["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    if cfg.get("max_bytes"):
        env["memory budget GB"] = round(cfg["max_bytes"] / 1e9, 1)
    env["timeout s"] = cfg.get("timeout")
    return env
