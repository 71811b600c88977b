"""The trainer's waits are bounded: stalled workers, the first fill, replacements.

:class:`StartupWatch` and :class:`ReplacementWatch` (one :class:`BoundedWait` each)
say when the trainer is blocked on workers that have not joined, or on a lost
worker's replacement, and fail the run past their bound (``startup_timeout``,
``replacement_timeout``). The stall watchdog: a worker that owes work and delivers
nothing is lost.

Heartbeats prove that a worker's process and event loop are alive, not that it
collects: an env whose ``step()`` never returns (a simulator deadlock, a network
call without a timeout) or a policy that hangs leaves the heartbeats going and the
run waiting for ever. RLlib bounds the same wait with ``sample_timeout_s`` (60 s)
and its env-runner health probes; here the coordinator knows what each worker owes
(:attr:`WorkerInfo.owed_since`: since when it owes a credit or a share and
delivered nothing) and when its env last stepped (:attr:`WorkerInfo.stepped_at`,
from its :class:`~asyncrl._protocol.Progress` reports), and this task marks one
that owed work and stepped no env for ``timeout`` seconds as lost, through the
path every other loss takes: ``on_worker_loss`` applies (``"restart"`` kills the
process and respawns its slot; ``"continue"`` gives its credits to the others, so
that an async run still ends exactly on ``total_frames``). A slow batch whose
steps return is never lost for it: it gets one warning a run.

Progress is a peer's word, so it buys a bounded time (issue #43). Only steps of the
share a worker owes count (reported for the request it was asked, while it owes
it), and a count beyond what its batches can hold (``(delivered + 1) x share``
steps since its admission: a step is at least one frame) refuses the worker. Its
share is due at the step rate it reported for it: with ``n`` steps of it reported
``t`` seconds after it was asked, at ``owed_since + share x t / n``
(:meth:`Rounds.share_due`); still missing ``timeout`` seconds after that, it is a
stall, progress or not. An honest worker never reports more steps of a share than
the share has frames, so this never comes before the last step plus ``timeout``;
a worker that reports any faster is lost at ``due + timeout``, and one that feeds
the count a step at a time, each just inside ``timeout``, at the latest about
``(share + 1) x timeout`` after its share was asked.

A worker owes nothing between sync rounds, at ``prefetch`` batches ahead, or
while the collector is paused with nothing asked: the timeout never counts a
slow trainer against a worker. Time during which the trainer's own event loop
did not run (a long training step) does not count either: the batches that came
meanwhile are still being read.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from .._observe.events import CollectorEvent

if TYPE_CHECKING:
    from .coordinator import Coordinator

__all__ = ["BoundedWait", "ReplacementWatch", "StallWatchdog", "StartupWatch"]

log = logging.getLogger("asyncrl.coordinator")


class StallWatchdog:
    """Marks a worker that owed work and delivered nothing for ``timeout`` s as lost.

    Run :meth:`run` in the coordinator's task group.

    >>> watchdog = StallWatchdog(coordinator, timeout=60.0)   # doctest: +SKIP
    >>> tg.start_soon(watchdog.run)                            # doctest: +SKIP
    """

    def __init__(self, coordinator: Coordinator, timeout: float, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if timeout <= 0:
            raise ValueError(f"the stall timeout must be > 0 s, got {timeout}")
        self.coordinator = coordinator
        self.timeout = timeout
        self._clock = clock
        #: How often it looks: a fraction of the timeout, at most once a second.
        self.interval = min(1.0, timeout / 4)
        self._awake_since = clock()
        self._warned_slow = False  # the slow-batch warning is given once a run

    async def run(self) -> None:
        due = self._clock() + self.interval
        while True:
            await anyio.sleep(max(0.0, due - self._clock()))
            now = self._clock()
            if now - due > max(self.interval, self.timeout / 4):
                # Our loop did not run for a while (a training step held it): what the
                # workers sent meanwhile is still to be read. Count from now.
                self._awake_since = now
            due = now + self.interval
            await self.check(now)

    async def check(self, now: float) -> None:
        """Mark every worker that owed work for more than the timeout as lost."""
        state = self.coordinator.state
        for worker, seconds in state.losses.stalled_workers(now, self.timeout, self._awake_since):
            await self.coordinator.worker_stalled(worker, seconds)
        self.warn_slow_batches()

    def warn_slow_batches(self) -> None:
        """Once a run: a worker's batch took longer than the timeout, yet it stepped.

        Such a worker is not lost (the timeout bounds the time without a step), but a
        user who set ``sample_timeout`` to bound a batch should hear what it takes.
        A batch owed since before the trainer's loop last stalled is not measured.
        """
        if self._warned_slow:
            return
        for worker in self.coordinator.state.roster.live_workers:
            if worker.last_batch is None:
                continue
            owed, delivered = worker.last_batch
            took = delivered - owed
            if took > self.timeout and owed >= self._awake_since:
                self._warned_slow = True
                log.warning(
                    "worker %d (%s, pid %d on %s) took %.1f s per batch, more than "
                    "sample_timeout=%s s; it is not lost, as its env steps: sample_timeout "
                    "bounds the time without a step. Raise sample_timeout above the time "
                    "per batch, or ask smaller batches, to silence this (said once)",
                    worker.index, worker.name, worker.pid, worker.host, took, self.timeout)
                return


class BoundedWait:
    """A wait the trainer is blocked on says so, and ends: the shared part of the
    first fill's (:class:`StartupWatch`) and the replacements' (:class:`ReplacementWatch`).

    While :meth:`awaited` names what the trainer waits for, it publishes a
    ``"waiting"`` event once, logs a WARNING every ``warn_every`` seconds (30, or a
    third of ``timeout`` if less), and after ``timeout`` seconds fails the run with
    :meth:`failure` (None: no bound, warnings only). Subclasses say what is awaited.
    """

    def __init__(self, coordinator: Coordinator, timeout: float | None, *,
                 warn_every: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.coordinator = coordinator
        self.timeout = timeout
        self.warn_every = warn_every if warn_every is not None else \
            30.0 if timeout is None else min(30.0, timeout / 3)
        self.interval = min(1.0, self.warn_every / 2)
        self._clock = clock
        self.since: float | None = None  # when the current wait began
        self._warned = 0.0

    async def run(self) -> None:
        while not self.finished():
            await anyio.sleep(self.interval)
            self.check(self._clock())

    def finished(self) -> bool:
        """Nothing more to watch (the run failed, or a one-time wait is over)."""
        return self.coordinator.state.losses.failure is not None

    def awaited(self) -> str:
        """What the trainer is blocked on now, in words ("": nothing, it progresses)."""
        raise NotImplementedError

    def failure(self, awaited: str, waited: float) -> BaseException:
        """The run's error once ``awaited`` did not come within the timeout."""
        raise NotImplementedError

    def event(self, awaited: str) -> CollectorEvent:
        """The ``"waiting"`` event that says the wait began."""
        return CollectorEvent("waiting", reason=f"waiting for {awaited}{self._bound()}")

    def ended(self, waited: float) -> None:
        """The wait ended after ``waited`` seconds (a log line)."""

    def check(self, now: float) -> None:
        """Note, warn about or end the wait the trainer is in (if any) at ``now``."""
        awaited = self.awaited() if self.coordinator.state.losses.failure is None else ""
        if not awaited:
            if self.since is not None:
                self.ended(now - self.since)
            self.since = None
            return
        if self.since is None:
            self.since = self._warned = now
            log.warning("waiting for %s%s", awaited, self._bound())
            self.coordinator.registry.publish(self.event(awaited))
            return
        waited = now - self.since
        if self.timeout is not None and waited > self.timeout:
            self.coordinator.fail(self.failure(awaited, waited))
            return
        if now - self._warned >= self.warn_every:
            self._warned = now
            log.warning("still waiting for %s: %.0f s so far%s", awaited, waited,
                        self._bound())

    def _bound(self) -> str:
        return "" if self.timeout is None else f"; the run fails after {self.timeout} s"


class ReplacementWatch(BoundedWait):
    """``on_worker_loss="wait"`` / ``"restart"``: a wait for a replacement says so, and ends.

    While the trainer is blocked on lost workers' replacements
    (:meth:`CoordinatorState.waiting_for`), it publishes a ``"waiting"`` event once,
    logs a WARNING every ``warn_every`` seconds, and after ``timeout`` seconds fails the
    run with :class:`~asyncrl.WorkerLostError` naming the slots it waited for.

    >>> watch = ReplacementWatch(coordinator, timeout=300.0)   # doctest: +SKIP
    >>> tg.start_soon(watch.run)                                # doctest: +SKIP
    """

    def awaited(self) -> str:
        waiting = self.coordinator.state.losses.waiting_for()
        if not waiting:
            return ""
        slots = ", ".join(f"worker {w.index} ({w.name}, pid {w.pid} on {w.host})"
                          for w in waiting)
        policy = self.coordinator.state.losses.policy
        return f"a replacement of {slots} (on_worker_loss={policy.on_worker_loss!r})"

    def event(self, awaited: str) -> CollectorEvent:
        first = self.coordinator.state.losses.waiting_for()[0]
        return dataclasses.replace(super().event(awaited), worker=first.index,
                                   name=first.name, host=first.host, pid=first.pid)

    def failure(self, awaited: str, waited: float) -> BaseException:
        state = self.coordinator.state
        slots = ", ".join(f"worker {w.index} ({w.name}, pid {w.pid} on {w.host})"
                          for w in state.losses.waiting_for())
        assert self.timeout is not None
        return state.losses.policy.replacement_timed_out(slots, self.timeout, waited)

    def ended(self, waited: float) -> None:
        log.info("a replacement joined after %.1f s: the run goes on", waited)


class StartupWatch(BoundedWait):
    """The first fill: the trainer's first call waits for the run's workers; says so, and ends.

    From the trainer's first call (:meth:`Coordinator.wait_for_workers`) until every
    local slot and ``remote_workers`` place is taken, it publishes a ``"waiting"``
    event, logs a WARNING every 30 s naming the empty places and the hellos refused
    so far (a host whose specs differ, a full collector...), and after ``timeout``
    seconds fails the run with :class:`~asyncrl.CollectorError` saying the same and
    what to do. Once the run has filled it stops: later waits are replacements'.

    >>> watch = StartupWatch(coordinator, 300.0, local_workers=2, remote_workers=1,
    ...                      listen="tcp://0.0.0.0:5555", endpoint=hub.endpoint)  # doctest: +SKIP
    >>> tg.start_soon(watch.run)                                                   # doctest: +SKIP
    """

    def __init__(self, coordinator: Coordinator, timeout: float | None, *,
                 local_workers: int, remote_workers: int, listen: str | None,
                 endpoint: str, warn_every: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(coordinator, timeout, warn_every=warn_every, clock=clock)
        self.local_workers = local_workers
        self.remote_workers = remote_workers
        self.listen = listen
        self.endpoint = endpoint
        self.filled = False

    def finished(self) -> bool:
        return self.filled or super().finished()

    def awaited(self) -> str:
        state = self.coordinator.state
        if self.filled or state.losses.expected == 0:  # filled, or the trainer did not ask yet
            return ""
        missing = state.losses.missing_workers()
        if missing <= 0:
            self.filled = True
            return ""
        live = {w.index for w in self.coordinator.roster.live_workers}
        places = []
        slots = [str(i) for i in range(self.local_workers) if i not in live]
        if slots:
            places.append(f"local worker slot(s) {', '.join(slots)} (their processes are "
                          "starting: imports, env construction)")
        remote = sum(1 for i in live if i >= self.local_workers)
        if remote < self.remote_workers:
            places.append(f"{self.remote_workers - remote} of remote_workers="
                          f"{self.remote_workers} remote worker(s) (hosts connect to "
                          f"{self.endpoint}, listen={self.listen!r})")
        refused = self.coordinator.registry.refusals()
        seen = f"; hellos refused so far: {'; '.join(refused)}" if refused else \
            "; no host was refused" if self.remote_workers else ""
        return (f"{missing} of {state.losses.expected} worker(s) to join: "
                f"{' and '.join(places) or 'workers lost before they joined'}{seen}")

    def failure(self, awaited: str, waited: float) -> BaseException:
        from .._errors import CollectorError

        todo = "start the worker hosts with `asyncrl worker --connect ...` (see " \
            "docs/multihost.md), make remote_workers the number of hosts you start, " \
            "fix what refused them" if self.remote_workers else \
            "check that the env and policy build quickly in a fresh process"
        return CollectorError(
            f"the run's workers did not all join within startup_timeout={self.timeout} s "
            f"(waited {waited:.1f} s): {awaited}. To go on: {todo}, or pass a larger "
            "startup_timeout (None: wait for ever, with warnings)")

    def ended(self, waited: float) -> None:
        log.info("every worker joined after %.1f s: the run starts", waited)
