"""BlockingCollector in TorchRL's shape: no ``with``; it starts on first use and always closes.

``c = BlockingCollector(...); for b in c: ...; c.shutdown()`` as a ported
TorchRL script writes it; the close also comes from garbage collection (with a
``ResourceWarning``) and from interpreter exit, never leaving a worker behind.
Each test runs the collector's loop on both anyio backends.
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from asyncrl import BlockingCollector, Collector, MultiSyncCollector
from asyncrl.testing import CountingEnv, ParamPolicy

from ..process_checks import pid_alive

BACKENDS = pytest.mark.parametrize("backend", ["asyncio", "trio"])
LIMIT = 120  # generous: 2 shared cores, spawned interpreters start slowly
counting = functools.partial(CountingEnv, length=4)


def _multi(policy: ParamPolicy, **kwargs) -> MultiSyncCollector:
    return MultiSyncCollector(counting, policy, num_workers=2, frames_per_batch=8, **kwargs)


def _wait_dead(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while any(map(pid_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if pid_alive(pid)]


@BACKENDS
def test_the_torchrl_shape_gives_exact_batches_and_shutdown_leaves_no_worker(backend) -> None:
    policy = ParamPolicy(1.0)
    c = BlockingCollector(_multi(policy, total_frames=24), backend=backend)
    batches, pids = [], []
    for batch in c:  # the first use starts it
        batches.append(batch)
        pids = pids or c.worker_pids
        with torch.no_grad():
            policy.value.neg_()
        c.update_policy_weights_()
    c.shutdown()
    c.shutdown()  # idempotent
    assert [int(b["collector", "policy_version"].max()) for b in batches] == [0, 1, 2]
    assert [b["action"].flatten().tolist() for b in batches] == [[1] * 8, [0] * 8, [1] * 8]
    assert batches[0]["observation"][0, :, 0].tolist() == [0, 1, 2, 3]  # two workers' shares
    assert len(pids) == 2 and _wait_dead(pids, 0) == []  # shutdown() returned: all gone
    with pytest.raises(RuntimeError, match=r"was shut down: .*create a new BlockingCollector"):
        next(iter(c))


@BACKENDS
def test_any_call_starts_it_and_with_still_closes_it(backend) -> None:
    policy = ParamPolicy(1.0)
    c = BlockingCollector(Collector(counting, policy, frames_per_batch=4, total_frames=8),
                          backend=backend)
    c.update_policy_weights_()  # the first use: starts the collector, then sends
    assert c.policy_version == 1
    with c:  # entering a started facade keeps it; leaving closes it
        assert [b["collector", "policy_version"].unique().tolist() for b in c] == [[1], [1]]
    assert c.collector._closed  # noqa: SLF001
    with pytest.raises(RuntimeError, match="was shut down"):
        c.update_policy_weights_()


@BACKENDS
def test_shutdown_before_any_use_starts_nothing(backend) -> None:
    c = BlockingCollector(_multi(ParamPolicy()), backend=backend)
    c.shutdown()
    assert c.worker_pids == [] and c.collector._closed  # noqa: SLF001
    with pytest.raises(RuntimeError, match="was shut down"):
        next(iter(c))


@BACKENDS
def test_a_collector_dropped_while_open_warns_and_closes_its_workers(backend) -> None:
    c = BlockingCollector(_multi(ParamPolicy(), total_frames=-1), backend=backend)
    next(iter(c))
    pids = c.worker_pids
    assert len(pids) == 2 and all(map(pid_alive, pids))
    with pytest.warns(ResourceWarning, match=r"BlockingCollector\(MultiSyncCollector\) was "
                                             r"garbage-collected while open.*shutdown\(\)"):
        del c
        gc.collect()
    assert _wait_dead(pids, 0) == []  # the close happened during the collection


SCRIPT = textwrap.dedent("""
    import functools, sys
    from asyncrl import BlockingCollector, MultiSyncCollector
    from asyncrl.testing import CountingEnv, ParamPolicy

    if __name__ == "__main__":
        collector = MultiSyncCollector(functools.partial(CountingEnv, length=4), ParamPolicy(),
                                       num_workers=2, frames_per_batch=8, total_frames=-1)
        c = BlockingCollector(collector, backend=sys.argv[1])
        for index, batch in enumerate(c):
            c.update_policy_weights_()
            if index == 2:
                break
        print(*c.worker_pids, flush=True)
        # no shutdown(): the interpreter's exit closes it
""")


@BACKENDS
def test_a_script_that_never_calls_shutdown_exits_cleanly(tmp_path, backend) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    process = subprocess.Popen([sys.executable, "-W", "always::ResourceWarning", str(script),
                                backend], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise AssertionError(f"the script did not exit within {LIMIT} s:\n{err}") from None
    pids = [int(pid) for pid in out.split()]
    assert process.returncode == 0, err
    assert len(pids) == 2, (out, err)
    # Gone when the trainer exited (the exit hook closed them), not later by their heartbeats.
    assert _wait_dead(pids, 0) == [], err
    assert "Traceback" not in err and "ResourceWarning" not in err, err
