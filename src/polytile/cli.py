"""Command line: ``polytile demo`` (more commands come with the benchmark suites)."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="polytile", description="polytile compiler tools")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="compile resnet18 and BERT, check against eager, time vs eager and Inductor")
    d.add_argument("--threads", type=int, default=None)
    d.add_argument("--rounds", type=int, default=10)
    d.add_argument("--seq", type=int, default=128)
    d.add_argument("--no-inductor", action="store_true", help="skip torch.compile's default backend")
    a = ap.parse_args(argv)
    if a.cmd == "demo":
        from .demo import run_demo

        print(run_demo(threads=a.threads, rounds=a.rounds, seq=a.seq, inductor=not a.no_inductor))
    return 0


if __name__ == "__main__":
    sys.exit(main())
