"""Chaos: local workers killed (SIGKILL) or frozen (SIGSTOP) in the middle of a run.

Each scenario runs on one backend (sync on asyncio, async on trio, or the other way
round) so that both backends are covered and the suite stays short.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import anyio
import pytest

from asyncrl import MultiAsyncCollector, MultiSyncCollector, WorkerLostError
from asyncrl.testing import ValuePolicy, identity_env

from .helpers import (
    LIMIT,
    LIVENESS,
    PEER_TIMEOUT,
    RSS_GROWTH_MB,
    assert_frames,
    pids_in,
    rss_mb,
    train,
)

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]
TOTAL = 240
MODES = [("asyncio", True), ("trio", False)]


def collector(sync: bool, on_worker_loss: Any, **kwargs: Any) -> Any:
    cls = MultiSyncCollector if sync else MultiAsyncCollector
    return cls(identity_env, ValuePolicy(0.0), num_workers=2, frames_per_batch=20,
               total_frames=TOTAL, on_worker_loss=on_worker_loss, **LIVENESS, **kwargs)


def kill_worker_after(batch_index: int, slot: int = 1):
    killed: list[int] = []

    async def after_batch(c, index: int) -> None:
        if index == batch_index:
            killed.append(c.worker_pids[slot])
            os.kill(killed[0], signal.SIGKILL)
    return after_batch, killed


@pytest.mark.parametrize(("anyio_backend", "sync"), MODES)
async def test_a_healthy_run_passes_every_check(sandbox, sync: bool) -> None:
    """The control: without a fault, every check of the suite holds."""
    rss = rss_mb()
    with anyio.fail_after(LIMIT):
        async with collector(sync, "raise") as c:
            batches, values = await train(c)
        await sandbox.assert_clean()
    assert_frames(batches, values, total_frames=TOTAL)
    assert rss_mb() - rss < RSS_GROWTH_MB


@pytest.mark.parametrize(("anyio_backend", "sync"), [("trio", False)])
async def test_killed_worker_fails_the_run_naming_the_signal(sandbox, sync: bool) -> None:
    after_batch, killed = kill_worker_after(1)
    with anyio.fail_after(LIMIT):
        async with collector(sync, "raise") as c:
            with pytest.raises(WorkerLostError) as caught:
                await train(c, after_batch=after_batch)
        await sandbox.assert_clean()
    message = str(caught.value)
    assert f"pid {killed[0]}" in message, message
    assert "SIGKILL" in message or "signal 9" in message or "-9" in message, message


@pytest.mark.parametrize(("anyio_backend", "sync"), MODES)
async def test_killed_worker_continue_delivers_every_frame(sandbox, sync: bool) -> None:
    after_batch, killed = kill_worker_after(2)
    rss = rss_mb()
    with anyio.fail_after(LIMIT):
        async with collector(sync, "continue") as c:
            batches, values = await train(c, after_batch=after_batch)
            assert killed[0] not in c.worker_pids
        await sandbox.assert_clean()
    assert_frames(batches, values, total_frames=TOTAL)
    assert rss_mb() - rss < RSS_GROWTH_MB


@pytest.mark.parametrize(("anyio_backend", "sync"), [("trio", True), ("asyncio", False)])
async def test_killed_worker_restart_respawns_the_slot(sandbox, sync: bool) -> None:
    after_batch, killed = kill_worker_after(2)
    with anyio.fail_after(LIMIT):
        async with collector(sync, "restart") as c:
            batches, values = await train(c, after_batch=after_batch)
            pids = list(c.worker_pids)
        await sandbox.assert_clean()
    assert_frames(batches, values, total_frames=TOTAL)
    assert len(pids) == 2 and killed[0] not in pids, pids
    fresh = set(pids) - pids_in(batches[:3])
    assert fresh, pids
    if sync:  # the round waits for the replacement's share (async may finish without it)
        assert fresh <= pids_in(batches), f"the respawned worker {fresh} delivered no frame"


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_frozen_worker_sync_wait_is_readmitted(sandbox) -> None:
    """SIGSTOP for three peer timeouts, then SIGCONT: "wait" waits, then goes on exactly."""
    frozen: list[int] = []

    async def thaw_later(pid: int) -> None:
        await anyio.sleep(3 * PEER_TIMEOUT)
        os.kill(pid, signal.SIGCONT)

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg, collector(True, "wait") as c:

            async def after_batch(c, index: int) -> None:
                if index == 1:
                    frozen.append(c.worker_pids[1])
                    os.kill(frozen[0], signal.SIGSTOP)
                    tg.start_soon(thaw_later, frozen[0])

            try:
                batches, values = await train(c, after_batch=after_batch)
            finally:
                if frozen:
                    os.kill(frozen[0], signal.SIGCONT)
            assert frozen[0] in c.worker_pids
        await sandbox.assert_clean()
    assert_frames(batches, values, total_frames=TOTAL)
    assert frozen[0] in pids_in(batches[3:]), "the resumed worker never delivered again"
