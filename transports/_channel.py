"""What :class:`Hub` and :class:`Link` share: lifecycle, the receive queue, heartbeats."""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from typing import Any, NamedTuple

import anyio
import anyio.abc
import anyio.lowlevel
import zmq

from ._codec import Decoded, decode_message, encode_message
from ._curve import CurveClient, CurveServer
from ._errors import ClosedResourceError, ProtocolError, TransportError
from ._ratelimit import RateLimitedLog
from ._resource import TaskGroupResource
from ._socket import AsyncSocket, configure, default_context
from ._trust import PeerKeys
from ._types import Message, PeerEvent

log = logging.getLogger("transports")

PING = "ping"
ACK = "ack"
BYE = "bye"
#: The body of the goodbye a hub sends a peer whose CURVE key it revoked (an older or
#: plain goodbye has none): the link then says it was refused, not that the hub closed.
BYE_REVOKED = {"reason": "revoked"}
#: The body of the goodbye of a hub whose owner is done for good (a finished run): every
#: peer, admitted or still asking to be, learns that there is nothing to wait for.
BYE_FINISHED = {"reason": "finished"}


class ChannelStatistics(NamedTuple):
    """Counters of one channel (in the spirit of anyio's ``statistics()``).

    >>> stats = hub.statistics()                                 # doctest: +SKIP
    >>> stats.peers, stats.bad_messages, stats.pending_acks       # doctest: +SKIP
    (2, 0, 0)
    """

    peers: int
    messages_received: int
    messages_sent: int
    bad_messages: int
    queued: int
    pending_acks: int


#: A consumer that finds items waiting yields to the event loop once per this many.
GETS_PER_YIELD = 32


class Inbox:
    """The bounded queue between a channel's pump and its consumers.

    A memory object stream with a buffer, tuned for the hot path: ``get()``
    parks only when the queue is empty and ``put_nowait()`` never yields, so a
    message costs no extra trip through the scheduler on either side. ``get()``
    still honours cancellation at once, a cancelled ``get()`` takes nothing, and
    a consumer that keeps finding items yields every ``GETS_PER_YIELD`` of them.
    ``put()`` waits while the queue is full: back-pressure on the pump.
    """

    def __init__(self, size: int) -> None:
        self._items: deque[Any] = deque()
        self._size = max(1, size)
        self._not_empty: anyio.Event | None = None
        self._not_full: anyio.Event | None = None
        self._gets_without_yield = 0
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put_nowait(self, item: Any, *, force: bool = False) -> bool:
        """Queue ``item``; False if full (unless ``force``) or closed."""
        if self.closed or (len(self._items) >= self._size and not force):
            return False
        self._items.append(item)
        if self._not_empty is not None:
            self._not_empty.set()
            self._not_empty = None
        return True

    async def put(self, item: Any) -> None:
        """Queue ``item``, waiting while the queue is full; dropped once closed."""
        while not self.put_nowait(item) and not self.closed:
            if self._not_full is None:
                self._not_full = anyio.Event()
            await self._not_full.wait()

    def get_nowait(self) -> Any:
        """The oldest item; ``anyio.WouldBlock`` if none, ``anyio.EndOfStream`` once closed."""
        if self._items:
            item = self._items.popleft()
            if self._not_full is not None:
                self._not_full.set()
                self._not_full = None
            return item
        if self.closed:
            raise anyio.EndOfStream
        raise anyio.WouldBlock

    async def get(self) -> Any:
        await anyio.lowlevel.checkpoint_if_cancelled()
        while not self._items and not self.closed:
            if self._not_empty is None:
                self._not_empty = anyio.Event()
            await self._not_empty.wait()
            self._gets_without_yield = 0
        item = self.get_nowait()
        self._gets_without_yield += 1
        if self._gets_without_yield >= GETS_PER_YIELD:
            self._gets_without_yield = 0
            await anyio.lowlevel.cancel_shielded_checkpoint()  # the item is ours: no cancel
        return item

    def close(self) -> None:
        """Wake everyone: getters drain what is left, then get ``EndOfStream``."""
        self.closed = True
        for event in (self._not_empty, self._not_full):
            if event is not None:
                event.set()
        self._not_empty = self._not_full = None


class Channel(TaskGroupResource):
    """Base of :class:`Hub` and :class:`Link`. Use them through ``async with``."""

    _socket_type: int
    _leading_bytes = 1  # frames received as bytes: [header] (a Hub adds the identity)

    def __init__(
        self,
        endpoint: str,
        *,
        heartbeat_interval: float = 1.0,
        peer_timeout: float = 10.0,
        max_bytes: int | None = None,
        queue_size: int = 1024,
        linger: float = 1.0,
        context: zmq.Context[Any] | None = None,
        curve: CurveServer | CurveClient | None = None,
    ) -> None:
        if heartbeat_interval <= 0 or peer_timeout <= heartbeat_interval:
            raise ValueError(
                f"need 0 < heartbeat_interval < peer_timeout, got {heartbeat_interval} "
                f"and {peer_timeout}"
            )
        self.endpoint = endpoint
        self.heartbeat_interval = heartbeat_interval
        self.peer_timeout = peer_timeout
        self.max_bytes = max_bytes
        self._linger_ms = int(linger * 1000)
        self._context = context or default_context()
        self.curve = curve
        self._trust: PeerKeys | None = None  # a CURVE hub's ZAP domain and key bindings
        self._io: AsyncSocket | None = None
        self._ping: list[Any] = []  # encoded once the socket is open
        self._inbox = Inbox(queue_size)
        self._background = anyio.CancelScope()
        self._background_done: anyio.Event | None = None  # made in _open (async context)
        self._closing = False
        self._next_liveness_check = 0.0
        self._beat_due = 0.0  # when the heartbeat loop should run next (0: not started)
        self._awake_since = 0.0  # a peer's silence counts from here at the earliest
        self._seq = 0
        self._received = 0
        self._sent = 0
        self._bad = 0
        self._limited_log = RateLimitedLog(log)  # hostile input must not flood the log

    # -- lifecycle --------------------------------------------------------------
    async def _open(self) -> None:
        socket = self._context.socket(self._socket_type)
        try:
            configure(socket, max_bytes=self.max_bytes, heartbeat_interval=self.heartbeat_interval,
                      peer_timeout=self.peer_timeout)
            self._secure(socket)
            self._prepare(socket)
        except BaseException:
            self._before_close(socket)
            socket.close(linger=0)
            self._stop_authenticator()
            raise
        if self._trust is not None:
            self._trust.bound(self.endpoint)  # its refusals name the real address
        self._io = AsyncSocket(socket, self._handle, self._deliver_nowait, self._deliver,
                               self._caught_up, leading_bytes=self._leading_bytes,
                               keep_metadata=self._trust is not None)
        self._io.translate = self._translate_send_error  # type: ignore[method-assign]
        self._ping = encode_message(None, kind=PING, meta=self._ping_meta())
        # The pump must be running before anyone can call aclose(), which waits for it.
        self._background_done = anyio.Event()
        await self._task_group.start(self._run_background)

    async def _run_background(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        assert self._io is not None
        try:
            with self._background:
                async with anyio.create_task_group() as tg:
                    await tg.start(self._io.pump)
                    tg.start_soon(self._heartbeat_loop)
                    self._start_watchers(tg)
                    task_status.started()
        finally:
            assert self._background_done is not None
            self._background_done.set()

    async def aclose(self) -> None:
        """Stop the background tasks and close the socket. Idempotent, safe when cancelled."""
        if self._closing or self._io is None:
            return
        self._closing = True
        self._background.cancel()
        with anyio.CancelScope(shield=True):
            await self._io.wait_stopped()  # never close an fd a task still waits on
            if self._background_done is not None:
                with anyio.move_on_after(5):  # nor a watcher's (see _start_watchers)
                    await self._background_done.wait()
            self._farewell(self._io.socket)
            self._before_close(self._io.socket)
            self._io.close(self._linger_ms)
            self._stop_authenticator()
            self._on_close()
            self._inbox.close()

    def _secure(self, socket: zmq.Socket[Any]) -> None:
        if self.curve is None:
            return
        if isinstance(self.curve, CurveServer):
            # The ZAP handler must run before the first peer connects.
            self._trust = PeerKeys(self._context, self.curve, secrets.token_hex(8))
            self._trust.apply(socket)
        else:
            self.curve.apply(socket)

    def _stop_authenticator(self) -> None:
        if self._trust is not None:
            self._trust.close()

    @property
    def refused_peers(self) -> int:
        """Connections refused because their CURVE key is not authorized (or revoked)."""
        return self._trust.refused if self._trust else 0

    def _closed_error(self) -> ClosedResourceError:
        return ClosedResourceError(f"{type(self).__name__} on {self.endpoint} is closed")

    def _require_open(self) -> AsyncSocket:
        if self._io is None:
            raise TransportError(f"{type(self).__name__} is not open: use it with 'async with'")
        if self._closing:
            raise self._closed_error()
        return self._io

    # -- receiving ----------------------------------------------------------------
    def _decode(self, frames: list[Any], origin: str) -> Decoded | None:
        try:
            return decode_message(frames, max_bytes=self.max_bytes)
        except ProtocolError as exc:
            # Hostile or broken input is dropped and counted; the loop goes on.
            self._bad += 1  # exact, whatever the log shows
            self._limited_log.warning("malformed", "dropped a malformed message from %s: %s",
                                      origin, exc)
            return None

    def _deliver_nowait(self, item: Message | PeerEvent) -> bool:
        if not self._inbox.put_nowait(item):
            return False
        self._received += isinstance(item, Message)
        return True

    async def _deliver(self, item: Message | PeerEvent) -> None:
        self._received += isinstance(item, Message)
        await self._inbox.put(item)  # waits while full (back-pressure); dropped if closing

    async def _next_item(self) -> Message | PeerEvent:
        self._require_open()
        try:
            item: Message | PeerEvent = await self._inbox.get()
            return item
        except anyio.EndOfStream:
            raise self._closed_error() from None

    def _next_item_nowait(self) -> Message | PeerEvent | None:
        self._require_open()
        try:
            item: Message | PeerEvent | None = self._inbox.get_nowait()
            return item
        except anyio.WouldBlock:
            return None
        except anyio.EndOfStream:
            raise self._closed_error() from None

    # -- sending ------------------------------------------------------------------
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    async def _send_frames(self, frames: list[Any]) -> None:
        await self._require_open().send(frames)
        self._sent += 1

    async def _heartbeat_loop(self) -> None:
        # Pings never wait: a peer whose queue is full must not delay the others.
        assert self._io is not None
        while True:
            self._send_pings(self._ping)
            self._io.wake()  # the pump checks liveness once it has read everything
            now = time.monotonic()
            self._note_stall(now)  # before the next due time hides it from the pump
            self._beat_due = now + self.heartbeat_interval
            await anyio.sleep(self.heartbeat_interval)

    def _ping_meta(self) -> dict[str, Any]:
        return {}

    def _note_stall(self, now: float) -> None:
        if self._beat_due and now - self._beat_due > self.peer_timeout / 2:
            # Our own heartbeat is long overdue: this process did not run (a training
            # step held the loop, or the process was frozen). What peers sent meanwhile
            # may still be on its way from ZeroMQ's I/O thread, and their silence over
            # that time says nothing: count it from now.
            self._awake_since = now

    def _silence(self, seen: float, now: float) -> float:
        """How long a peer last heard at ``seen`` has been silent while we listened."""
        return now - max(seen, self._awake_since)

    def _caught_up(self) -> None:
        # Silence is judged only here, with every received heartbeat accounted for:
        # neither a busy event loop nor a consumer that lags makes a live peer "lost".
        now = time.monotonic()
        self._note_stall(now)
        if now >= self._next_liveness_check:
            self._next_liveness_check = now + self.heartbeat_interval / 2
            self._check_liveness(now)

    # -- hooks for subclasses ---------------------------------------------------------
    def _prepare(self, socket: zmq.Socket[Any]) -> None:
        raise NotImplementedError

    def _handle(self, frames: list[Any]) -> Message | None:
        """Take in one received message; return what the consumers should get, if anything.

        Synchronous, so that it can run in the pump or in its reader callback.
        """
        raise NotImplementedError

    def _send_pings(self, ping: list[Any]) -> None:
        raise NotImplementedError

    def _check_liveness(self, now: float) -> None:
        raise NotImplementedError

    def _on_close(self) -> None:
        pass

    def _start_watchers(self, tg: anyio.abc.TaskGroup) -> None:
        """Start more background tasks (cancelled, and waited for, before the socket closes)."""

    def _farewell(self, socket: zmq.Socket[Any]) -> None:
        """Best effort, never blocking: tell the other end we are leaving."""

    def _before_close(self, socket: zmq.Socket[Any]) -> None:
        """Last call before ``socket`` is closed (in the thread that owns it)."""

    def _translate_send_error(self, exc: zmq.ZMQError) -> Exception:
        return TransportError(f"ZeroMQ send on {self.endpoint} failed: {exc}")
