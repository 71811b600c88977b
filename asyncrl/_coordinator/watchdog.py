"""The stall watchdog: a worker that owes work and delivers nothing is lost.

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

A worker owes nothing between sync rounds, at ``prefetch`` batches ahead, or
while the collector is paused with nothing asked: the timeout never counts a
slow trainer against a worker. Time during which the trainer's own event loop
did not run (a long training step) does not count either: the batches that came
meanwhile are still being read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from .coordinator import Coordinator

__all__ = ["ReplacementWatch", "StallWatchdog"]

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
        for worker, seconds in state.stalled_workers(now, self.timeout, self._awake_since):
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
        for worker in self.coordinator.state.live_workers:
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


class ReplacementWatch:
    """``on_worker_loss="wait"`` / ``"restart"``: a wait for a replacement says so, and ends.

    While the trainer is blocked on lost workers' replacements
    (:meth:`CoordinatorState.waiting_for`), it publishes a ``"waiting"`` event once,
    logs a WARNING every ``warn_every`` seconds, and after ``timeout`` seconds fails the
    run with :class:`~asyncrl.WorkerLostError` naming the slots it waited for.

    >>> watch = ReplacementWatch(coordinator, timeout=300.0)   # doctest: +SKIP
    >>> tg.start_soon(watch.run)                                # doctest: +SKIP
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
        while True:
            await anyio.sleep(self.interval)
            self.check(self._clock())

    def check(self, now: float) -> None:
        """Note, warn about or end the wait the trainer is in (if any) at ``now``."""
        from .._observe.events import CollectorEvent

        state = self.coordinator.state
        policy = state.loss_policy
        waiting = state.waiting_for()
        if not waiting:
            if self.since is not None:
                log.info("a replacement joined after %.1f s: the run goes on", now - self.since)
            self.since = None
            return
        slots = ", ".join(f"worker {w.index} ({w.name}, pid {w.pid} on {w.host})"
                          for w in waiting)
        bound = "" if self.timeout is None else f"; the run fails after {self.timeout} s"
        if self.since is None:
            self.since = self._warned = now
            log.warning("waiting for a replacement of %s (on_worker_loss=%r)%s", slots,
                        policy.on_worker_loss, bound)
            self.coordinator.registry.publish(CollectorEvent(
                "waiting", worker=waiting[0].index, name=waiting[0].name,
                host=waiting[0].host, pid=waiting[0].pid,
                reason=f"waiting for a replacement of {slots}{bound}"))
            return
        waited = now - self.since
        if self.timeout is not None and waited > self.timeout:
            self.coordinator.fail(policy.replacement_timed_out(slots, self.timeout, waited))
            return
        if now - self._warned >= self.warn_every:
            self._warned = now
            log.warning("still waiting for a replacement of %s: %.0f s so far%s", slots,
                        waited, bound)
