"""A host's workers are admitted together or not at all, and a part host does not linger.

Two 2-worker hosts racing for two places: one is admitted whole, the other is
refused whole (as full: it asks again until ``--join-timeout``, then exits 4), or
waits unready and joins whole once the first leaves. As a backstop, a host whose
workers stay part admitted (here: one process killed) exits non-zero after its
bound, so that its orchestrator restarts it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from asyncrl import MultiAsyncCollector
from asyncrl.testing import ParamPolicy
from tests.multihost.lines import Lines
from tests.multihost.processes import free_port, kill_group

LIMIT = 120
TRAINER = Path(__file__).parent / "trainer.py"  # MultiAsyncCollector, 100-frame batches
WHOLE = "a host joins whole or not at all"


def trainer(endpoint: str, total_frames: int, remote_workers: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(TRAINER), endpoint, str(total_frames),
                             str(remote_workers)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def worker_host(endpoint: str, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", endpoint, "--env",
         "CartPole-v1", "--policy", "asyncrl.testing:ParamPolicy", "--workers", "2",
         "--peer-timeout", "2", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def worker_processes(host: subprocess.Popen, count: int) -> list[int]:
    """The host's ``count`` worker processes: its Python children but the resource tracker.

    Polled (bounded): a short-lived child (``ldconfig`` run by ctypes' find_library while
    a worker imports torch) may be listed for a moment.
    """
    deadline = time.monotonic() + 30
    while True:
        found = []
        for pid in subprocess.run(["pgrep", "-P", str(host.pid)], capture_output=True,
                                  text=True).stdout.split():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    line = cmdline.read()
            except OSError:
                continue  # gone meanwhile
            if b"python" in line and b"resource_tracker" not in line:
                found.append(int(pid))
        if len(found) == count or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def stop(first: subprocess.Popen | None, *hosts: subprocess.Popen) -> None:
    if first is not None and first.poll() is None:
        first.kill()
        first.wait(LIMIT)
    for host in hosts:
        if host.poll() is None:
            kill_group(host)


async def exited(host: subprocess.Popen) -> int:
    return await anyio.to_thread.run_sync(host.wait, LIMIT)


def collector(total_frames: int) -> MultiAsyncCollector:
    # Async mode: workers run at most `prefetch` batches ahead, so the run cannot end
    # while the test does not take batches; it waits on the hosts in between.
    return MultiAsyncCollector(
        "CartPole-v1", ParamPolicy(1.0), num_workers=0, remote_workers=2,
        listen=f"tcp://127.0.0.1:{free_port()}", frames_per_batch=100,
        total_frames=total_frames, on_worker_loss="continue", heartbeat_interval=0.25,
        peer_timeout=2.0)


def skip_trio(anyio_backend: str) -> None:
    if anyio_backend == "trio":
        pytest.skip("host processes and sockets are the same on both backends; once is enough")


@pytest.mark.anyio
async def test_two_hosts_racing_for_two_places_one_joins_whole_the_other_exits_refused(
        anyio_backend: str, caplog: pytest.LogCaptureFixture) -> None:
    skip_trio(anyio_backend)
    caplog.set_level(logging.WARNING, logger="asyncrl")
    total, seen = 2000, []
    hosts: list[subprocess.Popen] = []
    try:
        with anyio.fail_after(2 * LIMIT):
            async with collector(total) as c:
                hosts = [worker_host(c.endpoint, "--join-timeout", "6") for _ in range(2)]
                async for batch in c:
                    seen.append(batch)
                    if len(seen) == 1:  # one host runs: the other is refused whole, exits
                        refused = await first_to_exit(hosts)
            # The run is over: its close sends the admitted host home.
            assert await exited(hosts[1 - refused]) == 0
    finally:
        stop(None, *hosts)
    output = hosts[refused].stdout.read()
    assert hosts[refused].returncode == 4, output
    assert output.count("still full after --join-timeout") == 2, output  # both, whole
    assert WHOLE in output, output
    assert sum(b.numel() for b in seen) == total == c.frames_collected
    assert {int(b["collector", "worker_id"].flatten()[0]) for b in seen} == {0, 1}
    assert sum(WHOLE in r.getMessage() for r in caplog.records) >= 2


async def first_to_exit(hosts: list[subprocess.Popen]) -> int:
    """The index of the first host to exit (the caller bounds the wait)."""
    while True:
        for index, host in enumerate(hosts):
            if host.poll() is not None:
                return index
        await anyio.sleep(0.1)


@pytest.mark.anyio
async def test_a_host_refused_whole_waits_and_joins_whole_once_the_other_leaves(
        anyio_backend: str, caplog: pytest.LogCaptureFixture) -> None:
    skip_trio(anyio_backend)
    caplog.set_level(logging.WARNING, logger="asyncrl")
    total, seen = 3000, []
    a = b = None
    try:
        with anyio.fail_after(3 * LIMIT):
            async with collector(total) as c:
                a = worker_host(c.endpoint)
                async for batch in c:
                    seen.append(batch)
                    if len(seen) == 1:
                        b = worker_host(c.endpoint, "--join-timeout", str(3 * LIMIT))
                        while sum(WHOLE in r.getMessage() for r in caplog.records) < 2:
                            await anyio.sleep(0.1)  # b is refused whole, asks again
                        a.send_signal(signal.SIGTERM)  # a leaves: its places free at once
                        assert await exited(a) == 0
                        first_of_b = len(seen)
            assert b is not None
            code = await exited(b)
    finally:
        stop(None, *(h for h in (a, b) if h is not None))
    assert code == 0, b.stdout.read()
    workers = [int(batch["collector", "worker_id"].flatten()[0]) for batch in seen]
    assert sum(batch.numel() for batch in seen) == total == c.frames_collected
    assert set(workers[:first_of_b]) <= {0, 1}
    # b's two joined whole, after a left (a's last delivered batches may still follow).
    assert {2, 3} <= set(workers[first_of_b:]) <= {0, 1, 2, 3}
    assert set(workers[-3:]) <= {2, 3}


def test_a_host_that_stays_part_admitted_exits_non_zero_after_its_bound() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    first = trainer(endpoint, 10**9, 2)
    host = None
    try:
        events = Lines(first)
        # Only then: on a loaded machine the trainer's start alone outlasts --join-timeout.
        events.until(lambda e: e["event"] == "listening", LIMIT)
        host = worker_host(endpoint, "--join-timeout", "3")  # the backstop's bound: 3 + 2 x 2 s
        events.until(lambda e: e["event"] == "batch", LIMIT)
        workers = worker_processes(host, 2)
        assert len(workers) == 2, workers
        os.kill(max(workers), signal.SIGKILL)  # one worker process dies (OOM, a crash)
        code = host.wait(LIMIT)
    finally:
        stop(first, *(h for h in (host,) if h is not None))
    assert host is not None
    output = host.stdout.read()
    assert code != 0, output
    assert "only 1 of this host's 2 workers were admitted (1 running)" in output, output
