"""The coordinator: admits workers, grants credits, gathers batches. Event-driven.

One task reads the hub and updates state; the trainer's calls wait on events
that state changes set. There is no polling and no timeout used as a
scheduling tool: a batch is handed over the moment its last share arrives.

* **sync** (on-policy): :meth:`Scheduler.next_round` asks every live worker
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from tensordict import TensorDictBase

from transports import Hub, Message, PeerEvent, PeerLostError, ProtocolError

from ._errors import WorkerLostError, rebuild_remote_exception
from ._protocol import (
    PROTOCOL,
    Batch,
    Collect,
    ErrorReport,
    Hello,
    Preempt,
    Refuse,
    RelayHello,
    RelayWelcome,
    Welcome,
)

log = logging.getLogger("asyncrl.scheduler")

OnWorkerLoss = Literal["raise", "continue", "wait"]


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


class Scheduler:
    """Coordinator state and the task that keeps it current (run it in a task group)."""

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
        batch_budget: int | None = None,
        first_remote_index: int | None = None,
        scheme_configs: dict[str, Any] | None = None,
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
        self._budget = batch_budget  # async: credits still allowed to be granted
        self._scheme_configs = dict(scheme_configs or {})
        self.workers: dict[bytes, WorkerInfo] = {}
        self.relays: dict[bytes, RelayInfo] = {}
        self.specs: dict[str, Any] | None = None
        # Remote workers (and rejoining ones) get fresh indices after the local slots.
        self._next_index = len(frames_per_worker) if first_remote_index is None \
            else first_remote_index
        self._changed = anyio.Event()
        self._failure: BaseException | None = None
        self._round: _Round | None = None
        self._request = 0
        # Credits bound this queue (live workers x prefetch, plus what a lost worker
        # had already delivered), so it needs no bound of its own.
        self._ready_send, self._ready_recv = anyio.create_memory_object_stream[
            tuple[WorkerInfo, TensorDictBase]](math.inf)
        self.paused = False

    # -- trainer-facing ------------------------------------------------------------
    @property
    def live_workers(self) -> list[WorkerInfo]:
        return sorted((w for w in self.workers.values() if w.alive), key=lambda w: w.index)

    async def wait_for_workers(self, count: int) -> None:
        """Return once ``count`` workers were admitted; raise a worker's failure."""
        while len(self.live_workers) < count:
            self._raise_failure()
            await self._wait_change()
        self._raise_failure()

    async def next_round(self) -> list[tuple[WorkerInfo, TensorDictBase]]:
        """Sync mode: one share from every live worker, ordered by worker index."""
        self._raise_failure()
        self._request += 1
        targets = {w.peer: w for w in self.live_workers}
        if not targets:
            raise WorkerLostError("no live worker to collect from")
        round_ = _Round(self._request, targets)
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
                elif item.kind == Hello.KIND:
                    await self._on_hello(item)
                elif item.kind == RelayHello.KIND:
                    await self._on_relay_hello(item)
                elif item.kind == Batch.KIND:
                    await self._on_batch(item)
                elif item.kind == ErrorReport.KIND:
                    await self._on_error(item)
                else:
                    log.warning("ignored a %r message from %r", item.kind, item.peer)
            except ProtocolError as exc:
                log.warning("dropped a bad %r message from %r: %s",
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
        frames = self.frames_per_worker[index % len(self.frames_per_worker)]
        welcome = Welcome(index=index, frames_per_batch=frames,
                          init_random_frames=self.init_random_frames,
                          schemes=self._scheme_configs, attempt=hello.attempt)
        await self._send(worker.peer, welcome.to_body(), Welcome.KIND)
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
        frames = self.frames_per_worker[worker.index % len(self.frames_per_worker)]
        welcome = Welcome(index=worker.index, frames_per_batch=frames,
                          init_random_frames=self.init_random_frames,
                          schemes=self._scheme_configs, attempt=hello.attempt)
        await self._send(worker.peer, welcome.to_body(), Welcome.KIND)
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
        if problems:
            reason = "; ".join(problems)
            log.warning("refused relay %s from %s: %s", hello.name, hello.host, reason)
            await self._send(message.peer, Refuse(reason).to_body(), Refuse.KIND)
            return
        self.relays[message.peer] = RelayInfo(message.peer, hello.host, hello.pid,
                                              frozenset(hello.members))
        log.info("relay %s on %s carries the weights of up to %d workers",
                 message.peer.decode(errors="replace"), hello.host, len(hello.members))
        await self._send(message.peer, RelayWelcome(len(hello.members)).to_body(),
                         RelayWelcome.KIND)

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
        return problems

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
        worker.credits = max(0, worker.credits - 1)
        worker.delivered += 1
        if self.sync:
            await self._on_share(worker, batch)  # wakes the trainer once the round is whole
        else:
            worker.queued += 1
            self._ready_send.send_nowait((worker, batch.frames))
            self._notify()

    async def _on_share(self, worker: WorkerInfo, batch: Batch) -> None:
        round_ = self._round
        if round_ is None or batch.request != round_.request or worker.peer not in round_.targets:
            log.warning("discarded a batch of worker %d for request %d", worker.index,
                        batch.request)
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
        name = (f"{worker.index} ({worker.name})" if worker
                else message.peer.decode(errors="replace"))
        error = rebuild_remote_exception(report.type, report.message, report.traceback,
                                         peer=name)
        if report.fatal:
            if worker is not None:
                worker.alive = False
            self.fail(error)
        else:
            log.warning("worker %s reported: %s", name, report.message)

    async def _on_lost(self, peer: bytes) -> None:
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
                "stopped answering; pass on_worker_loss='continue' or 'wait' to carry on"))
        await self._forget(worker)

    async def _forget(self, worker: WorkerInfo) -> None:
        """Drop a worker (lost, or replaced by its own new hello) and what it owed."""
        worker.alive = False
        round_ = self._round
        if round_ is not None and worker.peer in round_.targets \
                and worker.peer not in round_.shares:
            round_.targets.pop(worker.peer)  # its unfinished share is dropped
            if self.on_worker_loss == "wait":
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
        try:
            await self.hub.send(peer, body, kind=kind)
        except PeerLostError:
            await self._on_lost(peer)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _notify(self) -> None:
        self._changed.set()

    async def _wait_change(self) -> None:
        if self._changed.is_set():
            self._changed = anyio.Event()
        await self._changed.wait()


def check_specs(reference: dict[str, Any], hello: Hello) -> list[str]:
    """Handshake check: the worker's env specs must equal the first worker's."""
    from .envs import EnvSpecs

    try:
        theirs = EnvSpecs.from_dict(hello.specs)
    except ValueError as exc:
        return [f"specs: {exc}"]
    ours = EnvSpecs.from_dict(reference)
    return [f"specs: {line}" for line in ours.describe_mismatch(theirs)]


__all__ = ["OnWorkerLoss", "RelayInfo", "Scheduler", "WorkerInfo", "check_specs"]
