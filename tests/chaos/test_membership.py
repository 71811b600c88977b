"""Chaos: remote workers (``asyncrl worker`` hosts) leave, die and are replaced mid-run.

Elastic membership, end to end over TCP: a host stopped with SIGTERM leaves
cleanly (a departure, even under ``on_worker_loss="raise"``), a killed one is
lost on its closed connection (not after ``peer_timeout``), a worker refused
because the run is full asks again and takes the first free place, and a
worker that is never answered gives up after ``--join-timeout``. Every run
checks its frames (each env step once, none lost but a departed worker's
abandoned batch) and versions (each frame acted with the weights it is
stamped with), and its exact total.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncrl import MultiAsyncCollector, MultiSyncCollector
from asyncrl.testing import ValuePolicy, identity_env

from .helpers import LIMIT, LIVENESS, assert_frames, cli_host, pids_in, train, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]
TOTAL = 400


def remote_collector(sync: bool, remote_workers: int, **kwargs: Any) -> Any:
    cls = MultiSyncCollector if sync else MultiAsyncCollector
    options = {**LIVENESS, **kwargs}
    return cls(identity_env, ValuePolicy(0.0), num_workers=0, remote_workers=remote_workers,
               listen="tcp://127.0.0.1:0", frames_per_batch=10 * remote_workers if sync else 20,
               total_frames=TOTAL, **options)


def stop(*hosts: subprocess.Popen) -> None:
    for host in hosts:
        if host.poll() is None:
            host.kill()
        host.wait(LIMIT)
        if os.environ.get("CHAOS_DEBUG") and host.stdout:
            print(f"--- host {host.pid} exit {host.returncode}:\n{host.stdout.read()}")


async def wait_exit(host: subprocess.Popen) -> int:
    while host.poll() is None:
        await anyio.sleep(0.05)
    return host.returncode


def record_events(collector: Any, tg: Any) -> list[Any]:
    """Every event of ``collector`` from now on, appended as it comes (subscribe first)."""
    seen: list[Any] = []
    stream = collector.events()

    async def pump() -> None:
        async for event in stream:
            seen.append(event)

    tg.start_soon(pump)
    return seen


async def joined(collector: Any, count: int) -> None:
    await wait_for(lambda: sum(s.state in ("collecting", "idle")
                               for s in collector.statistics().workers) >= count,
                   f"{count} live workers")


async def sigterm_group_until_gone(host: subprocess.Popen) -> None:
    """SIGTERM to the host's whole process group (systemd's KillMode=control-group), then
    again and again until it is gone: each process must stop once, cleanly (exit 0), however
    many come; the host also forwards one to its workers."""
    while host.poll() is None:
        try:
            os.killpg(host.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        await anyio.sleep(0.02)


@pytest.mark.parametrize(("anyio_backend", "sync", "group"),
                         [("asyncio", True, True), ("trio", False, False)],
                         ids=["sync-asyncio-sigterm-to-the-group-repeated",
                              "async-trio-sigterm-to-the-host"])
async def test_a_host_stopped_with_sigterm_leaves_and_the_run_stays_exact(
        sandbox, sync: bool, group: bool) -> None:
    """Under the default on_worker_loss="raise": a goodbye is a departure, not a loss."""
    hosts: list[subprocess.Popen] = []
    try:
        with anyio.fail_after(3 * LIMIT):
            c = remote_collector(sync, 2)
            async with anyio.create_task_group() as tg, c:
                events = record_events(c, tg)
                hosts += [cli_host(c.endpoint, sandbox=sandbox) for _ in range(2)]

                async def after_batch(c: Any, index: int) -> None:
                    if index == 3:
                        if group:
                            tg.start_soon(sigterm_group_until_gone, hosts[0])
                        else:
                            hosts[0].send_signal(signal.SIGTERM)
                        await wait_for(lambda: any(e.kind == "left" for e in events),
                                       "the departure")

                batches, values = await train(c, after_batch=after_batch)
                states = sorted(s.state for s in c.statistics().workers)
            codes = [await wait_exit(h) for h in hosts]
        await sandbox.assert_clean()
    finally:
        stop(*hosts)
    assert codes == [0, 0], [h.stdout.read() for h in hosts if h.stdout]
    assert [e.kind for e in events].count("left") == 1, events
    assert not [e for e in events if e.kind == "lost"], events
    assert states.count("left") == 1, states
    assert_frames(batches, values, total_frames=TOTAL)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_killed_remote_worker_is_lost_at_once_and_replaced(sandbox) -> None:
    """SIGKILL, peer_timeout far away: the closed connection is the loss; a new host
    takes the free place, gets the latest weights before its first frame."""
    hosts: list[subprocess.Popen] = []
    try:
        with anyio.fail_after(3 * LIMIT):
            # peer_timeout=120: only the closed connection can end the wait in time.
            c = remote_collector(True, 2, on_worker_loss="wait", heartbeat_interval=0.5,
                                 peer_timeout=120)
            async with anyio.create_task_group() as tg, c:
                events = record_events(c, tg)
                hosts += [cli_host(c.endpoint, sandbox=sandbox) for _ in range(2)]
                killed: list[int] = []

                async def after_batch(c: Any, index: int) -> None:
                    if index == 3:
                        killed.append(c.statistics().workers[0].pid)
                        os.kill(killed[0], signal.SIGKILL)
                        with anyio.fail_after(30):  # far less than peer_timeout
                            await wait_for(lambda: any(e.kind == "lost" for e in events),
                                           "the loss")
                        hosts.append(cli_host(c.endpoint, sandbox=sandbox))

                batches, values = await train(c, after_batch=after_batch)
                lost = [e for e in events if e.kind == "lost"]
            for host in hosts:
                await wait_exit(host)  # a host takes seconds to exit on a loaded machine
        await sandbox.assert_clean()
    finally:
        stop(*hosts)
    assert len(lost) == 1 and "closed its connection" in lost[0].reason, lost
    fresh = pids_in(batches) - pids_in(batches[:4]) - set(killed)
    assert fresh, "the replacement delivered no frame"
    assert_frames(batches, values, total_frames=TOTAL)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_worker_refused_as_full_asks_again_and_takes_the_first_free_place(
        sandbox) -> None:
    hosts: list[subprocess.Popen] = []
    try:
        with anyio.fail_after(3 * LIMIT):
            # A departure, not a loss, is what frees the place: a peer_timeout longer than
            # the chaos default keeps a host slowed by a loaded machine from being lost
            # while it leaves (a full local suite run once saw it "went silent" mid-departure).
            c = remote_collector(False, 1, peer_timeout=6.0)
            async with anyio.create_task_group() as tg, c:
                events = record_events(c, tg)
                hosts.append(cli_host(c.endpoint, sandbox=sandbox))
                await joined(c, 1)
                hosts.append(cli_host(c.endpoint, "--join-timeout", str(2 * LIMIT),
                                      sandbox=sandbox))
                await wait_for(lambda: any(e.kind == "refused" for e in events),
                               "the full refusal")

                async def after_batch(c: Any, index: int) -> None:
                    if index == 2:
                        hosts[0].send_signal(signal.SIGTERM)  # frees the only place

                batches, values = await train(c, after_batch=after_batch)
                refused = [e for e in events if e.kind == "refused"]
                joins = [e for e in events if e.kind == "joined"]
            codes = [await wait_exit(h) for h in hosts]
        await sandbox.assert_clean()
    finally:
        stop(*hosts)
    assert codes == [0, 0], [h.stdout.read() for h in hosts if h.stdout]
    assert refused and all("remote_workers" in e.reason for e in refused), refused
    assert len(joins) == 2, joins  # the second host got the place the first one left
    assert len(pids_in(batches)) == 2
    assert_frames(batches, values, total_frames=TOTAL)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_worker_never_answered_gives_up_after_its_join_timeout(sandbox) -> None:
    """A listener that accepts but never answers (a bare hub): exit 5, not hello forever."""
    hub_script = str(Path(__file__).parents[1] / "multihost" / "hub.py")
    from tests.multihost.processes import free_port

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    hub = subprocess.Popen([sys.executable, hub_script, endpoint], stdout=subprocess.PIPE,
                           text=True)
    host = None
    try:
        assert hub.stdout is not None and hub.stdout.readline().startswith("up")
        host = cli_host(endpoint, "--join-timeout", "3", sandbox=sandbox)
        with anyio.fail_after(LIMIT):
            code = await wait_exit(host)
        output = host.stdout.read() if host.stdout else ""
    finally:
        stop(hub, *([host] if host else []))
    assert code == 5, output
    assert "--join-timeout" in output, output
