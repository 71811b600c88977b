"""A slow-greeting flood: many tcp connections that each send ZMTP's greeting a byte a second.

Usage: python flood.py PORT COUNT SECONDS
Keeps COUNT connections to 127.0.0.1:PORT open (a dropped one is replaced), for at most
SECONDS, and prints one JSON line a second: ``{"connected": .., "opened": .., "dropped": ..}``.
Loopback only; it raises its own open-files soft limit to its hard limit.
"""

from __future__ import annotations

import errno
import json
import resource
import socket
import sys
import time

# ZMTP 3.0's greeting (signature, version, NULL mechanism, as-server, filler): 64 bytes,
# of which one goes out a second, so that no handshake ever finishes.
GREETING = (b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0")
            + b"\0" + b"\0" * 31)
NOT_YET = (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOTCONN, errno.EINPROGRESS)


def _open(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    return s


def _drip(s: socket.socket, sent: int) -> int | None:
    """Send the next greeting byte; the bytes sent so far, or None if the peer dropped us."""
    try:
        while s.recv(4096):  # the hub's own greeting: read and forget
            pass
        return None  # b"": closed by the peer
    except OSError as exc:
        if exc.errno not in NOT_YET:
            return None
    if sent >= len(GREETING):
        return sent
    try:
        return sent + s.send(GREETING[sent:sent + 1])
    except OSError as exc:
        return sent if exc.errno in NOT_YET else None


def main(port: int, count: int, seconds: float) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sockets: dict[socket.socket, int] = {}
    opened = dropped = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        while len(sockets) < count:
            sockets[_open(port)] = 0
            opened += 1
        time.sleep(1.0)
        for s, sent in list(sockets.items()):
            now = _drip(s, sent)
            if now is None:
                s.close()
                del sockets[s]
                dropped += 1
            else:
                sockets[s] = now
        connected = sum(1 for sent in sockets.values() if sent > 0)
        print(json.dumps({"connected": connected, "opened": opened, "dropped": dropped}),
              flush=True)
    for s in sockets:
        s.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
