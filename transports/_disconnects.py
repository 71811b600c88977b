"""A hub's view of closed connections: a peer whose process dies is lost at once.

A process that dies (killed, crashed, OOM) has its TCP connections closed by
its kernel at once; waiting ``peer_timeout`` of silence for it wastes that
time (a weight update blocked 10 s on a killed Ray actor). ZeroMQ's socket
monitor reports each closed connection (``EVENT_DISCONNECTED``), but by file
descriptor, not by routing id, and ``ZMQ_ROUTER_NOTIFY`` (which would name
the peer) is a draft API that the libzmq bundled with pyzmq's wheels is not
built with. So a disconnection triggers a *route probe*: after a short grace,
each live peer is sent a ping with ``ROUTER_MANDATORY``; the ROUTER removes a
peer's route as soon as its only connection is gone, so a peer that has no
route any more (``EHOSTUNREACH``) is the one that left.

The grace is what a reconnecting DEALER needs: a peer whose connection broke
but whose process lives reconnects (``ZMQ_RECONNECT_IVL``, 100 ms) and takes
its route back (``ROUTER_HANDOVER``) before the probe, and is not lost. One
that comes back later than that was lost already; if it speaks again its owner
hears ``"returned"`` (asyncrl's coordinator then asks it to join again).
Probes are coalesced (one per grace period, whatever the number of
disconnections), so a peer that connects and disconnects in a loop costs at
most one ping per peer per grace period.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, cast

import anyio
import zmq
from zmq.utils.monitor import parse_monitor_message

_DOWN = int(zmq.EVENT_DISCONNECTED)


class DisconnectWatch:
    """Reads a socket's monitor; calls ``probe()`` ``grace`` s after connections closed."""

    def __init__(self, context: zmq.Context[Any], socket: zmq.Socket[Any], grace: float,
                 probe: Callable[[], None]) -> None:
        self.grace = grace
        self._probe = probe
        self.disconnections = 0  # closed connections seen (statistics, tests)
        # ZeroMQ's I/O thread sends each event with a blocking send: our end takes
        # any number (RCVHWM 0), so that a backlog can never block that thread.
        address = f"inproc://transports-hub-monitor-{secrets.token_hex(8)}"
        socket.monitor(address, _DOWN)
        self._monitor: zmq.Socket[Any] | None = context.socket(zmq.PAIR)
        self._monitor.setsockopt(zmq.RCVHWM, 0)
        self._monitor.connect(address)

    async def run(self) -> None:
        """Forever: wait for closed connections, let the grace pass, probe (cancel to stop)."""
        assert self._monitor is not None
        fd = cast(int, self._monitor.getsockopt(zmq.FD))
        while True:
            if self._read_events():
                await anyio.sleep(self.grace)
                self._read_events()  # those of the grace are covered by this probe
                self._probe()
                continue
            # Edge-triggered: the recv that failed above re-armed the descriptor.
            await anyio.wait_readable(fd)

    def _read_events(self) -> int:
        monitor = self._monitor
        count = 0
        while monitor is not None:
            try:
                frames = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:  # Again, or closed under us: nothing more now
                break
            try:
                event = parse_monitor_message(frames)["event"]
            except Exception:
                continue  # not ours to crash on
            count += event == _DOWN
        self.disconnections += count
        return count

    def close(self, socket: zmq.Socket[Any] | None) -> None:
        """Stop the monitor (see :func:`stop_monitor`); idempotent."""
        stop_monitor(self._monitor, socket)
        self._monitor = None


def stop_monitor(monitor: zmq.Socket[Any] | None, socket: zmq.Socket[Any] | None) -> None:
    """Close a socket monitor's reading end, ZeroMQ's end first (None: nothing to do).

    ZeroMQ's I/O thread sends each monitor event with a *blocking* send: an event
    sent after our end closed (the "disconnected" of the socket being closed) would
    block that thread for good, and with it every tcp:// and ipc:// socket of the
    process. So the socket stops monitoring while our end still reads.
    """
    if monitor is None:
        return
    if socket is not None and not socket.closed:
        try:
            socket.disable_monitor()
        except zmq.ZMQError:
            pass
    monitor.close(linger=0)
