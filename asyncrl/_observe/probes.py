"""Liveness and readiness probes of a worker host or an env worker: ``/livez``, ``/readyz``.

``asyncrl worker --probe-port 8080`` (and ``asyncrl env-worker --probe-port``)
answers two HTTP GETs on ``--probe-host`` (``0.0.0.0`` by default, as a
container's port must be reachable from its node):

- ``/livez``: 200 while the host's event loop answers (a stuck or dead process
  does not answer at all);
- ``/readyz``: 200 once a collector admitted this host (every one of its worker
  processes was welcomed, or the env worker was), 503 before and again when the
  collector is gone (``--reconnect`` waits for the next one).

Both answer a small JSON body (``{"ready": ..., "workers": ..., "admitted": ...}``).
The server is a few lines over anyio's TCP listener, not a web framework: HTTP/1.1,
one request per connection, requests capped in size, time and count, since
anyone who can reach the port can talk to it (it only ever reports state).

A worker host's K workers are separate processes: each marks its own byte in
an :class:`AdmissionBoard` (shared memory made by the host before it spawns
them) when it is welcomed, and clears it when that admission ends.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc

log = logging.getLogger("asyncrl.probes")

LIVENESS_PATH = "/livez"
READINESS_PATH = "/readyz"
#: Where the probe server binds unless told otherwise: every interface, for a container.
DEFAULT_HOST = "0.0.0.0"
#: The port the Dockerfile, the manifests and the docs use (nothing binds it by default).
DEFAULT_PORT = 8080

_MAX_REQUEST = 4096  # bytes of request line and headers: a probe sends a few hundred
_READ_TIMEOUT = 5.0
_MAX_CONNECTIONS = 16


def add_probe_options(parser: argparse.ArgumentParser) -> None:
    """``--probe-port`` and ``--probe-host``, the same for every command that has probes."""
    parser.add_argument(
        "--probe-port", type=int, default=None, metavar="PORT",
        help=f"serve HTTP liveness ({LIVENESS_PATH}: the process answers) and readiness "
             f"({READINESS_PATH}: 200 once admitted by a collector, 503 before and after "
             f"losing it) probes on PORT (e.g. {DEFAULT_PORT}; 0 picks a free one); none "
             "without it")
    parser.add_argument(
        "--probe-host", default=DEFAULT_HOST, metavar="ADDR",
        help="the address the probe server binds ('127.0.0.1': this host only)")


class AdmissionBoard:
    """Which of a host's worker processes a collector admitted: one shared byte each.

    Made by the host before it spawns the workers and handed to them with their
    arguments (a spawned child inherits the shared memory); each worker sets its
    byte with its own link identity.

    >>> board = AdmissionBoard([b"w0", b"w1"])
    >>> board.set(b"w1", True)
    >>> board.admitted()
    [False, True]
    """

    def __init__(self, identities: Sequence[bytes]) -> None:
        self.identities = list(identities)
        self._flags: Any = multiprocessing.get_context("spawn").RawArray("b", len(identities))

    def set(self, identity: bytes, admitted: bool) -> None:
        if identity in self.identities:
            self._flags[self.identities.index(identity)] = 1 if admitted else 0

    def admitted(self) -> list[bool]:
        return [bool(flag) for flag in self._flags]


class ProbeServer:
    """Answers ``GET /livez`` and ``GET /readyz``; ``state()`` says ready and what else to show.

    ``state()`` returns a dict with at least ``"ready"`` (bool); it is called on
    the event loop for each readiness request, so it must be quick.

    >>> server = ProbeServer(lambda: {"ready": admitted}, port=8080)  # doctest: +SKIP
    >>> port = await task_group.start(server.serve)   # bound: probes answer from now on
    """

    def __init__(self, state: Callable[[], dict[str, Any]], *, host: str = DEFAULT_HOST,
                 port: int = DEFAULT_PORT) -> None:
        self.state = state
        self.host = host
        self.port = port
        self._slots: anyio.Semaphore | None = None
        self._listener: anyio.abc.Listener[anyio.abc.SocketStream] | None = None

    async def bind(self) -> int:
        """Listen now (OSError naming the address if it cannot); return the bound port.

        Optional: :meth:`serve` binds if this was not called. Calling it first
        turns a port in use into a plain error before any task group is involved.
        """
        if self._listener is None:
            try:
                self._listener = await anyio.create_tcp_listener(local_host=self.host,
                                                                 local_port=self.port)
            except OSError as exc:
                raise OSError(exc.errno, f"cannot serve probes on {self.host}:{self.port}: "
                              f"{exc.strerror or exc} (is --probe-port in use?)") from None
        return int(self._listener.extra(anyio.abc.SocketAttribute.local_port))

    async def serve(self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
                    ) -> None:
        """Listen (if :meth:`bind` did not), report the bound port, answer until cancelled."""
        port = await self.bind()
        assert self._listener is not None
        self._slots = anyio.Semaphore(_MAX_CONNECTIONS)
        async with self._listener:
            log.info("probes on http://%s:%d%s and %s", self.host, port, LIVENESS_PATH,
                     READINESS_PATH)
            task_status.started(port)
            await self._listener.serve(self._handle)

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        assert self._slots is not None
        async with stream:
            if self._slots.value == 0:  # a flood of idle connections: refuse the newest
                return
            async with self._slots:
                request = b""
                with anyio.move_on_after(_READ_TIMEOUT):
                    while b"\r\n\r\n" not in request and len(request) < _MAX_REQUEST:
                        try:
                            request += await stream.receive(_MAX_REQUEST)
                        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                            return
                status, body = self.answer(request.split(b"\r\n", 1)[0])
                with anyio.move_on_after(_READ_TIMEOUT):
                    try:
                        await stream.send(_response(status, body))
                    except (anyio.BrokenResourceError, OSError):
                        pass

    def answer(self, request_line: bytes) -> tuple[int, dict[str, Any]]:
        """The status and JSON body for one request line (``GET /readyz HTTP/1.1``)."""
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return 400, {"error": "expected an HTTP request line"}
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method != b"GET":
            return 405, {"error": "GET only"}
        if target == LIVENESS_PATH.encode():
            return 200, {"alive": True}
        if target == READINESS_PATH.encode():
            state = self.state()
            return (200 if state.get("ready") else 503), state
        return 404, {"error": f"no such path: use {LIVENESS_PATH} or {READINESS_PATH}"}


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}


def _response(status: int, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode() + b"\n"
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    return head.encode() + data


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "LIVENESS_PATH", "READINESS_PATH", "AdmissionBoard",
           "ProbeServer", "add_probe_options"]
