#!/bin/bash
# Run on a development machine (with the package registry) before the GPU run: fetches the
# wheels the stock GPU image lacks (islpy for Python 3.12) into .whl/ and copies the shape
# files into .bench-shapes/ (../shared does not travel with the repository). Both folders are
# git-ignored; the device tool carries them: carry [".whl", ".bench-shapes"].
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl .bench-shapes
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl islpy
cp ../shared/bench/*.csv .bench-shapes/
ls -l .whl .bench-shapes
