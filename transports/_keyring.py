"""The key directory: who may join a CURVE hub, one key pair per host, revocation.

``asyncrl keys generate DIR`` then ``asyncrl keys add-host DIR NAME`` make::

    DIR/coordinator.key(_secret)     the coordinator's pair (the trainer only)
    DIR/worker.key(_secret)          a pair shared by hosts that have no key of their own
    DIR/authorized/worker.key        public keys the coordinator accepts, one file per host
    DIR/authorized/NAME.key
    DIR/hosts/NAME/                  what host NAME needs, nothing more: its own
                                     worker.key(_secret) and coordinator.key
    DIR/revoked/NAME.key             revoked keys: refused even if also in authorized/

A hub watches ``authorized/`` and ``revoked/`` (:class:`AuthorizedKeys`): a key
added there is accepted from the next connection on; a revoked key's peers are
disconnected and refused, without a restart.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from ._errors import TransportError
from ._keys import fingerprint, read_key_file

log = logging.getLogger("transports.curve")

COORDINATOR = "coordinator"
WORKER = "worker"
AUTHORIZED = "authorized"
REVOKED = "revoked"
HOSTS = "hosts"
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def generate_keys(directory: str | Path) -> Path:
    """Create the coordinator's and the shared worker key pairs in ``directory``."""
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
    _install(root / f"{WORKER}.key", root / AUTHORIZED / f"{WORKER}.key")
    return root


def add_host(directory: str | Path, name: str) -> Path:
    """A key pair of its own for host ``name``, authorized; returns ``DIR/hosts/NAME``.

    Copy that folder (and only it) to the host: ``asyncrl worker --keys hosts/NAME``.
    """
    root = Path(directory)
    _check_name(name)
    if not (root / f"{COORDINATOR}.key").is_file():
        raise TransportError(f"{root} has no {COORDINATOR}.key: run 'asyncrl keys generate "
                             f"{root}' first")
    taken = [p for p in (root / AUTHORIZED / f"{name}.key", root / REVOKED / f"{name}.key",
                         root / HOSTS / name) if p.exists()]
    if taken:
        raise FileExistsError(f"host name {name!r} is taken ({taken[0]}): choose another name "
                              "(a revoked name stays taken, so that its key stays refused)")
    host = root / HOSTS / name
    host.mkdir(parents=True, mode=0o700)
    zmq.auth.create_certificates(host, WORKER)
    (host / f"{WORKER}.key_secret").chmod(0o600)
    shutil.copy(root / f"{COORDINATOR}.key", host / f"{COORDINATOR}.key")
    (root / AUTHORIZED).mkdir(exist_ok=True)
    _install(host / f"{WORKER}.key", root / AUTHORIZED / f"{name}.key")
    return host


def revoke_host(directory: str | Path, name: str) -> Path:
    """Move ``authorized/NAME.key`` to ``revoked/``; returns the revoked file.

    A running hub disconnects the host's peers within its reload interval and
    refuses the key from then on. The host's secret key (``hosts/NAME``) is deleted.
    ``name`` may be ``worker``: the pair shared by hosts without a key of their own
    (``DIR/worker.key_secret`` is deleted), once every host has its own.
    """
    root = Path(directory)
    if name != WORKER:  # the shared pair is revocable, though no host may take its name
        _check_name(name)
    source, target = root / AUTHORIZED / f"{name}.key", root / REVOKED / f"{name}.key"
    if not source.is_file():
        state = "already revoked" if target.exists() else "not authorized"
        raise FileNotFoundError(f"{name!r} is {state} ({source} is missing)")
    target.parent.mkdir(exist_ok=True)
    # revoked/ first, then out of authorized/: at no moment is the key accepted by
    # a reload that sees one directory but not the other.
    _install(source, target)
    source.unlink()
    host = root if name == WORKER else root / HOSTS / name
    secret = host / f"{WORKER}.key_secret"
    secret.unlink(missing_ok=True)
    return target


@dataclass(frozen=True)
class KeyEntry:
    """One public key of a key directory (``asyncrl keys list``).

    >>> [(e.name, e.state) for e in list_keys("keys/")]     # doctest: +SKIP
    [('gpu1', 'authorized'), ('worker', 'authorized'), ('gpu2', 'revoked')]
    """

    name: str
    state: str  # "authorized" or "revoked"
    fingerprint: str


def list_keys(directory: str | Path) -> list[KeyEntry]:
    root = Path(directory)
    revoked = _read_dir(root / REVOKED)
    entries = []
    for state, folder in (("authorized", root / AUTHORIZED), ("revoked", root / REVOKED)):
        for key, name in sorted(_read_dir(folder).items(), key=lambda kv: kv[1]):
            if state == "authorized" and key in revoked:
                state_shown = "revoked"  # in both: refused
            else:
                state_shown = state
            entries.append(KeyEntry(name, state_shown, fingerprint(key)))
    return entries


class AuthorizedKeys:
    """The public keys a hub accepts, kept up to date with the key directory.

    ``authorized/*.key`` minus ``revoked/*.key`` (``revoked/`` beside it), plus
    ``fixed`` keys. :meth:`reload_if_changed` re-reads them when a file was
    added, removed or rewritten; ``keys`` is replaced whole, so other threads
    read it without a lock.

    >>> keys = AuthorizedKeys(Path("keys/authorized"))     # doctest: +SKIP
    >>> keys.allows(b"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7")   # doctest: +SKIP
    True
    """

    def __init__(self, directory: Path | None, fixed: frozenset[bytes] = frozenset()) -> None:
        if directory is not None and not directory.is_dir():
            raise TransportError(f"{directory} is missing: no worker could join")
        self.directory = directory
        self.revoked_dir = directory.parent / REVOKED if directory is not None else None
        self.fixed = fixed
        self.keys: frozenset[bytes] = fixed
        self.names: dict[bytes, str] = {}
        self._signature: object = None
        self.reload_if_changed()

    def allows(self, key: bytes) -> bool:
        return key in self.keys

    def name_of(self, key: bytes) -> str:
        return self.names.get(key, fingerprint(key))

    def reload_if_changed(self) -> tuple[frozenset[bytes], frozenset[bytes]] | None:
        """Re-read the directories if they changed: ``(added, removed)``, else None."""
        if self.directory is None:
            return None
        assert self.revoked_dir is not None
        signature = (_signature(self.directory), _signature(self.revoked_dir))
        if signature == self._signature:
            return None
        first = self._signature is None
        self._signature = signature
        if signature[0] is None:
            log.warning("%s is gone: no key is accepted until it is back", self.directory)
        granted = _read_dir(self.directory)
        revoked = _read_dir(self.revoked_dir)
        keys = frozenset(granted.keys() - revoked.keys()) | self.fixed
        old, self.keys = self.keys, keys
        self.names = {**revoked, **granted}
        if first:
            return None
        return keys - old, old - keys


def _signature(folder: Path) -> tuple[tuple[str, int, int], ...] | None:
    try:
        with os.scandir(folder) as it:
            entries = []
            for entry in it:
                if entry.name.endswith(".key"):
                    try:
                        st = entry.stat()  # follows links (secret mounts are links)
                    except OSError:
                        continue
                    entries.append((entry.name, st.st_mtime_ns, st.st_size))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return tuple(sorted(entries))


def _read_dir(folder: Path) -> dict[bytes, str]:
    """``{public key: file stem}`` of ``folder/*.key``; unreadable files skipped, logged."""
    keys: dict[bytes, str] = {}
    if not folder.is_dir():
        return keys
    for path in sorted(folder.glob("*.key")):
        try:
            keys[read_key_file(path, secret=False)] = path.stem
        except TransportError as exc:
            log.warning("skipped %s: %s", path, exc)
    return keys


def _check_name(name: str) -> None:
    if not _HOST_NAME.fullmatch(name) or name in (COORDINATOR, WORKER):
        raise ValueError(f"host name {name!r}: use 1 to 64 letters, digits, '.', '_' or '-', "
                         f"starting with a letter or digit, other than {COORDINATOR!r} and "
                         f"{WORKER!r}")


def _install(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` atomically (a watcher never reads half a key)."""
    temporary = target.with_name(f".{target.name}.tmp")
    shutil.copy(source, temporary)
    os.replace(temporary, target)
