#!/usr/bin/env bash
# Create .venv with asyncrl and everything the tests, examples and benchmarks need.
# torch is pinned first to the 2.13.0 CPU build so that nothing pulls a CUDA wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip >/dev/null
pip install -q "torch==2.13.0"
# atari (ale-py 3 MB, headless OpenCV 64 MB): the Atari benchmark, example and tests run
# real ALE frames with gymnasium's AtariPreprocessing, which needs cv2.
# editable_mode=compat: a plain path entry (.pth) instead of setuptools' import hook,
# so that mypy (and other static tools) see the installed package's types.
pip install -q -e ".[dev,torchrl,examples,ray,envpool,atari]" --config-settings editable_mode=compat
# Debian's chromium for the status page's headless-browser test (never fatal).
bash scripts/install_chromium.sh
