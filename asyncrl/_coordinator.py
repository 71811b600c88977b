"""The coordinator: admits workers, grants credits, gathers batches. Event-driven.

One task reads the hub and updates state; the trainer's calls wait on events
that state changes set. There is no polling and no timeout used as a
scheduling tool: a batch is handed over the moment its last share arrives.

* **sync** (on-policy): :meth:`Coordinator.next_round` asks every live worker
  for one share of a new round and returns them all. Workers are idle between
  rounds, so weights sent between two rounds are applied before the next one.
  With ``preemptive_threshold`` the stragglers are told to stop once that
  fraction of the workers has delivered, and send what they have.
* **async** (off-policy): each worker holds up to ``prefetch`` credits; a
  batch is handed over first come, first served and only then does its worker
  get a new credit, so a slow trainer bounds memory at ``workers x prefetch``
  batches.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from tensordict import TensorDictBase

from transports import Hub, Message, PeerEvent, PeerLostError, ProtocolError, RateLimitedLog

from ._checks import BatchChecker, check_specs
from ._errors import BadBatchError, WorkerLostError, rebuild_remote_exception
from ._protocol import (
    PROTOCOL,
    Batch,
    Collect,
    ErrorReport,
    Hello,
    Preempt,
    Refuse,
    Rejoin,
    RelayHello,
    RelayWelcome,
    Welcome,
)

log = logging.getLogger("asyncrl.coordinator")

#: What a lost worker (dead process, or silent for ``peer_timeout``) does to the run:
#:
#: * ``"raise"``: the run fails with :class:`WorkerLostError` naming the worker (and, for a
#:   local one, its exit code or signal).
#: * ``"continue"``: the others carry on. Async mode: the lost worker's credits go to
#:   the others, so ``total_frames`` stays exact. Sync mode: rounds shrink, and later
#:   rounds ask only the workers still needed to reach ``total_frames`` (exact when the
#:   shortfall is a multiple of the shares, as with equal shares and no preemption; else
#:   the last batch exceeds it by less than one share).
#: * ``"wait"``: sync mode: the round waits for a replacement to deliver the lost
#:   share (a remote newcomer, or the same worker coming back: a worker dropped for
#:   silence that speaks again is told to rejoin). A dead local process cannot come
#:   back: without ``remote_workers`` nothing can replace it, and the run fails with a
#:   clear error instead of waiting forever (use ``"restart"``).
#: * ``"restart"``: local workers: the slot is respawned (RLlib's
#:   ``restart_failed_env_runners``); the new process gets the latest weights before
#:   its first frame; a slot that dies again before delivering a batch more than
#:   ``max_restarts`` times in a row fails the run. Rounds wait for the replacement as
#:   with ``"wait"``. A remote worker cannot be respawned from here: it is waited for
#:   as with ``"wait"`` (its host's ``--reconnect`` brings it back).
#:
#: In every mode an error a worker *reports* (its env or policy raised) fails the run
#: with the worker's exception, type and traceback: restarting would repeat it.
OnWorkerLoss = Literal["raise", "continue", "wait", "restart"]


@dataclass(eq=False)
class WorkerInfo:
    """What the coordinator knows of one admitted worker."""

    index: int
    peer: bytes
    name: str
    host: str
    pid: int
    alive: bool = True
    credits: int = 0  # batches asked for and not delivered yet
    queued: int = 0  # async: delivered, not yet taken by the trainer
    delivered: int = 0
    relay: bytes | None = None  # the relay its hello named (weights go through it if it agrees)
    rejoin_asked: bool = False  # dropped, then told to rejoin (or refused: never to be)

    @property
    def ahead(self) -> int:
        """Batches this worker is ahead of the trainer (bounded by ``prefetch``)."""
        return self.credits + self.queued


@dataclass(frozen=True)
class RelayInfo:
    """A host's relay: it receives each weight version once for ``members``."""

    peer: bytes
    host: str
    pid: int
    members: frozenset[bytes]


@dataclass(eq=False)
class _Round:
    request: int
    targets: dict[bytes, WorkerInfo]
    shares: dict[bytes, TensorDictBase] = field(default_factory=dict)
    preempted: bool = False
    replacements: int = 0  # shares of lost workers a newcomer must deliver ("wait")
    complete: anyio.Event = field(default_factory=anyio.Event)

    def missing(self) -> list[WorkerInfo]:
        return [w for peer, w in self.targets.items() if peer not in self.shares]


class Coordinator:
    """Coordinator state and the task that keeps it current (run it in a task group).

    Peers are hostile until admitted. Only a welcomed, live worker's reports
    count (and a local worker's report before its hello, vouched for by its
    spawn token); the hub is told whom the scheduler admitted (``Hub.admit``
    when welcomed, ``Hub.expel`` when refused), so strangers cannot stream bulk
    data; ``max_remote_workers`` bounds the remote workers (and relays) alive
    at once; every batch is checked (:class:`BatchChecker`) before a frame of it
    is counted. Plain ``tcp://`` is unauthenticated by design: anyone who can
    reach the port can say hello as a remote worker; use CURVE keys on a network
    you do not trust.
    """

    def __init__(
        self,
        hub: Hub,
        *,
        sync: bool,
        frames_per_worker: list[int],
        prefetch: int = 1,
        preemptive_threshold: float | None = None,
        init_random_frames: int = 0,
        check_specs: Callable[[dict[str, Any], Hello], list[str]] | None = None,
        token: str = "",
        accept_remote: bool = False,
        on_worker_loss: OnWorkerLoss = "raise",
        on_join: Callable[[WorkerInfo], Awaitable[None]] | None = None,
        on_lost: Callable[[WorkerInfo], None] | None = None,
        batch_budget: int | None = None,
        first_remote_index: int | None = None,
        scheme_configs: dict[str, Any] | None = None,
        max_remote_workers: int | None = None,
    ) -> None:
        self.hub = hub
        self.sync = sync
        self.frames_per_worker = frames_per_worker
        self.prefetch = prefetch
        self.preemptive_threshold = preemptive_threshold
        self.init_random_frames = init_random_frames
        self._check_specs = check_specs
        self._token = token
        self._accept_remote = accept_remote
        self.on_worker_loss = on_worker_loss
        self._on_join = on_join
        self._on_lost_hook = on_lost  # e.g. "restart": end a silent local process
        self._budget = batch_budget  # async: credits still allowed to be granted
        self._scheme_configs = dict(scheme_configs or {})
        self.workers: dict[bytes, WorkerInfo] = {}
        self.relays: dict[bytes, RelayInfo] = {}
        self.specs: dict[str, Any] | None = None
        # Remote workers (and rejoining ones) get fresh indices after the local slots.
        self._next_index = len(frames_per_worker) if first_remote_index is None \
            else first_remote_index
        self._first_remote_index = self._next_index
        self._max_remote = max_remote_workers  # None: any number
        self._checker = BatchChecker()
        # Peers are hostile until admitted: what they make us log is rate-limited.
        self._limited_log = RateLimitedLog(log)
        self._changed = anyio.Event()
        self._failure: BaseException | None = None
        self._round: _Round | None = None
        self._request = 0
        # Credits bound this queue (live workers x prefetch, plus what a lost worker
        # had already delivered), so it needs no bound of its own.
        self._ready_send, self._ready_recv = anyio.create_memory_object_stream[
            tuple[WorkerInfo, TensorDictBase]](math.inf)
        self.paused = False
        # Peers whose loss was handled, newest last (bounded: peers may be hostile).
        self._gone: OrderedDict[bytes, None] = OrderedDict()
        self._written_off = 0  # workers lost under "continue": nobody waits for them
        self._expected = 0  # workers the run was started with (see wait_for_workers)

    # -- trainer-facing ------------------------------------------------------------
    @property
    def live_workers(self) -> list[WorkerInfo]:
        return sorted((w for w in self.workers.values() if w.alive), key=lambda w: w.index)

    async def wait_for_workers(self, count: int) -> None:
        """Return once ``count`` workers (less those lost before joining) were admitted."""
        self._expected = count
        while len(self.live_workers) < count - self._written_off:
            self._raise_failure()
            await self._wait_change()
        self._raise_failure()
        if not self.live_workers:
            raise WorkerLostError("every worker was lost before it joined")

    async def next_round(self, max_frames: int | None = None
                         ) -> list[tuple[WorkerInfo, TensorDictBase]]:
        """Sync mode: one share from every live worker, ordered by worker index.

        With ``max_frames`` (what ``total_frames`` still allows), only the workers
        needed to reach it are asked, in index order: after a round shrank
        (``on_worker_loss="continue"``) the run still ends on ``total_frames``.
        """
        self._raise_failure()
        self._request += 1
        targets = {}
        frames = 0
        for worker in self.live_workers:
            if max_frames is not None and frames >= max_frames:
                break
            targets[worker.peer] = worker
            frames += self._share(worker.index)
        replacements = 0
        if self.on_worker_loss in ("wait", "restart"):
            # Lost before this round began: the round waits for their replacements too.
            for _ in range(self._expected - self._written_off - len(self.live_workers)):
                if max_frames is not None and frames >= max_frames:
                    break
                replacements += 1
                frames += self.frames_per_worker[0]
        if not targets and not replacements:
            raise WorkerLostError("no live worker to collect from")
        round_ = _Round(self._request, targets, replacements=replacements)
        self._round = round_
        # A copy: a worker lost during a grant leaves round_.targets (the same dict).
        for worker in list(targets.values()):
            await self._grant(worker, round_.request)
        while not round_.complete.is_set():
            self._raise_failure()
            await self._wait_change()
        self._raise_failure()
        self._round = None
        return [(w, round_.shares[w.peer]) for w in sorted(
            (w for w in targets.values() if w.peer in round_.shares), key=lambda w: w.index)]

    async def next_batch(self) -> tuple[WorkerInfo, TensorDictBase]:
        """Async mode: the next batch any worker delivered; grants that worker a credit."""
        while True:
            self._raise_failure()
            try:
                worker, frames = self._ready_recv.receive_nowait()
            except anyio.WouldBlock:
                await self._wait_change()
                continue
            worker.queued -= 1
            if worker.alive and not self.paused and worker.ahead < self.prefetch:
                await self._grant(worker)
            return worker, frames

    async def resume(self) -> None:
        """Async mode: hand the credits withheld while paused back to every worker."""
        self.paused = False
        await self._top_up()

    async def _top_up(self) -> None:
        """Async mode: bring every live worker back to ``prefetch`` credits (budget allowing)."""
        if self.sync or self.paused:
            return
        for worker in self.live_workers:
            while worker.ahead < self.prefetch and await self._grant(worker):
                pass

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
        """Make every waiting and future trainer call raise ``error``."""
        if self._failure is None:
            self._failure = error
        self._notify()

    # -- the hub-reading task -----------------------------------------------------------
    async def run(self) -> None:
        async for item in self.hub:
            try:
                if isinstance(item, PeerEvent):
                    if item.event == "lost":
                        await self._on_lost(item.peer)
                    elif item.event in ("joined", "returned"):
                        await self._on_joined(item.peer)
                elif item.kind == Hello.KIND:
                    await self._on_hello(item)
                elif item.kind == RelayHello.KIND:
                    await self._on_relay_hello(item)
                elif item.kind == Batch.KIND:
                    await self._on_batch(item)
                elif item.kind == ErrorReport.KIND:
                    await self._on_error(item)
                else:
                    self._limited_log.warning("unknown-kind", "ignored a %r message from %r",
                                              item.kind, item.peer)
            except ProtocolError as exc:
                self._limited_log.warning("bad-message", "dropped a bad %r message from %r: %s",
                                          getattr(item, "kind", "?"), item.peer, exc)

    async def _on_hello(self, message: Message) -> None:
        hello = Hello.from_body(message.body)
        previous = self.workers.get(message.peer)
        if previous is not None and previous.alive and (previous.pid, previous.host) == (
                hello.pid, hello.host):
            await self._welcome_again(previous, hello)  # its welcome was late: same admission
            return
        problems = self._admission_problems(hello)
        if problems:
            reason = "; ".join(problems)
            log.warning("refused worker %s from %s: %s", hello.name, hello.host, reason)
            await self._send(message.peer, Refuse(reason).to_body(), Refuse.KIND)
            return
        if self.specs is None:
            self.specs = hello.specs
        previous = self.workers.get(message.peer)
        if previous is not None and previous.alive:
            await self._forget(previous)  # it restarted before its silence was noticed
        index = hello.slot if hello.slot >= 0 else self._take_index()
        worker = WorkerInfo(index, message.peer, hello.name, hello.host, hello.pid,
                            relay=hello.relay.encode() if hello.relay else None)
        self.workers[message.peer] = worker
        await self._welcome(worker, hello.attempt)
        # Each await may see the worker lost (by this task or the trainer's): from then
        # on there is nothing to catch up or grant, and its loss was handled already.
        if self._on_join is not None and worker.alive:
            await self._on_join(worker)  # latest weights before the first frame
        if not worker.alive:
            return
        round_ = self._round
        if self.sync and round_ is not None and round_.replacements > 0:
            # on_worker_loss="wait": the newcomer delivers the lost worker's share.
            round_.replacements -= 1
            round_.targets[worker.peer] = worker
            await self._grant(worker, round_.request)
        await self._top_up()
        self._notify()

    async def _welcome(self, worker: WorkerInfo, attempt: int) -> None:
        """Send ``worker`` its admission (``_send`` also admits it on the hub)."""
        welcome = Welcome(index=worker.index, frames_per_batch=self._share(worker.index),
                          init_random_frames=self.init_random_frames,
                          schemes=self._scheme_configs, attempt=attempt,
                          instance=getattr(self.hub, "instance", ""))
        await self._send(worker.peer, welcome.to_body(), Welcome.KIND)

    async def _welcome_again(self, worker: WorkerInfo, hello: Hello) -> None:
        """Answer a hello from a worker this coordinator has admitted already.

        A worker says hello again when no welcome came within twice its peer
        timeout, as when this trainer's loop was held by a long training step;
        it then takes only the welcome of its latest hello and drops the orders
        that came before it (weights excepted). So the same admission is welcomed
        again, echoing the latest attempt, followed by what the worker is owed:
        its credits, or its share of the current round. Idempotent: repeating
        it leaves the worker, and this state, where one answer would have.
        """
        log.warning("worker %d (%s) said hello again (attempt %d) while admitted: welcoming "
                    "it again", worker.index, worker.name, hello.attempt)
        worker.relay = hello.relay.encode() if hello.relay else None
        await self._welcome(worker, hello.attempt)
        # The latest weights again, ahead of its orders: a worker that joins again after
        # a broken connection may have missed what was sent meanwhile (newest wins, so a
        # copy it already has costs one ack).
        if self._on_join is not None and worker.alive:
            await self._on_join(worker)
        round_ = self._round
        if not worker.alive:
            return
        if not self.sync:
            if worker.credits:
                await self._send(worker.peer, Collect(worker.index, worker.credits).to_body(),
                                 Collect.KIND)
        elif round_ is not None and worker.peer in round_.targets \
                and worker.peer not in round_.shares:
            await self._send(worker.peer, Collect(round_.request, 1).to_body(), Collect.KIND)
            if round_.preempted and worker.alive:
                await self._send(worker.peer, Preempt(round_.request).to_body(), Preempt.KIND)

    async def _on_relay_hello(self, message: Message) -> None:
        hello = RelayHello.from_body(message.body)
        problems = []
        if hello.protocol != PROTOCOL:
            problems.append(f"protocol: coordinator speaks {PROTOCOL}, relay {hello.protocol}")
        if not self._accept_remote:
            problems.append("remote workers (and their relays) are not accepted by this "
                            "collector; pass listen= and remote_workers=")
        elif self._max_remote is not None and len(self.relays) >= self._max_remote \
                and message.peer not in self.relays:
            problems.append(f"remote_workers: this collector takes at most {self._max_remote} "
                            "remote worker(s), and as many relays are registered")
        if problems:
            reason = "; ".join(problems)
            log.warning("refused relay %s from %s: %s", hello.name, hello.host, reason)
            await self._send(message.peer, Refuse(reason).to_body(), Refuse.KIND)
            return
        self.relays[message.peer] = RelayInfo(message.peer, hello.host, hello.pid,
                                              frozenset(hello.members))
        log.info("relay %s on %s carries the weights of up to %d workers",
                 message.peer.decode(errors="replace"), hello.host, len(hello.members))
        welcome = RelayWelcome(len(hello.members), instance=getattr(self.hub, "instance", ""))
        await self._send(message.peer, welcome.to_body(), RelayWelcome.KIND)

    def _admission_problems(self, hello: Hello) -> list[str]:
        problems = []
        if hello.protocol != PROTOCOL:
            problems.append(f"protocol: coordinator speaks {PROTOCOL}, worker {hello.protocol}")
        local = hello.slot >= 0
        if local and hello.token != self._token:
            problems.append("token: this worker was not spawned by this coordinator")
        if not local and not self._accept_remote:
            problems.append("remote workers are not accepted by this collector")
        if local and any(w.index == hello.slot and w.alive for w in self.workers.values()):
            problems.append(f"slot: worker index {hello.slot} is taken")
        if self._check_specs is not None and self.specs is not None:
            problems += self._check_specs(self.specs, hello)
        if not local and not problems:
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

    async def _on_batch(self, message: Message) -> None:
        worker = self.workers.get(message.peer)
        if worker is None or not worker.alive:
            return  # a lost worker's late batch is discarded, never half-delivered
        batch = Batch.from_body(message.body)
        if not self.sync and batch.request != worker.index:
            return  # collected before this worker was (re)admitted: never half-delivered
        problems = self._batch_problems(worker, batch)
        if problems:
            await self._reject_batch(worker, batch, problems)  # never counted
            return
        worker.credits = max(0, worker.credits - 1)
        worker.delivered += 1
        if self.sync:
            await self._on_share(worker, batch)  # wakes the trainer once the round is whole
        else:
            worker.queued += 1
            self._ready_send.send_nowait((worker, batch.frames))
            self._notify()

    def _batch_problems(self, worker: WorkerInfo, batch: Batch) -> list[str]:
        """What is wrong with ``batch`` given what ``worker`` was asked for ([] if nothing)."""
        frames = self.frames_per_worker[worker.index % len(self.frames_per_worker)]
        round_ = self._round
        # Only a share the scheduler cut short (preemptive_threshold) may hold fewer steps.
        shorter = (self.sync and round_ is not None and round_.preempted
                   and batch.request == round_.request)
        return self._checker.problems(batch.frames, specs=self.specs, frames=frames,
                                      worker_index=worker.index, shorter_ok=shorter)

    async def _reject_batch(self, worker: WorkerInfo, batch: Batch, problems: list[str]) -> None:
        """A batch that is not what was asked: tell the worker, drop it, apply on_worker_loss."""
        what = "; ".join(problems)
        log.error("worker %d (%s on %s) sent a bad batch for request %d, dropped it: %s",
                  worker.index, worker.name, worker.host, batch.request, what)
        reason = f"your batch for request {batch.request} was rejected: {what}"
        worker.rejoin_asked = True  # refused for cause: never invited back
        await self._send(worker.peer, Refuse(reason).to_body(), Refuse.KIND)
        if self.on_worker_loss == "raise":
            self.fail(BadBatchError(
                f"worker {worker.index} ({worker.name}, pid {worker.pid} on {worker.host}) "
                f"sent a batch that is not what was asked: {what}; it was dropped and none "
                "of its frames were counted. Check that every worker runs the same asyncrl "
                "and env version, or pass on_worker_loss='continue' to carry on without it"))
        if worker.alive:
            await self._forget(worker)

    async def _on_share(self, worker: WorkerInfo, batch: Batch) -> None:
        round_ = self._round
        if round_ is None or batch.request != round_.request or worker.peer not in round_.targets:
            self._limited_log.warning(
                "stale-share", "discarded a batch of worker %d for request %d",
                worker.index, batch.request)
            return
        round_.shares[worker.peer] = batch.frames
        await self._check_round(round_)

    async def _check_round(self, round_: _Round) -> None:
        # O(1) per share: targets hold live workers only, and every share is a target's.
        if len(round_.shares) == len(round_.targets) and round_.replacements == 0:
            round_.complete.set()
            self._notify()
            return
        threshold = self.preemptive_threshold
        if (threshold is not None and not round_.preempted
                and len(round_.shares) >= math.ceil(threshold * len(round_.targets))):
            round_.preempted = True
            for worker in round_.missing():
                await self._send(worker.peer, Preempt(round_.request).to_body(), Preempt.KIND)

    async def _on_error(self, message: Message) -> None:
        report = ErrorReport.from_body(message.body)
        worker = self.workers.get(message.peer)
        if worker is not None and worker.alive:
            name = f"{worker.index} ({worker.name})"
        elif self._spawned_here(report):
            worker, name = None, f"{report.slot} (failed before joining)"
        else:
            # Only a peer that was admitted (or proves it was spawned here) may stop the
            # run: anyone can connect to a listening port and send an "error" message.
            self._limited_log.warning(
                "stranger-error", "ignored an error report from %r, which is not an admitted "
                "worker (a stranger, or a worker already lost): %s: %s", message.peer,
                report.error.type, report.error.message[:200])
            return
        error = rebuild_remote_exception(report.error, peer=name)
        if report.fatal:
            if worker is not None:
                worker.alive = False
            self.fail(error)
        else:
            self._limited_log.warning(f"report-{name}", "worker %s reported: %s", name,
                                      report.error.message)

    def _spawned_here(self, report: ErrorReport) -> bool:
        """A local worker's report sent before it was admitted (its env failed to build)."""
        if report.slot < 0 or not self._token or not report.token:
            return False
        if any(w.index == report.slot and w.alive for w in self.workers.values()):
            return False  # that slot's worker is live and speaks for itself
        return secrets.compare_digest(report.token.encode(), self._token.encode())

    async def _on_joined(self, peer: bytes) -> None:
        """A peer the hub had lost speaks again: if it was our worker, tell it to rejoin."""
        worker = self.workers.get(peer)
        if worker is None or worker.alive or worker.rejoin_asked:
            return
        worker.rejoin_asked = True
        self._gone.pop(peer, None)
        log.warning("worker %d (%s) speaks again after it was dropped: asking it to rejoin",
                    worker.index, worker.name)
        reason = f"silent for more than {self.hub.peer_timeout} s"
        await self._send(peer, Rejoin(reason).to_body(), Rejoin.KIND)

    async def settle(self, peer: bytes, timeout: float) -> None:
        """Wait (up to ``timeout`` s) until what ``peer`` sent before it went away is handled.

        A worker that reports an error sends the report, says goodbye and exits;
        its process may be seen dead before the hub delivered the report. The
        goodbye comes after the report on the same pipe, so once the peer's loss
        was handled (or the run failed) the report, if any, was too.
        """
        with anyio.move_on_after(timeout):
            while peer not in self._gone and self._failure is None:
                await self._wait_change()

    @property
    def failed(self) -> bool:
        return self._failure is not None

    def raise_if_failed(self) -> None:
        """Raise the run's failure, if it has one."""
        self._raise_failure()

    async def worker_exited(self, peer: bytes, error: WorkerLostError, *,
                            replaceable: bool) -> None:
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
            self._written_off += 1  # also if it died before it joined: stop waiting for it
        if worker is not None and worker.alive:
            await self._forget(worker)
        self._notify()

    def _mark_gone(self, peer: bytes) -> None:
        self._gone[peer] = None
        self._gone.move_to_end(peer)
        while len(self._gone) > 1024:
            self._gone.popitem(last=False)

    async def _on_lost(self, peer: bytes) -> None:
        self._mark_gone(peer)
        if self.relays.pop(peer, None) is not None:
            # Its workers get their weights directly from the next send on.
            log.warning("relay %s was lost", peer.decode(errors="replace"))
            return
        worker = self.workers.get(peer)
        if worker is None or not worker.alive:
            return
        log.warning("worker %d (%s on %s) was lost", worker.index, worker.name, worker.host)
        if self.on_worker_loss == "raise":
            self.fail(WorkerLostError(
                f"worker {worker.index} ({worker.name}, pid {worker.pid} on {worker.host}) "
                "stopped answering; pass on_worker_loss='continue', 'wait' or 'restart' to "
                "carry on"))
        elif self.on_worker_loss == "continue":
            self._written_off += 1
        await self._forget(worker)
        if self._on_lost_hook is not None:
            self._on_lost_hook(worker)

    async def _forget(self, worker: WorkerInfo) -> None:
        """Drop a worker (lost, or replaced by its own new hello) and what it owed."""
        worker.alive = False
        self._mark_gone(worker.peer)
        # A stranger again for the hub: acks it owes are abandoned at once (a weight
        # send does not wait for a dead process's heartbeats to stop), its bulk is no
        # longer taken, and if it speaks again the hub says so ("returned").
        self.hub.expel(worker.peer)
        round_ = self._round
        if round_ is not None and worker.peer in round_.targets \
                and worker.peer not in round_.shares:
            round_.targets.pop(worker.peer)  # its unfinished share is dropped
            if self.on_worker_loss in ("wait", "restart"):
                round_.replacements += 1
            await self._check_round(round_)
        if not self.sync:
            # Its unfinished batches will never come: give their credits to the others,
            # so total_frames is still met exactly.
            if self._budget is not None:
                self._budget += worker.credits
            worker.credits = 0
            await self._top_up()
        self._notify()

    # -- helpers ---------------------------------------------------------------------
    def _share(self, index: int) -> int:
        """Frames per batch of the worker admitted with ``index``."""
        return self.frames_per_worker[index % len(self.frames_per_worker)]

    async def _grant(self, worker: WorkerInfo, request: int | None = None) -> bool:
        """Ask ``worker`` for one batch: for sync round ``request``, or (None) in async mode."""
        if not worker.alive:
            return False  # lost during an earlier await: its credit would be a leak
        if request is None:
            request = worker.index  # tags its batches with this admission
            if self._budget is not None:
                if self._budget <= 0:
                    return False
                self._budget -= 1
        worker.credits += 1
        await self._send(worker.peer, Collect(request, 1).to_body(), Collect.KIND)
        return True

    async def _send(self, peer: bytes, body: Any, kind: str) -> None:
        if kind in (Welcome.KIND, RelayWelcome.KIND):
            # Admitted before it is told so: its first batch may be large (see Hub.admit).
            self.hub.admit(peer)
        try:
            await self.hub.send(peer, body, kind=kind)
        except PeerLostError:
            await self._on_lost(peer)
        if kind == Refuse.KIND:
            self.hub.expel(peer)  # a stranger again: small messages only, no say in the run

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _notify(self) -> None:
        self._changed.set()

    async def _wait_change(self) -> None:
        if self._changed.is_set():
            self._changed = anyio.Event()
        await self._changed.wait()


__all__ = ["Coordinator", "OnWorkerLoss", "RelayInfo", "WorkerInfo", "check_specs"]
