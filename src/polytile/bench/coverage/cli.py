"""Command line: ``polytile bench coverage`` (``add_arguments``, ``main_args``) and
``python -m polytile.bench.coverage`` (``main``, also the ``--one`` child)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from .isolate import _child, run
from .lists import collect, default_lists_dir
from .report import summary


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", choices=["hf", "timm", "torchbench", "all"], default="all")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="only this model (repeatable)")
    p.add_argument("--limit", type=int, default=None, help="the first N models of each suite")
    p.add_argument("--models-file", default=None,
                   help="a custom list: lines 'suite:name[,batch] [{json overrides}]' (suite: hf, timm, torchbench)")
    p.add_argument("--lists-dir", default=None, help="default: shared/bench/pytorch2")
    p.add_argument("--batch", type=int, default=None, help="default 1 (2 for vision models with --train)")
    p.add_argument("--timeout", type=float, default=600.0, help="wall-clock seconds per model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--inductor", action="store_true",
                   help="also Inductor's cold compile time and eager/polytile/Inductor speedups (slow)")
    p.add_argument("--rounds", type=int, default=3, help="timed alternating calls per system (with --inductor)")
    p.add_argument("--train", action="store_true", help="training mode: one forward+backward, gradients vs eager")
    p.add_argument("--max-gb", type=float, default=None,
                   help="skip models whose parameters need more memory (default: 70%% of MemAvailable)")
    p.add_argument("--options", default=None, metavar="JSON", help="extra polytile options")
    p.add_argument("--in-process", action="store_true", help="no subprocess per model (no timeout; for debugging)")
    p.add_argument("--out", default="coverage-out", help="folder for report.md, results.json, logs/")


def main_args(a: argparse.Namespace, command: str) -> int:
    try:
        specs = collect(a.suite, a.only, a.limit, a.lists_dir or default_lists_dir(), a.models_file)
    except (OSError, ValueError) as e:
        print(f"polytile: {e}", file=sys.stderr)
        return 2
    if not specs:
        print("polytile: no model matches", file=sys.stderr)
        return 2
    avail = _mem_available()
    max_bytes = int(a.max_gb * 1e9) if a.max_gb else (int(avail * 0.7) if avail else None)
    cfg = {"threads": a.threads, "batch": a.batch, "train": a.train, "inductor": a.inductor, "rounds": a.rounds,
           "max_bytes": max_bytes, "options": json.loads(a.options) if a.options else None}
    results = run(specs, cfg, a.out, command, isolate=not a.in_process, timeout=a.timeout)
    print(summary(results))
    print(f"report: {os.path.join(a.out, 'report.md')}  results: {os.path.join(a.out, 'results.json')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--one":  # the per-model child process
        ap = argparse.ArgumentParser(prog="polytile.bench.coverage --one")
        ap.add_argument("--one", required=True)
        ap.add_argument("--cfg", required=True)
        ap.add_argument("--result", required=True)
        c = ap.parse_args(argv)
        return _child(c.one, c.cfg, c.result)
    ap = argparse.ArgumentParser(prog="python -m polytile.bench.coverage")
    add_arguments(ap)
    return main_args(ap.parse_args(argv), "python -m polytile.bench.coverage " + " ".join(argv))
