"""Rounds and credits: what each live worker is asked for, owes and delivered.

Plain methods that update the books and return the orders to send (see
:mod:`asyncrl._coordinator.state`, which composes this with admission and losses).

* **sync** (on-policy): :meth:`Rounds.start_round` asks every live worker for
  one share; with ``preemptive_threshold`` the stragglers are told to stop once
  that fraction of the workers has delivered.
* **async** (off-policy): each worker holds up to ``prefetch`` credits; a batch
  is queued first come, first served, and its worker gets a new credit only once
  the trainer takes it (:meth:`Rounds.take`): a slow trainer bounds memory at
  ``workers x prefetch`` batches.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase

from transports import RateLimitedLog

from .._errors import WorkerLostError
from .._protocol import Batch, Collect, Preempt, Progress
from .actions import Action, Send
from .checks import BatchChecker
from .config import CoordinatorConfig
from .records import Roster, Round, WorkerInfo

__all__ = ["Rounds"]

log = logging.getLogger("asyncrl.coordinator")


class Rounds:
    """Sync rounds and async credits over the live workers of a :class:`Roster`.

    It reads ``sync``, the shares, ``prefetch``, ``preemptive_threshold``, the batch
    budget and the rollout's ``info_keys`` from ``config``.

    >>> from .config import CoordinatorConfig
    >>> rounds = Rounds(Roster(), CoordinatorConfig(sync=True, share_frames=[8, 8]))
    >>> rounds.config.share_of(3)
    8
    """

    def __init__(self, roster: Roster, config: CoordinatorConfig) -> None:
        self._roster = roster
        self.config = config
        self.budget = config.batch_budget  # async: credits still allowed to be granted
        self.round: Round | None = None
        self._request = 0
        self.paused = False
        # Async: delivered batches the trainer has not taken, oldest first. Credits
        # bound it (live workers x prefetch, plus what a lost worker had delivered).
        self.ready: deque[tuple[WorkerInfo, TensorDictBase]] = deque()
        self.clock: Callable[[], float] = time.monotonic  # owed_since's clock (tests set it)
        self._checker = BatchChecker(config.rollout.info_keys,
                                     first_remote_index=config.remote_start)
        # Peers are hostile until admitted: what they make us log is rate-limited.
        self._limited_log = RateLimitedLog(log)

    # -- what the trainer asks -------------------------------------------------------------
    def start_round(self, max_frames: int | None = None,
                    missing: int = 0) -> tuple[Round, list[Action]]:
        """Sync mode: a new round asking one share of each live worker, in index order.

        With ``max_frames`` (what ``total_frames`` still allows), only the workers
        needed to reach it are asked: after a round shrank
        (``on_worker_loss="continue"``) the run still ends on ``total_frames``.
        ``missing``: workers lost before this round began whose replacements it
        waits for too.
        """
        self._request += 1
        targets = {}
        frames = 0
        for worker in self._roster.live_workers:
            if max_frames is not None and frames >= max_frames:
                break
            targets[worker.peer] = worker
            frames += self.config.share_of(worker.index)
        replacements = 0
        for _ in range(missing):
            if max_frames is not None and frames >= max_frames:
                break
            replacements += 1
            frames += self.config.share_frames[0]
        if not targets and not replacements:
            raise WorkerLostError("no live worker to collect from")
        round_ = self.round = Round(self._request, targets, replacements=replacements)
        return round_, [self._grant_share(w, round_) for w in targets.values()]

    def end_round(self, round_: Round) -> list[tuple[WorkerInfo, TensorDictBase]]:
        """The shares of a complete round, ordered by worker index."""
        self.round = None
        return [(w, round_.shares[w.peer]) for w in sorted(
            (w for w in round_.targets.values() if w.peer in round_.shares),
            key=lambda w: w.index)] + sorted(round_.extras, key=lambda extra: extra[0].index)

    def take(self) -> tuple[WorkerInfo, TensorDictBase, list[Action]] | None:
        """Async mode: the oldest delivered batch (None: none yet), and its worker's new credit."""
        if not self.ready:
            return None
        worker, frames = self.ready.popleft()
        worker.queued -= 1
        actions: list[Action] = []
        if worker.alive and not self.paused and worker.ahead < self.config.prefetch:
            self._grant(worker, actions)
        return worker, frames, actions

    def resume(self) -> list[Action]:
        """Async mode: hand the credits withheld while ``paused`` back to every worker."""
        self.paused = False
        return self.top_up()

    # -- what workers deliver --------------------------------------------------------------
    def progressed(self, worker: WorkerInfo, progress: Progress) -> str:
        """``worker`` reports ``progress.steps`` env steps so far: it steps if the count
        grew while it owes the share ``progress.request`` names. Returns what is wrong
        ("" if nothing): a count its batches cannot hold is no honest worker's.

        The count is of its rollout's steps since it was admitted (a new admission
        builds a new rollout), all in batches asked of it: the ones it delivered and
        the one it collects. A step is at least one frame, so that is at most
        ``(delivered + 1) x share`` steps.
        """
        share = self.config.share_of(worker.index)
        most = (worker.delivered + 1) * share
        if progress.steps > most:
            return (f"its progress says {progress.steps} env steps, more than its "
                    f"{worker.delivered} delivered batch(es) and the one it collects can "
                    f"hold ({most}: {share} frames each, a step at least one frame)")
        if not worker.credits or progress.request != self._collecting(worker):
            return ""  # a report of a share it no longer owes: counts for nothing
        if progress.steps > worker.steps:
            worker.steps = progress.steps
            worker.stepped_at = self.clock()
            if worker.steps_from < 0:  # its first report of this share: counted from here
                worker.steps_from = progress.steps
        return ""

    def share_due(self, worker: WorkerInfo) -> float | None:
        """When the share ``worker`` owes is due at the step rate it reported for it
        (None: no rate yet): ``owed_since + share x (seconds stepping / steps)``.

        A step is at least one frame, so an honest worker, stepping at that rate, has
        delivered by then; the stall watchdog allows ``sample_timeout`` more.
        """
        if worker.owed_since is None or worker.stepped_at is None:
            return None
        steps = worker.steps - worker.steps_from
        took = worker.stepped_at - worker.owed_since
        if worker.steps_from < 0 or steps <= 0 or took <= 0:
            return None
        return worker.owed_since + self.config.share_of(worker.index) * took / steps

    def _collecting(self, worker: WorkerInfo) -> int | None:
        """The request a share ``worker`` owes is collected for (async: its index)."""
        if not self.config.sync:
            return worker.index
        return None if self.round is None else self.round.request

    def expects(self, worker: WorkerInfo, batch: Batch) -> bool:
        """Async: a batch collected before ``worker`` was (re)admitted is not its own."""
        return self.config.sync or batch.request == worker.index

    def batch_problems(self, worker: WorkerInfo, batch: Batch, specs: dict[str, Any] | None,
                       *, dropped: bool = False) -> list[str]:
        """What is wrong with ``batch`` given what ``worker`` was asked for ([] if nothing);
        ``dropped``: compact_obs, the ``("next", K)`` twins must be absent."""
        frames = self.config.share_of(worker.index)
        round_ = self.round
        # Only a share the coordinator cut short (preemptive_threshold) may hold fewer steps.
        shorter = (self.config.sync and round_ is not None and round_.preempted
                   and batch.request == round_.request)
        return self._checker.problems(batch.frames, specs=specs, frames=frames,
                                      worker_index=worker.index, shorter_ok=shorter,
                                      dropped=dropped)

    def deliver(self, worker: WorkerInfo, batch: Batch) -> list[Action]:
        """A checked batch of a live worker: counted, queued (async) or added to its round."""
        worker.credits = max(0, worker.credits - 1)
        now = self.clock()
        if worker.owed_since is not None:
            worker.last_batch = (worker.owed_since, now)
        worker.owed_since = now if worker.credits else None
        worker.steps_from = -1  # the next share's steps count from its own first report
        worker.delivered += 1
        if self.config.sync:
            return self._on_share(worker, batch)  # completes the round once it is whole
        worker.queued += 1
        self.ready.append((worker, batch.frames))
        return []

    # -- who joins and who goes ------------------------------------------------------------
    def newcomer(self, worker: WorkerInfo) -> list[Action]:
        """A worker just admitted: a lost worker's share of the round waiting for a
        replacement (``on_worker_loss="wait"``), and credits."""
        actions: list[Action] = []
        round_ = self.round
        if self.config.sync and round_ is not None and round_.replacements > 0:
            round_.replacements -= 1
            round_.targets[worker.peer] = worker
            actions.append(self._grant_share(worker, round_))
        return actions + self.top_up()

    def owed_orders(self, worker: WorkerInfo) -> list[Action]:
        """The orders ``worker`` holds now, sent again (it said hello again while admitted)."""
        round_ = self.round
        if not self.config.sync:
            if worker.credits:
                return [Send(worker.peer, Collect(worker.index, worker.credits), worker)]
            return []
        actions: list[Action] = []
        if round_ is not None and round_.unfinished(worker.peer):
            actions.append(Send(worker.peer, Collect(round_.request,
                                                     round_.unfinished(worker.peer)), worker))
            if round_.preempted:
                actions.append(Send(worker.peer, Preempt(round_.request), worker))
        return actions

    def release(self, worker: WorkerInfo, *, replan: bool, replace: bool) -> list[Action]:
        """What a worker no longer alive owed: ``replan`` (it left cleanly): its unfinished
        shares go to the others; ``replace``: the round waits for a newcomer to deliver
        them; neither: they are dropped. Its async credits go to the others."""
        actions: list[Action] = []
        round_ = self.round
        unfinished = round_.unfinished(worker.peer) if round_ is not None else 0
        if round_ is not None and unfinished:
            if worker.peer not in round_.shares:
                round_.targets.pop(worker.peer)  # its unfinished share is dropped
            round_.owed.pop(worker.peer, None)
            for _ in range(unfinished):
                if replan:
                    actions += self._replan_share(round_)
                elif replace:
                    round_.replacements += 1
            actions += self._check_round(round_)
        if not self.config.sync:
            # Its unfinished batches will never come: give their credits to the others,
            # so total_frames is still met exactly.
            if self.budget is not None:
                self.budget += worker.credits
            worker.credits = 0
            actions += self.top_up()
        return actions

    def top_up(self) -> list[Action]:
        """Async mode: bring every live worker back to ``prefetch`` credits (budget allowing)."""
        actions: list[Action] = []
        if self.config.sync or self.paused:
            return actions
        for worker in self._roster.live_workers:
            while worker.ahead < self.config.prefetch and self._grant(worker, actions):
                pass
        return actions

    # -- rounds ----------------------------------------------------------------------------
    def _on_share(self, worker: WorkerInfo, batch: Batch) -> list[Action]:
        round_ = self.round
        if round_ is None or batch.request != round_.request or worker.peer not in round_.targets:
            self._limited_log.warning(
                "stale-share", "discarded a batch of worker %d for request %d",
                worker.index, batch.request)
            return []
        if worker.peer not in round_.shares:
            round_.shares[worker.peer] = batch.frames
        elif round_.owed.get(worker.peer):  # a departed worker's share, re-planned
            round_.owed[worker.peer] -= 1
            round_.extras.append((worker, batch.frames))
        else:
            self._limited_log.warning(
                "extra-share", "discarded a second batch of worker %d for request %d",
                worker.index, batch.request)
            return []
        return self._check_round(round_)

    def _check_round(self, round_: Round) -> list[Action]:
        # O(1) per share (but for re-planned ones): targets hold live workers only, and
        # every share is a target's.
        if len(round_.shares) == len(round_.targets) and round_.replacements == 0 \
                and not any(round_.owed.values()):
            round_.complete = True
            return []
        threshold = self.config.preemptive_threshold
        if (threshold is not None and not round_.preempted
                and len(round_.shares) >= math.ceil(threshold * len(round_.targets))):
            round_.preempted = True
            return [Send(w.peer, Preempt(round_.request), w) for w in round_.missing()]
        return []

    def _replan_share(self, round_: Round) -> list[Action]:
        """Ask one more share of ``round_`` of a live target (the first that delivered,
        the least loaded); none: a newcomer delivers it (the round waits)."""
        candidates = [w for w in round_.targets.values() if w.alive]
        if not candidates:
            round_.replacements += 1
            return []
        worker = min(candidates, key=lambda w: (round_.unfinished(w.peer), w.index))
        round_.owed[worker.peer] = round_.owed.get(worker.peer, 0) + 1
        log.info("worker %d collects the share of a departed worker in round %d",
                 worker.index, round_.request)
        actions: list[Action] = [self._grant_share(worker, round_)]
        if round_.preempted:
            actions.append(Send(worker.peer, Preempt(round_.request), worker))
        return actions

    # -- credits ---------------------------------------------------------------------------
    def _grant(self, worker: WorkerInfo, actions: list[Action]) -> bool:
        """Async mode: one credit to ``worker`` (its batches are tagged with its admission)."""
        if self.budget is not None:
            if self.budget <= 0:
                return False
            self.budget -= 1
        self._owe(worker)
        actions.append(Send(worker.peer, Collect(worker.index, 1), worker))
        return True

    def _grant_share(self, worker: WorkerInfo, round_: Round) -> Send:
        """Sync mode: ask ``worker`` for its share of ``round_``."""
        self._owe(worker)
        return Send(worker.peer, Collect(round_.request, 1), worker)

    def _owe(self, worker: WorkerInfo) -> None:
        """One more batch asked of ``worker``; the stall clock starts if it owed nothing."""
        if not worker.credits:
            worker.owed_since = self.clock()
            worker.steps_from = -1
        worker.credits += 1
