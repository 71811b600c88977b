"""Trainer side: versioned weight sends to workers, with real acknowledgements."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from transports import PeerLostError, RemoteError, Ticket

from ._fanout import RELAY_TO, parse_relay_ack
from ._receiver import WEIGHTS_KIND
from ._strategy import WeightStrategy, as_strategy, clone_weights, flat_tensors

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


@dataclass(eq=False)
class _Part:
    """One hub message of a send: to workers directly, or to one relay for its members."""

    ticket: Ticket
    workers: dict[bytes, int]  # peer (direct) or member identity (relayed) -> worker id
    relay: bytes | None = None
    gone: set[int] = field(default_factory=set)  # relayed members removed since

    def silent(self) -> list[int]:
        if self.relay is not None:
            return sorted(self.workers.values()) if self.ticket.pending else []
        return [self.workers[p] for p in self.ticket.pending]


@dataclass(eq=False)
class _Sent:
    """One send (one version to some workers) waiting for its acknowledgements."""

    version: int
    parts: list[_Part]
    slot: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    _outcome: tuple[dict[int, int], list[BaseException]] | None = None

    @property
    def tickets(self) -> list[Ticket]:
        return [part.ticket for part in self.parts]

    @property
    def pending(self) -> bool:
        return any(part.ticket.pending for part in self.parts)

    def outcome(self, latest: int) -> tuple[dict[int, int], list[BaseException]]:
        """``({worker_id: version applied}, [errors])`` of a send that is not pending.

        ``latest`` is the sender's newest version: what a worker may have applied
        instead of this one.
        """
        if self._outcome is None:
            self._outcome = self._read_outcome(latest)
        return self._outcome

    def _read_outcome(self, latest: int) -> tuple[dict[int, int], list[BaseException]]:
        applied: dict[int, int] = {}
        errors: list[BaseException] = []
        for part in self.parts:
            ticket = part.ticket
            if part.relay is None:
                for peer, result in ticket.acks.items():
                    version = _acked_version(result, self.version)
                    if self.version <= version <= latest:
                        applied[part.workers[peer]] = version
                    else:  # e.g. a worker still counting in a previous trainer's versions
                        errors.append(_bad_ack(peer, version, self.version, latest))
                errors.extend(ticket.errors.values())
                if ticket.lost:
                    errors.append(PeerLostError(sorted(ticket.lost),
                                                f"before acknowledging message {ticket.seq}"))
                continue
            via = part.relay.decode(errors="replace")
            members = sorted(part.workers)
            for error in ticket.errors.values():  # the relay refused the message itself
                error.add_note(f"relay {via} failed to deliver to worker(s) "
                               f"{sorted(part.workers.values())}")
                errors.append(error)
            if ticket.lost:
                errors.append(PeerLostError(members, f"(their relay {via} went silent before "
                                                     f"acknowledging message {ticket.seq})"))
            if ticket.acks:
                live = {m: w for m, w in part.workers.items() if w not in part.gone}
                done, failed = parse_relay_ack(ticket.acks[part.relay], live, part.relay,
                                               self.version, latest)
                applied.update(done)
                errors.extend(failed.values())
                gone = [m for m, w in part.workers.items() if w in part.gone]
                if gone:
                    errors.append(PeerLostError(gone, "(removed while their relay delivered)"))
        return applied, errors


class WeightSender:
    """Sends the weights of one model id to workers; each send gets a new version.

    ``send()`` returns once every targeted worker has applied the weights;
    ``send_async()`` returns the version once the message is queued and
    ``wait_ack()`` waits for every outstanding send. Pipelined sends are fine:
    newest wins, so a worker that had not applied version *k* when *k + 1*
    arrived applies only *k + 1* and acks both sends with *k + 1*.

    The weights are snapshotted when sent (the model may train on right away)
    and encoded once whatever the number of workers. The scheduler tells the
    sender who the workers are (``add_worker`` / ``remove_worker``) and, for
    ``max_interval``, when each delivered a batch (``note_batch``).

    >>> # trainer side, with a transports.Hub (see docs/weights.md)
    >>> # sender = ZmqWeightSyncScheme().init_on_sender("policy", hub=hub, model=policy,
    >>> #                                               workers={0: b"worker-0"})
    >>> # version = await sender.send_async()      # queued
    >>> # await sender.wait_ack(timeout=30)        # {0: version}
    """

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
        self._version = 0
        self._latest: Any = None
        self._workers: dict[int, bytes] = {}  # added with add_worker
        self._workers_fn = workers if callable(workers) else None
        self._since: dict[int, int] = {}  # batches delivered since the last update
        self._acked: dict[int, int] = {}  # highest version each worker acked
        self._outstanding: list[_Sent] = []
        self._hooks: list[Callable[[], Any]] = []
        self._lock: anyio.Lock | None = None
        self._closed = False
        self._preparing = 0  # the version being written (shared memory: readable already)
        self._routes: RelayRoutes | None = None
        self.copies_sent = 0  # weight messages handed to the hub: one per peer (worker or relay)
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

    def remove_worker(self, worker_id: int) -> None:
        """Stop serving ``worker_id``; its pending acks fail with ``PeerLostError``."""
        peer = self.workers.get(worker_id)
        self._workers.pop(worker_id, None)
        self._since.pop(worker_id, None)
        self._acked.pop(worker_id, None)
        for sent in self._outstanding:
            for part in sent.parts:
                if part.relay is not None:
                    if worker_id in part.workers.values():
                        part.gone.add(worker_id)  # the relay still answers for the others
                elif peer is not None and part.workers.get(peer) == worker_id:
                    part.ticket.resolve(peer, lost=True)

    def note_batch(self, worker_id: int, count: int = 1) -> None:
        """Record that ``worker_id`` delivered ``count`` batches (for ``max_interval``)."""
        self._since[worker_id] = self._since.get(worker_id, 0) + count

    def register_post_hook(self, hook: Callable[[], Any]) -> None:
        """Call ``hook()`` after each send is queued (as TorchRL's post-hooks)."""
        self._hooks.append(hook)

    def latest(self) -> tuple[int, Any] | None:
        """``(version, payload)`` of the last send, or None: what late joiners receive."""
        return None if self._version == 0 else (self._version, self._latest)

    # -- sending ---------------------------------------------------------------------------------
    async def send(self, weights: Any = None, worker_ids: WorkerIds = None, *,
                   timeout: float | None = None) -> int:
        """Send and wait until every targeted worker applied; return the version.

        Raises ``RemoteError`` if a worker failed to apply, ``TimeoutError``
        naming the silent workers, ``PeerLostError`` if one vanished.
        """
        version = await self.send_async(weights, worker_ids)
        await self.wait_ack(timeout)
        return version

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
            if due:
                await self._post(payload, version, due, extra)
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
            if self._version == 0 or not targets:
                return None
            await self._post(self._latest, self._version, targets, self._latest_extra(),
                             direct=direct)
        return self._version

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
                for ticket in sent.tickets:
                    await ticket.done.wait()
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
            if errors and failure is None:
                failure = self._annotate(_first_error(errors), sent)
        if failure is not None:
            raise failure
        if late:
            raise self._timeout_error(late, timeout)
        return applied

    async def aclose(self) -> None:
        """Release the sender's resources (idempotent); outstanding sends are forgotten."""
        self._closed = True
        self._outstanding.clear()
        self._latest = None

    async def __aenter__(self) -> WeightSender:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    # -- for subclasses ----------------------------------------------------------------------------
    async def _prepare(self, source: Any, version: int) -> tuple[Any, dict[str, Any]]:
        """Turn ``source`` into the message body for ``version`` (snapshot, shm write...)."""
        weights = self.strategy.extract_weights(source)
        if self.snapshot:
            if _nbytes(weights) > THREAD_COPY_BYTES:
                weights = await anyio.to_thread.run_sync(clone_weights, weights)
            else:
                weights = clone_weights(weights)
        return weights, {}

    def _latest_extra(self) -> dict[str, Any]:
        return {}

    # -- internals ---------------------------------------------------------------------------------
    async def _post(self, payload: Any, version: int, worker_ids: list[int],
                    extra: dict[str, Any], *, direct: bool = False) -> _Sent:
        # Read the workers now, not when the targets were chosen: a worker may have
        # been lost while this send waited for the lock or copied the weights.
        workers = self.workers
        routes = {} if direct or self._routes is None else self._routes()
        peers: dict[bytes, int] = {}
        relayed: dict[bytes, dict[bytes, int]] = {}
        parts = []
        gone = [w for w in worker_ids if w not in workers]
        if gone:
            parts.append(_gone_part(gone))  # wait_ack reports them lost, like any other
            worker_ids = [w for w in worker_ids if w in workers]
        for worker_id in worker_ids:
            relay = routes.get(worker_id)
            if relay is None:
                peers[workers[worker_id]] = worker_id
            else:
                relayed.setdefault(relay, {})[workers[worker_id]] = worker_id
        meta: dict[str, Any] = {"model_id": self.model_id, "version": version}
        instance = getattr(self.hub, "instance", None)
        if isinstance(instance, str):
            # Versions are numbered per coordinator instance: a worker (or relay) that
            # follows another instance drops this message instead of comparing numbers.
            meta["instance"] = instance
        if peers:
            ticket = await self.hub.send_async(list(peers), payload, kind=WEIGHTS_KIND, meta=meta)
            parts.append(_Part(ticket, peers))
        for relay, members in relayed.items():
            # One copy per host: the relay delivers it to each member and acks for all.
            ticket = await self.hub.send_async([relay], payload, kind=WEIGHTS_KIND,
                                               meta={**meta, RELAY_TO: list(members)})
            parts.append(_Part(ticket, members, relay))
        self.copies_sent += len(peers) + len(relayed)
        self._prune()
        sent = _Sent(version, parts, extra.get("slot"), extra)
        self._outstanding.append(sent)
        for worker_id in worker_ids:
            self._since[worker_id] = 0
        return sent

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
        self._outstanding = keep

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

    def _annotate(self, exc: BaseException, sent: _Sent) -> BaseException:
        ids = sorted(w for part in sent.parts for w in part.workers.values())
        exc.add_note(f"while sending version {sent.version} of model {self.model_id!r} "
                     f"to worker(s) {ids}")
        return exc

    def _timeout_error(self, late: list[_Sent], timeout: float | None) -> TimeoutError:
        parts = [part for s in late for part in s.parts]
        silent = sorted({w for part in parts for w in part.silent()})
        peers = sorted({p.decode(errors="replace") for part in parts for p in part.ticket.pending})
        versions = sorted({s.version for s in late})
        return TimeoutError(
            f"model {self.model_id!r}: no acknowledgement of version(s) {versions} within "
            f"{timeout} s from worker(s) {silent} (peers {', '.join(peers)}); they may be busy, "
            "stuck or gone. The sends stay outstanding: call wait_ack() again to keep waiting."
        )


def _gone_part(worker_ids: list[int]) -> _Part:
    """The part of a send for workers that left before it went out: lost, never sent."""
    names = {f"worker-{w}".encode(): w for w in worker_ids}
    ticket = Ticket(seq=0, peers=frozenset(names))
    for name in names:
        ticket.resolve(name, lost=True)
    return _Part(ticket, names)


def _first_error(errors: list[BaseException]) -> BaseException:
    """A worker's own failure before a lost peer; the others are named in a note."""
    first = next((e for e in errors if isinstance(e, RemoteError)), errors[0])
    if len(errors) > 1:
        first.add_note(f"{len(errors) - 1} more failure(s) in the same send: "
                       + "; ".join(str(e).splitlines()[0] for e in errors if e is not first))
    return first


def _acked_version(result: Any, default: int) -> int:
    version = result.get("version") if isinstance(result, dict) else None
    return version if type(version) is int else default


def _bad_ack(peer: bytes, version: int, sent: int, latest: int) -> RemoteError:
    return RemoteError(
        f"worker acknowledged version {version} for a send of version {sent}; expected "
        f"{sent}..{latest} (newest wins). It may count versions of another trainer "
        "instance: restart it, or update asyncrl on its host",
        peer=peer, remote_type="asyncrl.weights.WeightSyncError")


def _nbytes(weights: Any) -> int:
    try:
        return sum(t.numel() * t.element_size() for t in flat_tensors(weights).values())
    except TypeError:
        return 0
