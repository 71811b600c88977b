"""``collector.events()``: typed events, fanned out to bounded subscriptions.

The fan-out is tested alone (drop-oldest with a count, several subscribers,
the end at close); admission, refusal and loss through the real coordinator
with simulated workers; and join, loss with the exit code, restart and weights
applied with real worker processes. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import uuid
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from asyncrl import CollectorEvent, MultiAsyncCollector, MultiSyncCollector, WorkerLostError
from asyncrl._coordinator.coordinator import Coordinator, check_specs
from asyncrl._observe.events import EventFanout
from asyncrl._worker.simulated import SimRecord, sim_worker
from asyncrl.testing import CountingEnv, ParamPolicy
from tests.asyncrl.coordinator.rules import rules
from transports import Hub

pytestmark = pytest.mark.anyio

LIMIT = 120
FAST = {"heartbeat_interval": 0.5, "peer_timeout": 5.0}


async def test_a_slow_subscriber_loses_the_oldest_events_and_counts_them() -> None:
    fanout = EventFanout()
    slow, fast = fanout.subscribe(maxlen=3), fanout.subscribe(maxlen=100)
    for version in range(10):
        fanout.publish(CollectorEvent("weights_applied", version=version))  # never blocks
    assert slow.dropped == 7 and fast.dropped == 0
    with anyio.fail_after(5):
        assert [(await slow.__anext__()).version for _ in range(3)] == [7, 8, 9]
        assert [(await fast.__anext__()).version for _ in range(10)] == list(range(10))


async def test_subscriptions_wake_on_publish_and_end_at_close() -> None:
    fanout = EventFanout()
    got: list[list[Any]] = [[], []]

    async def read(stream: Any, into: list[Any]) -> None:
        async for event in stream:
            into.append(event.kind)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for into in got:
                tg.start_soon(read, fanout.subscribe(), into)
            await anyio.lowlevel.checkpoint()
            fanout.publish(CollectorEvent("joined", worker=0))
            fanout.publish(CollectorEvent("lost", worker=0))
            fanout.close()  # both loops end once they drained
    assert got == [["joined", "lost"], ["joined", "lost"]]
    late = fanout.subscribe()  # subscribing after close: ends at once
    with pytest.raises(StopAsyncIteration):
        await late.__anext__()


async def test_an_unsubscribed_stream_gets_nothing_more() -> None:
    fanout = EventFanout()
    async with fanout.subscribe() as stream:
        fanout.publish(CollectorEvent("joined", worker=0))
    fanout.publish(CollectorEvent("joined", worker=1))
    first = stream.get_nowait()
    assert first is not None and (first.kind, first.worker) == ("joined", 0)
    assert stream.get_nowait() is None


async def _sim(endpoint: str, name: str, *, task_status: anyio.abc.TaskStatus[SimRecord]) -> None:
    await sim_worker(endpoint, name, frames=8, task_status=task_status)


async def test_the_coordinator_publishes_joined_refused_and_lost() -> None:
    events: list[CollectorEvent] = []
    with anyio.fail_after(LIMIT):
        async with Hub(f"inproc://events-{uuid.uuid4().hex}") as hub:
            coordinator = Coordinator(hub, *rules(sync=False, share_frames=[8, 8],
                                                  check_specs=check_specs, accept_remote=True,
                                                  max_remote_workers=2,
                                                  on_worker_loss="continue"),
                                      publish=events.append)
            async with anyio.create_task_group() as tg:
                tg.start_soon(coordinator.run)
                for name in ("sim-a", "sim-b", "sim-c"):
                    await tg.start(_sim, hub.endpoint, name)
                while len(events) < 3:
                    await anyio.sleep(0.02)
                joined = [e for e in events if e.kind == "joined"]
                refused = [e for e in events if e.kind == "refused"]
                assert len(joined) == 2 and len(refused) == 1
                assert {e.name for e in joined} | {refused[0].name} == {"sim-a", "sim-b", "sim-c"}
                assert "remote_workers" in refused[0].reason and refused[0].worker is None
                victim = coordinator.roster.live_workers[0]
                await coordinator.worker_exited(victim.peer, WorkerLostError("it died"),
                                                replaceable=False)
                lost = [e for e in events if e.kind == "lost"]
                assert [(e.worker, e.name, e.reason) for e in lost] == [
                    (victim.index, victim.name, "it died")]
                tg.cancel_scope.cancel()


@pytest.mark.parametrize(("anyio_backend", "kind"),
                         [("asyncio", MultiSyncCollector), ("trio", MultiAsyncCollector),
                          ("trio", MultiSyncCollector), ("asyncio", MultiAsyncCollector)])
async def test_join_weights_loss_and_restart_events(kind: type) -> None:
    collector = kind(CountingEnv, ParamPolicy(), num_workers=2, frames_per_batch=16,
                     total_frames=-1, on_worker_loss="restart", **FAST)
    # Subscribed before it opens: every join is seen. Two subscribers, the same events.
    events, other = collector.events(), collector.events()
    with anyio.fail_after(LIMIT):
        async with collector as c:
            await c.wait_ready(timeout=60)
            pids = list(c.worker_pids)
            await c.update_policy_weights()
            os.kill(pids[1], signal.SIGKILL)
            seen: list[CollectorEvent] = []
            async for event in events:
                seen.append(event)
                if event.kind == "joined" and event.pid not in pids:
                    break  # the replacement joined
            kinds = [e.kind for e in seen]
            assert kinds[:2] == ["joined", "joined"]
            assert {e.pid for e in seen[:2]} == set(pids)
            applied = [e for e in seen if e.kind == "weights_applied"]
            assert [(e.version, e.model_id) for e in applied] == [(1, "policy")]
            assert applied[0].seconds is not None and applied[0].seconds >= 0
            lost = next(e for e in seen if e.kind == "lost")
            assert (lost.worker, lost.pid, lost.exit_code) == (1, pids[1], -9)
            restarted = next(e for e in seen if e.kind == "restarted")
            assert (restarted.worker, restarted.pid) == (1, pids[1])
            assert kinds.index("lost") < kinds.index("restarted") < len(kinds) - 1
            assert seen[-1].worker == 1 and seen[-1].pid in c.worker_pids
            assert other.dropped == 0
            assert [other.get_nowait() for _ in seen] == seen
    with pytest.raises(StopAsyncIteration):  # closed: the subscriptions end
        with anyio.fail_after(5):
            await events.__anext__()
