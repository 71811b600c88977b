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

from asyncrl._coordinator.watchdog import StallWatchdog
from asyncrl._errors import WorkerLostError
from asyncrl._protocol import Batch, Progress
from asyncrl.collectors.multi.losses import WorkerLosses
from transports import ProtocolError

from .test_coordinator_state import admit, share
from .test_stall_watchdog import Clock, FakeCoordinator, clocked


def test_a_worker_that_reports_steps_is_not_stalled_however_long_its_batch() -> None:
    s, clock = clocked(share_frames=[64])
    a = admit(s, b"a")
    for step in range(1, 40):  # a step a second, for 39 s of one batch
        clock.now = 100.0 + step
        assert s.progress(b"a", Progress(a.index, steps=step)) == []
        assert s.stalled_workers(clock.now, 10.0) == []
    assert a.stepped_at == 139.0 and a.steps == 39


def test_a_worker_whose_steps_stop_is_stalled_from_its_last_step() -> None:
    s, clock = clocked()
    a = admit(s, b"a")
    clock.now = 104.0
    s.progress(b"a", Progress(a.index, steps=7))
    clock.now = 110.0
    s.progress(b"a", Progress(a.index, steps=7))  # the same count: no step since
    clock.now = 114.0
    assert s.stalled_workers(clock.now, 10.0) == []
    clock.now = 114.5
    assert s.stalled_workers(clock.now, 10.0) == [(a, 14.5)]
    s.stalled(b"a", 14.5)
    message = str(s.failure)
    assert isinstance(s.failure, WorkerLostError)
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
    assert s.stalled_workers(clock.now, 10.0) == [(a, 10.5)]


def test_progress_of_a_stranger_or_a_lost_worker_changes_nothing() -> None:
    s, _ = clocked(on_worker_loss="continue")
    a = admit(s, b"a")
    s.progress(b"stranger", Progress(0, steps=5))
    s.lost(b"a")
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
