"""Workers on other hosts, simulated by `asyncrl worker` processes over tcp loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncrl import MultiSyncCollector
from tests.multihost.lines import Lines
from tests.multihost.processes import free_port, wait_exit
from transports import Link, PeerLostError

pytestmark = pytest.mark.anyio
LIMIT = 90


def cli_worker(endpoint: str, *args: str, **popen: Any) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", endpoint, *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


@pytest.mark.parametrize("anyio_backend", ["trio"])  # end to end: one backend per test
async def test_cli_workers_join_a_listening_collector() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("CartPole-v1", num_workers=0, remote_workers=2,
                                      listen="tcp://127.0.0.1:0", frames_per_batch=100,
                                      total_frames=300) as collector:
            host = cli_worker(collector.endpoint, "--env", "CartPole-v1", "--workers", "2")
            try:
                batches = [b async for b in collector]
            except BaseException:
                host.kill()
                raise
        code = await wait_exit(host)
    output = host.stdout.read()
    assert code == 0, output
    assert len(batches) == 3
    for batch in batches:
        assert tuple(batch.shape) == (2, 50)
        assert sorted(batch["collector", "worker_id"][:, 0].tolist()) == [0, 1]


async def test_mixed_local_and_remote_workers() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("CartPole-v1", num_workers=1, remote_workers=1,
                                      listen="tcp://127.0.0.1:0", frames_per_batch=40,
                                      total_frames=80) as collector:
            host = cli_worker(collector.endpoint, "--env", "CartPole-v1")
            try:
                batches = [b async for b in collector]
            except BaseException:
                host.kill()
                raise
        assert await wait_exit(host) == 0
    assert [sorted(b["collector", "worker_id"][:, 0].tolist()) for b in batches] == [[0, 1]] * 2


async def test_spec_mismatch_is_refused_naming_the_field() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("CartPole-v1", num_workers=0, remote_workers=1,
                                      listen="tcp://127.0.0.1:0",
                                      frames_per_batch=10) as collector:
            host = cli_worker(collector.endpoint, "--env", "asyncrl.testing:CountingEnv")
            code = await wait_exit(host)
    output = host.stdout.read()
    assert code == 4, output
    assert "refused" in output and "observation" in output, output


def test_cli_bad_import_path_is_one_clear_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", "tcp://127.0.0.1:9",
         "--env", "no_such_module_xyz:make"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "no_such_module_xyz" in result.stderr


def test_cli_help_is_complete() -> None:
    result = subprocess.run([sys.executable, "-m", "asyncrl.cli", "worker", "--help"],
                            capture_output=True, text=True, timeout=60)
    for flag in ("--connect", "--env", "--policy", "--envs-per-worker", "--workers",
                 "--reconnect"):
        assert flag in result.stdout


def trainer(endpoint: str, total_frames: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "trainer.py"), endpoint,
         str(total_frames)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


async def test_a_link_sees_its_hub_die_and_a_new_one_answer() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    hub_script = str(Path(__file__).parent / "hub.py")
    first = subprocess.Popen([sys.executable, hub_script, endpoint], stdout=subprocess.PIPE,
                             text=True)
    second = None
    try:
        first_instance = first.stdout.readline().split()[1]
        async with Link(endpoint, identity=b"w", heartbeat_interval=0.25,
                        peer_timeout=2) as link:
            with anyio.fail_after(LIMIT):
                await link.send("hello")
                while link._hub_instance != first_instance:
                    await anyio.sleep(0.05)
                first.kill()  # dies without a goodbye
                with pytest.raises(PeerLostError):
                    await link.recv()
                second = subprocess.Popen([sys.executable, hub_script, endpoint],
                                          stdout=subprocess.PIPE, text=True)
                second_instance = second.stdout.readline().split()[1]
                await link.wait_connected()
                while link._hub_instance != second_instance:
                    await anyio.sleep(0.05)
                assert link.connected
    finally:
        for process in (first, second):
            if process is not None:
                process.kill()


def test_coordinator_death_ends_a_worker_without_reconnect() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    first = trainer(endpoint, 100_000)
    events = Lines(first)
    host = None
    try:
        events.until(lambda e: e["event"] == "listening", LIMIT)
        # A dead trainer and a cut link look alike from here: without --reconnect an
        # admitted worker waits --give-up-after seconds for it (default 120), then exits.
        host = cli_worker(endpoint, "--env", "CartPole-v1", "--policy",
                          "asyncrl.testing:ParamPolicy", "--peer-timeout", "2",
                          "--give-up-after", "3")
        events.until(lambda e: e["event"] == "batch", LIMIT)
        first.kill()  # the coordinator dies without a goodbye
        assert host.wait(timeout=LIMIT) == 3
        output = host.stdout.read()
        assert "is gone" in output and "did not come back within 3.0 s" in output, output
    finally:
        for process in (first, host):
            if process is not None and process.poll() is None:
                process.kill()


@pytest.mark.parametrize("peer_timeout", ["2", "600"])
def test_a_reconnecting_worker_joins_a_restarted_coordinator(peer_timeout: str) -> None:
    # A peer timeout longer than the test's bounds leaves one way to join again in
    # time: the new hub instance in the pings. With 2 s, the silence of the dead
    # coordinator may be noticed first; either way the worker joins once.
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    first = trainer(endpoint, 100_000)
    host = second = None
    failure = None
    try:
        events = Lines(first)
        events.until(lambda e: e["event"] == "listening", LIMIT)
        host = cli_worker(endpoint, "--env", "CartPole-v1", "--policy",
                          "asyncrl.testing:ParamPolicy", "--reconnect",
                          "--peer-timeout", peer_timeout,
                          start_new_session=True)  # its worker processes die with it
        events.until(lambda e: e["event"] == "batch", LIMIT)
        first.kill()  # the coordinator dies without a goodbye
        first.wait(LIMIT)
        second = trainer(endpoint, 100_000)
        try:
            Lines(second).until(lambda e: e["event"] == "batch", LIMIT)
        except AssertionError as exc:
            failure = exc
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(LIMIT)
        if host is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(host.pid, signal.SIGKILL)
    output = host.communicate(timeout=LIMIT)[0]
    assert failure is None, f"{failure}\nworker output:\n{output}"
    assert output.count("waiting for it to come back") == 1, output


async def test_a_hello_left_unanswered_is_said_again_and_only_its_welcome_counts() -> None:
    """As when a coordinator died between receiving a hello and answering it."""
    from asyncrl._protocol import Batch, Collect, Control, Hello, Welcome
    from asyncrl._worker.spec import WorkerSpec
    from asyncrl._worker.worker import run_worker
    from transports import Hub, Message

    codes: list[int] = []
    with anyio.fail_after(LIMIT):
        async with Hub("tcp://127.0.0.1:0", heartbeat_interval=0.1, peer_timeout=1.0) as hub:

            async def worker() -> None:
                codes.append(await run_worker(hub.endpoint, WorkerSpec("CartPole-v1"),
                                              identity=b"w", heartbeat_interval=0.1,
                                              peer_timeout=1.0))

            async def next_message(kind: str) -> Message:
                while not (isinstance(item := await hub.recv(), Message) and item.kind == kind):
                    pass
                return item

            async with anyio.create_task_group() as tg:
                tg.start_soon(worker)
                first = Hello.from_body((await next_message("hello")).body)  # left unanswered
                second = Hello.from_body((await next_message("hello")).body)
                assert (first.attempt, second.attempt) == (0, 1)
                for welcome in (Welcome(index=3, share_frames=4, attempt=0),  # stale
                                Welcome(index=7, share_frames=4, attempt=1)):
                    await hub.send(b"w", welcome.to_body(), kind=Welcome.KIND)
                await hub.send(b"w", Collect(7, 1).to_body(), kind=Collect.KIND)
                batch = Batch.from_body((await next_message("batch")).body)
                await hub.send(b"w", Control("close").to_body(), kind=Control.KIND)
    assert batch.request == 7
    assert batch.frames["collector", "worker_id"].unique().tolist() == [7]
    assert codes == [0]


def test_the_example_trains_with_workers_on_another_host() -> None:
    """The flow the example's docstring gives: trainer listens, `asyncrl worker` joins."""
    root = Path(__file__).parent.parent.parent
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    trainer = subprocess.Popen(
        [sys.executable, "examples/train_cartpole.py", "--workers", "0", "--remote-workers", "2",
         "--listen", endpoint, "--no-progress", "--frames-per-batch", "256", "--target", "0",
         "--window", "1"], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    host = None
    try:
        # The console script, as a user types it: the current directory is on the import
        # path only because the CLI puts it there (--app-dir).
        script = Path(sys.executable).parent / "asyncrl"
        command = [str(script)] if script.exists() else [sys.executable, "-m", "asyncrl.cli"]
        host = subprocess.Popen(
            [*command, "worker", "--connect", endpoint, "--env", "CartPole-v1",
             "--envs-per-worker", "4", "--workers", "2", "--policy",
             "examples.train_cartpole:make_policy"], cwd=root, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        output, _ = trainer.communicate(timeout=LIMIT)
        assert trainer.returncode == 0, output
        assert "SOLVED" in output
        assert host.wait(timeout=LIMIT) == 0, host.stdout.read() if host.stdout else ""
    finally:
        for process in (trainer, host):
            if process is not None and process.poll() is None:
                process.kill()
