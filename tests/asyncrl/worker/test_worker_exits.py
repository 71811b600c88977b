"""The worker's own life cycle against a scripted coordinator (a bare Hub): how it ends.

Each test plays the coordinator's side message by message and checks the exit
code :func:`asyncrl._worker.worker.run_worker` returns (see
:mod:`asyncrl._spawn.exit_codes`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncrl._protocol import Batch, Collect, Control, Hello, Refuse, Welcome
from asyncrl._spawn.exit_codes import (
    EXIT_COORDINATOR_LOST,
    EXIT_ERROR,
    EXIT_JOIN_TIMEOUT,
    EXIT_OK,
    EXIT_REFUSED,
)
from asyncrl._worker.spec import WorkerSpec
from asyncrl._worker.worker import run_worker
from asyncrl.testing import CountingEnv
from transports import Hub, Message

pytestmark = pytest.mark.anyio

FAST = {"heartbeat_interval": 0.2, "peer_timeout": 5.0}
ROOT = Path(__file__).parents[3]


@asynccontextmanager
async def cli_process(*args: str, **env: str) -> AsyncIterator[subprocess.Popen[str]]:
    """``python -m *args`` from the repository root, its output captured, ``env`` added;
    killed on the way out if it still runs."""
    process = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                               env={**os.environ, **env})
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def appears(path: Path) -> None:
    """Until ``path`` exists (a helper of the child writes it; the caller bounds the wait)."""
    while not await anyio.Path(path).exists():
        await anyio.sleep(0.02)


async def _next(hub: Hub, kind: str) -> Message:
    """The next message of ``kind`` (peer events and other kinds are skipped)."""
    while True:
        item = await hub.recv()
        if isinstance(item, Message) and item.kind == kind:
            return item


async def _run_against(script: Any, spec: WorkerSpec | None = None,
                       **options: Any) -> int:
    """Run a worker against a Hub that ``script(hub)`` drives; return its exit code."""
    codes: list[int] = []
    async with Hub("tcp://127.0.0.1:0", **FAST) as hub:
        async def worker() -> None:
            codes.append(await run_worker(hub.endpoint, spec or WorkerSpec(CountingEnv),
                                          identity=b"w", **FAST, **options))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker)
                await script(hub)
                while not codes:
                    await anyio.sleep(0.02)
    return codes[0]


async def _welcome(hub: Hub) -> Hello:
    hello = Hello.from_body((await _next(hub, Hello.KIND)).body)
    await hub.send(b"w", Welcome(index=0, share_frames=4, attempt=hello.attempt).to_body(),
                   kind=Welcome.KIND)
    return hello


async def test_a_worker_closed_by_its_coordinator_exits_0_after_a_batch() -> None:
    async def script(hub: Hub) -> None:
        await _welcome(hub)
        await hub.send(b"w", Collect(request=7, credits=1).to_body(), kind=Collect.KIND)
        batch = Batch.from_body((await _next(hub, Batch.KIND)).body)
        assert batch.request == 7 and batch.frames.numel() == 4
        await hub.send(b"w", Control("close").to_body(), kind=Control.KIND)

    assert await _run_against(script) == EXIT_OK


async def test_a_malformed_welcome_or_refusal_while_joining_is_dropped_not_the_end() -> None:
    """The join loop drops what it cannot decode (decode(): a ProtocolError) and waits on;
    the coordinator's next, well-formed welcome admits the worker."""
    async def script(hub: Hub) -> None:
        hello = Hello.from_body((await _next(hub, Hello.KIND)).body)
        await hub.send(b"w", {"index": 0, "share_frames": "4"}, kind=Welcome.KIND)
        await hub.send(b"w", {"reason": 7}, kind=Refuse.KIND)
        # A refusal whose env_source breaks its declaration (a script's module): dropped
        # at decode, before the worker imports anything or exits refused.
        await hub.send(b"w", {"reason": "r", "env_source": {
            "env_id": "Counting-v0", "module": "__main__", "package": "", "spec": {}}},
            kind=Refuse.KIND)
        await hub.send(b"w", [1, 2], kind=Welcome.KIND)
        await hub.send(b"w", Welcome(index=0, share_frames=4, attempt=hello.attempt).to_body(),
                       kind=Welcome.KIND)
        await hub.send(b"w", Collect(request=7, credits=1).to_body(), kind=Collect.KIND)
        assert Batch.from_body((await _next(hub, Batch.KIND)).body).request == 7
        await hub.send(b"w", Control("close").to_body(), kind=Control.KIND)

    assert await _run_against(script) == EXIT_OK


async def test_a_refused_worker_exits_4() -> None:
    async def script(hub: Hub) -> None:
        await _next(hub, Hello.KIND)
        await hub.send(b"w", Refuse("wrong token").to_body(), kind=Refuse.KIND)

    assert await _run_against(script) == EXIT_REFUSED


async def test_a_worker_never_welcomed_exits_5_after_its_join_timeout() -> None:
    async def script(hub: Hub) -> None:
        await _next(hub, Hello.KIND)  # and silence: something there, not a collector

    assert await _run_against(script, join_timeout=1.0) == EXIT_JOIN_TIMEOUT


async def test_a_worker_whose_parent_is_gone_exits_3() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: that pid names no process now

    async def script(hub: Hub) -> None:
        pass  # the worker ends by itself, welcomed or not

    assert await _run_against(script, parent_pid=gone.pid) == EXIT_COORDINATOR_LOST


def _failing_env() -> Any:
    raise RuntimeError("no such env")


async def test_an_env_that_cannot_be_built_is_reported_then_exits_1() -> None:
    reports: list[Message] = []

    async def script(hub: Hub) -> None:
        reports.append(await _next(hub, "error"))

    assert await _run_against(script, WorkerSpec(_failing_env)) == EXIT_ERROR
    assert "no such env" in str(reports[0].body)


@pytest.mark.parametrize("reconnect", [False, True])
async def test_a_worker_whose_key_was_revoked_exits_4_saying_so(
        tmp_path: Any, caplog: pytest.LogCaptureFixture, reconnect: bool) -> None:
    # Before: the denied handshake was silence, so the worker ended with "no coordinator
    # answered ... firewall" (exit 3), and with --reconnect it asked again for ever.
    from transports import CurveClient, CurveServer, add_host, generate_keys, revoke_host

    keys = generate_keys(tmp_path / "keys")
    client = CurveClient.from_dir(add_host(keys, "gpu1"))
    revoke_host(keys, "gpu1")
    codes: list[int] = []
    with anyio.fail_after(60):
        async with Hub("tcp://127.0.0.1:0", curve=CurveServer.from_dir(keys), **FAST) as hub:
            codes.append(await run_worker(hub.endpoint, WorkerSpec(CountingEnv), identity=b"w",
                                          curve_keys=client, heartbeat_interval=0.2,
                                          peer_timeout=30.0, reconnect=reconnect))
    assert codes == [EXIT_REFUSED]
    assert "denied this host's CURVE key at the handshake" in caplog.text
    assert "no coordinator answered" not in caplog.text


async def test_a_worker_stopped_by_sigterm_while_it_builds_its_env_says_so_and_exits_0(
        tmp_path: Any, anyio_backend: str) -> None:
    # Before: the handlers were set at the first yield after the build (seconds for a
    # pixel env), so a pod stopped while it started ended by the signal (-15), silently,
    # and a worker the coordinator had just admitted was logged as lost.
    from asyncrl._protocol import Leaving

    if anyio_backend == "trio":
        pytest.skip("the worker process is the same for both backends; once is enough")

    building = tmp_path / "building"
    kinds: list[str] = []
    async with Hub("tcp://127.0.0.1:0", **FAST) as hub, cli_process(
            "asyncrl.cli", "worker", "--connect", hub.endpoint,
            "--env", "tests.asyncrl.worker.slow_build:slow_env", "--peer-timeout", "5",
            ASYNCRL_TEST_BUILDING=str(building)) as process:
        with anyio.fail_after(60):
            await appears(building)  # it is inside the env's constructor now
            process.send_signal(signal.SIGTERM)
            while Leaving.KIND not in kinds:  # it says why, once the build is over
                item = await hub.recv()
                if isinstance(item, Message):
                    kinds.append(item.kind)
            code = await anyio.to_thread.run_sync(process.wait, 30)
    output = process.stdout.read() if process.stdout else ""
    assert code == EXIT_OK, output
    assert "got SIGTERM: stopping" in output, output
    assert kinds[-1] == Leaving.KIND and set(kinds) <= {Hello.KIND, Leaving.KIND}, kinds


async def test_a_host_stopped_by_sigterm_before_its_workers_start_exits_0(
        tmp_path: Any, anyio_backend: str) -> None:
    # Before: the host set its handlers once it started its workers, so a SIGTERM
    # while its relay opened (a pod deleted as it starts) ended it by the signal (-15).
    if anyio_backend == "trio":
        pytest.skip("the host process is the same for both backends; once is enough")

    opening = tmp_path / "opening"
    async with cli_process(
            "tests.asyncrl.worker.slow_relay", "worker", "--workers", "2",
            "--connect", "tcp://127.0.0.1:9", "--env", "asyncrl.testing:CountingEnv",
            ASYNCRL_TEST_OPENING=str(opening)) as process:
        with anyio.fail_after(60):
            await appears(opening)  # the host runs; its relay is opening
            process.send_signal(signal.SIGTERM)
            code = await anyio.to_thread.run_sync(process.wait, 30)
    output = process.stdout.read() if process.stdout else ""
    assert code == EXIT_OK, output
    assert "SIGTERM: stopping this host before its workers started" in output, output


async def test_a_worker_refused_as_full_goes_home_with_0_when_the_run_finishes(
        caplog: pytest.LogCaptureFixture) -> None:
    # Before: still asking to join when the trainer closed its finished run, it took the
    # goodbye for a coordinator it never reached and exited 3 (CI saw a host do so).
    import logging

    caplog.set_level(logging.INFO, logger="asyncrl.worker")
    codes: list[int] = []
    async with Hub("tcp://127.0.0.1:0", admission=True, **FAST) as hub:
        async def worker() -> None:
            codes.append(await run_worker(hub.endpoint, WorkerSpec(CountingEnv), identity=b"w",
                                          join_timeout=60.0, **FAST))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker)
                await _next(hub, Hello.KIND)
                await hub.send(b"w", Refuse("full: 2 of 2 places taken", full=True).to_body(),
                               kind=Refuse.KIND)
                while "asking again" not in caplog.text:
                    await anyio.sleep(0.02)
                hub.finish()  # the run is over: MultiCollector's close when total_frames came
                await hub.aclose()
    assert codes == [EXIT_OK]
    assert "is over (its trainer closed it): exiting" in caplog.text
