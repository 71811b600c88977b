"""ZeroMQ addresses checked before a socket sees them: a bad one is a one-line ValueError.

libzmq reports a malformed address as a bare ``zmq.error.ZMQError`` ("Invalid
argument") when the socket binds, and a connecting socket may accept one and
retry it forever: a worker started with ``tcp://127.0.0.1`` (no port) or
``http://...`` used to run 16-20 s and end in a worker's traceback. Checking
the text first names the argument, what came and what is expected.

Accepted, as asyncrl uses them: ``tcp://HOST:PORT`` (an IPv6 host in brackets;
``SOURCE;HOST:PORT`` when connecting, as libzmq allows), ``ipc://PATH`` and
``inproc://NAME``. A listening address may use ``*`` for every interface and
``*`` or ``0`` for a free port. Whether a host name resolves is a separate,
slower question: :func:`check_resolves`.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

__all__ = ["Endpoint", "check_resolves", "parse_endpoint"]

#: The forms, as the error messages show them.
FORMS = "tcp://HOST:PORT, ipc://PATH or inproc://NAME"
#: A Unix socket path's limit (``sun_path``: 108 bytes with the final NUL) on Linux.
MAX_IPC_PATH = 107
_HOST = re.compile(r"[A-Za-z0-9_.%-]+")  # names, IPv4, interface names (eth0)
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?")


@dataclass(frozen=True)
class Endpoint:
    """A checked ZeroMQ address: ``scheme`` ``"tcp"`` / ``"ipc"`` / ``"inproc"``.

    ``host`` and ``port`` are set for tcp (``port`` None: ``*``, any free port);
    ``path`` is the ipc path or the inproc name. ``text`` is the address as given.

    >>> parse_endpoint("tcp://[::1]:5555", argument="listen")
    Endpoint(text='tcp://[::1]:5555', scheme='tcp', host='::1', port=5555, path='')
    """

    text: str
    scheme: str
    host: str = ""
    port: int | None = None
    path: str = ""


def parse_endpoint(text: object, *, argument: str | None = None,
                   bind: bool = False) -> Endpoint:
    """``text`` checked as an address to connect to (``bind``: to listen on).

    ValueError says what is wrong, starting with ``argument=`` when given:

    >>> parse_endpoint("tcp://127.0.0.1", argument="listen", bind=True)
    Traceback (most recent call last):
    ...
    ValueError: listen='tcp://127.0.0.1' has no port: expected tcp://HOST:PORT, ipc://PATH or \
inproc://NAME (PORT 1-65535, or * or 0 for any free port)
    """
    try:
        return _parse(text, bind)
    except ValueError as exc:
        port_range = "1-65535, or * or 0 for any free port" if bind else "1-65535"
        where = f"{argument}={text!r}" if argument else repr(text)
        raise ValueError(f"{where} {exc}: expected {FORMS} (PORT {port_range})") from None


def check_resolves(endpoint: Endpoint) -> None:
    """OSError "does not resolve", naming the host, if ``endpoint``'s host name has no address.

    Only tcp addresses have a host; an IP address resolves at once, a name may
    take as long as the system's resolver does.
    """
    if endpoint.scheme != "tcp":
        return
    try:
        socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise OSError(f"the host name {endpoint.host!r} in {endpoint.text} does not resolve "
                      f"({reason}): check its spelling and this host's DNS "
                      "(/etc/resolv.conf, /etc/hosts)") from None


def _parse(text: object, bind: bool) -> Endpoint:
    if not isinstance(text, str):
        raise ValueError(f"is not a string (a {type(text).__name__})")
    scheme, separator, rest = text.partition("://")
    if not separator:
        raise ValueError("has no scheme")
    if scheme == "tcp":
        return _tcp(text, rest, bind)
    if scheme in ("ipc", "inproc"):
        if not rest or rest.isspace():
            raise ValueError(f"names no {'path' if scheme == 'ipc' else 'name'}")
        if scheme == "ipc" and len(rest.encode()) > MAX_IPC_PATH:
            raise ValueError(f"has a path of {len(rest.encode())} bytes; a Unix socket path "
                             f"holds at most {MAX_IPC_PATH}: use a shorter directory")
        return Endpoint(text, scheme, path=rest)
    raise ValueError(f"has the scheme {scheme!r}, which ZeroMQ here does not speak")


def _tcp(text: str, rest: str, bind: bool) -> Endpoint:
    if not bind:
        rest = rest.rpartition(";")[2]  # libzmq's SOURCE;HOST:PORT: the peer is last
    host, separator, port_text = rest.rpartition(":")
    if not separator or (host.startswith("[") and not host.endswith("]")) or (
            not host and not port_text.isdigit()):
        raise ValueError("has no port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not _IPV6.fullmatch(host):
            raise ValueError(f"has a bracketed host {host!r} that is not an IPv6 address")
    elif ":" in host:
        raise ValueError("has an IPv6 host without brackets (write tcp://[::1]:PORT)")
    elif not host:
        raise ValueError("has no host")
    elif host == "*":
        if not bind:
            raise ValueError("connects to '*': give the trainer's host name or address")
    elif not _HOST.fullmatch(host):
        raise ValueError(f"has a host {host!r} with characters a host name cannot hold")
    return Endpoint(text, "tcp", host=host, port=_port(port_text, bind))


def _port(text: str, bind: bool) -> int | None:
    if bind and text == "*":
        return None
    if not text:
        raise ValueError("has no port")
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"has a port {text!r} that is not a number")
    port = int(text)
    if not (0 if bind else 1) <= port <= 65535:
        raise ValueError(f"has the port {port}, out of range")
    return port
