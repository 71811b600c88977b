"""The first fill is bounded and said (issue #35, item 5).

Until every local slot and ``remote_workers`` place is taken, the trainer's first
call waits: :class:`StartupWatch` says so (a ``"waiting"`` event, WARNINGs naming
the empty places and the hellos refused meanwhile) and fails the run past
``startup_timeout``. Checked here with a fake clock on the coordinator's real
state and registry; ``tests/chaos/test_waits.py`` runs the real thing.
"""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl._coordinator.registry import WorkerRegistry
from asyncrl._coordinator.state import CoordinatorState
from asyncrl._coordinator.watchdog import StartupWatch
from asyncrl._errors import CollectorError

from .test_coordinator_state import TOKEN, admit, hello, state

LISTEN = "tcp://0.0.0.0:0"
ENDPOINT = "tcp://10.0.0.1:5555"


class FillingCoordinator:
    """What the watch reads of a coordinator: its state, its registry, its live workers."""

    def __init__(self, s: CoordinatorState) -> None:
        self.state = s
        self.events: list[Any] = []
        self.registry = WorkerRegistry(self.events.append)
        self.roster = s.roster

    def fail(self, error: BaseException) -> None:
        self.state.losses.fail(error)


def watched(local: int, remote: int, timeout: float | None = 9.0
            ) -> tuple[CoordinatorState, FillingCoordinator, StartupWatch]:
    s = state(max_remote_workers=remote, first_remote_index=local)
    coordinator = FillingCoordinator(s)
    watch = StartupWatch(coordinator, timeout, local_workers=local,  # type: ignore[arg-type]
                         remote_workers=remote, listen=LISTEN, endpoint=ENDPOINT)
    return s, coordinator, watch


def test_nothing_is_awaited_before_the_trainer_asks() -> None:
    s, coordinator, watch = watched(0, 1)
    watch.check(0.0)
    watch.check(100.0)
    assert coordinator.events == [] and s.losses.failure is None and watch.since is None


def test_no_host_arriving_is_said_then_fails_naming_remote_workers_and_listen(
        caplog: pytest.LogCaptureFixture) -> None:
    s, coordinator, watch = watched(0, 1)
    s.losses.expected = 1  # the trainer's first call (Coordinator.wait_for_workers)
    assert watch.warn_every == 3.0
    with caplog.at_level("WARNING", logger="asyncrl.coordinator"):
        for now in (0.0, 1.0, 3.5, 5.0, 7.0):
            watch.check(now)
    [event] = coordinator.events
    assert event.kind == "waiting" and event.worker is None
    assert "1 of remote_workers=1 remote worker(s)" in event.reason, event.reason
    assert "the run fails after 9.0 s" in event.reason, event.reason
    warnings = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert len(warnings) == 3, warnings  # at 0, 3.5 and 7 s
    assert "no host was refused" in warnings[0], warnings
    assert s.losses.failure is None
    watch.check(9.5)
    assert isinstance(s.losses.failure, CollectorError)
    message = str(s.losses.failure)
    for part in ("startup_timeout=9.0 s", "remote_workers=1", f"listen={LISTEN!r}", ENDPOINT,
                 "asyncrl worker --connect"):
        assert part in message, message
    assert watch.finished()


def test_a_host_refused_for_its_specs_is_named_in_the_warning_and_the_error(
        caplog: pytest.LogCaptureFixture) -> None:
    s, coordinator, watch = watched(0, 1)
    s.losses.expected = 1
    coordinator.registry.refused("w", "host-b", "observation: shape [4] differs from [3]")
    with caplog.at_level("WARNING", logger="asyncrl.coordinator"):
        watch.check(0.0)
    [warning] = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert "refused so far: w from host-b: observation: shape [4]" in warning, warning
    watch.check(9.5)
    assert "w from host-b: observation" in str(s.losses.failure), s.losses.failure


def test_the_registry_keeps_only_the_latest_distinct_refusals() -> None:
    registry = WorkerRegistry(max_refusals=2)
    for host in ("a", "b", "a", "c"):
        registry.refused("w", host, "bad token")
    assert registry.refusals() == ["w from a: bad token", "w from c: bad token"]


def test_empty_local_slots_are_named_and_the_fill_ends_the_watch() -> None:
    s, coordinator, watch = watched(2, 1)
    s.losses.expected = 3
    admit(s, b"local-1", slot=1, token=TOKEN)
    awaited = watch.awaited()
    assert "2 of 3 worker(s)" in awaited and "local worker slot(s) 0 " in awaited, awaited
    assert "1 of remote_workers=1" in awaited, awaited
    watch.check(0.0)
    admit(s, b"local-0", slot=0, token=TOKEN)
    s.hello(b"remote", hello())
    watch.check(1.0)
    assert watch.filled and watch.finished() and watch.since is None
    s.losses.expected = 4  # a later shortfall (a loss) is the replacement watch's, never this one's
    watch.check(100.0)
    assert s.losses.failure is None and len(coordinator.events) == 1


def test_without_a_bound_it_warns_for_ever() -> None:
    s, _, watch = watched(0, 1, timeout=None)
    s.losses.expected = 1
    assert watch.warn_every == 30.0
    for now in (0.0, 10_000.0):
        watch.check(now)
    assert s.losses.failure is None and watch.since == 0.0
