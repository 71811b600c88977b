"""ZeroMQ's authentication handler (ZAP) for CURVE hubs, one thread per context.

libzmq asks ``inproc://zeromq.zap.01`` of the socket's context whether a
connection may complete its handshake. One :class:`ZapHandler` answers for
every CURVE hub of a context, each under its own ZAP domain, in a thread (so
that a trainer whose event loop is held by a training step still admits
workers on time). It:

* accepts a CURVE client whose public key the hub's :class:`AuthorizedKeys`
  allows, and names it by that key: libzmq then stamps every message of the
  connection with ``User-Id`` = the Z85 public key, which the hub reads to bind
  a routing identity to its key;
* refuses anything else in a hub's domain (a rate-limited warning naming the
  hub's bound endpoint); NULL requests of other sockets are let through, as
  pyzmq's own authenticator does;
* re-reads each hub's key directory every ``reload_interval`` seconds.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.utils.z85

from ._keyring import AuthorizedKeys
from ._keys import fingerprint
from ._ratelimit import RateLimitedLog

log = logging.getLogger("transports.curve")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
RELOAD_INTERVAL = 1.0


@dataclass
class ZapDomain:
    """What the handler knows of one hub: its keys, its endpoint (for logs), counters."""

    keys: AuthorizedKeys
    endpoint: str
    refused: int = 0
    #: Called (in the handler's thread) after a reload changed the keys: (added, removed).
    on_change: Any = None
    limited_log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(log))


class ZapHandler:
    """The ZAP thread of one context; hubs :meth:`register` a domain and release it."""

    _lock = threading.Lock()
    _handlers: dict[int, ZapHandler] = {}

    @classmethod
    def register(cls, context: zmq.Context[Any], name: str, domain: ZapDomain) -> ZapHandler:
        with cls._lock:
            handler = cls._handlers.get(id(context))
            if handler is None or handler._stopped:
                handler = cls._handlers[id(context)] = cls(context)
            handler._domains[name] = domain
            return handler

    def __init__(self, context: zmq.Context[Any], reload_interval: float = RELOAD_INTERVAL
                 ) -> None:
        self._context = context
        self._domains: dict[str, ZapDomain] = {}
        self._stopped = False
        self._reload_interval = reload_interval
        # Bound here, before any hub can bind: no connection ever finds no handler.
        self._zap = context.socket(zmq.REP)
        self._zap.linger = 0
        try:
            self._zap.bind(ZAP_ENDPOINT)
        except zmq.ZMQError:
            self._zap.close()
            raise
        stop_address = f"inproc://transports-zap-stop-{id(self):x}"
        self._stop = context.socket(zmq.PAIR)
        self._stop.bind(stop_address)
        self._control = context.socket(zmq.PAIR)
        self._control.connect(stop_address)
        self._thread = threading.Thread(target=self._run, name="transports-zap", daemon=True)
        self._thread.start()

    def release(self, name: str) -> None:
        with self._lock:
            self._domains.pop(name, None)
            if self._domains or self._stopped:
                return
            self._stopped = True
            self._handlers.pop(id(self._context), None)
        self._control.send(b"stop")
        self._thread.join(timeout=5)
        self._control.close(linger=0)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        poller.register(self._stop, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll(int(self._reload_interval * 1000)))
                if self._stop in ready:
                    return
                if self._zap in ready:
                    self._answer(self._zap.recv_multipart())
                self._reload_all()
        except zmq.ZMQError as exc:  # the context ended under us (process exit)
            log.debug("ZAP handler stopped: %s", exc)
        finally:
            self._zap.close(linger=0)
            self._stop.close(linger=0)

    def _reload_all(self) -> None:
        with self._lock:
            domains = list(self._domains.values())
        for domain in domains:
            try:
                change = domain.keys.reload_if_changed()
            except Exception:  # a bad directory must not stop authentication
                log.exception("could not reload the authorized keys of %s", domain.endpoint)
                continue
            if change is None:
                continue
            added, removed = change
            log.info("authorized keys of the hub at %s reloaded from %s: %d added, %d removed "
                     "(%s), %d in all", domain.endpoint, domain.keys.directory, len(added),
                     len(removed), ", ".join(domain.keys.name_of(k) for k in removed) or "-",
                     len(domain.keys.keys))
            if domain.on_change is not None:
                domain.on_change(added, removed)

    def _answer(self, request: list[bytes]) -> None:
        if len(request) < 6:
            if len(request) >= 2:
                self._reply(request[1], b"400", b"not enough frames")
            return  # not even a request id: nothing to answer (libzmq never does this)
        request_id, name = request[1], request[2].decode(errors="replace")
        address, mechanism, credentials = request[3], request[5], request[6:]
        domain = self._domains.get(name)
        if domain is None:
            if mechanism == b"NULL":
                self._reply(request_id, b"200", b"OK", b"anonymous")  # not a hub of ours
            else:
                self._reply(request_id, b"400", b"unknown domain")
            return
        if mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
            self._refuse(domain, request_id, address, None, b"CURVE only")
            return
        key = zmq.utils.z85.encode(credentials[0])
        if domain.keys.allows(key):
            self._reply(request_id, b"200", b"OK", key)
        else:
            self._refuse(domain, request_id, address, key, b"key not authorized")

    def _refuse(self, domain: ZapDomain, request_id: bytes, address: bytes, key: bytes | None,
                reason: bytes) -> None:
        domain.refused += 1
        known = key is not None and key in domain.keys.names
        what = (f"its CURVE key {fingerprint(key)}... is "
                + (f"revoked ({domain.keys.name_of(key)})" if known else "not authorized")
                if key is not None else "it does not speak CURVE")
        domain.limited_log.warning(
            f"refused-{key!r}", "refused a peer on %s from %s: %s", domain.endpoint,
            address.decode(errors="replace") or "?", what)
        self._reply(request_id, b"400", reason)

    def _reply(self, request_id: bytes, status: bytes, text: bytes, user: bytes = b"") -> None:
        self._zap.send_multipart([b"1.0", request_id, status, text, user, b""])
