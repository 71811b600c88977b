"""``await pause()`` / ``resume()`` / ``paused``: what still arrives after pause() returns.

The bound (docs/operations.md): once ``await collector.pause()`` returned, no batch
is handed to the trainer until ``resume()`` (zero frames); workers get no new
credit (async) or round (sync); what they were already asked for is collected,
held and handed over after ``resume()``, never dropped. The coordinator tests use
simulated workers (exact credit accounting, no processes); the collector tests
use real worker processes, in both modes and on both backends. No timing
assertions: counts and states, every wait bounded.
"""

from __future__ import annotations

import os
import signal
import uuid
from typing import Any

import anyio
import pytest

from asyncrl import (
    BlockingCollector,
    Collector,
    MultiAsyncCollector,
    MultiSyncCollector,
    WorkerLostError,
)
from asyncrl._coordinator.coordinator import Coordinator, check_specs
from asyncrl._worker.simulated import SimRecord, sim_worker
from asyncrl.testing import CountingEnv, ParamPolicy
from tests.asyncrl.coordinator.rules import rules
from transports import Hub

pytestmark = pytest.mark.anyio

LIMIT = 120
FRAMES = 8
FAST = {"heartbeat_interval": 0.5, "peer_timeout": 5.0}


async def eventually(condition: Any, what: str, limit: float = 60) -> None:
    """Poll public state until ``condition()`` (bounded; never a speed assertion)."""
    with anyio.fail_after(limit):
        while not condition():
            await anyio.sleep(0.02)


async def nothing_within(call: Any, seconds: float = 0.3) -> bool:
    """True if ``call()`` did not return within ``seconds`` (it was waiting, as it should)."""
    with anyio.move_on_after(seconds) as scope:
        await call()
    return scope.cancelled_caught


async def _sim(endpoint: str, record: SimRecord, *,
               task_status: anyio.abc.TaskStatus[SimRecord]) -> None:
    await sim_worker(endpoint, record.name, frames=FRAMES, record=record,
                     task_status=task_status)


async def test_async_pause_grants_nothing_and_holds_what_was_in_flight() -> None:
    prefetch, workers = 2, 2
    with anyio.fail_after(LIMIT):
        async with Hub(f"inproc://pause-{uuid.uuid4().hex}") as hub:
            coordinator = Coordinator(hub, *rules(sync=False, share_frames=[FRAMES] * workers,
                                                  prefetch=prefetch, check_specs=check_specs,
                                                  accept_remote=True))
            async with anyio.create_task_group() as tg:
                tg.start_soon(coordinator.run)
                records = [await tg.start(_sim, hub.endpoint, SimRecord(f"sim-{i}"))
                           for i in range(workers)]
                await coordinator.wait_for_workers(workers)
                for _ in range(5):
                    await coordinator.next_batch()
                await coordinator.set_paused(True)

                def granted() -> int:  # credits the coordinator gave, delivered or not
                    return sum(w.delivered + w.credits for w in coordinator.roster.live_workers)

                before = granted()
                # The workers finish what they were asked for (credits already on their
                # way included), then idle.
                await eventually(lambda: sum(r.granted for r in records) == before
                                 and all(r.sent == r.granted for r in records), "idle")
                await eventually(lambda: sum(w.queued for w in coordinator.roster.live_workers)
                                 == sum(w.ahead for w in coordinator.roster.live_workers), "held")
                assert await nothing_within(coordinator.next_batch)  # nothing handed over
                assert granted() == before == sum(r.granted for r in records)  # none new
                held = len(coordinator.state.rounds.ready)
                assert 0 < held <= workers * prefetch
                await coordinator.set_paused(False)
                for _ in range(held + 2):  # the held batches first, then new ones
                    await coordinator.next_batch()
                assert sum(r.granted for r in records) > before
                tg.cancel_scope.cancel()


async def test_sync_pause_starts_no_round() -> None:
    workers = 2
    with anyio.fail_after(LIMIT):
        async with Hub(f"inproc://pause-{uuid.uuid4().hex}") as hub:
            coordinator = Coordinator(hub, *rules(sync=True, share_frames=[FRAMES] * workers,
                                                  check_specs=check_specs, accept_remote=True))
            async with anyio.create_task_group() as tg:
                tg.start_soon(coordinator.run)
                records = [await tg.start(_sim, hub.endpoint, SimRecord(f"sim-{i}"))
                           for i in range(workers)]
                await coordinator.wait_for_workers(workers)
                await coordinator.next_round()
                await coordinator.set_paused(True)
                assert await nothing_within(coordinator.next_round)
                assert [r.granted for r in records] == [1, 1]  # no share asked while paused
                await coordinator.set_paused(False)
                shares = await coordinator.next_round()
                assert len(shares) == workers
                assert [r.granted for r in records] == [2, 2]
                tg.cancel_scope.cancel()


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_no_frame_is_handed_over_between_pause_and_resume(sync: bool) -> None:
    kind = MultiSyncCollector if sync else MultiAsyncCollector
    options = {} if sync else {"prefetch": 2}
    with anyio.fail_after(LIMIT):
        async with kind(CountingEnv, num_workers=2, frames_per_batch=16, total_frames=-1,
                        **FAST, **options) as c:
            assert not c.paused
            await c.__anext__()
            await c.pause()
            assert c.paused and c.statistics().paused
            frames = c.statistics().frames
            # Work already asked for is finished; then every worker idles.
            await eventually(lambda: all(w.state == "idle" for w in c.statistics().workers),
                             "every worker idle while paused")
            assert await nothing_within(c.__anext__, 0.5)
            assert c.statistics().frames == frames == c.frames_collected
            await c.pause()  # idempotent
            await c.resume()
            assert not c.paused
            await c.__anext__()
            assert c.statistics().frames > frames
            async with c.pause():  # the block form still works
                assert c.paused
            assert not c.paused
            await c.resume()  # idempotent
            await c.__anext__()


class ListSink:
    def __init__(self) -> None:
        self.batches: list[Any] = []

    def extend(self, td: Any) -> None:
        self.batches.append(td)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_a_free_run_gets_nothing_after_pause_returns(sync: bool) -> None:
    kind = MultiSyncCollector if sync else MultiAsyncCollector
    sink = ListSink()
    with anyio.fail_after(LIMIT):
        async with kind(CountingEnv, num_workers=2, frames_per_batch=16, total_frames=-1,
                        replay_buffer=sink, **FAST) as c:
            c.start()
            await eventually(lambda: len(sink.batches) >= 2, "the free run fills the sink")
            await c.pause()
            held = len(sink.batches)
            await eventually(lambda: all(w.state == "idle" for w in c.statistics().workers),
                             "every worker idle while paused")
            await anyio.sleep(0.2)  # any batch that could still arrive would by now
            assert len(sink.batches) == held  # zero frames after pause() returned
            await c.resume()
            await eventually(lambda: len(sink.batches) >= held + 2, "it resumes")


async def test_in_process_collector_pauses() -> None:
    with anyio.fail_after(LIMIT):
        async with Collector(CountingEnv, frames_per_batch=8, total_frames=-1) as c:
            await c.__anext__()
            await c.pause()
            assert await nothing_within(c.__anext__)
            assert c.frames_collected == 8
            await c.resume()
            await c.__anext__()
            assert c.frames_collected == 16


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
def test_blocking_collector_pause_and_resume(anyio_backend: str) -> None:
    del anyio_backend  # a plain test: the facade runs its own loop
    with BlockingCollector(MultiSyncCollector(CountingEnv, ParamPolicy(), num_workers=1,
                                              frames_per_batch=8, total_frames=-1,
                                              **FAST)) as c:
        batches = iter(c)
        next(batches)
        with c.pause():
            assert c.paused
        assert not c.paused
        c.pause()
        assert c.paused
        c.resume()
        assert not c.paused
        c.wait_ready(timeout=60)
        next(batches)
        assert c.statistics().frames == 16
        events = c.events()  # subscribed now
        c.update_policy_weights()
        applied = next(events)
        assert (applied.kind, applied.version) == ("weights_applied", 1)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_a_loss_while_paused_is_seen_at_once_and_raised_after_resume(sync: bool) -> None:
    kind = MultiSyncCollector if sync else MultiAsyncCollector
    with anyio.fail_after(LIMIT):
        async with kind(CountingEnv, num_workers=2, frames_per_batch=16, total_frames=-1,
                        **FAST) as c:
            await c.__anext__()
            await c.pause()
            victim = c.worker_pids[1]
            os.kill(victim, signal.SIGKILL)
            await eventually(lambda: any(w.state == "lost" for w in c.statistics().workers),
                             "the loss is in statistics() while paused")
            assert [(w.pid, w.exit_code) for w in c.statistics().workers
                    if w.state == "lost"] == [(victim, -9)]
            await c.resume()
            with pytest.raises(WorkerLostError, match=r"SIGKILL"):
                await c.__anext__()
