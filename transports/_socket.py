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

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import zmq

from ._codec import DEFAULT_MAX_BYTES
from ._errors import ClosedResourceError, TransportError

log = logging.getLogger("transports")

_context: zmq.Context | None = None
#: A sender yields to the event loop once per this many sends that did not wait.
SENDS_PER_YIELD = 32


def default_context() -> zmq.Context:
    """The process-wide ZeroMQ context (``inproc://`` needs both ends to share it)."""
    global _context
    if _context is None or _context.closed:
        _context = zmq.Context.instance()
    return _context


class AsyncSocket:
    """Drives a ZeroMQ socket from anyio: a read pump plus non-blocking sends."""

    def __init__(self, socket: zmq.Socket, on_frames: Callable[[list[zmq.Frame]], Any],
                 on_caught_up: Callable[[], None] = lambda: None) -> None:
        self.socket = socket
        self._on_frames = on_frames  # async callable, handles one multipart message
        self._on_caught_up = on_caught_up  # called whenever everything queued has been read
        self._fd = socket.getsockopt(zmq.FD)
        self._wait_scope: anyio.CancelScope | None = None
        self._poked = False
        self._writable = anyio.Event()
        self._stopped = anyio.Event()
        self._started = False
        self._sends_without_yield = 0
        self.closed = False
        self.last_activity = time.monotonic()

    # -- pump -----------------------------------------------------------------
    async def pump(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                   ) -> None:
        """Read forever; run under a task group (``tg.start``), cancel to stop."""
        self._started = True
        try:
            task_status.started()
            while True:
                await self._drain()
                self._on_caught_up()
                with anyio.CancelScope() as scope:
                    self._wait_scope = scope
                    if not self._poked:
                        await anyio.wait_readable(self._fd)
                self._wait_scope = None
                self._poked = False
        finally:
            self._wait_scope = None
            self._stopped.set()

    async def _drain(self) -> None:
        while True:
            events = self.socket.getsockopt(zmq.EVENTS)
            if events & zmq.POLLOUT:
                self._writable.set()
            if not events & zmq.POLLIN:
                return
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.last_activity = time.monotonic()
            await self._on_frames(frames)

    def wake(self) -> None:
        """Make the pump look at the socket (and call ``on_caught_up``) again soon."""
        self._poke()

    def _poke(self) -> None:
        self._poked = True
        if self._wait_scope is not None:
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
                self.socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
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
                await self._writable.wait()
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

    def try_send(self, frames: Sequence[Any]) -> bool:
        """Send now or not at all (heartbeats): False if closed, full or unroutable."""
        if self.closed:
            return False
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:
            return False
        self._after_send()
        return True

    def _after_send(self) -> None:
        # The send may have consumed the edge that announced input: look again.
        if self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
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


def configure(socket: zmq.Socket, *, max_bytes: int | None, heartbeat_interval: float,
              peer_timeout: float) -> None:
    """Options both ends share: message size cap, queue limits, TCP keepalive.

    Liveness is our own heartbeat messages, not ZMTP's HEARTBEAT_IVL: in libzmq
    4.3.x a ZMTP heartbeat timeout on a connection whose input is stopped by
    back-pressure (a full receive pipe) aborts the whole process with
    ``Assertion failed: !_io_error (stream_engine_base.cpp)`` (libzmq issues
    3937, 4364, 4767), and even when it does not, it drops a healthy connection
    that merely has a slow reader. TCP keepalive, answered by the kernel
    whatever the reader does, covers half-open connections instead.
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
