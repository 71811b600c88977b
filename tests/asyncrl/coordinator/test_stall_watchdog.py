"""A worker that owes work and delivers nothing for ``sample_timeout`` is lost (issue #22).

The state's bookkeeping (``owed_since``) and the watchdog's decision are checked
here with a fake clock: no socket, no process, no sleeping on wall-clock speed.
The chaos suite runs the real thing (``tests/chaos/test_stalls.py``).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from asyncrl._coordinator.state import CoordinatorState, Expel, Send, WorkerInfo
from asyncrl._coordinator.watchdog import ReplacementWatch, StallWatchdog
from asyncrl._errors import WorkerLostError
from asyncrl._protocol import Batch, Collect

from .test_coordinator_state import admit, hello, share, state, sync_state


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def clocked(**options: Any) -> tuple[CoordinatorState, Clock]:
    s = state(**options)
    clock = s.rounds.clock = Clock()
    return s, clock


def test_a_worker_owes_from_its_first_credit_until_it_delivered_all() -> None:
    s, clock = clocked(prefetch=2)
    a = admit(s, b"a")
    assert (a.credits, a.owed_since) == (2, 100.0)
    clock.now = 105.0
    s.batch(b"a", Batch(a.index, share(a.index)))
    assert (a.credits, a.owed_since) == (1, 105.0)  # delivered: the clock starts again
    s.batch(b"a", Batch(a.index, share(a.index)))
    assert (a.credits, a.owed_since) == (0, None)  # owes nothing: a slow trainer is no stall


def test_only_a_worker_that_owed_longer_than_the_timeout_is_stalled() -> None:
    s, clock = clocked()
    a, b = admit(s, b"a"), admit(s, b"b")
    clock.now = 109.0
    s.batch(b"b", Batch(b.index, share(b.index)))  # b delivered; its next credit waits
    assert s.losses.stalled_workers(clock.now, 10.0) == []
    clock.now = 110.5
    assert s.losses.stalled_workers(clock.now, 10.0) == [(a, 10.5)]
    # Time while the trainer's loop did not run does not count.
    assert s.losses.stalled_workers(clock.now, 10.0, awake_since=105.0) == []


def test_a_stall_under_raise_fails_the_run_naming_slot_pid_time_and_cause() -> None:
    s, _ = clocked()
    a = admit(s, b"a")
    assert s.losses.stalled(b"a", 61.0) == [Expel(b"a")]
    assert isinstance(s.losses.failure, WorkerLostError) and not a.alive
    message = str(s.losses.failure)
    assert f"worker {a.index} (w, pid {a.pid} on test-host)" in message, message
    assert "delivered nothing for 61.0 s" in message, message
    assert "the env step or the policy did not return" in message, message


def test_a_stalled_workers_credits_go_to_the_others_so_total_frames_stays_exact() -> None:
    s, _ = clocked(prefetch=1, batch_budget=3, on_worker_loss="continue")
    a, b = admit(s, b"a"), admit(s, b"b")
    s.batch(b"b", Batch(b.index, share(b.index)))
    s.rounds.take()  # b's next credit
    assert (a.credits, b.credits, s.rounds.budget) == (1, 1, 0)
    s.batch(b"b", Batch(b.index, share(b.index)))
    s.rounds.take()  # the budget is spent: b idles while a holds the last credit hostage
    assert (b.credits, s.rounds.budget) == (0, 0)
    assert s.losses.stalled(b"a", 61.0) == [Expel(b"a"), Send(b"b", Collect(b.index, 1))]
    assert s.losses.failure is None and s.losses.written_off == 1


def test_a_stalled_share_leaves_a_continue_round_that_completes_without_it() -> None:
    s, (w0, _) = sync_state(2, on_worker_loss="continue")
    round_, _ = s.start_round()
    s.batch(b"w0", Batch(1, share(0)))
    assert s.losses.stalled(b"w1", 61.0) == [Expel(b"w1")]
    assert round_.complete and [w for w, _ in s.rounds.end_round(round_)] == [w0]


class Stop(Exception):
    pass


class FakeCoordinator:
    def __init__(self, s: CoordinatorState) -> None:
        self.state = s
        self.stalled: list[tuple[WorkerInfo, float]] = []

    async def worker_stalled(self, worker: WorkerInfo, seconds: float) -> None:
        self.stalled.append((worker, seconds))
        self.state.losses.stalled(worker.peer, seconds)


@pytest.mark.anyio
async def test_the_watchdog_marks_the_stalled_worker_once() -> None:
    s, clock = clocked()
    a = admit(s, b"a")
    coordinator = FakeCoordinator(s)
    watchdog: Any = StallWatchdog(coordinator, 10.0, clock=clock)  # type: ignore[arg-type]
    await watchdog.check(109.0)
    assert coordinator.stalled == []
    await watchdog.check(111.0)
    await watchdog.check(112.0)
    assert coordinator.stalled == [(a, 11.0)]


@pytest.mark.anyio
async def test_the_watchdog_forgives_the_time_its_own_loop_was_held() -> None:
    s, clock = clocked()
    admit(s, b"a")
    coordinator = FakeCoordinator(s)
    watchdog: Any = StallWatchdog(coordinator, 4.0, clock=clock)  # type: ignore[arg-type]
    ticks: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        # The first wake-up comes 30 s late (a training step held the loop).
        clock.now += seconds + (30.0 if not ticks else 0.0)
        ticks.append(clock.now)
        if len(ticks) > 3:
            raise Stop

    original = anyio.sleep
    anyio.sleep = fake_sleep  # type: ignore[assignment]
    try:
        with pytest.raises(Stop):
            await watchdog.run()
    finally:
        anyio.sleep = original  # type: ignore[assignment]
    assert coordinator.stalled == [], "the held loop's 30 s were counted against the worker"


# -- waiting for a replacement ("wait" / "restart"), bounded ---------------------------------
class Published:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def publish(self, event: Any) -> None:
        self.events.append(event)


class WaitingCoordinator:
    def __init__(self, s: CoordinatorState) -> None:
        self.state = s
        self.registry = Published()

    def fail(self, error: BaseException) -> None:
        self.state.losses.fail(error)


def test_a_waiting_round_names_the_lost_worker_until_a_newcomer_takes_its_place() -> None:
    s, (_, w1) = sync_state(2, on_worker_loss="wait")
    s.start_round()
    assert s.losses.waiting_for() == []
    s.losses.lost(b"w1")
    assert s.losses.waiting_for() == [w1]
    s.hello(b"new", hello())
    assert s.losses.waiting_for() == [] and not s.losses.vacant


def test_an_async_run_waits_only_once_no_worker_is_left() -> None:
    s, _ = clocked(on_worker_loss="wait")
    a, b = admit(s, b"a"), admit(s, b"b")
    s.losses.lost(b"a")
    assert s.losses.waiting_for() == []  # b still collects
    s.losses.lost(b"b")
    assert s.losses.waiting_for() == [a, b]


def test_the_wait_is_announced_once_warned_about_and_fails_after_the_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    s, (_, w1) = sync_state(2, on_worker_loss="wait")
    s.start_round()
    s.losses.lost(b"w1")
    coordinator = WaitingCoordinator(s)
    watch = ReplacementWatch(coordinator, 9.0, clock=Clock())  # type: ignore[arg-type]
    assert watch.warn_every == 3.0
    with caplog.at_level("WARNING", logger="asyncrl.coordinator"):
        for now in (0.0, 1.0, 3.5, 5.0, 7.0):
            watch.check(now)
    [event] = coordinator.registry.events
    assert (event.kind, event.worker, event.pid) == ("waiting", 1, w1.pid)
    assert "the run fails after 9.0 s" in event.reason
    warnings = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert len(warnings) == 3, warnings  # at 0, 3.5 and 7 s
    assert s.losses.failure is None
    watch.check(9.5)
    assert isinstance(s.losses.failure, WorkerLostError)
    message = str(s.losses.failure)
    assert f"worker 1 (w, pid {w1.pid} on test-host) was lost" in message, message
    assert "replacement_timeout=9.0 s" in message, message


def test_a_replacement_that_joins_ends_the_wait() -> None:
    s, _ = sync_state(2, on_worker_loss="wait")
    s.start_round()
    s.losses.lost(b"w1")
    watch = ReplacementWatch(WaitingCoordinator(s), 9.0)  # type: ignore[arg-type]
    watch.check(0.0)
    assert watch.since == 0.0
    s.hello(b"new", hello())
    watch.check(20.0)
    assert watch.since is None and s.losses.failure is None
