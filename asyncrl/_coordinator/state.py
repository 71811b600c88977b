"""The coordinator's state and rules, without I/O: each event returns the sends it takes.

As httpcore's connection pool (``_assign_requests_to_connections``) does, every
state change is a plain synchronous method: it updates the state at once and
returns the actions to take afterwards, in order: :class:`Send` a typed message,
:class:`Expel` a peer from the hub, :class:`CatchUp` a newcomer with the latest
weights. The async :class:`~asyncrl._coordinator.coordinator.Coordinator` reads the hub, calls
these methods and performs what they return; so admission, credits, rounds and
loss are decided in one place, and are tested without a hub or a socket.

The state is current before a send goes out, so a send may find its worker lost
meanwhile (another task handled an event while an earlier send awaited): an order
carries the admission it is for (``Send.worker``) and is dropped if that worker is
no longer alive; whatever it owed was released by the loss itself.

* **sync** (on-policy): :meth:`CoordinatorState.start_round` asks every live
  worker for one share; with ``preemptive_threshold`` the stragglers are told to
  stop once that fraction of the workers has delivered.
* **async** (off-policy): each worker holds up to ``prefetch`` credits; a batch
  is queued first come, first served, and its worker gets a new credit only once
  the trainer takes it (:meth:`CoordinatorState.take`): a slow trainer bounds
  memory at ``workers x prefetch`` batches.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase

from transports import RateLimitedLog

from .._errors import BadBatchError, WorkerLostError
from .._protocol import (
    Batch,
    Collect,
    Hello,
    Preempt,
    Refuse,
    Rejoin,
    RelayHello,
    RelayWelcome,
    Welcome,
)
from .actions import Action, CatchUp, Expel, Outbound, Send
from .checks import BatchChecker, hello_problems, relay_hello_problems
from .records import LOSS_WORDS, OnWorkerLoss, RelayInfo, Round, WorkerInfo

log = logging.getLogger("asyncrl.coordinator")

class CoordinatorState:
    """Who is admitted, what each worker owes, and what each event changes.

    Peers are hostile until admitted (protocol, spawn token or ``accept_remote``,
    free slot, ``check_specs``, ``max_remote_workers``); only a live admitted
    worker's batch counts, once :class:`BatchChecker` found it to be what was asked.
    """

    def __init__(
        self,
        *,
        sync: bool,
        share_frames: list[int],
        prefetch: int = 1,
        preemptive_threshold: float | None = None,
        init_random_frames: int = 0,
        check_specs: Callable[[dict[str, Any], Hello], list[str]] | None = None,
        token: str = "",
        accept_remote: bool = False,
        on_worker_loss: OnWorkerLoss = "raise",
        batch_budget: int | None = None,
        first_remote_index: int | None = None,
        scheme_configs: dict[str, Any] | None = None,
        max_remote_workers: int | None = None,
        specs: dict[str, Any] | None = None,
        instance: str = "",
        peer_timeout: float | None = None,
    ) -> None:
        self.sync = sync
        self.share_frames = share_frames
        self.prefetch = prefetch
        self.preemptive_threshold = preemptive_threshold
        self.init_random_frames = init_random_frames
        self.on_worker_loss = on_worker_loss
        self._check_specs = check_specs
        self._token = token
        self._accept_remote = accept_remote
        self._scheme_configs = dict(scheme_configs or {})
        self._instance = instance  # the hub's: weight versions are numbered per instance
        self._peer_timeout = peer_timeout
        self.workers: dict[bytes, WorkerInfo] = {}
        self.relays: dict[bytes, RelayInfo] = {}
        self.specs = specs  # the reference every hello must match (None: the first one's)
        self.budget = batch_budget  # async: credits still allowed to be granted
        # Remote workers (and rejoining ones) get fresh indices after the local slots.
        self._next_index = len(share_frames) if first_remote_index is None \
            else first_remote_index
        self._first_remote_index = self._next_index
        self._max_remote = max_remote_workers  # None: any number
        self._checker = BatchChecker()
        # Peers are hostile until admitted: what they make us log is rate-limited.
        self._limited_log = RateLimitedLog(log)
        self.failure: BaseException | None = None
        self.round: Round | None = None
        self._request = 0
        self.paused = False
        # Async: delivered batches the trainer has not taken, oldest first. Credits
        # bound it (live workers x prefetch, plus what a lost worker had delivered).
        self.ready: deque[tuple[WorkerInfo, TensorDictBase]] = deque()
        # Peers whose loss was handled, newest last (bounded: peers may be hostile).
        self.gone: OrderedDict[bytes, None] = OrderedDict()
        self.written_off = 0  # workers lost under "continue": nobody waits for them
        self.departures = 0  # workers that left cleanly (a goodbye): nobody waits for them
        self.left: OrderedDict[bytes, None] = OrderedDict()  # their peers (bounded as gone)
        self.expected = 0  # workers the run was started with (see missing_workers)
        self.clock: Callable[[], float] = time.monotonic  # owed_since's clock (tests set it)
        # "wait" / "restart": lost workers whose place a replacement is to take, oldest
        # first (bounded: peers may be hostile).
        self.vacant: OrderedDict[int, WorkerInfo] = OrderedDict()

    # -- what the trainer asks -------------------------------------------------------------
    @property
    def live_workers(self) -> list[WorkerInfo]:
        return sorted((w for w in self.workers.values() if w.alive), key=lambda w: w.index)

    def missing_workers(self) -> int:
        """Workers still to join of the ``expected`` ones (less those lost before joining)."""
        return self.expected - self.written_off - self.departures - len(self.live_workers)

    def worker_peers(self) -> dict[int, bytes]:
        """``{worker index: peer}`` of the live workers (whom a weight sender serves)."""
        return {w.index: w.peer for w in self.live_workers}

    def relay_routes(self) -> dict[int, bytes]:
        """``{worker index: relay peer}``: live workers whose weights go through a relay.

        A worker is routed through a relay only when both agree: its hello names
        the relay and the relay's hello lists it. Anyone else gets weights directly.
        """
        routes = {}
        for worker in self.workers.values():
            relay = self.relays.get(worker.relay) if worker.relay is not None else None
            if worker.alive and relay is not None and worker.peer in relay.members:
                routes[worker.index] = relay.peer
        return routes

    def fail(self, error: BaseException) -> None:
        """The run's failure (the first one stays)."""
        if self.failure is None:
            self.failure = error

    def start_round(self, max_frames: int | None = None) -> tuple[Round, list[Action]]:
        """Sync mode: a new round asking one share of each live worker, in index order.

        With ``max_frames`` (what ``total_frames`` still allows), only the workers
        needed to reach it are asked: after a round shrank
        (``on_worker_loss="continue"``) the run still ends on ``total_frames``.
        """
        self._request += 1
        targets = {}
        frames = 0
        for worker in self.live_workers:
            if max_frames is not None and frames >= max_frames:
                break
            targets[worker.peer] = worker
            frames += self._share_of(worker.index)
        replacements = 0
        if self.on_worker_loss in ("wait", "restart"):
            # Lost before this round began: the round waits for their replacements too.
            for _ in range(self.missing_workers()):
                if max_frames is not None and frames >= max_frames:
                    break
                replacements += 1
                frames += self.share_frames[0]
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
        if worker.alive and not self.paused and worker.ahead < self.prefetch:
            self._grant(worker, actions)
        return worker, frames, actions

    def resume(self) -> list[Action]:
        """Async mode: hand the credits withheld while ``paused`` back to every worker."""
        self.paused = False
        return self._top_up()

    # -- what peers say ------------------------------------------------------------------------
    def hello(self, peer: bytes, hello: Hello) -> list[Action]:
        """A worker's hello: welcome it (with its orders) or refuse it, naming why."""
        previous = self.workers.get(peer)
        if previous is not None and previous.alive and (previous.pid, previous.host) == (
                hello.pid, hello.host):
            return self._welcome_again(previous, hello)  # its welcome was late: same admission
        problems = self._admission_problems(hello)
        if problems:
            reason = "; ".join(problems)
            log.warning("refused worker %s from %s: %s", hello.name, hello.host, reason)
            # Full, and nothing else: it may ask again once a place is free.
            full = hello.slot < 0 and problems == self._remote_capacity_problems()
            return [Send(peer, Refuse(reason, full=full))]
        if self.specs is None:
            self.specs = hello.specs
        actions: list[Action] = []
        if previous is not None and previous.alive:
            actions += self._forget(previous)  # it restarted before its silence was noticed
        index = hello.slot if hello.slot >= 0 else self._take_index()
        worker = WorkerInfo(index, peer, hello.name, hello.host, hello.pid,
                            relay=hello.relay.encode() if hello.relay else None)
        self.workers[peer] = worker
        if index in self.vacant:  # a respawned slot takes its own place back
            del self.vacant[index]
        elif self.vacant:  # a newcomer takes the oldest vacancy
            self.vacant.popitem(last=False)
        actions += [self._welcome(worker, hello.attempt), CatchUp(worker)]
        round_ = self.round
        if self.sync and round_ is not None and round_.replacements > 0:
            # on_worker_loss="wait": the newcomer delivers the lost worker's share.
            round_.replacements -= 1
            round_.targets[peer] = worker
            actions.append(self._grant_share(worker, round_))
        return actions + self._top_up()

    def relay_hello(self, peer: bytes, hello: RelayHello) -> list[Action]:
        """A host's relay: register it for the members that name it, or refuse it."""
        problems = relay_hello_problems(
            hello, accept_remote=self._accept_remote, max_remote=self._max_remote,
            others=len(self.relays) - (peer in self.relays))
        if problems:
            reason = "; ".join(problems)
            log.warning("refused relay %s from %s: %s", hello.name, hello.host, reason)
            # Full, and nothing else (as many relays as remote_workers): it may ask again.
            full = not relay_hello_problems(hello, accept_remote=self._accept_remote,
                                            max_remote=None, others=0)
            return [Send(peer, Refuse(reason, full=full))]
        self.relays[peer] = RelayInfo(peer, hello.host, hello.pid, frozenset(hello.members))
        log.info("relay %s on %s carries the weights of up to %d workers",
                 peer.decode(errors="replace"), hello.host, len(hello.members))
        return [Send(peer, RelayWelcome(len(hello.members), instance=self._instance))]

    def batch(self, peer: bytes, batch: Batch) -> list[Action]:
        """A batch: counted if it is what its live worker was asked for, else refused."""
        worker = self.workers.get(peer)
        if worker is None or not worker.alive:
            return []  # a stranger's, or a lost worker's late batch: never half-delivered
        if not self.sync and batch.request != worker.index:
            return []  # collected before this worker was (re)admitted: never half-delivered
        problems = self._batch_problems(worker, batch)
        if problems:
            return self._reject_batch(worker, batch, problems)  # never counted
        worker.credits = max(0, worker.credits - 1)
        worker.owed_since = self.clock() if worker.credits else None
        worker.delivered += 1
        if self.sync:
            return self._on_share(worker, batch)  # completes the round once it is whole
        worker.queued += 1
        self.ready.append((worker, batch.frames))
        return []

    def returned(self, peer: bytes) -> list[Action]:
        """A peer the hub had lost speaks again: if it was our worker, tell it to rejoin."""
        worker = self.workers.get(peer)
        if worker is None or worker.alive or worker.rejoin_asked:
            return []
        worker.rejoin_asked = True
        self.gone.pop(peer, None)
        log.warning("worker %d (%s) speaks again after it was dropped: asking it to rejoin",
                    worker.index, worker.name)
        return [Send(peer, Rejoin(f"silent for more than {self._peer_timeout} s"))]

    def lost(self, peer: bytes, reason: str = "") -> list[Action]:
        """The hub lost ``peer`` (``reason``: ``"silent"`` too long, ``"disconnected"``,
        ``"goodbye"``; see :class:`transports.PeerEvent`): apply ``on_worker_loss``."""
        self._mark_gone(peer)
        if self.relays.pop(peer, None) is not None:
            # Its workers get their weights directly from the next send on.
            log.warning("relay %s was lost", peer.decode(errors="replace"))
            return []
        worker = self.workers.get(peer)
        if worker is None or not worker.alive:
            return []
        log.warning("worker %d (%s on %s) was lost", worker.index, worker.name, worker.host)
        return self._apply_loss(worker, LOSS_WORDS.get(reason, "stopped answering"))

    def stalled(self, peer: bytes, seconds: float) -> list[Action]:
        """``peer`` owed work and delivered nothing for ``seconds`` (the stall watchdog):
        a loss, by ``on_worker_loss``, although its process is alive and its heartbeats
        come (its env's ``step()`` or its policy hangs)."""
        worker = self.workers.get(peer)
        if worker is None or not worker.alive:
            return []
        what = (f"owed a batch and delivered nothing for {seconds:.1f} s: the env step or "
                "the policy did not return (sample_timeout)")
        log.warning("worker %d (%s, pid %d on %s) %s", worker.index, worker.name, worker.pid,
                    worker.host, what)
        return self._apply_loss(worker, what)

    def _apply_loss(self, worker: WorkerInfo, what: str) -> list[Action]:
        if self.on_worker_loss == "raise":
            self.fail(WorkerLostError(
                f"worker {worker.index} ({worker.name}, pid {worker.pid} on {worker.host}) "
                f"{what}; pass on_worker_loss='continue', 'wait' or 'restart' to carry on"))
        elif self.on_worker_loss == "continue":
            self.written_off += 1
        else:
            self._vacate(worker)
        return self._forget(worker)

    def _vacate(self, worker: WorkerInfo) -> None:
        """``"wait"`` / ``"restart"``: the run expects a replacement for ``worker``."""
        self.vacant[worker.index] = worker
        while len(self.vacant) > 1024:
            self.vacant.popitem(last=False)

    def waiting_for(self) -> list[WorkerInfo]:
        """The lost workers the trainer is blocked on, waiting for their replacements
        (``"wait"`` / ``"restart"``): a sync round that lacks their shares, or an async
        run with no live worker left; [] while the run can progress."""
        if not self.vacant or self.paused or self.failure is not None:
            return []
        if self.sync:
            round_ = self.round
            blocked = round_ is not None and round_.replacements > 0 and not round_.complete
        else:
            blocked = not self.live_workers and not self.ready
        return list(self.vacant.values()) if blocked else []

    def stalled_workers(self, now: float, timeout: float,
                        awake_since: float = 0.0) -> list[tuple[WorkerInfo, float]]:
        """Live workers that owe work and delivered nothing for more than ``timeout`` s
        while the trainer's loop ran (counted from ``awake_since`` at the earliest), with
        how long they have owed it."""
        return [(w, now - w.owed_since) for w in self.live_workers
                if w.owed_since is not None and w.credits > 0
                and now - max(w.owed_since, awake_since) > timeout]

    def departed(self, peer: bytes) -> list[Action]:
        """A worker leaves cleanly (it said so: SIGTERM, a host stopping): whatever
        ``on_worker_loss``, no failure and no wait for a replacement. What it owed goes
        to the others: async credits are granted again, and its unfinished share of
        the current round is asked of a live worker (one that already delivered
        first), so that the round and ``total_frames`` stay exact. With no live
        worker left, the round waits for a newcomer."""
        self._mark_gone(peer)
        worker = self.workers.get(peer)
        if worker is None or not worker.alive:
            return []
        log.info("worker %d (%s on %s) left the run", worker.index, worker.name, worker.host)
        self.departures += 1
        self.left[peer] = None
        while len(self.left) > 1024:
            self.left.popitem(last=False)
        return self._forget(worker, replan=True)

    def exited(self, peer: bytes, error: WorkerLostError, *, replaceable: bool) -> list[Action]:
        """A local worker's process ended without being told to: apply ``on_worker_loss``.

        ``replaceable``: something can take its place (it is respawned, or remote
        workers may join); without it ``"wait"`` would wait forever, so it fails.
        """
        self._mark_gone(peer)
        worker = self.workers.get(peer)
        if self.on_worker_loss == "raise":
            self.fail(error)
        elif self.on_worker_loss in ("wait", "restart") and not replaceable:
            self.fail(WorkerLostError(
                f"{error}. on_worker_loss={self.on_worker_loss!r} waits for a replacement, "
                "but nothing can replace a dead local worker here (no respawn, no remote "
                "workers accepted): pass on_worker_loss='restart' to respawn it, or "
                "'continue' to go on without it"))
        elif self.on_worker_loss == "continue" and (worker is None or worker.alive):
            self.written_off += 1  # also if it died before it joined: stop waiting for it
        if worker is not None and worker.alive:
            if self.on_worker_loss in ("wait", "restart") and self.failure is None:
                self._vacate(worker)
            return self._forget(worker)
        return []

    # -- admission -------------------------------------------------------------------------
    def _welcome(self, worker: WorkerInfo, attempt: int) -> Send:
        return Send(worker.peer, Welcome(
            index=worker.index, share_frames=self._share_of(worker.index),
            init_random_frames=self.init_random_frames, schemes=self._scheme_configs,
            attempt=attempt, instance=self._instance), worker)

    def _welcome_again(self, worker: WorkerInfo, hello: Hello) -> list[Action]:
        """Answer a hello from a worker this coordinator has admitted already.

        A worker says hello again when no welcome came within twice its peer
        timeout, as when this trainer's loop was held by a long training step;
        it then takes only the welcome of its latest hello and drops the orders
        that came before it (weights excepted). So the same admission is welcomed
        again, echoing the latest attempt, followed by the latest weights (a worker
        that joins again after a broken connection may have missed some; newest
        wins, so a copy it has costs one ack) and what it is owed: its credits, or
        its share of the current round. Idempotent: repeating it leaves the
        worker, and this state, where one answer would have.
        """
        log.warning("worker %d (%s) said hello again (attempt %d) while admitted: welcoming "
                    "it again", worker.index, worker.name, hello.attempt)
        worker.relay = hello.relay.encode() if hello.relay else None
        actions: list[Action] = [self._welcome(worker, hello.attempt), CatchUp(worker)]
        round_ = self.round
        if not self.sync:
            if worker.credits:
                actions.append(Send(worker.peer, Collect(worker.index, worker.credits), worker))
        elif round_ is not None and round_.unfinished(worker.peer):
            actions.append(Send(worker.peer, Collect(round_.request,
                                                     round_.unfinished(worker.peer)), worker))
            if round_.preempted:
                actions.append(Send(worker.peer, Preempt(round_.request), worker))
        return actions

    def _admission_problems(self, hello: Hello) -> list[str]:
        taken = hello.slot >= 0 and any(
            w.index == hello.slot and w.alive for w in self.workers.values())
        problems = hello_problems(hello, token=self._token, accept_remote=self._accept_remote,
                                  slot_taken=taken)
        # Specs are judged for peers that may join, never for an impostor: a local
        # worker's bad specs fail the run, and a stranger must not be able to do that.
        if self._check_specs is not None and self.specs is not None and not problems:
            problems += self._check_specs(self.specs, hello)
        if hello.slot < 0 and not problems:
            problems += self._remote_capacity_problems()
        return problems

    def _remote_capacity_problems(self) -> list[str]:
        """``remote_workers`` is a limit: who gets the weights is the trainer's choice."""
        if self._max_remote is None:
            return []
        remote = sum(1 for w in self.workers.values()
                     if w.alive and w.index >= self._first_remote_index)
        if remote < self._max_remote:
            return []
        return [f"remote_workers: this collector takes at most {self._max_remote} remote "
                f"worker(s) and {remote} already joined; stop one or start the trainer with "
                "a larger remote_workers"]

    def _take_index(self) -> int:
        # Never reuse an index: traj ids and batch tags of a lost worker stay unique.
        taken = {w.index for w in self.workers.values()}
        index = self._next_index
        while index in taken:
            index += 1
        self._next_index = index + 1
        return index

    # -- batches and rounds -------------------------------------------------------------------
    def _batch_problems(self, worker: WorkerInfo, batch: Batch) -> list[str]:
        """What is wrong with ``batch`` given what ``worker`` was asked for ([] if nothing)."""
        frames = self._share_of(worker.index)
        round_ = self.round
        # Only a share the coordinator cut short (preemptive_threshold) may hold fewer steps.
        shorter = (self.sync and round_ is not None and round_.preempted
                   and batch.request == round_.request)
        return self._checker.problems(batch.frames, specs=self.specs, frames=frames,
                                      worker_index=worker.index, shorter_ok=shorter)

    def _reject_batch(self, worker: WorkerInfo, batch: Batch,
                      problems: list[str]) -> list[Action]:
        """A batch that is not what was asked: tell the worker, drop it, apply on_worker_loss."""
        what = "; ".join(problems)
        log.error("worker %d (%s on %s) sent a bad batch for request %d, dropped it: %s",
                  worker.index, worker.name, worker.host, batch.request, what)
        reason = f"your batch for request {batch.request} was rejected: {what}"
        worker.rejoin_asked = True  # refused for cause: never invited back
        if self.on_worker_loss == "raise":
            self.fail(BadBatchError(
                f"worker {worker.index} ({worker.name}, pid {worker.pid} on {worker.host}) "
                f"sent a batch that is not what was asked: {what}; it was dropped and none "
                "of its frames were counted. Check that every worker runs the same asyncrl "
                "and env version, or pass on_worker_loss='continue' to carry on without it"))
        return [Send(worker.peer, Refuse(reason)), *self._forget(worker)]

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
        threshold = self.preemptive_threshold
        if (threshold is not None and not round_.preempted
                and len(round_.shares) >= math.ceil(threshold * len(round_.targets))):
            round_.preempted = True
            return [Send(w.peer, Preempt(round_.request), w) for w in round_.missing()]
        return []

    # -- loss and credits ----------------------------------------------------------------------
    def _mark_gone(self, peer: bytes) -> None:
        self.gone[peer] = None
        self.gone.move_to_end(peer)
        while len(self.gone) > 1024:
            self.gone.popitem(last=False)

    def _forget(self, worker: WorkerInfo, *, replan: bool = False) -> list[Action]:
        """Drop a worker (lost, left, or replaced by its own new hello) and release what
        it owed; ``replan`` (it left cleanly): its unfinished shares go to the others."""
        worker.alive = False
        worker.owed_since = None
        self._mark_gone(worker.peer)
        actions: list[Action] = [Expel(worker.peer)]
        round_ = self.round
        unfinished = round_.unfinished(worker.peer) if round_ is not None else 0
        if round_ is not None and unfinished:
            if worker.peer not in round_.shares:
                round_.targets.pop(worker.peer)  # its unfinished share is dropped
            round_.owed.pop(worker.peer, None)
            for _ in range(unfinished):
                if replan:
                    actions += self._replan_share(round_)
                elif self.on_worker_loss in ("wait", "restart"):
                    round_.replacements += 1
            actions += self._check_round(round_)
        if not self.sync:
            # Its unfinished batches will never come: give their credits to the others,
            # so total_frames is still met exactly.
            if self.budget is not None:
                self.budget += worker.credits
            worker.credits = 0
            actions += self._top_up()
        return actions

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

    def _top_up(self) -> list[Action]:
        """Async mode: bring every live worker back to ``prefetch`` credits (budget allowing)."""
        actions: list[Action] = []
        if self.sync or self.paused:
            return actions
        for worker in self.live_workers:
            while worker.ahead < self.prefetch and self._grant(worker, actions):
                pass
        return actions

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
        worker.credits += 1

    def _share_of(self, index: int) -> int:
        """The share (frames per batch it sends) of the worker admitted with ``index``."""
        return self.share_frames[index % len(self.share_frames)]


# The records and actions live in their own modules; importers of this one still find them.
__all__ = ["LOSS_WORDS", "Action", "CatchUp", "CoordinatorState", "Expel", "OnWorkerLoss",
           "Outbound", "RelayInfo", "Round", "Send", "WorkerInfo"]
