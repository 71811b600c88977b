"""CURVE encryption and authentication (ZeroMQ's own), from a directory of keys.

``generate_keys(DIR)`` writes::

    DIR/coordinator.key          public key of the coordinator   (workers need it)
    DIR/coordinator.key_secret   its secret key                  (coordinator only)
    DIR/worker.key               public key of the workers
    DIR/worker.key_secret        their secret key                (worker hosts only)
    DIR/authorized/worker.key    public keys the coordinator accepts (add more here)

A :class:`Hub` given ``curve=CurveServer.from_dir(DIR)`` encrypts every
connection and refuses (and logs) any peer whose public key is not in
``authorized/``; a :class:`Link` given ``curve=CurveClient.from_dir(DIR)``
proves its key and checks the hub's.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from ._errors import TransportError

log = logging.getLogger("transports.curve")

COORDINATOR = "coordinator"
WORKER = "worker"
AUTHORIZED = "authorized"
ZAP_DOMAIN = "asyncrl"


def generate_keys(directory: str | Path) -> Path:
    """Create the coordinator's and the workers' key pairs in ``directory``."""
    if not zmq.has("curve"):
        raise TransportError("this libzmq was built without CURVE support")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for name in (COORDINATOR, WORKER):
        if (root / f"{name}.key_secret").exists():
            raise FileExistsError(f"{root / (name + '.key_secret')} exists: not overwriting keys")
    zmq.auth.create_certificates(root, COORDINATOR)
    zmq.auth.create_certificates(root, WORKER)
    (root / f"{COORDINATOR}.key_secret").chmod(0o600)
    (root / f"{WORKER}.key_secret").chmod(0o600)
    (root / AUTHORIZED).mkdir(exist_ok=True)
    shutil.copy(root / f"{WORKER}.key", root / AUTHORIZED / f"{WORKER}.key")
    return root


def _load(path: Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise TransportError(f"cannot read CURVE key {path}: {exc}; make keys with "
                             "'asyncrl keys generate DIR'") from None
    if secret and not secret_key:
        raise TransportError(f"{path} holds no secret key")
    return public, secret_key


@dataclass(frozen=True)
class CurveServer:
    """The hub's keys and the directory of public keys it accepts.

    >>> keys = CurveServer.from_dir("keys/")   # `asyncrl keys generate keys/`  # doctest: +SKIP
    >>> hub = Hub("tcp://0.0.0.0:5555", curve=keys)                            # doctest: +SKIP
    """

    public_key: bytes
    secret_key: bytes
    authorized_dir: Path

    @classmethod
    def from_dir(cls, directory: str | Path) -> CurveServer:
        root = Path(directory)
        public, secret = _load(root / f"{COORDINATOR}.key_secret", secret=True)
        assert secret is not None
        return cls(public, secret, root / AUTHORIZED)

    def authorized_keys(self) -> set[bytes]:
        if not self.authorized_dir.is_dir():
            raise TransportError(f"{self.authorized_dir} is missing: no worker could join")
        return set(zmq.auth.load_certificates(self.authorized_dir))

    def apply(self, socket: zmq.Socket[Any]) -> None:
        socket.curve_secretkey = self.secret_key
        socket.curve_publickey = self.public_key
        socket.curve_server = True
        socket.zap_domain = ZAP_DOMAIN.encode()


@dataclass(frozen=True)
class CurveClient:
    """A worker's keys and the public key of the hub it trusts.

    >>> keys = CurveClient.from_dir("keys/")   # `asyncrl keys generate keys/`  # doctest: +SKIP
    >>> link = Link("tcp://trainer:5555", curve=keys)                          # doctest: +SKIP
    """

    public_key: bytes
    secret_key: bytes
    server_key: bytes

    @classmethod
    def from_dir(cls, directory: str | Path) -> CurveClient:
        root = Path(directory)
        public, secret = _load(root / f"{WORKER}.key_secret", secret=True)
        server, _ = _load(root / f"{COORDINATOR}.key", secret=False)
        assert secret is not None
        return cls(public, secret, server)

    def apply(self, socket: zmq.Socket[Any]) -> None:
        socket.curve_secretkey = self.secret_key
        socket.curve_publickey = self.public_key
        socket.curve_serverkey = self.server_key


class _KeyList:
    """ZAP credentials provider: a fixed set of public keys; refusals are logged."""

    def __init__(self, keys: set[bytes], endpoint: str) -> None:
        self.keys = keys
        self.endpoint = endpoint
        self.refused = 0

    def callback(self, domain: str, client_key: bytes) -> bool:
        if client_key in self.keys:
            return True
        self.refused += 1
        log.warning("refused a peer on %s: its CURVE key %s is not authorized",
                    self.endpoint, client_key.decode(errors="replace"))
        return False


class Authenticator:
    """Runs ZeroMQ's ZAP handler for one context while a CURVE hub is open."""

    def __init__(self, context: zmq.Context[Any], server: CurveServer, endpoint: str) -> None:
        self.provider = _KeyList(server.authorized_keys(), endpoint)
        self._auth: Any = ThreadAuthenticator(context, log=log)

    def start(self) -> None:
        self._auth.start()
        self._auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=self.provider)

    def stop(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
