"""Shutdown and logging as a service operator sees them (issue #13, deliverable 4).

- Closing mid-collection leaves every worker exited with code 0 (each said
  goodbye to a live hub: nothing lingers in its ZeroMQ queues).
- SIGTERM to the local workers (systemd's group SIGTERM) ends ``async for`` as
  a normal stop; later calls raise :class:`asyncrl.CollectorStopped`; nothing is
  logged at ERROR and the workers exit 0.
- Workers log with the trainer's level and format; the library logs open, join
  and close at INFO and installs a ``NullHandler`` only.
"""

from __future__ import annotations

import logging
import os
import signal

import anyio
import pytest

import asyncrl
from asyncrl import CollectorStopped, MultiAsyncCollector, MultiSyncCollector
from asyncrl._spawn import logs as _logs
from tests.multihost.processes import alive

pytestmark = pytest.mark.anyio

LIMIT = 120  # generous: 2 shared cores, process spawns


async def test_close_mid_collection_workers_exit_cleanly(anyio_backend: str) -> None:
    with anyio.fail_after(LIMIT):
        collector = MultiAsyncCollector("CartPole-v1", num_workers=2, frames_per_batch=64,
                                        total_frames=-1, prefetch=2)
        async with collector:
            seen = 0
            async for batch in collector:
                seen += batch.numel()
                if seen >= 4 * 64:
                    break
            pids = collector.worker_pids
            assert len(pids) == 2
        assert collector._run.workers is not None
        # Exited on their own after the close order (0), not SIGTERMed (-15) by stop().
        assert collector._run.workers.exitcodes == [0, 0]
        assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("cls", [MultiAsyncCollector, MultiSyncCollector])
async def test_sigterm_to_the_workers_is_a_normal_stop(
        anyio_backend: str, cls: type, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asyncrl")
    with anyio.fail_after(LIMIT):
        collector = cls("CartPole-v1", num_workers=2, frames_per_batch=64, total_frames=-1)
        async with collector:
            batches = 0
            async for _ in collector:
                batches += 1
                if batches == 2:
                    pids = collector.worker_pids
                    for pid in pids:  # as systemd's KillMode=control-group does
                        os.kill(pid, signal.SIGTERM)
            # The loop ended by itself: no exception, no total_frames.
            assert batches >= 2
            with pytest.raises(CollectorStopped, match="got SIGTERM"):
                await collector.set_seed(0)
        assert collector._run.workers is not None
        assert collector._run.workers.exitcodes == [0, 0]
        assert not any(alive(pid) for pid in pids)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    assert any("got SIGTERM: the collector stops" in r.getMessage() for r in caplog.records)


async def test_open_join_and_close_are_logged_at_info(
        anyio_backend: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asyncrl")
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("CartPole-v1", num_workers=2, frames_per_batch=64,
                                      total_frames=64) as collector:
            async for _ in collector:
                pass
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(m.startswith("MultiSyncCollector opened at ipc://") for m in messages)
    assert sum(" joined (local-" in m for m in messages) == 2
    assert "MultiSyncCollector closing after 64 frames" in messages
    assert messages[-1] == "MultiSyncCollector closed"


def test_the_library_configures_no_logging() -> None:
    handlers = logging.getLogger("asyncrl").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)
    assert all(isinstance(h, logging.NullHandler) for h in handlers)
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("transports").handlers)
    assert asyncrl.__name__ == "asyncrl"


def test_capture_reads_the_trainers_level_and_format() -> None:
    root = logging.getLogger()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("{levelname}|{name}|{message}", style="{",
                                           datefmt="%H:%M"))
    old_handlers, old_level = root.handlers[:], logging.getLogger("asyncrl").level
    root.handlers = [handler]
    logging.getLogger("asyncrl").setLevel(logging.DEBUG)
    try:
        config = _logs.capture()
    finally:
        root.handlers = old_handlers
        logging.getLogger("asyncrl").setLevel(old_level)
    assert config["level"] == logging.DEBUG
    assert config["format"] == "{levelname}|{name}|{message}"
    assert config["style"] == "{"
    assert config["datefmt"] == "%H:%M"


def test_parse_level_names_the_choices() -> None:
    assert _logs.parse_level("info") == logging.INFO
    with pytest.raises(ValueError, match="expected one of DEBUG, INFO, WARNING"):
        _logs.parse_level("loud")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_spawned_workers_log_with_the_trainers_format(
        anyio_backend: str, capfd: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("TRAINERFMT %(levelname)s %(name)s: %(message)s"))
    old_handlers, old_level = root.handlers[:], logging.getLogger("asyncrl").level
    root.handlers = [handler]
    logging.getLogger("asyncrl").setLevel(logging.INFO)
    try:
        with anyio.fail_after(LIMIT):
            # Spawned: the child's stderr is this test's (a fork server's is older).
            collector = MultiAsyncCollector("CartPole-v1", num_workers=1, frames_per_batch=64,
                                            total_frames=-1, start_method="spawn")
            async with collector:
                async for _ in collector:
                    os.kill(collector.worker_pids[0], signal.SIGTERM)
    finally:
        root.handlers = old_handlers
        logging.getLogger("asyncrl").setLevel(old_level)
    err = capfd.readouterr().err
    # The worker's INFO line, in the trainer's format.
    assert "TRAINERFMT INFO asyncrl.worker: worker 0 got SIGTERM: stopping" in err
