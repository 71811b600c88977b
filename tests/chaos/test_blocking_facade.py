"""Chaos: the blocking facade when the training loop's body raises or a worker dies.

The script runs in its own process: the fault under test is a process that never
exits (the portal's event loop thread left running), which no in-process test sees.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import anyio
import pytest

from .helpers import LIMIT, Sandbox, sandbox_env

SCRIPT = """
import json, os, signal, sys
from asyncrl import BlockingCollector, MultiSyncCollector
from asyncrl.testing import ValuePolicy, identity_env

if __name__ == "__main__":
    backend, fault = sys.argv[1], sys.argv[2]
    collector = MultiSyncCollector(identity_env, ValuePolicy(0.0), num_workers=2,
                                   frames_per_batch=20, total_frames=10**9,
                                   heartbeat_interval=0.2, peer_timeout=1.5)
    with BlockingCollector(collector, backend=backend) as c:
        for index, batch in enumerate(c):
            if index == 0:
                print(json.dumps({"pids": c.worker_pids}), flush=True)
                if fault == "body":
                    raise ValueError("loss is NaN")
                os.kill(c.worker_pids[0], signal.SIGKILL)  # the next batch fails
"""


def _run(sandbox: Sandbox, backend: str, fault: str) -> tuple[int, list[int], str]:
    script = sandbox.root / "train.py"
    script.write_text(SCRIPT)
    process = subprocess.Popen([sys.executable, str(script), backend, fault],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env=sandbox_env(sandbox))
    sandbox.watch(session=process.pid)
    try:
        out, err = process.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate(timeout=LIMIT)
        raise AssertionError(f"the script did not exit within {LIMIT} s:\n{err}") from None
    pids = json.loads(out.splitlines()[0])["pids"] if out.strip() else []
    return process.returncode, pids, err


@pytest.mark.chaos
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_error_in_the_loop_body_propagates_unchanged_and_the_process_exits(
        sandbox, backend: str) -> None:
    code, pids, err = _run(sandbox, backend, "body")
    assert code == 1, err
    assert len(pids) == 2, err
    assert err.rstrip().endswith("ValueError: loss is NaN"), err
    # The body's traceback as raised: one traceback, none of the portal's frames.
    assert err.count("Traceback") == 1 and "from_thread.py" not in err, err
    sandbox.watch(pids=pids)
    anyio.run(sandbox.assert_clean)


@pytest.mark.chaos
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_worker_lost_during_blocking_iteration_ends_the_process(sandbox, backend: str) -> None:
    code, pids, err = _run(sandbox, backend, "kill")
    assert code == 1, err
    assert len(pids) == 2, err
    assert "WorkerLostError" in err.strip().splitlines()[-1], err
    sandbox.watch(pids=pids)
    anyio.run(sandbox.assert_clean)
