"""Worker log records reach the trainer's ``logging`` as ``asyncrl.worker`` records (issue #26).

Each carries the worker's index, host and pid as attributes (``asyncrl_worker``,
``asyncrl_host``, ``asyncrl_pid``, ...), for a JSON log pipeline. The wire is
hostile: bounded fields, a rate per worker, a stranger's records dropped.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncrl import MultiAsyncCollector, MultiSyncCollector
from asyncrl._coordinator.coordinator import Coordinator, check_specs
from asyncrl._coordinator.state import WorkerInfo
from asyncrl._coordinator.worker_logs import WorkerLogs
from asyncrl._protocol import (
    MAX_LOG_MESSAGE,
    MAX_LOG_RECORDS,
    PROTOCOL,
    Hello,
    LogEntry,
    Refuse,
    Welcome,
    WorkerLog,
)
from asyncrl._worker.log_forward import LogForwarder
from asyncrl._worker.simulated import make_specs
from tests.asyncrl.coordinator.rules import rules
from tests.multihost.processes import wait_exit
from transports import Hub, Link, ProtocolError

LIMIT = 90
ENV = "tests.asyncrl.observe.logging_envs:make_logging_env"
ROOT = str(Path(__file__).resolve().parents[3])  # the repository: --app-dir of a host


# -- the wire ---------------------------------------------------------------------------
def test_a_log_message_round_trips_and_is_bounded() -> None:
    message = WorkerLog([LogEntry(30, "user.env", "hello\x1b[2Jthere\n", "Traceback...")], 3)
    back = WorkerLog.from_body(message.to_body())
    assert back.dropped == 3
    # Control characters (a terminal escape) are shown escaped; a message keeps its
    # newlines; the traceback, printed under the message, has every line indented.
    assert back.records == [LogEntry(30, "user.env", "hello\\x1b[2Jthere\n", "  Traceback...")]
    long = WorkerLog.from_body({"records": [[20, "x", "a" * (MAX_LOG_MESSAGE + 5), ""]]})
    marker = f" [... cut, {MAX_LOG_MESSAGE + 5} characters in all]"
    assert long.records[0].message == "a" * (MAX_LOG_MESSAGE - len(marker)) + marker


@pytest.mark.parametrize(("body", "error"), [
    ({"records": "no"}, "log message field 'records' must be list, got str"),
    ({"records": [[20, "x", "m", ""]] * (MAX_LOG_RECORDS + 1)},
     f"log message field 'records' must be list of length <= {MAX_LOG_RECORDS}, got list of "
     f"length {MAX_LOG_RECORDS + 1}"),
    ({"records": [[20, "x", "m"]]},
     "log message field 'records[0]' must be list of length 4, got list of length 3"),
    ({"records": [[True, "x", "m", ""]]},
     "log message field 'records[0].level' must be an int in 0..100, got bool"),
    ({"records": [[500, "x", "m", ""]]},
     "log message field 'records[0].level' must be an int in 0..100, got 500"),
    ({"records": [[20, b"x", "m", ""]]},
     "log message field 'records[0].logger' must be str, got bytes"),
    ({"records": [], "dropped": -1}, "log message field 'dropped' must be int >= 0, got -1"),
])
def test_a_bad_log_message_is_a_protocol_error(body: Any, error: str) -> None:
    with pytest.raises(ProtocolError) as info:
        WorkerLog.from_body(body)
    assert error in str(info.value)


# -- the worker's side --------------------------------------------------------------------
def record(msg: str, level: int = logging.INFO, name: str = "user") -> logging.LogRecord:
    return logging.makeLogRecord({"name": name, "levelno": level, "msg": msg,
                                  "levelname": logging.getLevelName(level)})


def test_the_forwarder_queues_sends_and_counts_what_it_drops() -> None:
    forwarder = LogForwarder(capacity=3, rate=0.0, burst=5)  # 5 records, then none
    for i in range(7):
        forwarder.handle(record(f"line {i}"))
    message = forwarder.take()
    assert message is not None
    # 5 passed the bucket; the queue holds 3 (lines 2..4); 2 over the rate + 2 pushed out.
    assert [r.message for r in message.records] == ["line 2", "line 3", "line 4"]
    assert message.dropped == 4
    assert forwarder.take() is None


def test_records_never_sent_go_to_the_fallback_at_exit() -> None:
    forwarder = LogForwarder()
    forwarder.handle(record("first", logging.WARNING, "user.env"))
    try:
        raise KeyError("k")
    except KeyError:
        forwarder.handle(logging.LogRecord("user", logging.ERROR, "f", 1, "failed", (),
                                           sys.exc_info()))
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, r: logging.LogRecord) -> None:
            seen.append(self.format(r))

    fallback = Collect()
    fallback.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    assert forwarder.write_undelivered(fallback) == 2
    assert seen[0] == "WARNING user.env: first"
    assert seen[1].startswith("ERROR user: failed\nTraceback (most recent call last):")
    assert seen[1].endswith("KeyError: 'k'")
    assert forwarder.take() is None  # written once, never sent as well


# -- the coordinator's side ----------------------------------------------------------------
class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, r: logging.LogRecord) -> None:
        self.records.append(r)


def test_records_are_reemitted_with_the_workers_fields_and_rate_limited() -> None:
    logger = logging.getLogger(f"test.worker_logs.{uuid.uuid4().hex}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    keep = Keep()
    logger.addHandler(keep)
    logs = WorkerLogs(rate=0.0, burst=3, logger=logger)
    worker = WorkerInfo(index=2, peer=b"p", name="w-2", host="node-7", pid=4242)
    logs.emit(worker, WorkerLog([LogEntry(logging.WARNING, "user.env", "hot", "TB"),
                                 LogEntry(logging.DEBUG, "user.env", "below the level", "")]))
    logs.emit(worker, WorkerLog([LogEntry(logging.INFO, "x", f"n{i}", "") for i in range(4)], 5))
    assert [r.getMessage() for r in keep.records] == ["hot", "n0"]
    first = keep.records[0]
    assert (first.levelno, first.name, first.exc_text) == (logging.WARNING, logger.name, "TB")
    assert (first.asyncrl_worker, first.asyncrl_host, first.asyncrl_pid,  # type: ignore[attr-defined]
            first.asyncrl_name, first.asyncrl_logger) == (2, "node-7", 4242, "w-2", "user.env")  # type: ignore[attr-defined]
    assert (first.process, first.processName) == (4242, "asyncrl-worker-2")
    assert logs.dropped == 3 + 5  # 3 over the bucket here, 5 the worker said it dropped
    formatted = logging.Formatter("%(processName)s %(message)s").format(first)
    assert formatted == "asyncrl-worker-2 hot\nTB"


@pytest.mark.anyio
async def test_a_strangers_log_is_dropped_and_an_admitted_workers_is_kept(
        anyio_backend: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asyncrl")
    endpoint = f"inproc://logs-{uuid.uuid4().hex}"
    body = WorkerLog([LogEntry(logging.WARNING, "user", "from a peer", "")]).to_body()
    with anyio.fail_after(LIMIT):
        async with Hub(endpoint) as hub, anyio.create_task_group() as tg:
            coordinator = Coordinator(hub, *rules(sync=False, share_frames=[10],
                                                  check_specs=check_specs, accept_remote=True))
            tg.start_soon(coordinator.run)
            async with Link(endpoint) as stranger, Link(endpoint) as worker:
                await stranger.send(body, kind=WorkerLog.KIND)
                await worker.send(Hello(protocol=PROTOCOL, name="w", host="h", pid=77,
                                        specs=make_specs(4)).to_body(), kind=Hello.KIND)
                while (message := await worker.recv()).kind not in (Welcome.KIND, Refuse.KIND):
                    pass
                assert message.kind == Welcome.KIND
                await worker.send(body, kind=WorkerLog.KIND)
                while not any(r.name == "asyncrl.worker" for r in caplog.records):
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    kept = [r for r in caplog.records if r.name == "asyncrl.worker"]
    assert len(kept) == 1  # the stranger's (sent first, same hub) was dropped
    assert (kept[0].getMessage(), kept[0].asyncrl_pid, kept[0].asyncrl_host) == (  # type: ignore[attr-defined]
        "from a peer", 77, "h")


# -- end to end ------------------------------------------------------------------------------
async def wait_for_record(collector: Any, caplog: pytest.LogCaptureFixture,
                          text: str) -> logging.LogRecord:
    async for _ in collector:
        for r in caplog.records:
            if r.name == "asyncrl.worker" and r.getMessage().startswith(text):
                return r
    raise AssertionError(f"no record {text!r}")


async def host_record(collector: Any, caplog: pytest.LogCaptureFixture, text: str,
                      *cli: str) -> tuple[subprocess.Popen[str], logging.LogRecord]:
    """Start ``python -m asyncrl.cli *cli`` and wait for its record ``text`` (killed if none)."""
    host = subprocess.Popen([sys.executable, "-m", "asyncrl.cli", *cli],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        return host, await wait_for_record(collector, caplog, text)
    except BaseException:
        host.kill()
        raise


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_local_workers_records_reach_the_trainer(
        anyio_backend: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asyncrl")
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector(ENV, num_workers=1, frames_per_batch=32,
                                       total_frames=-1) as collector:
            built = await wait_for_record(collector, caplog, "env built in pid")
            failed = await wait_for_record(collector, caplog, "env saw a traceback")
            pid = collector.worker_pids[0]
    assert built.getMessage() == f"env built in pid {pid}"
    assert (built.levelno, built.asyncrl_worker, built.asyncrl_pid,  # type: ignore[attr-defined]
            built.asyncrl_host, built.asyncrl_logger) == (  # type: ignore[attr-defined]
        logging.WARNING, 0, pid, socket.gethostname(), "user.env")
    assert failed.levelno == logging.ERROR
    assert failed.exc_text is not None and failed.exc_text.endswith(
        "ValueError: a handled failure")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_remote_hosts_records_reach_the_trainer_and_its_log_file(
        anyio_backend: str, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    caplog.set_level(logging.INFO, logger="asyncrl")
    log_file = tmp_path / "host.log"
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("CartPole-v1", num_workers=0, remote_workers=1,
                                      listen="tcp://127.0.0.1:0", frames_per_batch=32,
                                      total_frames=-1) as collector:
            host, built = await host_record(
                collector, caplog, "env built in pid", "worker", "--connect",
                collector.endpoint, "--env", ENV, "--log-file", str(log_file))
        code = await wait_exit(host)
    assert code == 0, host.stdout.read() if host.stdout else ""
    pid = built.asyncrl_pid  # type: ignore[attr-defined]
    assert pid != os.getpid() and built.getMessage() == f"env built in pid {pid}"
    assert built.asyncrl_worker == 0  # type: ignore[attr-defined]
    # The host's own copy: its stderr and the --log-file.
    assert f"env built in pid {pid}" in log_file.read_text()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_remote_env_hosts_records_reach_the_trainer(
        anyio_backend: str, caplog: pytest.LogCaptureFixture) -> None:
    """``asyncrl env-worker`` (central inference) forwards its records as worker hosts do."""
    from asyncrl import AsyncBatchedCollector
    from asyncrl.testing import CountingEnv, ValuePolicy

    caplog.set_level(logging.INFO, logger="asyncrl")
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                CountingEnv, num_envs=1, policy=ValuePolicy(1.0), frames_per_batch=8,
                listen="tcp://127.0.0.1:0", remote_workers=1, total_frames=-1) as collector:
            host, built = await host_record(
                collector, caplog, "counting env built in pid", "env-worker", "--connect",
                collector.endpoint, "--env",
                "tests.asyncrl.observe.logging_envs:make_logging_counting_env",
                "--app-dir", ROOT, "--backend", anyio_backend)
        code = await wait_exit(host)
    output = host.stdout.read() if host.stdout else ""
    assert code == 0, output
    pid = built.asyncrl_pid  # type: ignore[attr-defined]
    assert built.getMessage() == f"counting env built in pid {pid}" and pid == host.pid
    assert (built.levelno, built.asyncrl_worker, built.asyncrl_host,  # type: ignore[attr-defined]
            built.asyncrl_name, built.asyncrl_logger) == (  # type: ignore[attr-defined]
        logging.WARNING, 1, socket.gethostname(), "env-1", "user.env")
    assert "counting env built" not in output  # sent, so not written to stderr as well


@pytest.mark.anyio
async def test_a_malformed_log_from_a_remote_env_host_is_refused(anyio_backend: str) -> None:
    from asyncrl import AsyncBatchedCollector
    from asyncrl.testing import CountingEnv, ValuePolicy
    from tests.asyncrl.inference.test_batched_remote_env_hosts import hello

    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                CountingEnv, num_envs=1, policy=ValuePolicy(1.0), frames_per_batch=8,
                listen="tcp://127.0.0.1:0", remote_workers=1) as collector:
            async with Link(collector.endpoint, identity=b"h", heartbeat_interval=0.5) as link:
                await link.send(hello([2]), kind="hello")
                assert (await link.recv()).kind == "env_welcome"
                await link.send({"records": "no"}, kind=WorkerLog.KIND)
                answer = await link.recv()
                assert answer.kind == "refuse"
            assert collector.remote_refusals == [
                "remote env worker b'h' (slot 1) refused: log message field 'records' "
                "must be list, got str"]
