"""Who a hub's peers are: routing identities bound to CURVE keys, and exposed endpoints.

A routing identity is a name the *client* picks; on a CURVE hub the key is what
was proven. :class:`PeerKeys` binds the two: each identity speaks with the key
it first came with for as long as the hub remembers it, so a copied identity
presented with another (even authorized) key is dropped unread, and a peer whose
key is revoked is found and expelled. Live routes themselves are kept by libzmq:
a CURVE hub turns ``ROUTER_HANDOVER`` off, so a second connection with a live
peer's identity is never given its route (libzmq leaves it unrouted).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterable
from typing import Any

import zmq

from ._curve import CurveServer
from ._keys import fingerprint
from ._ratelimit import RateLimitedLog
from ._zap import ZapDomain, ZapHandler

log = logging.getLogger("transports.curve")


class PeerKeys:
    """A CURVE hub's ZAP domain and the key each routing identity speaks with.

    >>> trust = PeerKeys(context, CurveServer.from_dir("keys/"), "hub-1")  # doctest: +SKIP
    >>> trust.apply(socket)                  # before bind               # doctest: +SKIP
    >>> peer = trust.screen(frame)           # None: dropped unread      # doctest: +SKIP
    """

    def __init__(self, context: zmq.Context[Any], server: CurveServer, instance: str) -> None:
        self.server = server
        self.keys = server.authorized_keys()
        self._name = f"transports-{instance}"
        self._domain = ZapDomain(self.keys, endpoint="(not bound yet)")
        self._handler: ZapHandler | None = ZapHandler.register(context, self._name, self._domain)
        self._key_of: dict[bytes, bytes] = {}
        self._limited_log = RateLimitedLog(log)

    @property
    def refused(self) -> int:
        """Connections refused at the handshake (key unknown or revoked)."""
        return self._domain.refused

    def apply(self, socket: zmq.Socket[Any]) -> None:
        self.server.apply(socket)
        socket.zap_domain = self._name.encode()

    def bound(self, endpoint: str) -> None:
        self._domain.endpoint = endpoint
        where = f"{self.keys.directory} (watched)" if self.keys.directory else "fixed keys"
        log.info("hub at %s: CURVE on, %d key(s) authorized from %s", endpoint,
                 len(self.keys.keys), where)

    def close(self) -> None:
        if self._handler is not None:
            self._handler.release(self._name)
            self._handler = None

    def screen(self, frame: Any) -> bytes | None:
        """The routing identity of a received identity frame, or None to drop the message.

        Dropped: no key (cannot happen through our ZAP handler), a key no longer
        authorized (revoked since the handshake), or an identity bound to another key.
        """
        peer: bytes = frame.bytes
        user = frame.get("User-Id")
        key = user.encode() if user else b""
        if not self.keys.allows(key):
            self._limited_log.warning(
                f"revoked-{key!r}", "dropped a message from %r: its CURVE key %s... is not "
                "authorized any more", peer, fingerprint(key) if key else "(none)")
            return None
        bound = self._key_of.setdefault(peer, key)
        if bound != key:
            self._limited_log.warning(
                f"impostor-{peer!r}", "dropped a message from %r with CURVE key %s... (%s): "
                "that identity belongs to key %s... (%s); a copied identity takes nothing over",
                peer, fingerprint(key), self.keys.name_of(key), fingerprint(bound),
                self.keys.name_of(bound))
            return None
        return peer

    def revoked(self, peers: Iterable[bytes]) -> list[bytes]:
        """The ``peers`` whose key is not authorized any more."""
        return [p for p in peers if p in self._key_of and not self.keys.allows(self._key_of[p])]

    def key_of(self, peer: bytes) -> bytes | None:
        return self._key_of.get(peer)

    def forget_unless(self, known: Callable[[bytes], bool]) -> None:
        """Drop the bindings of identities the hub no longer remembers (bounded table)."""
        for peer in [p for p in self._key_of if not known(p)]:
            del self._key_of[peer]


def warn_if_exposed(endpoint: str, *, curve: bool) -> bool:
    """Log a WARNING when ``endpoint`` is a tcp port beyond loopback without CURVE."""
    if curve or not endpoint.startswith("tcp://"):
        return False  # ipc:// is guarded by its directory's permissions, inproc by the process
    host = endpoint.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    try:
        if ipaddress.ip_address(host).is_loopback:
            return False
    except ValueError:
        if host == "localhost":
            return False
    log.warning("listening on %s without CURVE keys: anyone who can reach this address can "
                "join as a worker, read the weights and the orders, and send batches. Give "
                "curve_keys=DIR ('asyncrl keys generate DIR'), or listen on 127.0.0.1 "
                "(see docs/security.md)", endpoint)
    return True


def tighten_for_curve(socket: zmq.Socket[Any], peer_timeout: float) -> None:
    """A CURVE hub's connection to a vanished peer closes within half ``peer_timeout``.

    Without handover, a peer whose old connection the hub still holds cannot take
    its identity back on a new one. The hub pings every peer each heartbeat, so a
    cut connection always has unacknowledged data: bounding it (``TCP_MAXRT``, as
    links do with ``peer_timeout``) makes the hub's end close before the link's,
    and the link's reconnection finds its identity free.
    """
    socket.setsockopt(zmq.TCP_MAXRT, max(1000, int(peer_timeout * 500)))
