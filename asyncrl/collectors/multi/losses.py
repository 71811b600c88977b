"""What a lost worker does to a MultiCollector's run (``on_worker_loss``), trainer side.

A worker is lost three ways: its local process ends (the process watcher
reaps it), it goes silent for ``peer_timeout`` (the hub), or it says it stops
on a signal. The coordinator keeps the run's books (rounds, registry,
replacements) and the run's :class:`~asyncrl._coordinator.loss_policy.LossPolicy`
decides what each loss means; this module does it for the collector's
processes: fail the run naming the worker and how it ended, go on, or respawn
the slot (``"restart"``, bounded by ``MultiCollector.max_restarts`` deaths in a
row without a delivered batch). It reads the :class:`~.run.MultiRun` (this
module depends on :mod:`.run`, never the other way: the run calls it through
:class:`~.run.LossHandling`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio

from transports import PeerLostError, peer_name

from ..._coordinator.coordinator import WorkerInfo
from ..._errors import CollectorStopped, WorkerLostError
from ..._observe.events import CollectorEvent
from ..._spawn.exit_codes import EXIT_ERROR, EXIT_OK, likely_causes
from ..._spawn.processes import describe_exit

if TYPE_CHECKING:
    from .run import MultiRun

__all__ = ["WorkerLosses"]

log = logging.getLogger("asyncrl.collectors")


class WorkerLosses:
    """A MultiCollector's answers to its workers' losses (one per collector).

    It reads the run's state (:class:`~.run.MultiRun`), never the collector's.

    >>> losses = WorkerLosses(run)                         # doctest: +SKIP
    >>> respawn = await losses.process_died(0, process)   # doctest: +SKIP
    """

    def __init__(self, run: MultiRun) -> None:
        self._run = run
        self._restart_streak: dict[int, int] = {}  # slot -> deaths since its last batch
        #: pid -> why we killed it (silent, stalled): its death names that, not a signal's
        #: usual causes (the OOM killer). Bounded by the live slots' processes.
        self._killed: dict[int, str] = {}

    async def process_died(self, slot: int, process: Any) -> bool:
        """A local worker's process ended (reaped); returns True to respawn its slot."""
        run = self._run
        coordinator = run.coordinator
        if run.closing or coordinator is None or coordinator.state.losses.failure is not None:
            return False
        pid, exitcode = process.pid, process.exitcode
        # statistics() and events() show it lost with its exit code, whatever follows.
        coordinator.registry.exited(pid, exitcode, f"{describe_exit(exitcode)}")
        assert run.workers is not None
        peer = run.workers.identities[process]
        if exitcode in (EXIT_ERROR, EXIT_OK):
            # It may have reported its error (type, traceback), or that it stops on
            # SIGTERM, just before exiting: that report must win, and it may still be
            # on its way. A peer the hub never heard from has nothing on its way (the
            # grace is a safety margin).
            hub = run.hub
            connected = hub is not None and (peer in hub.peers
                                             or peer in coordinator.roster.workers)
            await coordinator.settle(peer, run.config.peer_timeout + 1.0 if connected else 1.0)
        if run.closing or coordinator.state.losses.failure is not None:
            return False
        worker = coordinator.roster.workers.get(peer)
        if worker is not None and worker.delivered:
            self._restart_streak[slot] = 0
        policy = run.config.coordinator.loss_policy
        error = self._death(slot, pid, exitcode)
        streak = self._restart_streak.get(slot, 0)
        crash_loop = policy.restart_refused(slot, streak, run.max_restarts(), error)
        if crash_loop is not None:
            coordinator.fail(crash_loop)
            return False
        log.warning("%s", error)
        await coordinator.worker_exited(peer, error,
                                        replaceable=policy.respawns or run.remote_workers > 0)
        if not policy.respawns or coordinator.state.losses.failure is not None:
            return False
        self._restart_streak[slot] = streak + 1
        log.warning("restarting worker slot %d", slot)
        run.publish(CollectorEvent("restarted", worker=slot, pid=pid, exit_code=exitcode,
                                          reason=describe_exit(exitcode)))
        return True

    def _death(self, slot: int, pid: int, exitcode: int | None) -> WorkerLostError:
        """What ended ``slot``'s process ``pid``: our kill (and why), or its exit code."""
        killed = self._killed.pop(pid, None)
        if killed is not None:
            return WorkerLostError(
                f"worker {slot} (pid {pid}) was killed by the collector to restart its slot "
                f"(on_worker_loss='restart'): it {killed}")
        return WorkerLostError(
            f"worker {slot} (pid {pid}) {describe_exit(exitcode)} before the collector was "
            f"closed: {likely_causes(exitcode)}")

    def leaving(self, worker: WorkerInfo, reason: str) -> None:
        """A worker stops on a signal: a local one stops the run (systemd's group SIGTERM)."""
        coordinator = self._run.coordinator
        if worker.index >= self._run.num_workers or coordinator is None:
            return  # a remote host leaving: a loss, as on_worker_loss says
        worker.alive = False
        log.info("worker %d (pid %d) got %s: the collector stops", worker.index, worker.pid,
                 reason or "a signal")
        coordinator.fail(CollectorStopped(
            f"the collector was stopped: worker {worker.index} (pid {worker.pid}) got "
            f"{reason or 'a signal'} (systemd and `kill -TERM -PGID` stop a whole process "
            "group); make a new collector to collect again"))

    def silent(self, worker: WorkerInfo) -> None:
        """A worker went silent for ``peer_timeout``: "restart" replaces a local one."""
        run = self._run
        workers = run.workers
        if not run.config.coordinator.loss_policy.respawns or workers is None or run.closing:
            return
        process = workers.slots.get(worker.index)
        if process is not None and process.pid == worker.pid and process.is_alive():
            # Hung or frozen: kill it; its slot's watcher respawns it (RLlib restarts
            # unhealthy env runners the same way).
            why = worker.lost_because or "stopped answering"
            log.warning("worker %d (pid %d) %s: killing it to restart its slot",
                        worker.index, worker.pid, why)
            self._killed[process.pid] = why
            process.kill()

    async def during_update(self, error: PeerLostError) -> None:
        """A worker was lost while weights were sent: the run's error, or go on without it."""
        run = self._run
        coordinator = run.coordinator
        assert coordinator is not None
        # The coordinator hears of the loss on its own path (the process's exit status,
        # the hub's silence): let it apply on_worker_loss first, so that the error the
        # user sees names the cause, and "continue" really continues.
        timeout = run.config.peer_timeout + 1.0
        with anyio.move_on_after(timeout):
            for peer in error.peers:
                await coordinator.settle(peer, timeout)
        coordinator.raise_if_failed()
        departed = all(coordinator.state.losses.has_left(peer) for peer in error.peers)
        policy = run.config.coordinator.loss_policy
        if policy.fails_weight_update(departed=departed):
            # The coordinator did not (yet) name the loss: one class whatever the timing.
            lost = [_describe(coordinator.roster.workers.get(peer), peer) for peer in error.peers]
            raise policy.lost_during_update(lost, error) from error
        log.info("weights applied by every worker still in the run; %s: %s",
                 "left meanwhile" if departed else "lost",
                 ", ".join(peer_name(p) for p in error.peers))


def _describe(worker: WorkerInfo | None, peer: bytes) -> str:
    if worker is None:  # never admitted (or forgotten): its peer id is all there is
        return f"peer {peer_name(peer)}"
    return f"worker {worker.index} ({worker.name}, pid {worker.pid} on {worker.host})"
