"""A trainer that stops is not a run that finished; a host that stops is not a host lost.

A trainer's close says whether the run is over (``total_frames`` reached): then
its hosts go home (exit 0). A trainer stopped before that (SIGTERM: a rollout
restart, a node drain) only stops, and hosts started with ``--reconnect`` wait
for the next one (up to ``--give-up-after``), whose batches then come. On the
trainer, a host's SIGTERM goodbye is a planned departure, logged at INFO; only
a host that vanishes (kill -9) is a loss, and warns.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from asyncrl import MultiAsyncCollector
from asyncrl.testing import ParamPolicy
from tests.multihost.lines import Lines
from tests.multihost.processes import free_port, kill_group

LIMIT = 120
STOPPING_TRAINER = Path(__file__).parent / "stopping_trainer.py"


def trainer(endpoint: str, workers: int, total_frames: int, value: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(STOPPING_TRAINER), endpoint, str(workers), str(total_frames),
         str(value)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def worker_host(endpoint: str, workers: int, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", endpoint, "--env",
         "CartPole-v1", "--policy", "asyncrl.testing:ParamPolicy", "--workers", str(workers),
         "--peer-timeout", "2", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def stop(*trainers: subprocess.Popen | None, host: subprocess.Popen | None = None) -> None:
    for process in trainers:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(LIMIT)
    if host is not None and host.poll() is None:
        kill_group(host)  # its worker processes and relay too


@pytest.mark.parametrize("workers", [1, 2], ids=["direct", "relay"])
def test_hosts_wait_through_a_sigterm_to_the_trainer_and_go_home_when_the_run_is_over(
        workers: int) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    total = 10 * workers * 6
    first = trainer(endpoint, workers, -1, -1.0)  # acts 0
    host = worker_host(endpoint, workers, "--reconnect")
    second = None
    try:
        Lines(first).until(lambda e: e["event"] == "batch", LIMIT)
        first.send_signal(signal.SIGTERM)  # kubectl rollout restart: a stop, not the end
        assert first.wait(LIMIT) == 0
        assert host.poll() is None, "the host left with the stopping trainer"
        second = trainer(endpoint, workers, total, 1.0)  # acts 1
        events = Lines(second)
        done = events.until(lambda e: e["event"] == "done", LIMIT)
        code = host.wait(LIMIT)  # that run is over: its close sends the host home
    finally:
        stop(first, second, host=host)
    output = host.stdout.read()
    batches = [e for e in events.events if e["event"] == "batch"]
    assert done["frames"] == total == sum(b["frames"] for b in batches)
    assert all(b["actions"] == [1] for b in batches)  # the new trainer's weights, from frame 0
    assert {w for b in batches for w in b["workers"]} == set(range(workers))
    assert code == 0, output
    assert "stopping before the run finished" in output, output
    assert "Traceback" not in output, output


def test_a_host_gives_up_on_a_stopped_trainer_after_give_up_after() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    first = trainer(endpoint, 2, -1, 1.0)
    host = worker_host(endpoint, 2, "--reconnect", "--give-up-after", "3")
    try:
        Lines(first).until(lambda e: e["event"] == "batch", LIMIT)
        first.send_signal(signal.SIGTERM)
        assert first.wait(LIMIT) == 0
        code = host.wait(LIMIT)
    finally:
        stop(first, host=host)
    output = host.stdout.read()
    assert code == 3, output  # non-zero: the orchestrator restarts it
    assert "no next one answered within --give-up-after 3.0 s" in output, output


# -- the trainer's log when a host stops ------------------------------------------------------
async def wait_until(predicate) -> None:
    while not predicate():
        await anyio.sleep(0.05)


@pytest.mark.parametrize("how", ["sigterm", "kill-9"])
async def test_a_host_stopped_by_sigterm_leaves_only_info_records_and_a_killed_one_warns(
        how: str, anyio_backend: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asyncrl")
    host = None
    try:
        with anyio.fail_after(LIMIT):
            async with MultiAsyncCollector(
                    "CartPole-v1", ParamPolicy(1.0), num_workers=0, remote_workers=2,
                    listen="tcp://127.0.0.1:0", frames_per_batch=20, total_frames=-1,
                    on_worker_loss="continue", heartbeat_interval=0.25,
                    peer_timeout=2.0) as collector:
                host = worker_host(collector.endpoint, 2)
                batches = collector.__aiter__()
                await batches.__anext__()
                coordinator = collector._run.coordinator
                assert coordinator is not None
                # Both admitted (tests/asyncrl/worker/test_worker_exits.py stops one
                # that is still starting).
                await wait_until(lambda: len(coordinator.roster.relays) == 1
                                 and len(coordinator.roster.live_workers) == 2)
                caplog.clear()
                if how == "sigterm":
                    host.send_signal(signal.SIGTERM)  # the pod stops: workers, then its relay
                    assert await anyio.to_thread.run_sync(host.wait, LIMIT) == 0
                else:
                    os.killpg(host.pid, signal.SIGKILL)
                await wait_until(lambda: not coordinator.roster.live_workers
                                 and not coordinator.roster.relays)
                await anyio.sleep(1.0)  # late records (the goodbyes' echoes) have come
                records = [(r.levelname, r.name, r.getMessage()) for r in caplog.records]
    finally:
        stop(host=host)
    warnings = [r for r in records if r[0] not in ("DEBUG", "INFO")]
    if how == "sigterm":
        assert host is not None
        said = (records, host.stdout.read())  # the host's workers' own account
        assert warnings == [], said
        assert sum("left the run" in r[2] for r in records) == 2, said
        assert any("relay" in r[2] and "left" in r[2] for r in records), said
    else:
        assert sum("was lost" in r[2] for r in warnings) >= 2, records
