"""A slow worker that steps is never lost for it; one that stops stepping is (issue #35).

``sample_timeout`` bounds the time without an env step, read from the worker's
``progress`` reports, not the time a batch takes. State and watchdog with a fake
clock, no socket; the chaos suite runs the real thing (``tests/chaos/test_slow_steps.py``).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from asyncrl._coordinator.state import Expel
from asyncrl._coordinator.watchdog import StallWatchdog
from asyncrl._errors import WorkerLostError
from asyncrl._protocol import Batch, Progress, Refuse
from asyncrl.collectors.multi.losses import WorkerLosses
from transports import ProtocolError

from .test_coordinator_state import FRAMES, admit, share
from .test_stall_watchdog import Clock, FakeCoordinator, clocked


def test_a_worker_that_reports_steps_is_not_stalled_however_long_its_batch() -> None:
    s, clock = clocked(share_frames=[64])
    a = admit(s, b"a")
    for step in range(1, 40):  # a step a second, for 39 s of one batch
        clock.now = 100.0 + step
        assert not s.progress(b"a", Progress(a.index, steps=step))
        assert s.losses.stalled_workers(clock.now, 10.0) == []
    assert a.stepped_at == 139.0 and a.steps == 39


def test_a_worker_whose_steps_stop_is_stalled_from_its_last_step() -> None:
    s, clock = clocked()
    a = admit(s, b"a")
    clock.now = 104.0
    s.progress(b"a", Progress(a.index, steps=7))
    clock.now = 110.0
    s.progress(b"a", Progress(a.index, steps=7))  # the same count: no step since
    clock.now = 114.0
    assert s.losses.stalled_workers(clock.now, 10.0) == []
    clock.now = 114.5
    assert s.losses.stalled_workers(clock.now, 10.0) == [(a, 14.5)]
    s.losses.stalled(b"a", 14.5)
    message = str(s.losses.failure)
    assert isinstance(s.losses.failure, WorkerLostError)
    assert "delivered nothing for 14.5 s, no step for 10.5 s" in message, message
    assert "the env step or the policy did not return (sample_timeout)" in message, message


def test_a_step_before_the_owed_batch_does_not_count_for_it() -> None:
    s, clock = clocked(prefetch=2)
    a = admit(s, b"a")
    clock.now = 105.0
    s.progress(b"a", Progress(a.index, steps=3))
    clock.now = 106.0
    s.batch(b"a", Batch(a.index, share(a.index)))  # owes its second from 106 on
    clock.now = 116.5
    assert s.losses.stalled_workers(clock.now, 10.0) == [(a, 10.5)]


def test_progress_of_a_stranger_or_a_lost_worker_changes_nothing() -> None:
    s, _ = clocked(on_worker_loss="continue")
    a = admit(s, b"a")
    s.progress(b"stranger", Progress(0, steps=5))
    s.losses.lost(b"a")
    s.progress(b"a", Progress(a.index, steps=5))
    assert a.stepped_at is None and a.steps == -1


@pytest.mark.parametrize("body", [None, {}, {"request": 1}, {"request": 1, "steps": -1},
                                  {"request": 1, "steps": 1 << 63},
                                  {"request": 1, "steps": True}, {"request": "1", "steps": 1}])
def test_a_bad_progress_message_is_a_protocol_error(body: Any) -> None:
    with pytest.raises(ProtocolError):
        Progress.from_body(body)


@pytest.mark.anyio
async def test_a_slow_batch_is_warned_about_once_with_its_time_and_the_knob(
        caplog: pytest.LogCaptureFixture) -> None:
    s, clock = clocked(prefetch=3)
    a = admit(s, b"a")
    watchdog: Any = StallWatchdog(FakeCoordinator(s), 10.0, clock=Clock())  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="asyncrl.coordinator"):
        clock.now = 109.0
        s.batch(b"a", Batch(a.index, share(a.index)))  # 9 s: within the timeout
        await watchdog.check(clock.now)
        for done, now in enumerate((121.5, 134.0), start=1):  # 12.5 s each, stepping
            s.progress(b"a", Progress(a.index, steps=done * 8 + 4))
            clock.now = now
            s.batch(b"a", Batch(a.index, share(a.index)))
            await watchdog.check(clock.now)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert f"worker {a.index} (w, pid {a.pid}" in warnings[0], warnings[0]
    assert "took 12.5 s per batch" in warnings[0], warnings[0]
    assert "sample_timeout=10.0 s" in warnings[0] and "not lost" in warnings[0]
    assert a.alive


def test_a_slot_killed_for_a_stall_is_reported_with_why_not_the_oom_killer() -> None:
    losses = WorkerLosses(SimpleNamespace())  # type: ignore[arg-type]
    losses._killed[4242] = "owed a batch and delivered nothing for 2.1 s (sample_timeout)"
    killed = str(losses._death(1, 4242, -9))
    assert "killed by the collector" in killed and "sample_timeout" in killed, killed
    assert "OOM" not in killed, killed
    assert "OOM" in str(losses._death(1, 4243, -9))  # a kill of someone else's


# -- progress is bounded by the share owed (issue #43, attack 5) --------------------------------
def test_progress_that_rises_past_what_its_batches_hold_refuses_the_worker() -> None:
    """The attack: sample_timeout=3, a count rising each second, never a batch."""
    s, clock = clocked(on_worker_loss="continue")  # shares of 8 frames
    a = admit(s, b"a")
    actions: list[Any] = []
    for step in range(1, 26):  # 25 s watched
        clock.now = 100.0 + step
        actions = s.progress(b"a", Progress(a.index, steps=step))
        if actions or s.losses.stalled_workers(clock.now, 3.0):
            break
    assert clock.now == 109.0 and not a.alive  # its 9th step: one more than a share holds
    refuse = actions[0].message
    assert isinstance(refuse, Refuse) and not refuse.full
    assert refuse.reason == ("dropped: its progress says 9 env steps, more than its 0 "
                             "delivered batch(es) and the one it collects can hold (8: 8 "
                             "frames each, a step at least one frame)")
    assert isinstance(actions[1], Expel) and s.losses.written_off == 1
    assert a.rejoin_asked  # refused for cause: never invited back


def test_a_refused_progress_under_raise_fails_the_run_naming_the_worker() -> None:
    s, _ = clocked()
    a = admit(s, b"a")
    s.progress(b"a", Progress(a.index, steps=10**6))
    assert isinstance(s.losses.failure, WorkerLostError)
    assert f"worker {a.index} (w, pid {a.pid}" in str(s.losses.failure), s.losses.failure
    assert "was refused: its progress says 1000000 env steps, more than its 0 delivered " \
        "batch(es)" in str(s.losses.failure), s.losses.failure


def test_a_share_whose_steps_rise_past_its_frames_but_which_never_comes_is_a_stall() -> None:
    """Two shares delivered (no progress then), then for its third a count rising by 10
    a second and no batch: more steps than the share's 64 frames after 7.4 s. At that rate
    the share was due 6.4 s after it was asked; it is lost sample_timeout (3 s) later."""
    s, clock = clocked(share_frames=[64], on_worker_loss="continue")
    a = admit(s, b"a")
    for _ in range(2):
        s.batch(b"a", Batch(a.index, share(a.index, 64)))
        owed = clock.now = clock.now + 5.0
        assert s.rounds.take() is not None  # the trainer takes it: its next credit, owed from now
    assert (a.delivered, a.credits, a.owed_since) == (2, 1, owed)
    stalled: list[Any] = []
    for tick in range(1, 25 * 4):  # the watchdog looks every 0.25 s, for 25 s
        clock.now = owed + tick / 4
        if tick % 4 == 0:  # a report a second
            assert not s.progress(b"a", Progress(a.index, steps=1 + 10 * (tick // 4 - 1)))
        stalled = s.losses.stalled_workers(clock.now, 3.0)
        if stalled:
            break
    assert stalled == [(a, clock.now - owed)]
    assert owed + 9.4 < clock.now <= owed + 11.0, clock.now - owed
    s.losses.stalled(b"a", stalled[0][1])
    assert not a.alive and s.losses.written_off == 1
    assert "although its progress reports" in a.lost_because, a.lost_because
    assert "its share of 64 frames was due after" in a.lost_because, a.lost_because


def test_a_slow_worker_that_steps_evenly_is_never_due_before_its_share_ends() -> None:
    """A step every 2.5 s (sample_timeout=3), 8 steps of a 64-frame share (8 envs):
    20 s a batch, never lost, batch after batch."""
    s, clock = clocked(share_frames=[64], prefetch=2)
    a = admit(s, b"a")
    steps = 0
    for _batch in range(3):
        for _ in range(8):
            clock.now += 2.5
            steps += 1
            assert not s.progress(b"a", Progress(a.index, steps=steps))  # not refused
            assert s.losses.stalled_workers(clock.now, 3.0) == []
        s.batch(b"a", Batch(a.index, share(a.index, 64)))
    assert a.alive and a.delivered == 3


def test_progress_for_a_share_it_does_not_owe_counts_for_nothing() -> None:
    s, clock = clocked(sync=True, share_frames=[FRAMES])
    a = admit(s, b"a")  # sync: owes nothing before the first round
    clock.now = 101.0
    assert not s.progress(b"a", Progress(0, steps=3))
    assert (a.steps, a.stepped_at) == (-1, None)
    round_, _ = s.start_round()
    clock.now = 102.0
    s.progress(b"a", Progress(round_.request + 7, steps=4))  # not the round it was asked
    assert (a.steps, a.stepped_at) == (-1, None)
    s.progress(b"a", Progress(round_.request, steps=4))
    assert (a.steps, a.stepped_at) == (4, 102.0)
