#!/usr/bin/env bash
# The wheels bench/gpu_check.py installs on a GPU machine that reaches no package registry: what
# gpudoctor needs beyond the PyTorch image's stack (pydantic and its parts, orjson, py-spy, a recent
# typing-extensions), for CPython 3.12 on x86-64 Linux. Run from the checkout's root, where the
# registry is reachable; .whl/ is ignored by git and carried to the GPU machine by name
# (the device tool's `carry: [".whl"]`). Another Python: PYVER=3.13 bench/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${PYVER:-3.12}"
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .whl \
  "pydantic==2.13.4" "pydantic-core==2.46.4" annotated-types typing-inspection typing-extensions orjson py-spy
ls .whl
