"""CURVE encryption and authentication (ZeroMQ's own): whose keys a channel uses.

Keys come from a directory (``asyncrl keys generate DIR``, see ``_keyring``),
from environment variables, or from key files of any layout (see ``_keys``).

A :class:`Hub` given ``curve=CurveServer.from_dir(DIR)`` encrypts every
connection, refuses (and logs) any peer whose public key is not authorized,
binds each peer's routing identity to its key, and follows changes of
``authorized/`` and ``revoked/`` while it runs; a :class:`Link` given
``curve=CurveClient.from_dir(DIR)`` proves its key and checks the hub's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import zmq

from ._errors import TransportError
from ._keyring import AUTHORIZED, COORDINATOR, WORKER, AuthorizedKeys
from ._keys import AUTHORIZED as ENV_AUTHORIZED
from ._keys import (
    ENV_PREFIX,
    SECRET_KEY,
    SERVER_KEY,
    env_key,
    env_keys_list,
    public_of,
    read_key_file,
)


@dataclass(frozen=True)
class CurveServer:
    """The hub's keys and the public keys it accepts.

    ``authorized_dir`` is watched while the hub runs (``revoked/`` beside it
    overrides it); ``authorized`` keys are accepted besides it, fixed.

    >>> keys = CurveServer.from_dir("keys/")   # `asyncrl keys generate keys/`  # doctest: +SKIP
    >>> hub = Hub("tcp://0.0.0.0:5555", curve=keys)                            # doctest: +SKIP
    >>> CurveServer.load(None)   # ASYNCRL_CURVE_SECRET_KEY + _AUTHORIZED, or None  # doctest: +SKIP
    """

    public_key: bytes
    secret_key: bytes
    authorized_dir: Path | None = None
    authorized: frozenset[bytes] = field(default_factory=frozenset)

    @classmethod
    def from_dir(cls, directory: str | Path) -> CurveServer:
        root = Path(directory)
        secret = read_key_file(root / f"{COORDINATOR}.key_secret", secret=True)
        return cls(public_of(secret), secret, root / AUTHORIZED)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CurveServer | None:
        """From ``ASYNCRL_CURVE_SECRET_KEY[_FILE]`` and ``ASYNCRL_CURVE_AUTHORIZED`` (a
        directory) and/or ``ASYNCRL_CURVE_AUTHORIZED_KEYS``; None when neither of the
        last two is set."""
        env = os.environ if environ is None else environ
        folder = env.get(ENV_PREFIX + ENV_AUTHORIZED)
        fixed = env_keys_list(env)
        if not folder and not fixed:
            return None
        secret = env_key(SECRET_KEY, env, secret=True)
        if secret is None:
            raise TransportError(f"{ENV_PREFIX}{ENV_AUTHORIZED}(_KEYS) is set but not "
                                 f"{ENV_PREFIX}{SECRET_KEY} (or {ENV_PREFIX}{SECRET_KEY}_FILE): "
                                 "the coordinator's secret key is missing")
        return cls(public_of(secret), secret, Path(folder) if folder else None, fixed)

    @classmethod
    def load(cls, keys: str | Path | CurveServer | None,
             environ: Mapping[str, str] | None = None) -> CurveServer | None:
        """``keys`` itself, from the directory ``keys``, or (None) from the environment."""
        if isinstance(keys, CurveServer):
            return keys
        if keys is not None:
            return cls.from_dir(keys)
        return cls.from_env(environ)

    def authorized_keys(self) -> AuthorizedKeys:
        """The accepted keys, read now (a missing ``authorized_dir`` is an error)."""
        return AuthorizedKeys(self.authorized_dir, self.authorized)

    def with_local_client(self) -> tuple[CurveServer, CurveClient]:
        """This server accepting one more, fresh key pair, and a client with that pair.

        For the trainer's own worker processes: they never see a key of the key
        directory, and their key dies with the hub.
        """
        public, secret = zmq.curve_keypair()
        server = replace(self, authorized=self.authorized | {public})
        return server, CurveClient(public, secret, self.public_key)

    def apply(self, socket: zmq.Socket[Any]) -> None:
        socket.curve_secretkey = self.secret_key
        socket.curve_publickey = self.public_key
        socket.curve_server = True


@dataclass(frozen=True)
class CurveClient:
    """A worker's keys and the public key of the hub it trusts.

    >>> keys = CurveClient.from_dir("keys/hosts/gpu1")  # asyncrl keys add-host  # doctest: +SKIP
    >>> link = Link("tcp://trainer:5555", curve=keys)                          # doctest: +SKIP
    >>> CurveClient.load(None)  # ASYNCRL_CURVE_SECRET_KEY + _SERVER_KEY, or None  # doctest: +SKIP
    """

    public_key: bytes
    secret_key: bytes
    server_key: bytes

    @classmethod
    def from_dir(cls, directory: str | Path) -> CurveClient:
        root = Path(directory)
        secret = read_key_file(root / f"{WORKER}.key_secret", secret=True)
        server = read_key_file(root / f"{COORDINATOR}.key", secret=False)
        return cls(public_of(secret), secret, server)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CurveClient | None:
        """From ``ASYNCRL_CURVE_SERVER_KEY[_FILE]`` and ``ASYNCRL_CURVE_SECRET_KEY[_FILE]``;
        None when no server key is set."""
        server = env_key(SERVER_KEY, environ, secret=False)
        if server is None:
            return None
        secret = env_key(SECRET_KEY, environ, secret=True)
        if secret is None:
            raise TransportError(f"{ENV_PREFIX}{SERVER_KEY} is set but not {ENV_PREFIX}"
                                 f"{SECRET_KEY} (or {ENV_PREFIX}{SECRET_KEY}_FILE): this "
                                 "host's secret key is missing")
        return cls(public_of(secret), secret, server)

    @classmethod
    def load(cls, keys: str | Path | CurveClient | None,
             environ: Mapping[str, str] | None = None) -> CurveClient | None:
        """``keys`` itself, from the directory ``keys``, or (None) from the environment."""
        if isinstance(keys, CurveClient):
            return keys
        if keys is not None:
            return cls.from_dir(keys)
        return cls.from_env(environ)

    def apply(self, socket: zmq.Socket[Any]) -> None:
        socket.curve_secretkey = self.secret_key
        socket.curve_publickey = self.public_key
        socket.curve_serverkey = self.server_key

