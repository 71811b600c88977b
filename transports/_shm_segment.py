"""Where a shared-memory block's memory comes from: a sealed memfd, or a ``/dev/shm`` segment.

What a block holds and how it is read is :mod:`._shm_format`'s and the views'
(:mod:`._shm`, :mod:`._shm_arrays`, :mod:`._shm_file`); this module makes the
segment, names it, opens it from another process and removes it.

The creator reserves every page when it makes a segment (``posix_fallocate``): a
full ``/dev/shm`` is a :class:`SharedMemoryFullError` at creation, naming the
bytes needed and free and the fix, instead of a SIGBUS in whichever process
first touches a page that tmpfs cannot supply (``ftruncate`` alone reserves
nothing). A segment that could not be reserved is unlinked at once.

A process that maps a segment another process can write is also one that other
process can kill: ``ftruncate`` needs only a read-write descriptor, and a mapped
page past the new end is a SIGBUS, which Python cannot catch. So a block is
**sealed** by default: :meth:`SharedTensorBlock.create` makes it a ``memfd``
(Linux), reserves its pages, and adds ``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``
before anyone else can open it (:func:`create_sealed`). The kernel then refuses
every change of its size, from any descriptor, for its whole life (``EPERM``), and
nobody can add or lift a seal. A hole punched into it reads as zeros and is filled
again on the next touch from kernel memory that has no size limit of its own, so
nothing a writer does to it reaches a mapping as a signal: neither the trainer that
made it nor the other workers that read it. Such a block has no ``/dev/shm`` name:
its name ``asyncrl_<pid>_<hex>_fd<n>`` says where others open it,
``/proc/<pid>/fd/<n>`` of the creator (same host, same PID namespace, same user);
:func:`open_segment` checks that the descriptor there is that memfd and that it is
sealed. It lives while its creator holds it or anyone maps it, so a crashed run
leaves nothing behind, and it is not bounded by the size of ``/dev/shm`` (it is
charged to the creator's memory).

``sealed=False`` makes a plain ``/dev/shm`` segment (``shm_open``), for a creator
that maps it and trusts every writer. A creator whose writer is less trusted than
itself and that must keep a ``/dev/shm`` name (the trainer and a local worker's batch
slots) never maps the segment: :class:`~transports.SharedTensorFile`
(``_shm_file.py``) reads it through its descriptor, so a writer that shrinks it
causes a short read there, not a SIGBUS.

Readers never register a ``/dev/shm`` segment with Python's ``resource_tracker``
(Python 3.11 would unlink a segment it merely attached to when the reader exits):
they map it with ``shm_open`` directly. The creator registers it, so a crashed
trainer's segment is still removed. POSIX only (sealed blocks: Linux).
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
from multiprocessing import resource_tracker
from typing import Any

from ._errors import ProtocolError, TransportError

try:
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None
try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["NAME_PREFIX", "SEALS", "SHM_DIR", "SharedMemoryFullError", "checked_name",
           "create_sealed", "is_sealed_name", "map_segment", "new_name", "open_segment",
           "remove_segment"]

NAME_PREFIX = "asyncrl_"
#: Where POSIX shared memory lives on Linux (glibc's shm_open): what a full one is called.
SHM_DIR = "/dev/shm"
#: A sealed block's name: its memfd's label, then the creator's descriptor number.
_SEALED_NAME = re.compile(r"(asyncrl_(\d{1,10})_[0-9a-f]{1,64})_fd(\d{1,10})\Z")
#: Seals every sealed block carries: its size is fixed for life, and so are its seals.
SEALS = (getattr(fcntl, "F_SEAL_SHRINK", 2) | getattr(fcntl, "F_SEAL_GROW", 4)
         | getattr(fcntl, "F_SEAL_SEAL", 1))


class SharedMemoryFullError(TransportError):
    """Shared memory (``/dev/shm``) has no room for a new block; nothing was left behind.

    ``needed`` and ``free`` are bytes (``free`` is -1 when it could not be read).
    Raised where the block is made, so the process that asked for it gets a
    Python error instead of a SIGBUS later.

    >>> error = SharedMemoryFullError("asyncrl_1_ab", needed=30 << 20, free=4 << 20)
    >>> error.needed, error.free
    (31457280, 4194304)
    >>> "--shm-size" in str(error)
    True
    """

    def __init__(self, name: str, *, needed: int, free: int, directory: str = SHM_DIR) -> None:
        self.name = name
        self.needed = needed
        self.free = free
        self.directory = directory
        free_text = "an unknown amount" if free < 0 else _mib(free)
        super().__init__(
            f"{directory} is too small: a shared-memory block ({name}) needs {_mib(needed)} "
            f"and {free_text} is free. Give shared memory more room: 'docker run "
            f"--shm-size=2g' (Docker's default is 64 MiB), in Kubernetes an emptyDir with "
            f"'medium: Memory' and a 'sizeLimit' mounted at {directory}; or remove what "
            f"fills it (ls -la {directory}: {NAME_PREFIX}* segments of runs that were killed)"
        )


def new_name() -> str:
    """A fresh segment name: ``asyncrl_<pid>_<random>``."""
    return f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"


def checked_name(name: Any) -> str:
    """``name`` if it can be a block's (ours, no path in it); ProtocolError if not.

    A name comes from another process: one that is not ours could open any file
    ``shm_open`` reaches.
    """
    if not (isinstance(name, str) and name.startswith(NAME_PREFIX) and len(name) < 250
            and "/" not in name):
        raise ProtocolError(f"shared-memory name {name!r} is not an asyncrl block name")
    return name


def is_sealed_name(name: str) -> bool:
    """True for the name of a sealed block (a memfd: see the module docstring)."""
    return _SEALED_NAME.match(name) is not None


def map_segment(name: str, *, create: int = 0) -> mmap.mmap:
    """Map the segment ``name``: a new ``/dev/shm`` one of ``create`` bytes, or the existing
    one (a sealed block's too: see :func:`open_segment`)."""
    fd = open_segment(name, create=create)
    try:
        if not create:
            return mmap.mmap(fd, os.fstat(fd).st_size)
        try:
            return mmap.mmap(fd, create)
        except BaseException:
            remove_segment(name)  # nothing half-made stays behind
            raise
    finally:
        os.close(fd)


def create_sealed(size: int) -> tuple[str, int]:
    """A new memfd of ``size`` bytes, its pages reserved and :data:`SEALS` added: its
    name (``asyncrl_<pid>_<hex>_fd<n>``) and its descriptor, the caller's to close."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is None or fcntl is None:  # pragma: no cover - not Linux
        raise TransportError("sealed shared-memory blocks need Linux (memfd_create); pass "
                             "sealed=False for a /dev/shm segment")
    label = new_name()
    fd: int = memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        _reserve(fd, size, label, directory="memory (memfd)")
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)  # before any other process can open it
    except BaseException:
        os.close(fd)
        raise
    return f"{label}_fd{fd}", fd


def _open_sealed(name: str) -> int | None:
    """A read-write descriptor of the sealed block ``name`` (None: not a sealed block's name).

    Opened through the creator's ``/proc/<pid>/fd/<n>``, then checked to be that memfd
    (a descriptor number is reused once closed) and to carry :data:`SEALS`.
    """
    match = _SEALED_NAME.match(name)
    if match is None:
        return None
    label, pid, number = match.group(1), match.group(2), match.group(3)
    try:
        fd = os.open(f"/proc/{pid}/fd/{number}", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise TransportError(
            f"shared-memory block {name!r} cannot be opened through /proc/{pid}/fd/{number} "
            f"({exc.strerror}): a sealed block is opened from its creator's process, on the "
            "same host, in the same PID namespace, by the same user") from None
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != f"/memfd:{label} (deleted)":
            raise FileNotFoundError(name)  # the creator closed it and reused the number
        if fcntl is None or fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS != SEALS:
            raise ProtocolError(f"shared-memory block {name!r} is not sealed: its size could "
                                "change under a mapping")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_segment(name: str, *, create: int = 0) -> int:
    """A read-write descriptor of ``/dev/shm/name``: a new segment of ``create`` bytes (its
    pages reserved, its name registered with the resource tracker), or the existing one
    (a sealed block's too, named as :func:`create_sealed` names it)."""
    if not create:
        sealed = _open_sealed(name)
        if sealed is not None:
            return sealed
    if _posixshmem is None:  # pragma: no cover
        raise TransportError("shared-memory blocks need a POSIX system")
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd: int = _posixshmem.shm_open("/" + name, flags, mode=0o600)
    if not create:
        return fd
    # The creator registers the name: if it crashes, the tracker unlinks it.
    resource_tracker.register("/" + name, "shared_memory")
    try:
        _reserve(fd, create, name)
    except BaseException:
        os.close(fd)
        remove_segment(name)  # nothing half-made stays behind
        raise
    return fd


def remove_segment(name: str) -> None:
    """Unlink ``/dev/shm/name`` and take it off the resource tracker's list (idempotent)."""
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass
    resource_tracker.unregister("/" + name, "shared_memory")


def _reserve(fd: int, size: int, name: str, directory: str = SHM_DIR) -> None:
    """Size the segment and reserve its pages now; :class:`SharedMemoryFullError` if no room.

    tmpfs hands out pages on first touch; one it cannot supply is a SIGBUS in
    whoever touches it. ``posix_fallocate`` takes them all at once, or fails.
    """
    free = _free_bytes(fd)
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        try:
            fallocate(fd, 0, size)
            return
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise SharedMemoryFullError(name, needed=size, free=free,
                                            directory=directory) from None
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
    # No way to reserve here (not Linux, or a filesystem without fallocate): at least
    # refuse what plainly does not fit.
    if 0 <= free < size:
        raise SharedMemoryFullError(name, needed=size, free=free, directory=directory)
    os.ftruncate(fd, size)


def _free_bytes(fd: int) -> int:
    """Bytes the filesystem under ``fd`` can still give an unprivileged writer; -1 if unknown."""
    try:
        stats = os.fstatvfs(fd)
    except OSError:
        return -1
    return stats.f_bavail * stats.f_frsize


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB ({nbytes} bytes)"
