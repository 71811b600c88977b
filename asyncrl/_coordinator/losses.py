"""Losses, departures and vacancies: workers that go, and what the run does about it.

A worker goes four ways: the hub loses it (silent, disconnected, revoked), it
stalls (owes work and delivers nothing), its local process exits, or it leaves
cleanly (it said so). The :class:`~asyncrl._coordinator.loss_policy.LossPolicy`
says what a loss does (fail the run, write the worker off, keep its place for a
replacement); a departure fails nothing whatever the policy. Either way what the
worker owed is released through :class:`~asyncrl._coordinator.rounds.Rounds`.
Plain methods that update the books and return the actions to take (see
:mod:`asyncrl._coordinator.state`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from transports import peer_name

from .._errors import WorkerLostError
from .._protocol import Refuse, Rejoin
from .actions import Action, Expel, Send
from .loss_policy import LossOutcome, LossPolicy
from .records import LOSS_WORDS, Roster, WorkerInfo
from .rounds import Rounds

__all__ = ["Losses"]

log = logging.getLogger("asyncrl.coordinator")

#: How many gone peers, departed peers and vacancies are remembered (peers may be hostile).
REMEMBERED = 1024


class Losses:
    """Who was lost or left, whose place a replacement is to take, and the run's failure.

    >>> from .config import CoordinatorConfig
    >>> roster = Roster()
    >>> config = CoordinatorConfig(sync=False, share_frames=[8])
    >>> losses = Losses(roster, Rounds(roster, config), config.loss_policy)
    >>> losses.lost(b"stranger")   # never admitted: nothing to do
    []
    """

    def __init__(self, roster: Roster, rounds: Rounds, policy: LossPolicy, *,
                 peer_timeout: float | None = None) -> None:
        self._roster = roster
        self._rounds = rounds
        self.policy = policy
        self._peer_timeout = peer_timeout
        self.failure: BaseException | None = None
        # Peers whose loss was handled, newest last.
        self.gone: OrderedDict[bytes, None] = OrderedDict()
        self.written_off = 0  # workers lost under "continue": nobody waits for them
        self.departures = 0  # workers that left cleanly (a goodbye): nobody waits for them
        self.left: OrderedDict[bytes, None] = OrderedDict()  # their peers (bounded as gone)
        self.expected = 0  # workers the run was started with (see missing_workers)
        # "wait" / "restart": lost workers whose place a replacement is to take, oldest first.
        self.vacant: OrderedDict[int, WorkerInfo] = OrderedDict()
        # Workers stalled_workers() found past their share's due time: when it was due
        # (s after it was owed), for the loss's words.
        self._overdue: dict[bytes, float] = {}

    def fail(self, error: BaseException) -> None:
        """The run's failure (the first one stays)."""
        if self.failure is None:
            self.failure = error

    # -- what the trainer asks -------------------------------------------------------------
    def missing_workers(self) -> int:
        """Workers still to join of the ``expected`` ones (less those lost before joining)."""
        return self.expected - self.written_off - self.departures \
            - len(self._roster.live_workers)

    def awaited_replacements(self) -> int:
        """Workers a new sync round waits for besides the live ones (``"wait"`` /
        ``"restart"``: the replacements of those lost before it began)."""
        return self.missing_workers() if self.policy.waits_for_replacements else 0

    def has_left(self, peer: bytes) -> bool:
        """``peer`` left the run cleanly (a departure, not a loss)."""
        return peer in self.left

    def waiting_for(self) -> list[WorkerInfo]:
        """The lost workers the trainer is blocked on, waiting for their replacements
        (``"wait"`` / ``"restart"``): a sync round that lacks their shares, or an async
        run with no live worker left; [] while the run can progress."""
        rounds = self._rounds
        if not self.vacant or rounds.paused or self.failure is not None:
            return []
        if rounds.config.sync:
            round_ = rounds.round
            blocked = round_ is not None and round_.replacements > 0 and not round_.complete
        else:
            blocked = not self._roster.live_workers and not rounds.ready
        return list(self.vacant.values()) if blocked else []

    def stalled_workers(self, now: float, timeout: float,
                        awake_since: float = 0.0) -> list[tuple[WorkerInfo, float]]:
        """Live workers that owe work and stepped no env for more than ``timeout`` s
        while the trainer's loop ran (counted from ``awake_since`` at the earliest), with
        how long they have owed it. A worker that reports progress is judged on its last
        step; one that never did, on its last batch. A slow batch is no stall, but a
        share is due by its reported step rate (:meth:`Rounds.share_due`): one still
        missing ``timeout`` s after that is a stall too, whatever progress says."""
        stalled = []
        for w in self._roster.live_workers:
            if w.owed_since is None or w.credits <= 0:
                continue
            if now - max(w.owed_since, w.stepped_at or 0.0, awake_since) > timeout:
                stalled.append((w, now - w.owed_since))
                continue
            due = self._rounds.share_due(w)
            if due is not None and now - max(due, awake_since) > timeout:
                self._overdue[w.peer] = due - w.owed_since
                stalled.append((w, now - w.owed_since))
        return stalled

    # -- what happens to workers -----------------------------------------------------------
    def lost(self, peer: bytes, reason: str = "") -> list[Action]:
        """The hub lost ``peer`` (``reason``: ``"silent"`` too long, ``"disconnected"``,
        ``"goodbye"``; see :class:`transports.PeerEvent`): apply ``on_worker_loss``."""
        self._mark_gone(peer)
        if self._roster.relays.pop(peer, None) is not None:
            # Its workers get their weights directly from the next send on. A relay
            # closes only when its host stops (SIGTERM, a pod stop): its goodbye is
            # a planned departure; silence or a dropped connection is a loss.
            if reason == "goodbye":
                log.info("relay %s left (its host stops)", peer_name(peer))
            else:
                log.warning("relay %s was lost", peer_name(peer))
            return []
        worker = self._roster.live(peer)
        if worker is None:
            return []
        log.warning("worker %d (%s on %s) was lost", worker.index, worker.name, worker.host)
        return self._apply_loss(worker, LOSS_WORDS.get(reason, "stopped answering"))

    def stalled(self, peer: bytes, seconds: float) -> list[Action]:
        """``peer`` owed work and delivered nothing for ``seconds`` (the stall watchdog):
        a loss, by ``on_worker_loss``, although its process is alive and its heartbeats
        come (its env's ``step()`` or its policy hangs)."""
        worker = self._roster.live(peer)
        due = self._overdue.pop(peer, None)
        if worker is None:
            return []
        idle = seconds if worker.stepped_at is None or worker.owed_since is None else \
            min(seconds, seconds - (worker.stepped_at - worker.owed_since))
        what = (f"owed a batch and delivered nothing for {seconds:.1f} s, no step for "
                f"{idle:.1f} s: the env step or the policy did not return (sample_timeout)")
        if due is not None:
            what = (f"owed a batch and delivered nothing for {seconds:.1f} s, although its "
                    f"progress reports {worker.steps - worker.steps_from} steps of it: at "
                    f"that rate its share of {self._rounds.config.share_of(worker.index)} frames "
                    f"was due after {due:.1f} s (a step is at least one frame); a share "
                    "later than that by sample_timeout is a stall")
        log.warning("worker %d (%s, pid %d on %s) %s", worker.index, worker.name, worker.pid,
                    worker.host, what)
        return self._apply_loss(worker, what)

    def exited(self, peer: bytes, error: WorkerLostError, *, replaceable: bool) -> list[Action]:
        """A local worker's process ended without being told to: apply ``on_worker_loss``.

        ``replaceable``: something can take its place (it is respawned, or remote
        workers may join); without it ``"wait"`` would wait forever, so it fails.
        """
        self._mark_gone(peer)
        worker = self._roster.workers.get(peer)
        outcome = self.policy.exited(error, replaceable=replaceable)
        if outcome.failure is not None:
            self.fail(outcome.failure)
        elif outcome.written_off and (worker is None or worker.alive):
            self.written_off += 1  # also if it died before it joined: stop waiting for it
        if worker is not None and worker.alive:
            if outcome.vacancy and self.failure is None:
                self._vacate(worker)
            return self.forget(worker)
        return []

    def departed(self, peer: bytes) -> list[Action]:
        """A worker leaves cleanly (it said so: SIGTERM, a host stopping): whatever
        ``on_worker_loss``, no failure and no wait for a replacement. What it owed goes
        to the others: async credits are granted again, and its unfinished share of
        the current round is asked of a live worker (one that already delivered
        first), so that the round and ``total_frames`` stay exact. With no live
        worker left, the round waits for a newcomer."""
        self._mark_gone(peer)
        worker = self._roster.live(peer)
        if worker is None:
            return []
        log.info("worker %d (%s on %s) left the run", worker.index, worker.name, worker.host)
        self.departures += 1
        self.left[peer] = None
        while len(self.left) > REMEMBERED:
            self.left.popitem(last=False)
        return self.forget(worker, replan=True)

    def refused(self, worker: WorkerInfo, what: str) -> list[Action]:
        """A live worker said what no honest one says (a progress count its batches
        cannot hold): tell it, drop it for cause (never invited back), and apply
        ``on_worker_loss`` as for any loss."""
        log.error("worker %d (%s, pid %d on %s) refused: %s", worker.index, worker.name,
                  worker.pid, worker.host, what)
        worker.rejoin_asked = True
        return [Send(worker.peer, Refuse(f"dropped: {what}")),
                *self._apply_loss(worker, f"was refused: {what}")]

    def bad_batch(self, worker: WorkerInfo, request: int, problems: list[str]) -> list[Action]:
        """A batch that is not what was asked: tell the worker, drop it, apply on_worker_loss."""
        what = "; ".join(problems)
        log.error("worker %d (%s on %s) sent a bad batch for request %d, dropped it: %s",
                  worker.index, worker.name, worker.host, request, what)
        reason = f"your batch for request {request} was rejected: {what}"
        worker.rejoin_asked = True  # refused for cause: never invited back
        failure = self.policy.bad_batch(worker, what)
        if failure is not None:
            self.fail(failure)
        return [Send(worker.peer, Refuse(reason)), *self.forget(worker)]

    def returned(self, peer: bytes) -> list[Action]:
        """A peer the hub had lost speaks again: if it was our worker, tell it to rejoin."""
        worker = self._roster.workers.get(peer)
        if worker is None or worker.alive or worker.rejoin_asked:
            return []
        if peer in self.left:
            # It left (SIGTERM, a pod stop) and speaks only to finish its goodbye
            # (the close's ack): a departure is never invited back, and no warning.
            worker.rejoin_asked = True
            return []
        worker.rejoin_asked = True
        self.gone.pop(peer, None)
        log.warning("worker %d (%s) speaks again after it was dropped: asking it to rejoin",
                    worker.index, worker.name)
        return [Send(peer, Rejoin(f"silent for more than {self._peer_timeout} s"))]

    def fill_vacancy(self, index: int) -> None:
        """A worker was admitted with ``index``: a respawned slot takes its own place
        back, a newcomer the oldest vacancy."""
        if index in self.vacant:
            del self.vacant[index]
        elif self.vacant:
            self.vacant.popitem(last=False)

    def forget(self, worker: WorkerInfo, *, replan: bool = False) -> list[Action]:
        """Drop a worker (lost, left, or replaced by its own new hello) and release what
        it owed; ``replan`` (it left cleanly): its unfinished shares go to the others."""
        worker.alive = False
        worker.owed_since = None
        self._mark_gone(worker.peer)
        return [Expel(worker.peer), *self._rounds.release(
            worker, replan=replan, replace=self.policy.waits_for_replacements)]

    # -- the books -------------------------------------------------------------------------
    def _apply_loss(self, worker: WorkerInfo, what: str) -> list[Action]:
        worker.lost_because = what
        outcome: LossOutcome = self.policy.lost(worker, what)
        if outcome.failure is not None:
            self.fail(outcome.failure)
        if outcome.written_off:
            self.written_off += 1
        if outcome.vacancy:
            self._vacate(worker)
        return self.forget(worker)

    def _vacate(self, worker: WorkerInfo) -> None:
        """``"wait"`` / ``"restart"``: the run expects a replacement for ``worker``."""
        self.vacant[worker.index] = worker
        while len(self.vacant) > REMEMBERED:
            self.vacant.popitem(last=False)

    def _mark_gone(self, peer: bytes) -> None:
        self.gone[peer] = None
        self.gone.move_to_end(peer)
        while len(self.gone) > REMEMBERED:
            self.gone.popitem(last=False)
