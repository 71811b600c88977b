"""An anyio driver for one ZeroMQ socket, shared by :class:`Hub` and :class:`Link`.

ZeroMQ exposes one file descriptor per socket, readable whenever the socket's
*events* may have changed. It is edge-triggered: any call on the socket (a send
included) may consume the edge while messages wait, so after every wake-up and
every send we read ``zmq.EVENTS`` and drain until it says nothing is left.

One pump task owns reading. Senders send directly with ``NOBLOCK``; if ZeroMQ
is full (high-water mark) they wait for the pump to see ``POLLOUT``. After a
send that left input pending, the sender pokes the pump out of its wait.

Whenever the pump has read everything there was, it calls ``on_caught_up``:
the only moment at which a peer's silence means something (a pump that is
starved by a busy task, or blocked on a full receive queue, has simply not
read the peer's heartbeats yet).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import anyio
import anyio.abc
import anyio.lowlevel
import zmq

from ._codec import DEFAULT_MAX_BYTES
from ._errors import ClosedResourceError, TransportError

log = logging.getLogger("transports")

_context: zmq.Context[Any] | None = None
#: A sender yields to the event loop once per this many sends that did not wait.
SENDS_PER_YIELD = 32
#: The pump yields to the event loop after reading this many messages or bytes in a row.
DRAIN_MESSAGES = 32
DRAIN_BYTES = 1 << 20

# Plain ints: ZeroMQ's enum flags cost a Python-level enum operation per use.
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_SNDMORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_RCVMORE = int(zmq.RCVMORE)
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)


def default_context() -> zmq.Context[Any]:
    """The process-wide ZeroMQ context (``inproc://`` needs both ends to share it)."""
    global _context
    if _context is None or _context.closed:
        _context = zmq.Context.instance()
    return _context


def shutdown(linger: float = 1.0) -> None:
    """Deliver what is still queued (up to ``linger`` s), then end ZeroMQ in this process.

    Call it last in a process that leaves through ``os._exit``: the error
    report or goodbye it just sent is flushed first.
    """
    global _context
    if _context is not None and not _context.closed:
        _context.destroy(linger=int(linger * 1000))
    _context = None


class AsyncSocket:
    """Drives a ZeroMQ socket from anyio: a read pump plus non-blocking sends.

    ``leading_bytes`` says how many leading frames of each message are received
    as ``bytes`` (routing identity, header: small, and cheaper to copy than to
    wrap); the frames after them stay zero-copy ``zmq.Frame`` objects. With
    ``keep_metadata`` the first frame is a ``zmq.Frame`` too (``frame.get("User-Id")``).
    """

    def __init__(self, socket: zmq.Socket[Any], handle: Callable[[list[Any]], Any],
                 deliver_nowait: Callable[[Any], bool],
                 deliver: Callable[[Any], Awaitable[None]],
                 on_caught_up: Callable[[], None] = lambda: None, *,
                 leading_bytes: int = 1, keep_metadata: bool = False) -> None:
        self.socket = socket
        self._handle = handle  # one message's frames -> an item for the consumers, or None
        self._deliver_nowait = deliver_nowait  # queue an item now, or say False
        self._deliver = deliver  # queue an item, waiting for room (back-pressure)
        self._on_caught_up = on_caught_up  # called whenever everything queued has been read
        self._stash: Any = None  # an item the reader callback could not queue
        self._error: BaseException | None = None  # raised in the reader callback
        self._leading_bytes = leading_bytes
        # The first frame stays a zmq.Frame: its metadata (CURVE's User-Id) is readable.
        self._copy_first = not keep_metadata
        self._fd = cast(int, socket.getsockopt(zmq.FD))
        self._wait_scope: anyio.CancelScope | None = None
        self._poked = False
        self._parked = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._future: asyncio.Future[None] | None = None
        self._watching = False
        self._writable = anyio.Event()
        self._send_waiters = 0
        self._stopped = anyio.Event()
        self._started = False
        self._sends_without_yield = 0
        self.closed = False

    # -- pump -----------------------------------------------------------------
    async def pump(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                   ) -> None:
        """Read forever; run under a task group (``tg.start``), cancel to stop."""
        self._started = True
        wait = self._waiter_for_backend()
        try:
            task_status.started()
            while True:
                # One cancel scope serves every wait until a poke cancels it: creating
                # one per message would cost more than the rest of the wait.
                with anyio.CancelScope() as scope:
                    self._wait_scope = scope
                    while True:
                        await self._drain()
                        self._on_caught_up()
                        if self._poked:
                            self._poked = False
                            await anyio.lowlevel.checkpoint()  # let others run, look again
                            continue
                        self._parked = True
                        try:
                            await wait()
                        finally:
                            self._parked = False
                        await self._take_over()
                self._poked = False
        finally:
            self._wait_scope = None
            self._stop_watching()
            self._stopped.set()

    # asyncio's add_reader()/remove_reader() around every wait (what anyio.wait_readable
    # does) cost two epoll_ctl calls and a handful of allocations per message. On
    # asyncio the descriptor stays registered while the pump keeps up; the callback
    # unregisters it when it fires while the pump is busy, so that a pump held up by
    # a full inbox never makes the event loop spin on a readable descriptor.
    def _waiter_for_backend(self) -> Callable[[], Awaitable[None]]:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or asyncio.current_task() is None:
            return lambda: anyio.wait_readable(self._fd)  # trio: one epoll_ctl per wait
        try:
            loop.add_reader(self._fd, self._on_readable)
        except NotImplementedError:  # a loop without readers (Windows' proactor)
            return lambda: anyio.wait_readable(self._fd)
        self._loop, self._watching = loop, True
        return self._wait_asyncio

    async def _wait_asyncio(self) -> None:
        assert self._loop is not None
        future = self._loop.create_future()
        self._future = future
        if not self._watching:
            self._loop.add_reader(self._fd, self._on_readable)
            self._watching = True
        try:
            await future
        finally:
            self._future = None

    def _on_readable(self) -> None:
        future = self._future
        if future is None:
            self._stop_watching()  # busy: looked at again before the next wait
            return
        if future.done():
            return
        # The pump is parked: read right here. Waking the pump task only to hand
        # the message to the consumer task would cost one more trip through the
        # event loop per message. Anything that must wait goes to the pump.
        try:
            if self._drain_now():
                self._on_caught_up()
                return
        except BaseException as exc:  # a bug, not bad input: let the pump raise it
            self._error = exc
        future.set_result(None)

    async def _take_over(self) -> None:
        """After a wake-up: finish what the reader callback could not."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._stash is not None:
            item, self._stash = self._stash, None
            await self._deliver(item)

    def _stop_watching(self) -> None:
        if self._watching and self._loop is not None:
            self._loop.remove_reader(self._fd)
        self._watching = False

    async def _drain(self) -> None:
        # Read until ZeroMQ says nothing is left: a failed recv or EVENTS without
        # POLLIN both re-arm the descriptor. Woken up, we try recv straight away
        # (no EVENTS call first): a wake-up almost always means a message.
        budget, count = DRAIN_BYTES, 0
        while True:
            read = self._read_one()
            if read is not None:
                item, size = read
                if item is not None and not self._deliver_nowait(item):
                    await self._deliver(item)  # the inbox is full: back-pressure
                # A backlog is not read in one go: the consumers (and the heartbeats)
                # run every few messages or megabytes, and free what they are done
                # with instead of the whole backlog being alive at once.
                count += 1
                budget -= size
                if budget <= 0 or count >= DRAIN_MESSAGES:
                    budget, count = DRAIN_BYTES, 0
                    await anyio.lowlevel.checkpoint()
            if not self._input_waiting(read is not None):
                return

    def _drain_now(self) -> bool:
        """``_drain`` without waiting: True once caught up, False to hand over to the pump."""
        budget, count = DRAIN_BYTES, 0
        while True:
            read = self._read_one()
            if read is not None:
                item, size = read
                if item is not None and not self._deliver_nowait(item):
                    self._stash = item
                    return False
                count += 1
                budget -= size
                if budget <= 0 or count >= DRAIN_MESSAGES:
                    return False  # a backlog: the pump reads on, yielding as it goes
            if not self._input_waiting(read is not None):
                return True

    def _read_one(self) -> tuple[Any, int] | None:
        """Receive and handle one message: ``(item or None, bytes)``; None if none is waiting."""
        try:
            frames = self._recv()
        except zmq.Again:
            return None
        return self._handle(frames), sum(len(frame) for frame in frames)

    def _input_waiting(self, read: bool) -> bool:
        """Re-read ``EVENTS`` (edge-triggered descriptor): wake senders; True if input waits.

        After a failed recv EVENTS is only needed for blocked senders: the failed
        recv itself re-armed the descriptor.
        """
        events = cast(int, self.socket.get(_EVENTS)) if read or self._send_waiters else 0
        if events & _POLLOUT:
            self._writable.set()
        return bool(events & _POLLIN)

    def _recv(self) -> list[Any]:
        socket = self.socket
        frames: list[Any] = [socket.recv(_NOBLOCK, copy=self._copy_first)]
        # A multipart message arrives whole: once its first frame is here, all are.
        while socket.get(_RCVMORE):
            frames.append(socket.recv(_NOBLOCK, copy=len(frames) < self._leading_bytes))
        return frames

    def wake(self) -> None:
        """Make the pump look at the socket (and call ``on_caught_up``) again soon."""
        self._poke()

    def _poke(self) -> None:
        self._poked = True
        # Only a parked pump is interrupted: elsewhere a cancellation could land in
        # the middle of a delivery, and the pump looks at `_poked` before parking.
        if self._parked and self._wait_scope is not None:
            self._wait_scope.cancel()

    # -- send -----------------------------------------------------------------
    async def send(self, frames: Sequence[Any]) -> None:
        """Queue one multipart message, waiting (not spinning) while ZeroMQ is full.

        A cancelled send raises before sending; a send that went through returns.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        retries = 0
        while True:
            if self.closed:
                raise ClosedResourceError("the channel is closed")
            try:
                self._send(frames)
                break
            except zmq.Again:
                if retries:
                    # POLLOUT can be true for the socket while this one peer's pipe is
                    # still full (ROUTER): back off instead of spinning.
                    await anyio.sleep(min(0.05, 0.0005 * 2**retries))
                retries += 1
                if self._writable.is_set():
                    self._writable = anyio.Event()
                self._poke()  # the pump re-reads EVENTS and sets _writable on POLLOUT
                self._send_waiters += 1
                try:
                    await self._writable.wait()
                finally:
                    self._send_waiters -= 1
            except zmq.ZMQError as exc:
                raise self.translate(exc) from exc
        self._after_send()
        if retries:
            return  # it waited: other tasks ran
        # A task that sends in a loop must still let the pump and the heartbeats run,
        # but yielding on every send would cost a scheduler round trip per message.
        self._sends_without_yield += 1
        if self._sends_without_yield >= SENDS_PER_YIELD:
            self._sends_without_yield = 0
            await anyio.lowlevel.cancel_shielded_checkpoint()

    def try_send(self, frames: Sequence[Any], *, from_handle: bool = False) -> bool:
        """Send now or not at all (heartbeats): False if closed, full or unroutable.

        ``from_handle=True`` is for a send made inside ``handle``, in the middle of
        a drain: the drain reads ``zmq.EVENTS`` again before it parks, so the pump
        is not poked (a poke there would cancel the wait the reader callback is
        about to complete).
        """
        if self.closed:
            return False
        try:
            self._send(frames)
        except zmq.ZMQError:
            return False
        if not from_handle:
            self._after_send()
        return True

    def routable(self, frames: Sequence[Any]) -> bool:
        """Send now if possible (a ROUTER's probe): False only if the peer has no route.

        A full queue or a closed socket says nothing about the route: True.
        """
        if self.closed:
            return True
        try:
            self._send(frames)
        except zmq.ZMQError as exc:
            return exc.errno != errno.EHOSTUNREACH
        self._after_send()
        return True

    def _send(self, frames: Sequence[Any]) -> None:
        # send_multipart, minus its per-frame type checks and enum flag arithmetic.
        # Only the first frame can fail (EAGAIN, EHOSTUNREACH): the rest follow it.
        socket = self.socket
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            socket.send(frame, _NOBLOCK_SNDMORE if i < last else _NOBLOCK, copy=False)

    def _after_send(self) -> None:
        # The send may have consumed the edge that announced input: look again.
        if cast(int, self.socket.get(_EVENTS)) & _POLLIN:
            self._poke()

    def translate(self, exc: zmq.ZMQError) -> Exception:
        return TransportError(f"ZeroMQ send failed: {exc}")

    # -- close ----------------------------------------------------------------
    async def wait_stopped(self) -> None:
        if not self._started:
            return  # cancelled before it ever ran: nothing waits on the descriptor
        with anyio.move_on_after(5):
            await self._stopped.wait()

    def close(self, linger_ms: int) -> None:
        if self.closed:
            return
        self.closed = True
        self._writable.set()  # release blocked senders; they see `closed`
        self.socket.close(linger=linger_ms)


def configure(socket: zmq.Socket[Any], *, max_bytes: int | None, heartbeat_interval: float,
              peer_timeout: float) -> None:
    """Options both ends share: message size cap, queue limits, TCP keepalive.

    Liveness is our own heartbeat messages, not ZMTP's HEARTBEAT_IVL: in libzmq
    4.3.x a ZMTP heartbeat timeout on a connection whose input is stopped by
    back-pressure (a full receive pipe) aborts the whole process with
    ``Assertion failed: !_io_error (stream_engine_base.cpp)`` (libzmq issues
    3937, 4364, 4767), and even when it does not, it drops a healthy connection
    that merely has a slow reader. TCP keepalive, answered by the kernel
    whatever the reader does, covers half-open connections instead.

    Silence alone is not loss on a :class:`Link`: its hub may be a trainer whose
    event loop a training step holds. The link also watches its connection
    (ZeroMQ's socket monitor) and bounds unacknowledged data (``TCP_MAXRT``),
    since its heartbeats keep its connection from ever being idle, the one case
    keepalive probes.
    """
    del heartbeat_interval  # app-level heartbeats use it, ZeroMQ does not
    limit = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    socket.setsockopt(zmq.MAXMSGSIZE, limit)
    socket.setsockopt(zmq.TCP_KEEPALIVE, 1)
    socket.setsockopt(zmq.TCP_KEEPALIVE_IDLE, max(1, int(peer_timeout)))
    socket.setsockopt(zmq.TCP_KEEPALIVE_INTVL, max(1, int(peer_timeout / 3)))
    socket.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)
    socket.setsockopt(zmq.RCVHWM, 10_000)
    socket.setsockopt(zmq.SNDHWM, 10_000)
