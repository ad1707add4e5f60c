#!/bin/bash
# The GPU benchmark in one command on a stock NVIDIA machine (Python 3.12, torch 2.11,
# Triton 3.6, no network), after benchmarks/gpu/prepare.sh on a development machine:
#   bash benchmarks/gpu/run.sh [OUT_DIR] [extra `polytile bench gpu` flags]
# Writes OUT_DIR/report.md and results.json (default: $OUT, else bench-gpu).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-bench-gpu}}"
shift || true
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/polytile-site .whl/*.whl
    export PYTHONPATH=/tmp/polytile-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
unset TRITON_INTERPRET
shapes=.bench-shapes
[ -d "$shapes" ] || shapes=../shared/bench
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv || true
python3 -m polytile.cli bench gpu --shapes-dir "$shapes" --out "$out" "$@"
