"""Reports of the model suite: markdown table, PNG chart of speedups, JSON of the raw results."""
from __future__ import annotations

import json
import math
import os

from ..benchmarking import format_table
from .flops import peak_ms
from .suite import ModelResult

PEAK_KEY = "fma peak GFLOP/s"


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summary(results: list[ModelResult]) -> str:
    passing = [r for r in results if r.status == "pass"]
    ge = geomean([r.speedup_eager for r in passing])
    gi = geomean([r.speedup_inductor for r in passing])
    gf = geomean([r.speedup_frozen for r in passing])
    fmt = lambda x: f"{x:.2f}x" if x else "n/a"  # noqa: E731
    frozen = f", {fmt(gf)} vs Inductor with freezing" if gf else ""
    return (f"pass rate {len(passing)}/{len(results)} (compiled with zero fallbacks and accurate); "
            f"geomean speedup over the passing models: {fmt(ge)} vs eager, {fmt(gi)} vs Inductor{frozen}")


def _f(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def markdown(results: list[ModelResult], env: dict, command: str) -> str:
    rows = []
    peak = env.get(PEAK_KEY)
    for r in results:
        fb = ", ".join(f"{k.replace('aten.', '')} x{v}" for k, v in sorted(r.fallbacks.items())) or "0"
        at_peak = peak_ms(r.gflop, peak)
        rows.append([r.suite, r.name, r.batch, r.status, r.accuracy[:60] or "-", _f(r.eager_ms), _f(r.inductor_ms),
                     _f(r.frozen_ms), _f(r.polytile_ms), _f(r.speedup_eager, ".2f"), _f(r.speedup_inductor, ".2f"),
                     _f(r.speedup_frozen, ".2f"),
                     _f(r.gflop), _f(_ratio(100 * at_peak, r.polytile_ms) if at_peak else None, ".0f"),
                     _f(_ratio(r.inductor_ms, at_peak), ".2f"), _f(r.compile_s), _f(r.inductor_compile_s), fb, r.rounds])
    table = format_table(["suite", "model", "batch", "status", "accuracy", "eager ms", "inductor ms",
                          "inductor frozen ms", "polytile ms", "vs eager", "vs inductor", "vs inductor frozen", "GFLOP", "% of peak", "ceiling vs inductor", "compile s",
                          "inductor compile s", "fallbacks", "rounds"], rows)
    failures = [f"- **{r.name}** ({r.status}): {r.error or r.accuracy or ', '.join(r.fallbacks)}"
                for r in results if r.status != "pass"]
    env_lines = "\n".join(f"- {k}: {v}" for k, v in env.items())
    if env.get("mode") == "training":
        how = ("Training mode (dropout off, batch norm in train mode): a model passes when its gradients "
               "after one forward and backward step, and its weights after 3 SGD-with-momentum steps, "
               "match eager's by the accuracy rule (tol 1e-2, PyTorch's training tolerance), with no op "
               "run through ATen. Times are medians of alternating steps (zero_grad, forward, backward; "
               "the optimizer is left out) after warm-up; `compile s` and `inductor compile s` are each system's first step "
               "(with the kernel caches as they were: `bench coverage` measures cold compiles).")
        return "\n\n".join(["# polytile model suite, training", f"Command: `{command}`",
                             "Environment:\n" + env_lines, "**" + summary(results) + "**", how, table,
                             "## Failures and their causes\n\n" + ("\n".join(failures) if failures else "none")]) + "\n"
    return "\n\n".join([
        "# polytile model suite", f"Command: `{command}`", "Environment:\n" + env_lines,
        "**" + summary(results) + "**",
        "Times are medians of alternating calls (eager, polytile, Inductor, Inductor with "
        "`freezing=True`: its best CPU inference mode) after warm-up, "
        "under torch.no_grad(), all with the same thread count; `rounds` is how many calls each "
        "system got (fewer for slow models, to bound the run). `GFLOP` is the contraction work of one "
        "call (matmul, bmm, convolution, attention; torch's FlopCounterMode on eager); `% of peak` is "
        "that work over polytile's whole time against the FMA peak measured in the same run; `ceiling "
        "vs inductor` is the speedup over Inductor that running those contractions at exactly the "
        "peak, and everything else in no time, would give: no compiler can beat it on this machine.",
        table, "## Failures and their causes\n\n" + ("\n".join(failures) if failures else "none"),
    ]) + "\n"


def chart(results: list[ModelResult], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rs = [r for r in results if r.polytile_ms]
    if not rs:
        return None
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(rs)), 5))
    xs = range(len(rs))
    w = 0.4
    ax.bar([x - w / 2 for x in xs], [r.speedup_eager or 0 for r in rs], w, label="polytile vs eager")
    ax.bar([x + w / 2 for x in xs], [r.speedup_inductor or 0 for r in rs], w, label="polytile vs Inductor")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r.name for r in rs], rotation=70, ha="right", fontsize=8)
    ax.set_ylabel("speedup (higher is better)")
    ax.set_title("polytile speedup, " + summary(results).split(";")[0])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(results: list[ModelResult], env: dict, out_dir: str, command: str) -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"markdown": os.path.join(out_dir, "report.md"), "json": os.path.join(out_dir, "results.json")}
    with open(paths["markdown"], "w") as f:
        f.write(markdown(results, env, command))
    with open(paths["json"], "w") as f:
        json.dump({"environment": env, "command": command, "results": [r.to_dict() for r in results]}, f, indent=1)
    png = chart(results, os.path.join(out_dir, "speedup.png"))
    if png:
        paths["chart"] = png
    return paths
