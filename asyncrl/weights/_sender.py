"""Trainer side: versioned weight sends to workers, with real acknowledgements."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, ClassVar, Protocol

import anyio

from transports import Ticket

from .._errors import translating
from .._observe.latency import LatencyHistogram
from .._observe.tracing import ENABLED as TRACING
from .._observe.tracing import record_span
from .._protocol import WEIGHTS_KIND, WeightMeta
from ._codec import FULL_TENSORS, WeightCodec
from ._in_flight import Part, Sent, first_error, gone_part, timeout_error
from ._newest import Lanes, Queued
from ._staging import Stage, free_stage
from ._strategy import WeightStrategy, as_strategy, flat_tensors

__all__ = ["HubLike", "WeightSender"]

log = logging.getLogger("asyncrl.weights")

#: Copies above this many bytes run in a worker thread so the event loop keeps beating.
THREAD_COPY_BYTES = 32 << 20

WorkerIds = int | Iterable[int] | None
Workers = Mapping[int, bytes] | Callable[[], Mapping[int, bytes]]
#: ``{worker_id: relay peer}`` for the workers whose weights go through their host's relay.
RelayRoutes = Callable[[], Mapping[int, bytes]]


class HubLike(Protocol):
    """What a sender needs from its transport: a ``transports.Hub`` has it."""

    async def send_async(self, peers: Iterable[bytes], body: Any, *, kind: str = ...,
                         meta: dict[str, Any] | None = ...) -> Ticket: ...

    async def send(self, peer: bytes, body: Any, *, kind: str = ...,
                   meta: dict[str, Any] | None = ...) -> None: ...


class FormerPeers:
    """The hub identities of workers, kept once they are gone (the latest ``limit``).

    >>> former = FormerPeers()
    >>> former.remember({3: b"host-a/3"})
    >>> former.peer_of(3), former.peer_of(4)
    (b'host-a/3', b'worker-4')
    """

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._peers: dict[int, bytes] = {}  # oldest first

    def remember(self, workers: Mapping[int, bytes]) -> None:
        peers = self._peers
        for worker_id, peer in workers.items():
            if peers.get(worker_id) != peer:
                peers.pop(worker_id, None)
                peers[worker_id] = peer
        while len(peers) > self.limit:
            del peers[next(iter(peers))]

    def peer_of(self, worker_id: int) -> bytes:
        """``worker_id``'s last known identity (``worker-ID`` if it never had one here)."""
        return self._peers.get(worker_id, f"worker-{worker_id}".encode())


class WeightSender:
    """Sends the weights of one model id to workers; each send gets a new version.

    ``send()`` returns once every targeted worker has applied the weights;
    ``send_async()`` returns the version once the message is queued and
    ``wait_ack()`` waits for every outstanding send. Pipelined sends are fine:
    newest wins, so a worker that had not applied version *k* when *k + 1*
    arrived applies only *k + 1* and acks both sends with *k + 1*.

    Newest wins in the trainer's memory too (:mod:`._newest`, the one place of
    that rule): each worker has at most one message in transit (handed to
    ZeroMQ, not acknowledged yet) and one queued here. A newer version replaces
    the queued one, which is never transmitted; both sends are then
    acknowledged with the newer version. The queued version goes out as soon as
    the one in transit is acknowledged (by :meth:`run`, which the collectors
    start; without it, when the sender is next used: ``send_async``,
    ``send_latest``, ``wait_ack``).

    The weights are snapshotted when sent (the model may train on right away)
    into reused buffers (no allocation per send; CUDA weights through one
    pinned staging copy), in the scheme's codec (:mod:`._codec`: full tensors
    by default), and encoded once per group of workers. The scheduler tells the
    sender who the workers are (``add_worker`` / ``remove_worker``) and, for
    ``max_interval``, when each delivered a batch (``note_batch``).

    >>> # trainer side, with a transports.Hub (see docs/weights.md)
    >>> # sender = ZmqWeightSyncScheme().init_on_sender("policy", hub=hub, model=policy,
    >>> #                                               workers={0: b"worker-0"})
    >>> # version = await sender.send_async()      # queued
    >>> # await sender.wait_ack(timeout=30)        # {0: version}
    """

    #: False for senders whose transport shares or writes the model's own memory: they
    #: carry the identity codec only (see :mod:`._codec`).
    takes_codecs: ClassVar[bool] = True

    def __init__(self, model_id: str, hub: HubLike, *, model: Any = None,
                 strategy: WeightStrategy | str = "tensordict",
                 workers: Workers | None = None, max_interval: int = 0,
                 snapshot: bool = True) -> None:
        if max_interval < 0:
            raise ValueError(f"max_interval must be >= 0, got {max_interval}")
        self.model_id = model_id
        self.hub = hub
        self.model = model
        self.strategy = as_strategy(strategy)
        self.max_interval = max_interval
        self.snapshot = snapshot
        #: What the tensors travel as (:mod:`._codec`); the scheme sets its own.
        self.codec: WeightCodec = FULL_TENSORS
        self._version = 0
        self._base = 0  # the version a restored run continues from (continue_from)
        self._latest: Any = None
        self._workers: dict[int, bytes] = {}  # added with add_worker
        self._workers_fn = workers if callable(workers) else None
        self._since: dict[int, int] = {}  # batches delivered since the last update
        self._acked: dict[int, int] = {}  # highest version each worker acked
        self._outstanding: list[Sent] = []
        self._hooks: list[Callable[[], Any]] = []
        self._lock: anyio.Lock | None = None
        self._closed = False
        self._preparing = 0  # the version being written (shared memory: readable already)
        self._routes: RelayRoutes | None = None
        self._lanes = Lanes()  # per worker: in transit and queued (newest wins)
        # A send queued for a worker before it left fails naming its hub identity, which
        # tells a departure from a loss (the scheduler's ``workers`` forgets it at once).
        self._former = FormerPeers()
        self._stages: list[Stage] = []  # snapshot buffers, reused once free
        self._latest_stage: Stage | None = None
        self._wake: anyio.Event | None = None  # set when a version is queued (for run())
        self.copies_sent = 0  # weight messages handed to the hub: one per peer (worker or relay)
        #: Seconds from each ``send_async`` to its last acknowledgement, seen when the
        #: trainer collects the acks (``send()``, ``wait_ack()``, or the next send).
        self.sync_latency = LatencyHistogram()
        #: Called ``(model_id, version, seconds)`` once every worker a send targeted
        #: applied it (the collectors publish a ``weights_applied`` event).
        self.on_applied: Callable[[str, int, float], Any] | None = None
        if workers is not None and not callable(workers):
            for worker_id, peer in workers.items():
                self.add_worker(worker_id, peer)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.model_id!r}, version={self._version}, "
                f"workers={sorted(self.workers)}, outstanding={len(self._outstanding)})")

    # -- state -----------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Version of the last send (0 before the first)."""
        return self._version

    @property
    def workers(self) -> dict[int, bytes]:
        """``{worker_id: peer identity}`` of the workers this sender serves.

        That is the ``workers`` callable's answer (the scheduler's live workers)
        if one was given, plus the workers added with :meth:`add_worker`.
        """
        current = dict(self._workers_fn()) if self._workers_fn is not None else {}
        current.update(self._workers)
        return current

    @property
    def acked_versions(self) -> dict[int, int]:
        """Highest version each worker acknowledged (0 if none)."""
        return {w: self._acked.get(w, 0) for w in self.workers}

    @property
    def outstanding(self) -> int:
        """Sends whose acknowledgements ``wait_ack`` has not collected yet."""
        return len(self._outstanding)

    #: False for senders whose messages only make sense on the trainer's host (shared memory).
    relayable: bool = True

    def set_relay_routes(self, routes: RelayRoutes | None) -> None:
        """Send the weights of the workers ``routes()`` names through their host's relay.

        ``routes()`` returns ``{worker_id: relay peer}`` at each send: those workers
        get one message per relay (the relay fans it out and acks for each of
        them); the others, and every catch-up of a joining worker, go direct.
        """
        if routes is not None and not self.relayable:
            raise ValueError(f"{type(self).__name__} cannot send through relays")
        self._routes = routes

    def add_worker(self, worker_id: int, peer: bytes) -> None:
        """Serve ``worker_id`` (reachable as ``peer`` on the hub). Follow with ``send_latest``."""
        self._workers[worker_id] = peer
        self._since[worker_id] = self.max_interval  # due for its first update
        self._acked.pop(worker_id, None)
        self._lanes.renew(worker_id)  # a new incarnation: nothing of its own is in transit

    def remove_worker(self, worker_id: int) -> None:
        """Stop serving ``worker_id``; its pending acks fail with ``PeerLostError``."""
        peer = self.workers.get(worker_id)
        if peer is not None:
            self._former.remember({worker_id: peer})
        self._workers.pop(worker_id, None)
        self._since.pop(worker_id, None)
        self._acked.pop(worker_id, None)
        lane = self._lanes.pop(worker_id, None)
        if lane is not None and lane.queued is not None:
            self._fail_queued(worker_id, lane.queued)
        for sent in self._outstanding:
            for part in sent.parts:
                if part.relay is not None:
                    if worker_id in part.workers.values():
                        part.gone.add(worker_id)  # the relay still answers for the others
                elif peer is not None and part.workers.get(peer) == worker_id:
                    part.ticket.resolve(peer, lost=True)

    def _fail_queued(self, worker_id: int, queued: Queued) -> None:
        """``worker_id`` is gone: its queued sends, never transmitted, are lost like the
        others, naming its hub identity (``worker-ID`` if it never had one here)."""
        peer = self._former.peer_of(worker_id)
        for sent in queued.sends:
            sent.waiting.discard(worker_id)
            sent.parts.append(gone_part(peer, worker_id))

    def note_batch(self, worker_id: int, count: int = 1) -> None:
        """Record that ``worker_id`` delivered ``count`` batches (for ``max_interval``)."""
        self._since[worker_id] = self._since.get(worker_id, 0) + count

    def register_post_hook(self, hook: Callable[[], Any]) -> None:
        """Call ``hook()`` after each send is queued (as TorchRL's post-hooks)."""
        self._hooks.append(hook)

    def latest(self) -> tuple[int, Any] | None:
        """``(version, payload)`` of the last send, or None: what late joiners receive."""
        return None if self._version == self._base else (self._version, self._latest)

    def continue_from(self, version: int) -> None:
        """Number sends on from ``version`` (a run restored from a checkpoint): the next
        send is ``version + 1``. Only before the first send; joiners keep their own
        weights until then, as with version 0.
        """
        if self._version != self._base:
            raise RuntimeError(f"continue_from({version}) after version {self._version} was "
                               "sent: call it before any send")
        if version < 0:
            raise RuntimeError(f"continue_from({version}) needs a version >= 0 (the version "
                               "the restored run last sent)")
        self._version = self._base = version

    # -- sending ---------------------------------------------------------------------------------
    async def send(self, weights: Any = None, worker_ids: WorkerIds = None, *,
                   timeout: float | None = None) -> int:
        """Send and wait until every targeted worker applied; return the version.

        Raises asyncrl's ``RemoteError`` if a worker failed to apply, ``TimeoutError``
        naming the silent workers, ``PeerLostError`` if one vanished.
        """
        version = await self.send_async(weights, worker_ids)
        await self.wait_ack(timeout)
        return version

    @translating
    async def send_async(self, weights: Any = None, worker_ids: WorkerIds = None) -> int:
        """Queue new weights for ``worker_ids`` (None: all) and return their version.

        ``weights`` may be an ``nn.Module``, a TensorDict or a state dict; None
        takes them from the registered model. With ``max_interval``, workers that
        delivered fewer batches than that since their last update are skipped.
        """
        targets = self._select(worker_ids)
        source = self._source(weights)
        async with self._get_lock():
            version = self._version + 1
            due = [w for w in targets if self._since.get(w, self.max_interval) >= self.max_interval]
            self._preparing = version
            try:
                payload, extra = await self._prepare(source, version)
            finally:
                self._preparing = 0
            self._version, self._latest = version, payload
            self._latest_stage = extra.get("stage")
            if due:
                self._queue(payload, version, due, extra).started = time.monotonic()
            try:
                await self._dispatch()
            finally:
                await self._prepared(extra)
        for hook in self._hooks:
            hook()
        return version

    async def send_latest(self, worker_ids: WorkerIds = None, *,
                          direct: bool = False) -> int | None:
        """Send the last version again to ``worker_ids`` (e.g. a worker that just joined).

        Returns that version, or None if nothing was ever sent (the workers keep
        their own initial weights, version 0). ``direct=True`` bypasses relays.
        """
        return await self._send_latest(self._select(worker_ids), direct=direct)

    async def on_worker_joined(self, worker_id: int) -> int | None:
        """Catch a (late) joiner up: ``send_latest(worker_id, direct=True)``.

        Call it when a worker is admitted and before granting it credits: the
        weights then arrive before its first collect request, because they
        travel on the same socket, ahead of it (hence never through a relay).

        A worker that is gone by now (lost between its welcome and this call, or
        while an earlier send held the lock) is skipped: there is nobody to catch
        up, and its loss is the scheduler's to handle. Returns None then.
        """
        if self._closed:
            return None  # the collector is closing: nobody to catch up
        if worker_id not in self.workers:
            log.info("model %r: worker %d left before its catch-up; nothing sent",
                     self.model_id, worker_id)
            return None
        return await self._send_latest([worker_id], direct=True, skip_gone=True)

    async def _send_latest(self, targets: list[int], *, direct: bool,
                           skip_gone: bool = False) -> int | None:
        async with self._get_lock():
            if skip_gone:  # it may have left while an earlier send held the lock
                known = self.workers
                targets = [w for w in targets if w in known]
            if self._version == self._base or not targets:
                return None
            self._queue(self._latest, self._version, targets, self._latest_extra(),
                        direct=direct)
            await self._dispatch()
        return self._version

    async def run(self) -> None:
        """Transmit each queued version as soon as the message ahead of it is acknowledged.

        Without this task a queued version goes out at the sender's next use
        (``send_async``, ``send_latest``, ``wait_ack``). The collectors run it
        for as long as their hub is open; cancel it to stop.
        """
        while not self._closed:
            ahead = self._lanes.ahead()
            if ahead is None:  # nothing queued: sleep until something is
                self._wake = anyio.Event()
                if self._lanes.ahead() is None:
                    await self._wake.wait()
            elif ahead == "send":
                async with self._get_lock():
                    await self._dispatch()
                if self._lanes.ahead() == "send":
                    await anyio.sleep(0.05)  # not sendable yet: never spin
            else:
                assert isinstance(ahead, Ticket)
                await ahead.done.wait()

    @translating
    async def wait_ack(self, timeout: float | None = None) -> dict[int, int]:
        """Wait for every outstanding send; return ``{worker_id: version applied}``.

        Raises the first ``RemoteError`` a worker sent (its type and traceback
        inside), ``PeerLostError`` for vanished workers, or ``TimeoutError``
        naming the workers still silent after ``timeout`` seconds; sends that
        timed out stay outstanding, so calling ``wait_ack`` again keeps waiting.
        """
        records = list(self._outstanding)
        with anyio.move_on_after(timeout):
            for sent in records:
                await self._settle(sent)
        finished = [s for s in records if not s.pending]
        late = [s for s in records if s.pending]
        self._outstanding = [s for s in self._outstanding if s not in finished]
        applied: dict[int, int] = {}
        failure: BaseException | None = None
        for sent in finished:
            done, errors = sent.outcome(self._newest)
            for worker_id, version in done.items():
                applied[worker_id] = max(applied.get(worker_id, 0), version)
                self._acked[worker_id] = max(self._acked.get(worker_id, 0), version)
            if not errors:
                self._applied(sent)
            if errors and failure is None:
                failure = sent.annotate(first_error(errors), self.model_id)
        if failure is not None:
            raise failure
        if late:
            raise timeout_error(self.model_id, late, timeout)
        return applied

    async def aclose(self) -> None:
        """Release the sender's resources (idempotent); outstanding sends are forgotten."""
        self._closed = True
        if self._wake is not None:
            self._wake.set()  # run() ends
        self._outstanding.clear()
        self._lanes.clear()
        self._stages.clear()
        self._latest = self._latest_stage = None

    async def __aenter__(self) -> WeightSender:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    # -- for subclasses ----------------------------------------------------------------------------
    async def _prepare(self, source: Any, version: int) -> tuple[Any, dict[str, Any]]:
        """Turn ``source`` into the message body for ``version`` (snapshot, shm write...)."""
        return await self._snapshot(self._encoded(self.strategy.extract_weights(source)))

    def _encoded(self, weights: Any) -> Any:
        """``weights`` as the codec sends them (themselves: the identity codec)."""
        if self.codec.identity:
            return weights
        return dict(self.codec.encode(flat_tensors(weights)))

    async def _snapshot(self, weights: Any) -> tuple[Any, dict[str, Any]]:
        """A private copy of ``weights`` in a reused stage (unless ``snapshot=False``)."""
        if not self.snapshot:
            return weights, {}
        flat = flat_tensors(weights)
        stage = self._free_stage(weights, flat)
        if stage.nbytes > THREAD_COPY_BYTES:
            await anyio.to_thread.run_sync(stage.fill, flat)
        else:
            stage.fill(flat)
        return stage.payload, {"stage": stage}

    async def _prepared(self, extra: dict[str, Any]) -> None:
        """The send's snapshot must be complete now (a subclass may fill it while sending)."""

    def _latest_extra(self) -> dict[str, Any]:
        return {"stage": self._latest_stage} if self._latest_stage is not None else {}

    def _on_transmit(self, queued: Queued, ticket: Ticket) -> None:
        """``queued``'s payload was handed to the hub under ``ticket``."""
        stage = queued.extra.get("stage")
        if stage is not None:
            stage.transmitted(ticket)

    # -- internals ---------------------------------------------------------------------------------
    def _queue(self, payload: Any, version: int, worker_ids: list[int],
               extra: dict[str, Any], *, direct: bool = False) -> Sent:
        """Record a send of ``version`` and queue it for each worker (under the lock).

        A version already queued for a worker is replaced: it will never be sent, and
        its send is answered by this one's acknowledgement (newest wins).
        """
        sent = Sent(version, [], extra.get("slot"), extra, waiting=set(worker_ids))
        self._lanes.queue(worker_ids, version, payload, extra, direct, sent)
        for worker_id in worker_ids:
            self._since[worker_id] = 0
        self._prune()
        self._outstanding.append(sent)
        if self._wake is not None:
            self._wake.set()
        return sent

    async def _dispatch(self) -> None:
        """Hand each queued version whose worker has nothing in transit to the hub.

        Under the lock. Workers that get the same version the same way share one
        message (one per relay for relayed ones).
        """
        # Read the workers now, not when the sends were queued: a worker may have
        # been lost while this send waited for the lock or copied the weights.
        workers = self.workers
        self._former.remember(workers)  # a worker gone by the next dispatch is named by it
        groups, gone = self._lanes.ready(workers)
        for worker_id, queued in gone:  # gone before it went out: lost, like any other
            self._fail_queued(worker_id, queued)
        for (_, direct), worker_ids in groups.items():
            await self._transmit(worker_ids, workers, direct=direct or not self.relayable)

    async def _transmit(self, worker_ids: list[int], workers: Mapping[int, bytes], *,
                        direct: bool) -> None:
        queued = self._lanes[worker_ids[0]].queued
        assert queued is not None
        routes = {} if direct or self._routes is None else self._routes()
        peers: dict[bytes, int] = {}
        relayed: dict[bytes, dict[bytes, int]] = {}
        for worker_id in worker_ids:
            relay = routes.get(worker_id)
            if relay is None:
                peers[workers[worker_id]] = worker_id
            else:
                relayed.setdefault(relay, {})[workers[worker_id]] = worker_id
        instance = getattr(self.hub, "instance", None)
        # Versions are numbered per coordinator instance: a worker (or relay) that
        # follows another instance drops this message instead of comparing numbers.
        meta = WeightMeta(self.model_id, queued.version,
                          instance if isinstance(instance, str) else "", codec=self.codec.name)
        if peers:
            ticket = await self._send_payload(list(peers), queued.payload, meta)
            self._in_flight(ticket, peers, None, queued)
        for relay, members in relayed.items():
            # One copy per host: the relay delivers it to each member and acks for all.
            relayed_meta = replace(meta, relay_to=tuple(members))
            ticket = await self._send_payload([relay], queued.payload, relayed_meta)
            self._in_flight(ticket, members, relay, queued)

    async def _send_payload(self, peers: list[bytes], payload: Any, meta: WeightMeta) -> Ticket:
        """Hand ``payload`` to the hub for ``peers``; the ticket's acks say it was applied."""
        return await self.hub.send_async(peers, payload, kind=WEIGHTS_KIND, meta=meta.to_meta())

    def _in_flight(self, ticket: Ticket, members: dict[bytes, int], relay: bytes | None,
                   queued: Queued) -> None:
        """Record that ``ticket`` carries ``queued``'s version to ``members``."""
        self.copies_sent += 1 if relay is not None else len(members)
        self._on_transmit(queued, ticket)
        views: dict[int, dict[bytes, int]] = {}  # id(send) -> its members in this message
        sends: dict[int, Sent] = {}
        for member, worker_id in members.items():
            for sent in self._lanes.hand_over(worker_id, ticket, relay or member).sends:
                views.setdefault(id(sent), {})[member] = worker_id
                sends[id(sent)] = sent
                sent.waiting.discard(worker_id)
        for key, view in views.items():
            sends[key].parts.append(Part(ticket, view, relay))

    async def _settle(self, sent: Sent) -> None:
        """Wait until ``sent`` is acknowledged, transmitting it where it is queued."""
        waited: set[Ticket] = set()
        while sent.pending:
            ticket = self._blocking(sent)
            if ticket is None:  # queued behind nothing any more: send it now
                before = len(sent.waiting)
                async with self._get_lock():
                    await self._dispatch()
                if len(sent.waiting) == before:
                    return  # nothing moved (cannot happen): report it late, never spin
                continue
            if ticket in waited:
                return  # done yet pending: the hub closed; wait_ack reports it
            waited.add(ticket)
            await ticket.done.wait()

    def _blocking(self, sent: Sent) -> Ticket | None:
        """A ticket ``sent`` waits for, or None if only queued workers with a free lane."""
        for part in sent.parts:
            if part.pending:
                return part.ticket
        return self._lanes.blocking(sent.waiting)

    def _free_stage(self, weights: Any, flat: Mapping[str, Any]) -> Stage:
        """A snapshot buffer nothing reads any more (reused), else a new one."""
        used = {id(self._latest_stage)}
        used.update(id(queued.extra.get("stage")) for queued in self._lanes.queued())
        stage, self._stages = free_stage(self._stages, used, weights, flat)
        return stage

    def _prune(self) -> None:
        """Forget finished, successful sends nobody waited for (bounded memory)."""
        keep = []
        for sent in self._outstanding:
            if sent.pending:
                keep.append(sent)
                continue
            done, errors = sent.outcome(self._newest)
            if errors:
                keep.append(sent)  # wait_ack() reports them
                continue
            for worker_id, version in done.items():
                self._acked[worker_id] = max(self._acked.get(worker_id, 0), version)
            self._applied(sent)
        self._outstanding = keep

    def _applied(self, sent: Sent) -> None:
        """Every worker ``sent`` targeted applied it: observe its latency, once."""
        if sent.started is None:
            return  # a catch-up, or observed already
        seconds, sent.started = time.monotonic() - sent.started, None
        self.sync_latency.observe(seconds)
        if TRACING:
            record_span("asyncrl.weight_update", seconds, {
                "asyncrl.model_id": self.model_id, "asyncrl.version": sent.version,
                "asyncrl.worker": sorted({w for part in sent.parts
                                          for w in part.workers.values()})})
        if self.on_applied is not None:
            try:
                self.on_applied(self.model_id, sent.version, seconds)
            except Exception:  # an observer's bug must not fail a weight send
                log.exception("on_applied observer of %r failed", self.model_id)

    @property
    def _newest(self) -> int:
        """The newest version a worker may have applied (acks above it are invalid)."""
        return max(self._version, self._preparing)

    def _select(self, worker_ids: WorkerIds) -> list[int]:
        if self._closed:
            raise RuntimeError(f"weight sender for {self.model_id!r} is closed")
        workers = self.workers
        if worker_ids is None:
            return sorted(workers)
        ids = [worker_ids] if isinstance(worker_ids, int) else list(worker_ids)
        unknown = [w for w in ids if w not in workers]
        if unknown:
            raise ValueError(f"unknown worker id(s) {unknown} for model {self.model_id!r}; "
                             f"known workers are {sorted(workers)}")
        return ids

    def _source(self, weights: Any) -> Any:
        if weights is not None:
            return weights
        if self.model is None:
            raise ValueError(f"no model registered for {self.model_id!r}: pass weights= "
                             "or give init_on_sender a model")
        return self.model

    def _get_lock(self) -> anyio.Lock:
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock
