"""CURVE keys as text: from key files of any layout and from environment variables.

A key is 40 characters of Z85 (ZeroMQ's encoding of 32 bytes). A key file is
either ZeroMQ's certificate format (what ``zmq.auth.create_certificates`` and
``asyncrl keys`` write: ``public-key = "..."`` / ``secret-key = "..."``) or the
bare 40 characters on one line (a Kubernetes or Docker secret, a vault export).
A public key is always derived from its secret key, so a host needs one secret.

Environment variables (``prefix`` is ``ASYNCRL_CURVE_``; each ``*_FILE`` form names
a file in either format instead of holding the key itself):

==========================  ===============================================================
``SECRET_KEY[_FILE]``       this process's own secret key (a worker host's, or the
                            coordinator's on the trainer)
``SERVER_KEY[_FILE]``       a worker: the coordinator's public key (its presence makes a
                            process a CURVE client)
``AUTHORIZED``              a collector: the directory of authorized public keys (watched)
``AUTHORIZED_KEYS``         a collector: public keys it accepts, comma-separated (fixed)
==========================  ===============================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import zmq
import zmq.utils.z85

from ._errors import TransportError

ENV_PREFIX = "ASYNCRL_CURVE_"
SECRET_KEY = "SECRET_KEY"
SERVER_KEY = "SERVER_KEY"
AUTHORIZED = "AUTHORIZED"
AUTHORIZED_KEYS = "AUTHORIZED_KEYS"
KEY_CHARS = 40
#: Key files are tiny: anything bigger is not one (and is not read whole).
MAX_KEY_FILE_BYTES = 4096


def check_key(text: str | bytes, what: str) -> bytes:
    """``text`` as a Z85 key (bytes), or :class:`TransportError` saying what is wrong."""
    raw = text.encode() if isinstance(text, str) else bytes(text)
    raw = raw.strip()
    if len(raw) != KEY_CHARS:
        raise TransportError(f"{what}: expected a {KEY_CHARS}-character Z85 CURVE key, got "
                             f"{len(raw)} characters; make keys with 'asyncrl keys generate DIR'")
    try:
        zmq.utils.z85.decode(raw)
    except (ValueError, KeyError, IndexError):
        raise TransportError(f"{what}: not Z85 text (ZeroMQ's key encoding)") from None
    return raw


def public_of(secret: bytes) -> bytes:
    """The public key that goes with ``secret`` (both Z85)."""
    return bytes(zmq.curve_public(secret))


def fingerprint(key: bytes) -> str:
    """A short, log-safe name for a public key: its first 8 Z85 characters."""
    return key[:8].decode(errors="replace")


def read_key_file(path: str | Path, *, secret: bool) -> bytes:
    """The public key (``secret=False``) or secret key (``secret=True``) in ``path``.

    A certificate with both keys gives either; a bare key is taken as the kind asked.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise TransportError(f"cannot read CURVE key {path}: {exc.strerror or exc}; make keys "
                             "with 'asyncrl keys generate DIR'") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise TransportError(f"{path} is not a CURVE key file (over {MAX_KEY_FILE_BYTES} bytes)")
    text = data.decode("utf-8", errors="replace")
    wanted = "secret-key" if secret else "public-key"
    found = _certificate_keys(text)
    if found:
        if wanted in found:
            return check_key(found[wanted], f"{path} ({wanted})")
        if not secret and "secret-key" in found:
            return public_of(check_key(found["secret-key"], f"{path} (secret-key)"))
        raise TransportError(f"{path} holds no {wanted}")
    return check_key(text, str(path))


def _certificate_keys(text: str) -> dict[str, str]:
    """``public-key`` / ``secret-key`` of ZeroMQ's certificate format (ZPL), if any."""
    found = {}
    for line in text.splitlines():
        name, sep, value = line.strip().partition("=")
        name = name.strip()
        if sep and name in ("public-key", "secret-key"):
            found[name] = value.strip().strip('"')
    return found


def env_key(name: str, environ: Mapping[str, str] | None = None, *, secret: bool,
            prefix: str = ENV_PREFIX) -> bytes | None:
    """``PREFIX+name`` (the key itself) or ``PREFIX+name_FILE`` (a key file); None if unset."""
    env = os.environ if environ is None else environ
    value, path = env.get(prefix + name), env.get(f"{prefix}{name}_FILE")
    if value and path:
        raise TransportError(f"both {prefix}{name} and {prefix}{name}_FILE are set: keep one")
    if value:
        return check_key(value, f"${prefix}{name}")
    if path:
        return read_key_file(path, secret=secret)
    return None


def env_keys_list(environ: Mapping[str, str] | None = None, *,
                  prefix: str = ENV_PREFIX) -> frozenset[bytes]:
    """The comma-separated public keys of ``PREFIX+AUTHORIZED_KEYS`` (empty if unset)."""
    env = os.environ if environ is None else environ
    text = env.get(prefix + AUTHORIZED_KEYS, "")
    return frozenset(check_key(part, f"${prefix}{AUTHORIZED_KEYS}")
                     for part in text.split(",") if part.strip())
