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
#: * ``"waiting"``: the trainer is blocked waiting for the replacement of lost worker
#:   ``worker`` (``on_worker_loss="wait"`` / ``"restart"``; ``reason`` names every slot
#:   and the bound, ``replacement_timeout``); once per wait.
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
        self._queue: deque[CollectorEvent] = deque(maxlen=maxlen)
        self._wake: anyio.Event | None = None  # made on first wait (needs an event loop)
        self.dropped = 0  #: events dropped because this subscriber fell behind
        self.closed = False

    def _put(self, event: CollectorEvent) -> None:
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append(event)
        if self._wake is not None:
            self._wake.set()

    def _end(self) -> None:
        self.closed = True
        if self._wake is not None:
            self._wake.set()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> CollectorEvent:
        while not self._queue:
            if self.closed:
                raise StopAsyncIteration
            self._wake = anyio.Event()
            await self._wake.wait()
        self._wake = None
        return self._queue.popleft()

    def get_nowait(self) -> CollectorEvent | None:
        """The next waiting event, or None."""
        return self._queue.popleft() if self._queue else None

    async def aclose(self) -> None:
        """Unsubscribe (idempotent); iteration ends after the events still waiting."""
        self._fanout._unsubscribe(self)
        self._end()

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class EventFanout:
    """Copies each published event to every subscription (publish never blocks)."""

    def __init__(self) -> None:
        self._streams: list[EventStream] = []
        self._closed = False

    def subscribe(self, maxlen: int = 1024) -> EventStream:
        if maxlen < 1:
            raise ValueError(f"maxlen must be >= 1, got {maxlen}")
        stream = EventStream(self, maxlen)
        if self._closed:
            stream._end()
        else:
            self._streams.append(stream)
        return stream

    def publish(self, event: CollectorEvent) -> None:
        for stream in self._streams:
            stream._put(event)

    def close(self) -> None:
        """The collector closed: every subscription ends once drained."""
        self._closed = True
        for stream in self._streams:
            stream._end()
        self._streams.clear()

    def _unsubscribe(self, stream: EventStream) -> None:
        if stream in self._streams:
            self._streams.remove(stream)


__all__ = ["CollectorEvent", "EventFanout", "EventKind", "EventStream"]
