"""A collector's event stream: typed events fanned out to bounded subscriptions.

Publishing never blocks and never fails: each subscription holds at most
``maxlen`` events; when a slow (or absent) subscriber lets it fill up, the
oldest event is dropped and counted in :attr:`EventStream.dropped`. So
collection never waits for a subscriber, and memory stays bounded whatever
they do.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import anyio

#: * ``"joined"``: a worker was admitted (``worker``, ``name``, ``host``, ``pid``);
#: * ``"lost"``: an admitted worker is gone (``reason``; ``exit_code`` for a local process);
#: * ``"left"``: an admitted remote worker left cleanly (it said so: SIGTERM to its host);
#:   its unfinished work went to the others;
#: * ``"restarted"``: a local slot's process is being respawned (``worker``: the slot,
#:   ``pid``: the dead process); a ``"joined"`` follows when the new one is admitted;
#: * ``"refused"``: a peer's hello (or batch) was refused (``name``, ``host``, ``reason``);
#: * ``"weights_applied"``: every targeted worker acknowledged ``version`` of
#:   ``model_id`` (``seconds``: send to last acknowledgement);
#: * ``"waiting"``: the trainer is blocked waiting for workers: the first fill
#:   (``worker`` None; ``reason`` names the empty places, the hellos refused so far and
#:   the bound, ``startup_timeout``) or the replacement of lost worker ``worker``
#:   (``on_worker_loss="wait"`` / ``"restart"``; ``reason`` names every slot and the
#:   bound, ``replacement_timeout``); once per wait.
#: * ``"left"``: a remote worker left cleanly (its host stopped on SIGTERM); its
#:   unfinished work went to the others.
EventKind = Literal["joined", "lost", "left", "restarted", "refused", "weights_applied",
                   "waiting"]


@dataclass(frozen=True)
class CollectorEvent:
    """Something that happened to a collector's workers or weights.

    >>> e = CollectorEvent("joined", worker=0, name="worker-0", host="h", pid=42)
    >>> e.kind, e.worker
    ('joined', 0)
    """

    kind: EventKind
    worker: int | None = None  #: the worker index (None: not admitted, or all of them)
    name: str = ""
    host: str = ""
    pid: int | None = None
    reason: str = ""  #: why it was lost or refused
    exit_code: int | None = None  #: a lost local process's exit code (negative: signal)
    version: int | None = None  #: ``weights_applied``: the version every worker applied
    model_id: str = ""  #: ``weights_applied``: whose weights
    seconds: float | None = None  #: ``weights_applied``: from the send to the last ack
    time: float = field(default_factory=time.time)  #: when it happened (``time.time()``)


class EventStream:
    """One subscription: ``async for event in stream`` until the collector closes.

    Bounded: at most ``maxlen`` events wait here; when full, the oldest is dropped
    and :attr:`dropped` counts it. ``aclose()`` (or leaving an ``async with``)
    unsubscribes.

    >>> async with collector.events() as events:                     # doctest: +SKIP
    ...     async for event in events:
    ...         print(event.kind, event.worker, events.dropped)
    """

    def __init__(self, fanout: EventFanout, maxlen: int) -> None:
        self._fanout = fanout
        self._mailbox = fanout.attach(maxlen)

    @property
    def dropped(self) -> int:
        """Events dropped because this subscriber fell behind."""
        return self._mailbox.dropped

    @property
    def closed(self) -> bool:
        """The subscription ended (the collector closed, or :meth:`aclose`)."""
        return self._mailbox.closed

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> CollectorEvent:
        event = await self._mailbox.get()
        if event is None:
            raise StopAsyncIteration
        return event

    def get_nowait(self) -> CollectorEvent | None:
        """The next waiting event, or None."""
        return self._mailbox.get_nowait()

    async def aclose(self) -> None:
        """Unsubscribe (idempotent); iteration ends after the events still waiting."""
        self._fanout.detach(self._mailbox)

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _Mailbox:
    """What an :class:`EventFanout` writes for one subscription and its stream reads."""

    def __init__(self, maxlen: int) -> None:
        self._queue: deque[CollectorEvent] = deque(maxlen=maxlen)
        self._wake: anyio.Event | None = None  # made on first wait (needs an event loop)
        self.dropped = 0
        self.closed = False

    def put(self, event: CollectorEvent) -> None:
        """Keep ``event``; when full, drop the oldest and count it (never blocks)."""
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append(event)
        if self._wake is not None:
            self._wake.set()

    def end(self) -> None:
        """No more events: readers finish what waits, then stop."""
        self.closed = True
        if self._wake is not None:
            self._wake.set()

    async def get(self) -> CollectorEvent | None:
        """The next event, waiting for one; None once ended and drained."""
        while not self._queue:
            if self.closed:
                return None
            self._wake = anyio.Event()
            await self._wake.wait()
        self._wake = None
        return self._queue.popleft()

    def get_nowait(self) -> CollectorEvent | None:
        return self._queue.popleft() if self._queue else None


class EventFanout:
    """Copies each published event to every subscription (publish never blocks)."""

    def __init__(self) -> None:
        self._mailboxes: list[_Mailbox] = []
        self._closed = False

    def subscribe(self, maxlen: int = 1024) -> EventStream:
        if maxlen < 1:
            raise ValueError(f"maxlen must be >= 1, got {maxlen}")
        return EventStream(self, maxlen)

    def attach(self, maxlen: int) -> _Mailbox:
        """A new subscription's mailbox (already ended if the collector closed)."""
        mailbox = _Mailbox(maxlen)
        if self._closed:
            mailbox.end()
        else:
            self._mailboxes.append(mailbox)
        return mailbox

    def detach(self, mailbox: _Mailbox) -> None:
        """Stop feeding ``mailbox`` and end it (idempotent)."""
        if mailbox in self._mailboxes:
            self._mailboxes.remove(mailbox)
        mailbox.end()

    def publish(self, event: CollectorEvent) -> None:
        for mailbox in self._mailboxes:
            mailbox.put(event)

    def close(self) -> None:
        """The collector closed: every subscription ends once drained."""
        self._closed = True
        for mailbox in self._mailboxes:
            mailbox.end()
        self._mailboxes.clear()
