"""Chaos: a trainer that blocks its loop, restarts on the same port, or is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from asyncrl import MultiAsyncCollector, MultiSyncCollector
from asyncrl.testing import ValuePolicy, identity_env
from tests.multihost.lines import Lines
from tests.multihost.processes import free_port

from .helpers import (
    LIMIT,
    LIVENESS,
    PEER_TIMEOUT,
    RSS_GROWTH_MB,
    Sandbox,
    alive,
    assert_frames,
    cli_host,
    pids_in,
    rss_mb,
    sandbox_env,
    train,
)

TRAINER = str(Path(__file__).parent / "trainer.py")


def trainer(sandbox: Sandbox, *args: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, TRAINER, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               env=sandbox_env(sandbox))
    sandbox.watch(session=process.pid)
    return process


@pytest.mark.anyio
@pytest.mark.chaos
@pytest.mark.parametrize(("anyio_backend", "sync"), [("asyncio", True), ("trio", False)])
async def test_a_trainer_blocked_for_several_peer_timeouts_keeps_its_workers(
        sandbox, sync: bool) -> None:
    """A synchronous training step (time.sleep) of 4 peer timeouts loses nothing."""
    cls = MultiSyncCollector if sync else MultiAsyncCollector
    total = 200

    async def block(c, index: int) -> None:
        if index == 2:
            time.sleep(4 * PEER_TIMEOUT)  # the event loop is blocked: no heartbeat goes out

    rss = rss_mb()
    with anyio.fail_after(LIMIT):
        async with cls(identity_env, ValuePolicy(0.0), num_workers=2, frames_per_batch=20,
                       total_frames=total, **LIVENESS) as c:
            pids = list(c.worker_pids)
            batches, values = await train(c, after_batch=block)
            assert c.worker_pids == pids, "a worker was replaced"
        await sandbox.assert_clean()
    assert_frames(batches, values, total_frames=total)
    assert set(pids) <= pids_in(batches[3:]), "a worker stopped delivering after the block"
    assert rss_mb() - rss < RSS_GROWTH_MB


@pytest.mark.chaos
@pytest.mark.parametrize("workers", [1, 2])  # 1: weights sent directly; 2: through the relay
def test_a_reconnecting_host_acts_with_the_restarted_trainers_weights(
        sandbox, workers: int) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    first = trainer(sandbox, "remote", endpoint, str(workers))
    host = cli_host(endpoint, "--reconnect", "--workers", str(workers), sandbox=sandbox)
    try:
        events = Lines(first)
        events.until(lambda e: e["event"] == "batch" and e["version"] >= 5, LIMIT)
        first.kill()  # the old trainer dies without a goodbye, its workers at version >= 5
        first.wait(LIMIT)
        anyio.run(_second_trainer, endpoint, workers, sandbox)
        # The new trainer closed with a goodbye: the host exits by itself, cleanly.
        try:
            output = host.communicate(timeout=LIMIT)[0]
        except subprocess.TimeoutExpired:
            raise AssertionError("the host did not exit after the trainer closed") from None
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
            host.communicate(timeout=LIMIT)
    assert host.returncode == 0 and "Traceback" not in output, output
    anyio.run(sandbox.assert_clean)


async def _second_trainer(endpoint: str, workers: int, sandbox: Sandbox) -> None:
    total = 20 * workers * 10
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(identity_env, ValuePolicy(1000.0), num_workers=0,
                                      remote_workers=workers, listen=endpoint,
                                      frames_per_batch=10 * workers, total_frames=total,
                                      **LIVENESS) as c:
            batches, values = await train(c, offset=1000.0)
    # Version 0 is the host's own policy; every later version must be the new trainer's.
    values[0] = None
    assert_frames(batches, values, total_frames=total, from_start=False)


@pytest.mark.chaos
def test_a_killed_trainer_leaves_no_worker_and_no_socket_directory(sandbox) -> None:
    process = trainer(sandbox, "local")
    try:
        ready = Lines(process).until(lambda e: e["event"] == "ready", LIMIT)
        sandbox.watch(pids=ready["pids"])
        assert ready["endpoint"].startswith(f"ipc://{sandbox.root}/"), ready  # checked below
        assert sandbox.socket_dirs()
        assert all(alive(pid) for pid in ready["pids"])
        process.kill()
        process.wait(LIMIT)
    finally:
        if process.poll() is None:
            process.kill()
    # The workers notice their parent's death and exit; nobody is left to remove the
    # coordinator's socket directory but them.
    anyio.run(sandbox.assert_clean, 30.0)
