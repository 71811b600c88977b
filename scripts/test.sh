#!/usr/bin/env bash
# Set up .venv (idempotent) and run the whole test suite on both anyio backends.
# Extra arguments go to pytest.
#
# TEST_WORKERS=N runs the tests on N pytest-xdist processes (most tests wait on
# worker processes, subprocesses and peer timeouts rather than burn CPU); the
# default, 0, runs them all in this process. Not the default yet: on a loaded
# 2-core box, 2 or 3 xdist workers made timing-bound tests fail (a starved worker
# silent past its peer_timeout, a CLI subprocess not up within 60 s) that pass
# in one process under the same load. --dist loadgroup keeps the tests of one
# xdist_group (the Ray tests: one local cluster at a time; a cached TorchRL run) on
# one worker.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
xdist=()
if [ "${TEST_WORKERS:-0}" != 0 ]; then
    xdist=(-n "$TEST_WORKERS" --dist loadgroup)
fi
python -m pytest -q -p no:cacheprovider "${xdist[@]}" "$@"
