#!/usr/bin/env bash
# Set up .venv (idempotent) and run the whole test suite on both anyio backends.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q -p no:cacheprovider "$@"
