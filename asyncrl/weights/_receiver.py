"""Worker side: hold the newest weights, apply them at a step boundary, ack with the version."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from tensordict import TensorDictBase

from transports import Message, ProtocolError

from .._protocol import WEIGHTS_KIND, WeightMeta, WeightsApplied, decode
from ._codec import FULL_TENSORS, WeightCodec
from ._errors import WeightSyncError
from ._newest import Offer, offer
from ._strategy import WeightStrategy, as_strategy, flat_tensors

__all__ = ["AckRoute", "Acker", "PendingUpdate", "WeightAck", "WeightReceiver",
           "WeightReceiverGroup"]

class Acker(Protocol):
    """What :meth:`WeightReceiver.flush_acks` needs: a ``transports.Link`` has it."""

    async def ack(self, message: Message, result: Any = None, *,
                  error: BaseException | None = None) -> None: ...


class AckRoute(enum.Enum):
    """The way a weight message came, which is the way its ack goes back.

    >>> AckRoute("relay") is AckRoute.RELAY
    True
    >>> applier.deliver(message, AckRoute.RELAY)   # from this host's relay  # doctest: +SKIP
    """

    #: Over the worker's own link, to the coordinator that sent it.
    DIRECT = "direct"
    #: Over the link to this host's relay, which acks upstream for all its members.
    RELAY = "relay"


class WeightAck(NamedTuple):
    """One acknowledgement to send: ``(message, result, error, route)``.

    ``result`` is the msgpack ack body ``{"model_id": ..., "version": applied}``
    (None when ``error`` is set). ``route`` is the way the message came (see
    :class:`~asyncrl.weights.WeightApplier`, which picks the link by it). Send
    it with ``await ack.send(link)`` or ``link.ack(message, result)`` /
    ``link.ack(message, error=error)``.

    >>> for ack in receiver.take_acks():     # doctest: +SKIP
    ...     await ack.send(link)              # the ack goes back the way its message came
    """

    message: Message
    result: dict[str, Any] | None
    error: BaseException | None = None
    route: AckRoute = AckRoute.DIRECT

    @property
    def version(self) -> int | None:
        """Version applied, or None for an error ack."""
        return None if self.result is None else self.result["version"]

    async def send(self, link: Acker) -> None:
        if self.error is not None:
            await link.ack(self.message, error=self.error)
        else:
            await link.ack(self.message, self.result)


@dataclass(frozen=True, slots=True)
class PendingUpdate:
    """A version held until the next step boundary: what a receiver's ``_apply`` takes."""

    version: int
    payload: Any


class WeightReceiver:
    """Applies the weights of one model id on a worker, at step boundaries only.

    Three calls drive it, usually from the worker's code:

    * ``on_message(msg)`` (event loop, for each ``kind == "weights"`` message):
      stores the update, applies nothing. A newer version replaces an unapplied
      older one (newest wins) and the older message is acked with the newer
      version once that is applied.
    * ``apply_pending()`` (at a step boundary, between batches, or right away
      when the rollout is idle; any thread): copies the newest pending update into
      the model, sets :attr:`version`, calls ``on_apply(version)`` (e.g. to set the
      rollout's ``policy_version``). A failure is kept as an error ack; it never
      raises into the rollout.
    * ``await flush_acks(link)`` (event loop): sends the acks due.

    >>> import torch
    >>> from torch import nn
    >>> from transports import Message
    >>> policy = nn.Linear(2, 1)
    >>> receiver = WeightReceiver("policy", policy)
    >>> update = {"weight": torch.ones(1, 2), "bias": torch.zeros(1)}
    >>> receiver.on_message(Message(b"", "weights", 7, update,
    ...                             {"model_id": "policy", "version": 3}, True))
    >>> receiver.apply_pending(), receiver.version
    (True, 3)
    >>> [(ack.message.seq, ack.result) for ack in receiver.take_acks()]
    [(7, {'model_id': 'policy', 'version': 3})]
    """

    #: True for receivers that assemble versions streamed in chunks (``WeightChunk``).
    takes_chunks: bool = False
    #: True for receivers that, once a message attached them, read later versions from a
    #: word the sender publishes in shared memory (their acks say so: no more messages).
    reads_published: bool = False
    #: Why the model is half-written, if it is (``in_place``); None while it is whole.
    torn: str | None = None

    def __init__(self, model_id: str, model: Any, *,
                 strategy: WeightStrategy | str = "tensordict",
                 on_apply: Callable[[int], None] | None = None,
                 link: Acker | None = None) -> None:
        self.model_id = model_id
        self.model = model
        self.strategy = as_strategy(strategy)
        self.on_apply = on_apply
        self.link = link
        #: What the tensors come as (:mod:`._codec`); the scheme sets its own.
        self.codec: WeightCodec = FULL_TENSORS
        #: Called on the event loop when an update that could not be applied on arrival
        #: (its bytes were still coming, e.g. by broadcast) can be (the applier sets it).
        self.on_ready: Callable[[], None] | None = None
        self.last_error: BaseException | None = None
        #: The coordinator instance whose versions :attr:`version` counts ("": not told).
        self.instance = ""
        self._version = 0
        self._pending: PendingUpdate | None = None
        self._waiting: list[tuple[Message, AckRoute]] = []  # acked with the version applied next
        self._acks: list[WeightAck] = []
        self._lock = threading.Lock()  # guards the three fields above
        self._apply_lock = threading.Lock()  # one apply at a time

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.model_id!r}, version={self._version}, "
                f"pending={self.pending_version})")

    @property
    def version(self) -> int:
        """Version applied to the model; 0 until the first update (the worker's own weights)."""
        return self._version

    @property
    def pending_version(self) -> int | None:
        """Version waiting for :meth:`apply_pending`, if any."""
        pending = self._pending
        return None if pending is None else pending.version

    @property
    def has_pending(self) -> bool:
        """Cheap check for the hot loop (no lock)."""
        return self._pending is not None

    @property
    def has_acks(self) -> bool:
        """Whether an ack is due (see :meth:`take_acks`)."""
        return bool(self._acks)

    @property
    def needs_park(self) -> bool:
        """Whether the model must not be used now: a version is being written into it
        (``ZmqWeightSyncScheme(in_place=True)``); see :meth:`park`."""
        return False

    # -- event-loop side --------------------------------------------------------------------
    def follow(self, instance: str) -> bool:
        """Count versions in the numbering of coordinator ``instance`` (from its welcome).

        Versions are numbered per coordinator instance: a restarted trainer starts
        again at 1. Told a new instance, the receiver starts afresh: version 0 (the
        model keeps the weights it holds until the new trainer sends its own), the
        old instance's pending update dropped and its waiting messages acked with an
        error. Returns True if that happened. ``""`` (an old coordinator) changes nothing.
        """
        if not instance or instance == self.instance:
            return False
        with self._apply_lock, self._lock:
            known, self.instance = self.instance, instance
            if not known:
                return False  # the first coordinator: nothing to forget
            waiting = self._waiting
            self._pending, self._waiting, self._version = None, [], 0
            stale = WeightSyncError(f"the coordinator restarted (instance {known} -> "
                                    f"{instance}) before these weights were applied")
            for message, route in waiting:
                self._queue_ack(message, route, None, stale)
        return True

    def on_message(self, message: Message, route: AckRoute = AckRoute.DIRECT) -> None:
        """Take a ``weights`` message; never raises (a bad one is acked with the error).

        Its acks carry ``route``, the way it came (see :class:`AckRoute`).
        """
        try:
            version = self._check_meta(message)
            payload = self._load(message)
        except Exception as exc:
            self._ack_all([(message, route)], None, exc)
            return
        self._offer(version, payload, message, route)

    def _offer(self, version: int, payload: Any, message: Message, route: AckRoute) -> None:
        """Keep ``payload`` as the pending update unless a newer version is held or pending."""
        with self._lock:
            pending = self._pending
            decision = offer(version, self._version, None if pending is None else pending.version)
            dropped = payload
            if decision is Offer.HELD:
                self._queue_ack(message, route, self._version, None)
            else:  # acked with the version applied next: this one, or the pending newer one
                self._waiting.append((message, route))
                if decision is Offer.NEWEST:
                    dropped = pending.payload if pending is not None else None
                    self._pending = PendingUpdate(version, payload)
            if dropped is not None:
                self._discard(dropped)

    def take_acks(self) -> list[WeightAck]:
        """The acks due (each once); send them with ``WeightAck.send(link)``."""
        with self._lock:
            acks, self._acks = self._acks, []
        return acks

    async def flush_acks(self, link: Acker | None = None) -> int:
        """Send the acks due over ``link`` (default: the one given at construction).

        Returns how many were sent. If cancelled or failing midway, the unsent
        acks stay queued for the next call.
        """
        over = link or self.link
        if over is None:
            raise ValueError(f"receiver {self.model_id!r}: no link to send acks over")
        return await _send_in_order(self.take_acks(), lambda ack: over, self._requeue)

    def _requeue(self, acks: list[WeightAck]) -> None:
        with self._lock:
            self._acks[:0] = acks

    # -- rollout side ---------------------------------------------------------------------------
    def apply_pending(self) -> bool:
        """Apply the newest pending update; True if the model changed (see :attr:`version`)."""
        if self._pending is None:  # hot-loop fast path
            return False
        with self._apply_lock:
            with self._lock:
                update, waiting = self._pending, self._waiting
                self._pending, self._waiting = None, []
            if update is None:
                return False
            if offer(update.version, self._version, None) is Offer.HELD:  # applied meanwhile
                self._ack_all(waiting, self._version, None)
                return False
            try:
                applied = self._apply(update)
            except Exception as exc:
                self.last_error = exc
                self._ack_all(waiting, None, exc)
                return False
            self._version = applied
            if self.on_apply is not None:
                self.on_apply(applied)
            self._ack_all(waiting, applied, None)
            return True

    def admitted(self, index: int) -> None:
        """The worker was welcomed as worker ``index`` (event loop); most receivers ignore it."""

    def park(self) -> None:
        """The model is not in use until :attr:`needs_park` is false again (event loop): a
        receiver that writes into the model as bytes come may start now. Most ignore it."""

    def close(self) -> None:
        """Release what the receiver holds (idempotent)."""
        with self._lock:
            self._pending = None

    def _discard(self, payload: Any) -> None:
        """``payload`` will never be applied (superseded); under the lock. For subclasses."""

    async def aclose(self) -> None:
        self.close()

    # -- for subclasses -------------------------------------------------------------------------
    def _load(self, message: Message) -> Any:
        """Validate a message's body on arrival (event loop); returns what ``_apply`` takes."""
        if not isinstance(message.body, Mapping | TensorDictBase):
            raise ProtocolError(f"weights for {self.model_id!r} must be a TensorDict or a state "
                                f"dict, got {type(message.body).__name__}")
        return message.body

    def _apply(self, update: PendingUpdate) -> int:
        """Copy ``update`` into the model and return the version now held."""
        self.strategy.apply_weights(self.model, self._decoded(update.payload))
        return update.version

    def _decoded(self, received: Any) -> Any:
        """What came, as full tensors for the model (itself: the identity codec)."""
        if self.codec.identity:
            return received
        return self.codec.decode(flat_tensors(received), flat_tensors(self.model, live=True))

    # -- internals ------------------------------------------------------------------------------
    def _check_meta(self, message: Message) -> int:
        """The version ``message`` carries, once its meta is read and meant for us."""
        return self._read_meta(message).version

    def _read_meta(self, message: Message) -> WeightMeta:
        """``message``'s meta, checked: meant for this receiver, from the instance followed."""
        meta = decode(WeightMeta, message.meta)
        # Weights stamped by another coordinator instance than the one we follow (a
        # relay forwarding what the dead trainer sent): their version means nothing here.
        if self.instance and meta.instance and meta.instance != self.instance:
            raise WeightSyncError(
                f"weights for {self.model_id!r} from coordinator instance {meta.instance!r}, "
                f"but this worker was welcomed by {self.instance!r}: dropped (stale)")
        if meta.model_id != self.model_id:
            raise ProtocolError(f"weights for model {meta.model_id[:100]!r} reached the "
                                f"receiver of {self.model_id!r}")
        if meta.codec != self.codec.name:
            raise WeightSyncError(
                f"weights for {self.model_id!r} are encoded as {meta.codec or 'full tensors'!r}"
                f", but this worker's scheme decodes {self.codec.name or 'full tensors'!r}: "
                "give the worker the trainer's scheme")
        if meta.chunk is not None and not self.takes_chunks:
            raise WeightSyncError(
                f"weights for {self.model_id!r} came in chunks, but this worker's scheme for "
                f"it ({type(self).__name__}) takes whole messages only: give the worker the "
                "trainer's scheme (ZmqWeightSyncScheme), or chunk_bytes=0 on the trainer")
        return meta

    def _queue_ack(self, message: Message, route: AckRoute, version: int | None,
                   error: BaseException | None) -> None:
        if message.needs_ack:
            result = (WeightsApplied(self.model_id, version, self.reads_published).to_body()
                      if error is None and version is not None else None)
            self._acks.append(WeightAck(message, result, error, route))

    def _ack_all(self, messages: list[tuple[Message, AckRoute]], version: int | None,
                 error: BaseException | None) -> None:
        with self._lock:
            for message, route in messages:
                self._queue_ack(message, route, version, error)


class WeightReceiverGroup:
    """The receivers of one worker, one per model id, driven as one.

    >>> from torch import nn
    >>> group = WeightReceiverGroup([WeightReceiver("policy", nn.Linear(2, 1))])
    >>> group.versions
    {'policy': 0}
    """

    def __init__(self, receivers: Iterable[WeightReceiver] = (), *,
                 on_apply: Callable[[str, int], None] | None = None) -> None:
        self._receivers: dict[str, WeightReceiver] = {}
        self._each: tuple[WeightReceiver, ...] = ()
        # Acks due here: unknown model ids, and what an interrupted flush left unsent.
        self._due: list[WeightAck] = []
        self.on_apply = on_apply
        for receiver in receivers:
            self.add(receiver)

    def add(self, receiver: WeightReceiver) -> None:
        if receiver.model_id in self._receivers:
            raise ValueError(f"a receiver for {receiver.model_id!r} is already registered")
        self._receivers[receiver.model_id] = receiver
        self._each = tuple(self._receivers.values())  # for the per-step check
        if self.on_apply is not None and receiver.on_apply is None:
            on_apply, model_id = self.on_apply, receiver.model_id
            receiver.on_apply = lambda version: on_apply(model_id, version)

    def __getitem__(self, model_id: str) -> WeightReceiver:
        return self._receivers[model_id]

    def __iter__(self) -> Iterator[WeightReceiver]:
        return iter(self._receivers.values())

    def __len__(self) -> int:
        return len(self._receivers)

    @staticmethod
    def handles(message: Message) -> bool:
        """True for the messages :meth:`on_message` takes."""
        return message.kind == WEIGHTS_KIND

    @property
    def versions(self) -> dict[str, int]:
        """Applied version per model id (what a worker reports in its hello or batches)."""
        return {model_id: r.version for model_id, r in self._receivers.items()}

    @property
    def has_pending(self) -> bool:
        for receiver in self._each:  # (every step: no generator, no dict view)
            if receiver.has_pending:
                return True
        return False

    def follow(self, instance: str) -> bool:
        """Tell every receiver the coordinator instance (see :meth:`WeightReceiver.follow`)."""
        changed = [receiver.follow(instance) for receiver in self._receivers.values()]
        return any(changed)

    def admitted(self, index: int) -> None:
        """Tell every receiver the worker's index (see :meth:`WeightReceiver.admitted`)."""
        for receiver in self._receivers.values():
            receiver.admitted(index)

    def on_message(self, message: Message, route: AckRoute = AckRoute.DIRECT) -> None:
        """Route a ``weights`` message to its model id's receiver (never raises)."""
        model_id = message.meta.get("model_id")
        receiver = self._receivers.get(model_id) if isinstance(model_id, str) else None
        if receiver is None:
            if message.needs_ack:
                self._due.append(WeightAck(message, None, LookupError(
                    f"this worker has no weight receiver for model {model_id!r}; it has "
                    f"{sorted(self._receivers)}: give the worker a scheme for that model id"),
                    route))
            return
        receiver.on_message(message, route)

    @property
    def needs_park(self) -> bool:
        return any(r.needs_park for r in self._receivers.values())

    @property
    def has_acks(self) -> bool:
        """Whether an ack is due (a version published in shared memory is acked by nobody)."""
        return bool(self._due) or any(r.has_acks for r in self._receivers.values())

    def park(self) -> None:
        for receiver in self._receivers.values():
            receiver.park()

    def check_whole(self) -> None:
        """Raise ``WeightSyncError`` if a model is half-written (an ``in_place`` stream failed)."""
        for receiver in self._receivers.values():
            if receiver.torn is not None:
                raise WeightSyncError(f"{receiver.torn}; this worker does not step with it "
                                      "(send the weights again, or restart the worker)")

    def apply_pending(self) -> dict[str, int]:
        """Apply what is pending for every model; return ``{model_id: version applied}``."""
        applied = {}
        for model_id, receiver in self._receivers.items():
            if receiver.has_pending and receiver.apply_pending():
                applied[model_id] = receiver.version
        return applied

    def take_acks(self) -> list[WeightAck]:
        acks, self._due = self._due, []
        for receiver in self._receivers.values():
            acks.extend(receiver.take_acks())
        return acks

    async def flush_acks(self, link: Acker) -> int:
        """Send every ack due over ``link``; see :meth:`WeightReceiver.flush_acks`."""
        return await self.flush_routed_acks(lambda ack: link)

    async def flush_routed_acks(self, link_for: Callable[[WeightAck], Acker | None]) -> int:
        """Send every ack due over ``link_for(ack)`` (None drops it); return how many went.

        If cancelled or failing midway, the unsent acks stay queued for the next call.
        """
        return await _send_in_order(self.take_acks(), link_for, self._requeue)

    def _requeue(self, acks: list[WeightAck]) -> None:
        self._due[:0] = acks

    async def aclose(self) -> None:
        for receiver in self._receivers.values():
            await receiver.aclose()


async def _send_in_order(acks: Sequence[WeightAck],
                         link_for: Callable[[WeightAck], Acker | None],
                         requeue: Callable[[list[WeightAck]], None]) -> int:
    """Send ``acks`` in order, each over ``link_for(ack)`` (None: dropped); return how many went.

    If cancelled or failing midway, the unsent ones go to ``requeue``: a flush
    either sends an ack or keeps it, never loses it.
    """
    sent = 0
    for index, ack in enumerate(acks):
        link = link_for(ack)
        if link is None:
            continue
        try:
            await ack.send(link)
        except BaseException:
            requeue(list(acks[index:]))
            raise
        sent += 1
    return sent
