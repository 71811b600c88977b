"""The worker's end: a DEALER socket connected to one hub."""

from __future__ import annotations

import logging
import os
import secrets
import socket as _socket
import time
from typing import Any

import anyio
import zmq
from zmq.utils.monitor import parse_monitor_message

from ._channel import ACK, BYE, BYE_FINISHED, BYE_REVOKED, PING, Channel, ChannelStatistics
from ._codec import encode_message
from ._disconnects import stop_monitor
from ._error_payload import ErrorPayload
from ._errors import PeerLostError
from ._types import Message, PeerEvent

HUB = b""

log = logging.getLogger("transports")

# The connection events the link's liveness needs: a ZMTP handshake done (the hub's
# ZeroMQ is there, whatever its event loop is doing) and a connection closed.
_UP = int(zmq.EVENT_HANDSHAKE_SUCCEEDED)
_DOWN = int(zmq.EVENT_DISCONNECTED)
# The hub's ZAP handler answered our CURVE handshake with a status code: 400 is a
# denied key (revoked, or never authorized), final for this key; 300 is temporary.
_DENIED = int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_ZAP_DENIED = 400


def random_identity(prefix: str) -> bytes:
    """``prefix-<32 hex digits>``: readable in logs, and 128 random bits nobody can guess.

    A hub's route to a peer is its identity (and ``ROUTER_HANDOVER`` gives the
    route to whoever presents it last), so an identity must not be guessable
    from what is public (host name, pid, slot). The prefix is cut so that the
    whole identity fits ZeroMQ's 255 bytes.
    """
    return f"{prefix[:200]}-{secrets.token_hex(16)}".encode()


def default_identity() -> bytes:
    """``host-pid-random``: readable in logs, with 128 random bits (unguessable)."""
    return random_identity(f"{_socket.gethostname()}-{os.getpid()}")


class Link(Channel):
    """One upstream hub: send messages, receive messages, acknowledge them.

    The link connects (and reconnects) in the background; ZeroMQ queues sends
    until the hub is there. ``recv()`` raises :class:`PeerLostError` once the hub
    is *gone*: it said goodbye, or it has been silent for longer than
    ``peer_timeout`` seconds and no connection to it is up (it was never
    reached, or its connection closed and did not come back). A hub that is
    silent over a live connection is *busy* (a training step that holds its
    event loop), not gone: the link logs it once and keeps waiting (a frozen
    hub process too: it is the same to TCP). A dead process's connection is
    closed by its kernel; a dead host's or a cut network's by TCP (the link
    gives unacknowledged data ``peer_timeout`` seconds, and keepalive probes
    an idle connection), so a worker never waits forever on a coordinator
    that is gone.

    >>> async with Link("tcp://127.0.0.1:5555", identity=b"w0") as link:  # doctest: +SKIP
    ...     msg = await link.recv()
    ...     if msg.needs_ack:
    ...         await link.ack(msg, result={"version": 3})
    """

    _socket_type = zmq.DEALER

    def __init__(self, endpoint: str, *, identity: bytes | str | None = None,
                 **options: Any) -> None:
        super().__init__(endpoint, **options)
        if isinstance(identity, str):
            identity = identity.encode()
        if identity is not None and (not 0 < len(identity) <= 255 or identity[:1] == b"\0"):
            raise ValueError(f"identity must be 1 to 255 bytes, not NUL-led: {identity!r}")
        self.identity = identity or default_identity()
        self._last_seen = time.monotonic()
        self._lost = False
        self._back: anyio.Event | None = None  # set when the hub is heard again
        self._hub_instance: str | None = None  # changes when the coordinator restarts
        self._loss_reported = False  # recv raised "lost" since the hub was last heard
        self._goodbye = False  # the last loss was a goodbye (the hub closed)
        self._bye: Any = None  # that goodbye's known body: BYE_REVOKED, BYE_FINISHED or None
        self._denied = False  # the hub's authentication denied our CURVE key at a handshake
        self._why_lost = ""
        # Connection state, from ZeroMQ's socket monitor (read by the liveness check).
        self._monitor: zmq.Socket[Any] | None = None
        self._up = False  # a connection to the hub is established (handshake done)
        self._silence_noted = False  # "silent but connected" was logged for this silence
        self._was_down = False  # a connection closed once: the next ones are reconnections
        self._unanswered_since: float | None = None  # CURVE: a reconnection not answered yet

    def _prepare(self, socket: zmq.Socket[Any]) -> None:
        socket.setsockopt(zmq.IDENTITY, self.identity)
        # TCP keepalive covers an idle connection, but ours never is: heartbeats are
        # always in flight, and the kernel would retransmit them to a dead host for
        # ~15 minutes (tcp_retries2) before closing. Data unacknowledged by the hub's
        # kernel for peer_timeout closes the connection instead. A busy hub's kernel
        # (and its ZeroMQ I/O thread) keeps acknowledging, so this never fires for it.
        socket.setsockopt(zmq.TCP_MAXRT, max(1, int(self.peer_timeout * 1000)))
        # Watch the connection before connecting, so that its first handshake is seen.
        # ZeroMQ's I/O thread sends each event with a blocking send: our end takes
        # any number (RCVHWM 0), so that a backlog (a loop held for long, a link
        # never closed) can never block that thread and, with it, every tcp:// and
        # ipc:// socket of the process.
        address = f"inproc://transports-link-monitor-{secrets.token_hex(8)}"
        socket.monitor(address, _UP | _DOWN | _DENIED)
        self._monitor = self._context.socket(zmq.PAIR)
        self._monitor.setsockopt(zmq.RCVHWM, 0)
        self._monitor.connect(address)
        socket.connect(self.endpoint)  # (on failure, _before_close stops the monitor)
        self._last_seen = time.monotonic()  # the timeout counts from opening, not creation

    @property
    def connected(self) -> bool:
        """False once the hub is considered gone (see the class docstring)."""
        return not self._lost

    @property
    def hub_instance(self) -> str | None:
        """The instance id the hub sends in its pings (None until heard): a restart changes it."""
        return self._hub_instance

    @property
    def hub_closed(self) -> bool:
        """True when the hub was lost because it said goodbye (closed), not by silence."""
        return self._lost and self._goodbye

    @property
    def hub_finished(self) -> bool:
        """True when the hub's last goodbye said its owner is done for good (a finished
        run, see :meth:`Hub.finish`): there is nothing to wait or ask again for."""
        return self._lost and self._bye == BYE_FINISHED

    @property
    def key_revoked(self) -> bool:
        """True when the hub's last goodbye said this link's CURVE key was revoked."""
        return self._lost and self._bye == BYE_REVOKED

    @property
    def key_denied(self) -> bool:
        """True when the hub's authentication denied this link's CURVE key at a handshake
        (revoked before we connected, or never authorized): the hub is lost at once."""
        return self._lost and self._denied

    async def wait_connected(self) -> None:
        """Return once the hub is heard from (at once if it is not considered lost)."""
        while self._lost:
            if self._back is None or self._back.is_set():
                self._back = anyio.Event()
            await self._back.wait()

    # -- API --------------------------------------------------------------------------
    async def send(self, body: Any, *, kind: str = "data",
                   meta: dict[str, Any] | None = None) -> None:
        """Queue ``body`` for the hub (returns once ZeroMQ took it).

        Tensors travel without a copy, as with :meth:`Hub.send`: do not modify
        them in place right after sending.
        """
        await self._send_frames(encode_message(body, kind=kind, seq=self._next_seq(), meta=meta))

    async def recv(self) -> Message:
        """The next message from the hub; :class:`PeerLostError` if the hub went silent.

        Messages that arrived before the hub was lost come first; after that every
        call raises until the hub is heard from again. A restarted hub (a new
        instance) raises once too, unless a "lost" was raised since the old one
        was last heard: the caller joins again either way, and only once.
        """
        while True:
            if self._lost and not self._queued():
                raise self._lost_error()
            item = await self._next_item()
            if isinstance(item, Message):
                return item
            if item.event == "restarted":
                raise self._restarted_error()
            if self._lost:
                raise self._lost_error()
            # A stale "lost": the hub has been heard from since. Keep reading.

    def recv_nowait(self) -> Message | None:
        """The next message if one is queued, else ``None`` (raises like :meth:`recv`)."""
        while True:
            item = self._next_item_nowait()
            if isinstance(item, Message):
                return item
            if item is not None and item.event == "restarted":
                raise self._restarted_error()
            if self._lost:
                raise self._lost_error()
            if item is None:
                return None

    async def ack(self, message: Message, result: Any = None, *,
                  error: BaseException | None = None) -> None:
        """Acknowledge ``message``: with a msgpack ``result``, or with ``error``.

        An error travels as an :class:`ErrorPayload` (type, message, traceback
        text); the hub's ``wait_ack`` raises it as :class:`RemoteError`.
        """
        if error is None:
            frames = encode_message(result, kind=ACK, seq=message.seq)
        else:
            frames = encode_message(ErrorPayload.from_exception(error).to_body(), kind=ACK,
                                    seq=message.seq, meta={"error": True})
        await self._send_frames(frames)

    def __aiter__(self) -> Link:
        return self

    async def __anext__(self) -> Message:
        return await self.recv()

    def statistics(self) -> ChannelStatistics:
        return ChannelStatistics(int(not self._lost), self._received, self._sent, self._bad,
                                 len(self._inbox), 0)

    # -- internals ------------------------------------------------------------------------
    def _queued(self) -> int:
        return len(self._inbox)

    def _restarted_error(self) -> PeerLostError:
        return PeerLostError([b"hub@" + self.endpoint.encode()],
                             "and a restarted hub answers in its place: join it again")

    def _lost_error(self) -> PeerLostError:
        self._loss_reported = True  # only made to be raised by recv()
        return PeerLostError([b"hub@" + self.endpoint.encode()], self._why_lost)

    def _handle(self, frames: list[Any]) -> Message | None:
        now = time.monotonic()
        self._unanswered_since = None
        if self._silence_noted:
            self._silence_noted = False
            log.warning("the hub at %s answers again after %.1f s of silence",
                        self.endpoint, now - self._last_seen)
        self._last_seen = now
        if self._lost:
            self._lost = False
            if self._back is not None:
                self._back.set()
        message = self._decode(frames, origin=self.endpoint)
        if message is None:
            return None
        if message.kind == PING:
            self._note_instance(message.meta.get("hub"))
            self._loss_reported = False
            return None
        if message.kind == BYE:
            # Only the exact known bodies count; anything else is a plain goodbye.
            known = next((b for b in (BYE_REVOKED, BYE_FINISHED) if message.body == b), None)
            self._lose_hub(goodbye=True, bye=known)
            return None
        self._loss_reported = False
        return Message(HUB, message.kind, message.seq, message.body, message.meta,
                       message.needs_ack)

    def _note_instance(self, instance: Any) -> None:
        if not isinstance(instance, str):
            return
        # A consumer that recv() already told the hub is gone joins again anyway: a
        # second report would make it join twice.
        if (self._hub_instance is not None and instance != self._hub_instance
                and not self._loss_reported):
            self._inbox.put_nowait(PeerEvent(HUB, "restarted"), force=True)
        self._hub_instance = instance

    def _send_pings(self, ping: list[Any]) -> None:
        assert self._io is not None
        self._io.try_send(ping)

    def _farewell(self, socket: zmq.Socket[Any]) -> None:
        # Lets the hub report us lost at once instead of after its peer timeout.
        try:
            socket.send_multipart(encode_message(None, kind=BYE), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _check_liveness(self, now: float) -> None:
        # Silence alone does not make the hub gone: its event loop may be held by a
        # training step for longer than peer_timeout. Silence while no connection is
        # up does (never reached, or its connection closed and did not come back).
        # inproc:// has no connections to watch: silence alone decides there, as the
        # hub shares this process and its event loop.
        self._read_connection_events()
        if self._unanswered_since is not None and now - self._unanswered_since > self.peer_timeout:
            self._redial(now)
        silence = self._silence(self._last_seen, now)
        if self._lost or silence <= self.peer_timeout:
            return
        if not self._up:
            self._lose_hub()
        elif not self._silence_noted:
            self._silence_noted = True
            log.warning("the hub at %s has been silent for %.1f s but its connection is up: "
                        "waiting for it (a busy trainer is not a gone one)",
                        self.endpoint, silence)

    def _read_connection_events(self) -> None:
        # Never waited on: read (without blocking) whenever liveness is checked, which
        # the heartbeat loop makes happen every heartbeat_interval. No extra task, no
        # extra descriptor to wait on, the same on both anyio backends.
        monitor = self._monitor
        if monitor is None:
            return
        while True:
            try:
                frames = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:  # closed under us: nothing more to learn
                return
            try:
                parsed = parse_monitor_message(frames)
                event, value = parsed["event"], parsed["value"]
            except Exception:
                continue  # not ours to crash on
            if event == _DENIED:
                if value == _ZAP_DENIED and not self._lost:
                    self._lose_hub(denied=True)
            elif event == _UP:
                self._up = True
                if self._was_down and self.curve is not None:
                    self._unanswered_since = time.monotonic()
            elif event == _DOWN:
                self._up = False
                self._was_down = True

    def _redial(self, now: float) -> None:
        """A CURVE hub never hands a live identity over (see ``transports._trust``): a
        reconnection that reached it while it still held our old connection (its event
        loop was held, or the old one was not closed yet on its side) is never routed.
        Connecting again once the old one is gone is how the route comes back."""
        log.warning("the hub at %s has not answered on a new connection for %.1f s: it may "
                    "still hold our previous one; connecting again", self.endpoint,
                    now - (self._unanswered_since or now))
        self._unanswered_since = None
        self._awake_since = now  # the new connection gets a full peer_timeout to be heard
        assert self._io is not None
        try:
            self._io.socket.disconnect(self.endpoint)
            self._io.socket.connect(self.endpoint)
        except zmq.ZMQError as exc:  # not ours to crash on: liveness decides as before
            log.warning("could not connect again to %s: %s", self.endpoint, exc)

    def _lose_hub(self, *, goodbye: bool = False, bye: Any = None,
                  denied: bool = False) -> None:
        self._lost = True
        self._goodbye = goodbye
        self._bye = bye
        self._denied = denied
        if denied:
            self._why_lost = ("(its authentication denied this link's CURVE key at the "
                              "handshake: the key was revoked, or is not among its authorized "
                              "keys)")
        elif bye == BYE_REVOKED:
            self._why_lost = ("(it said goodbye: this link's CURVE key was revoked, and it is "
                              "refused from now on)")
        elif bye == BYE_FINISHED:
            self._why_lost = "(it said goodbye: its run is over)"
        elif goodbye:
            self._why_lost = "(it said goodbye: the hub closed)"
        elif self._hub_instance is None and not self._received:
            self._why_lost = (f"for {self.peer_timeout} s and no connection to it came up "
                              "(never reached)")
        else:
            self._why_lost = (f"for {self.peer_timeout} s with its connection closed "
                              "(the process or its host is gone, or the network is cut)")
        self._inbox.put_nowait(PeerEvent(HUB, "lost"), force=True)  # wakes a waiting recv()

    def _before_close(self, socket: zmq.Socket[Any]) -> None:
        if self.hub_closed:
            # It said goodbye: what is still queued for it can never be delivered, and a
            # linger would only hold this process's exit (ZeroMQ's term) for nothing.
            self._linger_ms = 0
        self._close_monitor(socket)

    def _on_close(self) -> None:
        self._close_monitor(None)  # (already done before the socket closed)

    def _close_monitor(self, socket: zmq.Socket[Any] | None) -> None:
        stop_monitor(self._monitor, socket)  # ZeroMQ's end first: see stop_monitor
        self._monitor = None

