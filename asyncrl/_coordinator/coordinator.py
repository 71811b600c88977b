"""The coordinator: reads the hub, applies each event to its state, makes the sends.

The decisions (admission, credits, rounds, loss) are :class:`CoordinatorState`'s
plain methods, which return the sends to make; this module is the I/O around
them: the hub-reading task (each message decoded once, batches through the
:class:`~asyncrl._coordinator.batch_sink.BatchSink`) and the trainer's calls
(rounds, batches, control operations, the close broadcast). What the state
decided is sent by the :class:`~asyncrl._coordinator.outbox.Outbox`, in order:
welcomes and refusals, orders, and newcomers' catch-ups; every protocol message
the trainer sends a worker goes through one of the two except the weights (the
:class:`~asyncrl.weights.WeightSender` sends those).

One task reads the hub and updates state; the trainer's calls wait on events
that state changes set. There is no polling and no timeout used as a
scheduling tool: a batch is handed over the moment its last share arrives.
See :mod:`asyncrl._coordinator.state` for the sync and async modes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from tensordict import TensorDictBase

from transports import Hub, Message, PeerEvent, PeerLostError, ProtocolError, RateLimitedLog

from .._errors import (
    CollectorError,
    CollectorStopped,
    WorkerLostError,
    rebuild_remote_exception,
)
from .._observe.events import CollectorEvent
from .._observe.tracing import span
from .._protocol import (
    Batch,
    BatchSlots,
    Closing,
    Control,
    ErrorReport,
    Hello,
    Leaving,
    Progress,
    Refuse,
    RelayHello,
    SharedBatch,
    Welcome,
    WorkerLog,
    decode,
)
from .actions import Action, Send
from .admission import AdmissionTerms
from .batch_sink import BatchSink
from .checks import check_specs, reporter
from .config import CoordinatorConfig
from .outbox import Outbox
from .records import LOSS_WORDS, RelayInfo, WorkerInfo
from .registry import WorkerRegistry
from .shared_batches import SlotError
from .state import CoordinatorState
from .worker_logs import WorkerLogs

if TYPE_CHECKING:
    pass

log = logging.getLogger("asyncrl.coordinator")


class Coordinator:
    """The coordinator's task and the trainer's calls (run :meth:`run` in a task group).

    Peers are hostile until admitted. Only a welcomed, live worker's reports
    count (and a local worker's report before its hello, vouched for by its
    spawn token); the hub is told whom the coordinator admitted (``Hub.admit``
    when welcomed, ``Hub.expel`` when refused or lost), so strangers cannot
    stream bulk data; ``max_remote_workers`` bounds the remote workers (and
    relays) alive at once; every batch is checked before a frame of it is
    counted. Plain ``tcp://`` is unauthenticated by design: anyone who can reach
    the port can say hello as a remote worker; use CURVE keys on a network you
    do not trust.

    Weight senders are attached to its ``outbox`` (``outbox.attach``), which tells
    them who the workers are and which go through a relay, catches each newcomer
    up before its first order, and counts delivered batches for ``max_interval``.
    """

    def __init__(
        self,
        hub: Hub,
        config: CoordinatorConfig,
        terms: AdmissionTerms | None = None,
        *,
        on_join: Callable[[WorkerInfo], Awaitable[None]] | None = None,
        on_lost: Callable[[WorkerInfo], None] | None = None,
        on_leaving: Callable[[WorkerInfo, str], None] | None = None,
        publish: Callable[[CollectorEvent], None] | None = None,
        paused: bool = False,
    ) -> None:
        """``config``: the run's rules (read whole by the state and the batch sink);
        ``terms``: what newcomers are checked against and told; the hub's coordinator
        instance and peer timeout are taken from ``hub``; ``publish`` receives the
        registry's events (joined, lost, refused)."""
        self.hub = hub
        self.config = config
        #: The decisions (admission, rounds, losses: use its parts directly).
        self.state = CoordinatorState(
            config, terms, instance=getattr(hub, "instance", ""),
            peer_timeout=getattr(hub, "peer_timeout", None))
        #: Every admitted worker and relay (the state's :class:`Roster`, the same object).
        self.roster = self.state.roster
        self._on_lost_hook = on_lost  # e.g. "restart": end a silent local process
        self._on_leaving_hook = on_leaving  # a worker stops on a signal (SIGTERM)
        # Peers are hostile until admitted: what they make us log is rate-limited.
        self._limited_log = RateLimitedLog(log)
        self._changed = anyio.Event()
        self._closing = False
        self._close_error: BaseException | None = None  # close()'s "failure": no failure
        # Every admission, live and lost, for statistics() and the event stream.
        self.registry = WorkerRegistry(publish)
        #: Admitted workers' log records, re-emitted into the ``asyncrl.worker`` logger.
        self.worker_logs = WorkerLogs()
        self.state.rounds.paused = paused  # pause() before the collector opened
        #: Every batch from its arrival to the round's batch: decoded or read from its
        #: shared-memory slot, compacted, counted, gathered and joined.
        self.batches = BatchSink(config)
        #: Performs what the state decided, in order; serves the attached weight senders
        #: (``outbox.attach(sender)``) and the newcomers' ``outbox.catch_up_hooks``.
        self.outbox = Outbox(hub, self.roster, self.registry, self.worker_logs,
                             self.batches.shared, lost=self._on_lost, changed=self._notify,
                             on_join=on_join)
        #: Message kinds served by another part of the trainer (a served module's calls:
        #: ``asyncrl.served``): ``{kind: handler(worker or None, message)}``. The handler
        #: is told the live admitted worker that sent it (None: a stranger or a lost one,
        #: to refuse); it must return at once (its work goes to a task of its own).
        self.services: dict[str, Callable[[WorkerInfo | None, Message], Awaitable[None]]] = {}

    # -- the run's failure ------------------------------------------------------------------
    @property
    def run_failed(self) -> bool:
        """The run failed: not closed, not stopped on a signal (a worker's fatal error,
        a loss under ``on_worker_loss="raise"``, a replacement that never came...)."""
        failure = self.state.losses.failure
        return failure is not None and failure is not self._close_error \
            and not isinstance(failure, CollectorStopped)

    def raise_if_failed(self) -> None:
        """Raise the run's failure, if it has one."""
        self._raise_failure()

    def fail(self, error: BaseException) -> None:
        """Make every waiting and future trainer call raise ``error``."""
        self.state.losses.fail(error)
        self._notify()

    # -- trainer-facing ----------------------------------------------------------------------
    async def wait_for_workers(self, count: int) -> None:
        """Return once ``count`` workers (less those lost before joining) were admitted."""
        self.state.losses.expected = count
        while self.state.losses.missing_workers() > 0:
            self._raise_failure()
            await self._wait_change()
        self._raise_failure()
        if not self.roster.live_workers:
            raise WorkerLostError("every worker was lost before it joined")

    async def next_round(self, max_frames: int | None = None
                         ) -> list[tuple[WorkerInfo, TensorDictBase]]:
        """Sync mode: one share from every live worker, ordered by worker index.

        With ``max_frames`` (what ``total_frames`` still allows), only the workers
        needed to reach it are asked (see :meth:`CoordinatorState.start_round`).
        """
        await self._wait_resumed()  # paused: no new round is asked for
        round_, orders = self.state.start_round(max_frames)
        await self.outbox.perform(orders)
        while not round_.complete or self.state.rounds.paused:  # a round done while paused is held
            self._raise_failure()
            await self._wait_change()
        self._raise_failure()
        shares = self.state.rounds.end_round(round_)
        for worker, frames in shares:
            self.outbox.count_batch(worker, frames.numel())
        return shares

    async def next_batch(self) -> tuple[WorkerInfo, TensorDictBase]:
        """Async mode: the next batch any worker delivered; grants that worker a credit."""
        while True:
            await self._wait_resumed()  # paused: delivered batches are held, not handed over
            taken = self.state.rounds.take()
            if taken is None:
                await self._wait_change()
                continue
            worker, frames, orders = taken
            await self.outbox.perform(orders)
            self.outbox.count_batch(worker, frames.numel())
            return worker, frames

    async def set_paused(self, paused: bool) -> None:
        """Paused: no new credit (async) or round (sync) is granted, and no batch is
        handed to the trainer; what workers were already asked for is collected and
        held. Resumed: the held batches are handed over and credits are topped up."""
        if paused:
            self.state.rounds.paused = True
            self._notify()
        elif self.config.sync:
            self.state.rounds.paused = False
            self._notify()
        else:
            await self.outbox.perform(self.state.rounds.resume())

    def heard(self, peer: bytes) -> float | None:
        """``time.monotonic()`` when the hub last heard ``peer`` (None: not connected)."""
        last_heard = getattr(self.hub, "last_heard", None)
        return last_heard(peer) if last_heard is not None else None

    async def control(self, worker: WorkerInfo, op: str, **args: Any) -> Any:
        """Run the control operation ``op`` on ``worker`` and return its answer (60 s at most)."""
        ticket = await self.hub.send_async([worker.peer], Control(op, args).to_body(),
                                           kind=Control.KIND)
        return (await self.hub.wait_ack(ticket, timeout=60))[worker.peer]

    async def close(self, grace: float = 1.0, *, finished: bool = True) -> None:
        """The collector closes: every waiting trainer call raises, every live worker stops.

        ``finished``: the run is over and the workers go home; False: only this
        trainer stops (SIGTERM, an error, a close before ``total_frames``), and hosts
        started with ``--reconnect`` wait for the next one (see :class:`Closing`).
        Telling the workers is best effort (2 s in all): one that is gone already is
        stopped by whoever started its process. Then the hub stays open until each
        told worker said goodbye (``grace`` s at most, milliseconds usually): a worker
        whose last messages (its ack, its goodbye) reached a live hub has nothing left
        to deliver, so ZeroMQ's linger does not hold its exit for a second.
        """
        self._close_error = CollectorError("the collector was closed")
        self.fail(self._close_error)  # wake waiters
        self._closing = True  # goodbyes from now on are workers stopping, not losses
        if finished:
            # Also for the peers not told below: a worker still asking to join (refused
            # as full, rejoining) goes home too instead of exiting as unreachable (3).
            self.hub.finish()
        told = []
        with anyio.move_on_after(2):
            for worker in self.roster.live_workers:
                try:
                    await self.hub.send(worker.peer, Control(
                        "close", Closing(finished).to_args()).to_body(), kind=Control.KIND)
                except Exception:
                    continue  # gone already: its process's owner takes care of it
                told.append(worker.peer)
        with anyio.move_on_after(grace):
            while any(peer not in self.state.losses.gone for peer in told):
                await self._wait_change()

    async def settle(self, peer: bytes, timeout: float) -> None:
        """Wait (up to ``timeout`` s) until what ``peer`` sent before it went away is handled.

        A worker that reports an error sends the report, says goodbye and exits;
        its process may be seen dead before the hub delivered the report. The
        goodbye comes after the report on the same pipe, so once the peer's loss
        was handled (or the run failed) the report, if any, was too.
        """
        state = self.state
        with anyio.move_on_after(timeout):
            # (a departed worker's late message can take it off ``gone``: ``left`` stays)
            losses = state.losses
            while peer not in losses.gone and not losses.has_left(peer) and losses.failure is None:
                await self._wait_change()

    async def worker_exited(self, peer: bytes, error: WorkerLostError, *,
                            replaceable: bool) -> None:
        """A local worker's process ended without being told to: apply ``on_worker_loss``.

        ``replaceable``: something can take its place (it is respawned, or remote
        workers may join); without it ``"wait"`` would wait forever, so it fails.
        """
        await self.outbox.perform(self.state.losses.exited(peer, error, replaceable=replaceable),
                                  str(error))

    async def worker_stalled(self, worker: WorkerInfo, seconds: float) -> None:
        """``worker`` owed work and delivered nothing for ``seconds`` (see
        :class:`~asyncrl._coordinator.watchdog.StallWatchdog`): a loss, by
        ``on_worker_loss`` (``"restart"``: the ``on_lost`` hook ends its process)."""
        if self._closing or not worker.alive:
            return
        await self.outbox.perform(self.state.losses.stalled(worker.peer, seconds),
                                  f"owed work and delivered nothing for {seconds:.1f} s (the "
                                  "env step or the policy did not return)")
        if self._on_lost_hook is not None:
            self._on_lost_hook(worker)

    # -- the hub-reading task ------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._read_hub()
        finally:
            self.batches.shared.close()  # no segment outlives the run

    async def _read_hub(self) -> None:
        async for item in self.hub:
            try:
                if isinstance(item, PeerEvent):
                    if item.event == "lost":
                        await self._on_lost(item.peer, item.reason)
                    elif item.event in ("joined", "returned"):
                        await self.outbox.perform(self.state.losses.returned(item.peer))
                elif item.kind == Hello.KIND:
                    await self._on_hello(item.peer, decode(Hello, item.body))
                elif item.kind == RelayHello.KIND:
                    relay_hello = decode(RelayHello, item.body)
                    actions = self.state.admission.relay_hello(item.peer, relay_hello)
                    self.outbox.note_refusals(actions, relay_hello.name, relay_hello.host,
                                        relay_hello.pid)
                    await self.outbox.perform(actions)
                elif item.kind == Batch.KIND:
                    await self._on_batch(item)
                elif item.kind == SharedBatch.KIND:
                    await self._on_shared_batch(item)
                elif item.kind == ErrorReport.KIND:
                    await self._on_error(item)
                elif item.kind == Leaving.KIND:
                    await self._on_leaving(item)
                elif item.kind == WorkerLog.KIND:
                    self._on_log(item)
                elif item.kind == Progress.KIND:  # it steps: slow is not hung
                    progress = decode(Progress, item.body)
                    await self.outbox.perform(self.state.progress(item.peer, progress))
                elif (service := self.services.get(item.kind)) is not None:
                    await service(self.roster.live(item.peer), item)
                else:
                    self._limited_log.warning("unknown-kind", "ignored a %r message from %r",
                                              item.kind, item.peer)
            except ProtocolError as exc:  # every decode raises only this (see decode())
                self._limited_log.warning("bad-message", "dropped a bad %r message from %r: %s",
                                          getattr(item, "kind", "?"), item.peer, exc)

    async def _on_hello(self, peer: bytes, hello: Hello) -> None:
        with span("asyncrl.admission") as current:  # a shared no-op without the otel extra
            actions = self.state.hello(peer, hello)
            self.outbox.note_refusals(actions, hello.name, hello.host, hello.pid)
            await self.outbox.perform(actions, "replaced by its own new hello")
            worker = self.state.roster.workers.get(peer)
            if worker is not None and worker.alive:  # a spawn slot is vouched for by the token
                self.batches.shared.admitted(peer, local=hello.slot >= 0)
            if current is not None and current.is_recording():
                trace_admission(current, hello, actions)
                # The version it was caught up to (0: its initial weights).
                current.set_attribute("asyncrl.version", next(
                    (s.version for s in self.outbox.senders if s.model_id == "policy"), 0))

    async def _on_batch(self, message: Message) -> None:
        worker = self.state.roster.workers.get(message.peer)
        if worker is None or not worker.alive:
            return  # a stranger's, or a lost worker's late batch: not even read
        try:  # decoded against its share (what we asked for), then counted
            batch = self.batches.from_socket(worker, message.body)
        except ProtocolError as exc:  # an admitted worker's batch: it is a bad batch
            body = message.body
            request = body.get("request") if isinstance(body, dict) else None
            await self._refuse_batch(worker, request if type(request) is int else -1, exc)
            return
        await self._deliver(worker, batch)
        if worker.alive and (offer := self.batches.shared.offer(worker, batch.frames)) is not None:
            try:  # its next batches go through shared memory
                await self.hub.send(worker.peer, offer.to_body(), kind=BatchSlots.KIND)
            except PeerLostError:
                await self._on_lost(worker.peer)

    async def _on_shared_batch(self, message: Message) -> None:
        worker = self.state.roster.workers.get(message.peer)
        if worker is None or not worker.alive:
            return  # a stranger's, or a lost worker's late notice: not even read
        notice = decode(SharedBatch, message.body)
        try:  # sync: into the round's batch
            batch = self.batches.from_slot(worker, notice, self.state.rounds.round)
        except SlotError as exc:  # shrunk or torn: refused as any bad batch, segment unlinked
            await self._refuse_batch(worker, notice.request, exc)
            return
        await self._deliver(worker, batch)

    async def _refuse_batch(self, worker: WorkerInfo, request: int, error: Exception) -> None:
        """A batch that could not be read whole (undecodable, or a slot shrunk or torn)."""
        actions = self.state.bad_batch(worker.peer, request, str(error))
        self.outbox.note_refusals(actions, worker.name, worker.host, worker.pid)
        await self.outbox.perform(actions, "refused for a bad batch")

    async def _deliver(self, worker: WorkerInfo, batch: Batch) -> None:
        actions = self.state.batch(worker.peer, batch)
        if actions:
            self.outbox.note_refusals(actions, worker.name, worker.host, worker.pid)
        await self.outbox.perform(actions, "refused for a bad batch")

    def _on_log(self, message: Message) -> None:
        worker = self.state.roster.workers.get(message.peer)
        if worker is None or not worker.alive:
            return  # a stranger's (or a lost worker's) log: not even read
        self.worker_logs.emit(worker, decode(WorkerLog, message.body))

    async def _on_lost(self, peer: bytes, reason: str = "") -> None:
        self.worker_logs.forget(peer)
        self.batches.shared.forget(peer)  # a dead worker's segment is unlinked
        if self._closing:  # told to close: its goodbye is no loss (and no warning)
            self.state.losses.gone[peer] = None
            self._notify()
            return
        worker = self.state.roster.workers.get(peer)
        was_alive = worker is not None and worker.alive
        await self.outbox.perform(self.state.losses.lost(peer, reason), LOSS_WORDS.get(
            reason, "stopped answering (silent or disconnected)"))
        if was_alive and self._on_lost_hook is not None:
            assert worker is not None
            self._on_lost_hook(worker)

    async def _on_error(self, message: Message) -> None:
        report = decode(ErrorReport, message.body)
        workers = self.roster.workers
        speaker = reporter(report, workers.get(message.peer), workers.values(),
                           self.state.admission.terms.token)
        if speaker is None:  # only an admitted worker, or one spawned here, stops the run
            self._limited_log.warning(
                "stranger-error", "ignored an error report from %r, which is not an admitted "
                "worker (a stranger, or a worker already lost): %s: %s", message.peer,
                report.error.type, report.error.message[:200])
            return
        worker, name = speaker
        error = rebuild_remote_exception(report.error, peer=name)
        if report.fatal:
            if worker is not None:
                worker.alive = False
                self.registry.check_lost(f"reported {report.error.type}: "
                                         f"{report.error.message[:200]}")
            self.fail(error)
        else:
            self._limited_log.warning(f"report-{name}", "worker %s reported: %s", name,
                                      report.error.message)

    async def _on_leaving(self, message: Message) -> None:
        """A worker stops on its own (SIGTERM): the collector decides what that means.

        Unless its hook stops the run (a local worker: systemd stops a whole process
        group), it is a departure, whatever ``on_worker_loss``: no failure, and what
        it owed goes to the others (see :meth:`CoordinatorState.departed`).
        """
        leaving = decode(Leaving, message.body)
        worker = self.roster.workers.get(message.peer)
        if worker is None or not worker.alive:
            return  # a stranger's, or a worker already gone: no say in the run
        if self._on_leaving_hook is not None:
            self._on_leaving_hook(worker, leaving.reason)
        if worker.alive:  # the hook did not take it as a stop: a departure
            reason = leaving.reason or "no reason given"
            log.info("worker %d (%s on %s) is leaving (%s): its unfinished work goes to the "
                     "others", worker.index, worker.name, worker.host, reason)
            await self.outbox.perform(self.state.losses.departed(message.peer),
                                      f"it left ({reason})", left=True)
        self._notify()
        # It waits for this before it says goodbye (see Worker._watch_signals).
        try:
            await self.hub.send(message.peer, Control("close").to_body(), kind=Control.KIND)
        except Exception:
            pass  # gone already: its process's owner takes care of it

    # -- waiting on the state -----------------------------------------------------------
    async def _wait_resumed(self) -> None:
        self._raise_failure()
        while self.state.rounds.paused:
            await self._wait_change()
            self._raise_failure()

    def _raise_failure(self) -> None:
        if self.state.losses.failure is not None:
            raise self.state.losses.failure

    def _notify(self) -> None:
        self._changed.set()

    async def _wait_change(self) -> None:
        if self._changed.is_set():
            self._changed = anyio.Event()
        await self._changed.wait()


def trace_admission(current: Any, hello: Hello, actions: list[Action]) -> None:
    """A recording ``asyncrl.admission`` span's attributes: who, and what was decided."""
    attributes: dict[str, Any] = {"asyncrl.host": hello.host, "asyncrl.pid": hello.pid,
                                  "asyncrl.name": hello.name, "asyncrl.admitted": False}
    for action in actions:
        if isinstance(action, Send) and isinstance(action.message, Welcome):
            attributes.update({"asyncrl.admitted": action.worker is not None
                               and action.worker.alive, "asyncrl.worker": action.message.index})
        elif isinstance(action, Send) and isinstance(action.message, Refuse):
            attributes["asyncrl.reason"] = action.message.reason[:500]
    current.set_attributes(attributes)


__all__ = ["Coordinator", "RelayInfo", "WorkerInfo", "check_specs"]
