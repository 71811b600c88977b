"""Trainer side: versioned weight sends to workers, with real acknowledgements."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from transports import PeerLostError, RemoteError, Ticket

from ._receiver import WEIGHTS_KIND
from ._strategy import WeightStrategy, as_strategy, clone_weights, flat_tensors

__all__ = ["HubLike", "WeightSender"]

#: Copies above this many bytes run in a worker thread so the event loop keeps beating.
THREAD_COPY_BYTES = 32 << 20

WorkerIds = int | Iterable[int] | None
Workers = Mapping[int, bytes] | Callable[[], Mapping[int, bytes]]


class HubLike(Protocol):
    """What a sender needs from its transport: a ``transports.Hub`` has it."""

    async def send_async(self, peers: Iterable[bytes], body: Any, *, kind: str = ...,
                         meta: dict[str, Any] | None = ...) -> Ticket: ...


@dataclass(eq=False)
class _Sent:
    """One send waiting for its acknowledgements."""

    ticket: Ticket
    version: int
    workers: dict[bytes, int]  # peer -> worker id
    slot: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


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
        if peer is not None:
            for sent in self._outstanding:
                if sent.workers.get(peer) == worker_id:
                    sent.ticket.resolve(peer, lost=True)

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
            payload, extra = await self._prepare(source, version)
            self._version, self._latest = version, payload
            if due:
                await self._post(payload, version, due, extra)
        for hook in self._hooks:
            hook()
        return version

    async def send_latest(self, worker_ids: WorkerIds = None) -> int | None:
        """Send the last version again to ``worker_ids`` (e.g. a worker that just joined).

        Returns that version, or None if nothing was ever sent (the workers keep
        their own initial weights, version 0).
        """
        targets = self._select(worker_ids)
        async with self._get_lock():
            if self._version == 0 or not targets:
                return None
            await self._post(self._latest, self._version, targets, self._latest_extra())
        return self._version

    async def on_worker_joined(self, worker_id: int) -> int | None:
        """Catch a (late) joiner up: same as ``send_latest(worker_id)``.

        Call it when a worker is admitted and before granting it credits: the
        weights then arrive before its first collect request.
        """
        return await self.send_latest(worker_id)

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
                await sent.ticket.done.wait()
        finished = [s for s in records if not s.ticket.pending]
        late = [s for s in records if s.ticket.pending]
        self._outstanding = [s for s in self._outstanding if s not in finished]
        applied: dict[int, int] = {}
        failure: BaseException | None = None
        for sent in finished:
            try:
                acks = sent.ticket.outcome()
            except (RemoteError, PeerLostError) as exc:
                failure = failure or self._annotate(exc, sent)
                continue
            for peer, result in acks.items():
                worker_id = sent.workers[peer]
                version = _acked_version(result, sent.version)
                applied[worker_id] = max(applied.get(worker_id, 0), version)
                self._acked[worker_id] = max(self._acked.get(worker_id, 0), version)
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
                    extra: dict[str, Any]) -> Ticket:
        workers = self.workers
        peers = {workers[w]: w for w in worker_ids}
        meta = {"model_id": self.model_id, "version": version}
        ticket = await self.hub.send_async(list(peers), payload, kind=WEIGHTS_KIND, meta=meta)
        self._prune()
        self._outstanding.append(_Sent(ticket, version, peers, extra.get("slot"), extra))
        for worker_id in worker_ids:
            self._since[worker_id] = 0
        return ticket

    def _prune(self) -> None:
        """Forget finished, successful sends nobody waited for (bounded memory)."""
        keep = []
        for sent in self._outstanding:
            ticket = sent.ticket
            if ticket.pending or ticket.errors or ticket.lost:
                keep.append(sent)
                continue
            for peer, result in ticket.acks.items():
                worker_id = sent.workers[peer]
                version = _acked_version(result, sent.version)
                self._acked[worker_id] = max(self._acked.get(worker_id, 0), version)
        self._outstanding = keep

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
        ids = sorted(sent.workers.values())
        exc.add_note(f"while sending version {sent.version} of model {self.model_id!r} "
                     f"to worker(s) {ids}")
        return exc

    def _timeout_error(self, late: list[_Sent], timeout: float | None) -> TimeoutError:
        silent = sorted({s.workers[p] for s in late for p in s.ticket.pending})
        peers = sorted({p.decode(errors="replace") for s in late for p in s.ticket.pending})
        versions = sorted({s.version for s in late})
        return TimeoutError(
            f"model {self.model_id!r}: no acknowledgement of version(s) {versions} within "
            f"{timeout} s from worker(s) {silent} (peers {', '.join(peers)}); they may be busy, "
            "stuck or gone. The sends stay outstanding: call wait_ack() again to keep waiting."
        )


def _acked_version(result: Any, default: int) -> int:
    version = result.get("version") if isinstance(result, dict) else None
    return version if type(version) is int else default


def _nbytes(weights: Any) -> int:
    try:
        return sum(t.numel() * t.element_size() for t in flat_tensors(weights).values())
    except TypeError:
        return 0
