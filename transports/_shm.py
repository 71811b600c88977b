"""Shared-memory tensor blocks: same-host bulk data (weights) that never crosses a socket.

A block is one POSIX shared-memory segment holding ``slots`` copies of a fixed
set of tensors (a flat ``{key: tensor}`` layout). One process writes, any number
read. Only the block's *name*, a slot index and a sequence number travel over
ZeroMQ; readers attach by name and find the layout in the segment itself.

Each slot is guarded by a seqlock: the writer makes the slot's sequence number
odd, copies, writes the version, then makes it even again. A reader notes the
(even) sequence number, copies, and checks that it did not move; if it did, the
read was torn and :class:`TornReadError` is raised (the caller retries from
:meth:`SharedTensorBlock.latest`). With two slots the writer alternates, so a
reader of version *k* is only disturbed by the write of version *k + 2*.

Segment format (all integers little-endian int64)::

    [0, 64)                 magic, layout length, layout offset, data offset, slot size, slots
    [64, 128)               latest slot written (-1 before the first write)
    [128 + 64 i, +16)       slot i: sequence number, version
    [layout offset, ...)    msgpack [[key, dtype, shape, offset], ...] (offsets inside a slot)
    [data offset + i * slot size, ...)   slot i's tensors, each 64-byte aligned

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
before anyone else can open it. The kernel then refuses every change of its size,
from any descriptor, for its whole life (``EPERM``), and nobody can add or lift a
seal. A hole punched into it reads as zeros and is filled again on the next
touch from kernel memory that has no size limit of its own, so nothing a writer
does to it reaches a mapping as a signal: neither the trainer that made it nor
the other workers that read it. Such a block has no ``/dev/shm`` name: its name
``asyncrl_<pid>_<hex>_fd<n>`` says where others open it, ``/proc/<pid>/fd/<n>``
of the creator (same host, same PID namespace, same user); :meth:`attach` checks
that the descriptor there is that memfd and that it is sealed. It lives while its
creator holds it or anyone maps it, so a crashed run leaves nothing behind, and it
is not bounded by the size of ``/dev/shm`` (it is charged to the creator's memory).

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

Every tensor view keeps the mapping alive: ``close()`` drops the block's own
references and the segment is unmapped when the last view goes, never under a
tensor still in use.

The seqlock relies on loads and stores not being reordered across the copy
calls, which holds on x86-64 (TSO) and, in practice, on ARM64 too because every
copy is an opaque call that ends with a thread-pool join.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import re
import secrets
import weakref
from collections.abc import Mapping
from multiprocessing import resource_tracker
from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack
import numpy as np

from ._codec import _TORCH_DTYPES, _TORCH_NAMES
from ._errors import ProtocolError, TransportError
from ._torch_free import TORCH_FREE

if TYPE_CHECKING or not TORCH_FREE:  # a torch-free process attaches SharedArrayBlocks
    import torch

try:
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None
try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["NAME_PREFIX", "SHM_DIR", "SharedMemoryFullError", "SharedTensorBlock",
           "TornReadError", "copy_into"]

NAME_PREFIX = "asyncrl_"
#: Where POSIX shared memory lives on Linux (glibc's shm_open): what a full one is called.
SHM_DIR = "/dev/shm"
MAGIC = int.from_bytes(b"ARLSHM01", "little")
MAX_SLOTS = 8
MAX_LAYOUT_BYTES = 16 << 20
_ALIGN = 64
_CTRL_INTS = 16  # bytes [0, 128): header and the latest slot
_SLOT_STRIDE = 8  # int64s per slot control line (64 bytes)
#: A sealed block's name: its memfd's label, then the creator's descriptor number.
_SEALED_NAME = re.compile(r"(asyncrl_(\d{1,10})_[0-9a-f]{1,64})_fd(\d{1,10})\Z")
#: Seals every sealed block carries: its size is fixed for life, and so are its seals.
SEALS = (getattr(fcntl, "F_SEAL_SHRINK", 2) | getattr(fcntl, "F_SEAL_GROW", 4)
         | getattr(fcntl, "F_SEAL_SEAL", 1))


class TornReadError(TransportError):
    """A slot was overwritten before or while it was read; retry from ``latest()``."""


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


class SharedTensorBlock:
    """A named shared-memory segment holding ``slots`` copies of a set of tensors.

    The writer creates it from example tensors and publishes versions with
    :meth:`write`; readers :meth:`attach` by name and copy a slot into their own
    tensors with :meth:`read_into`, which never returns a torn copy.

    >>> block = SharedTensorBlock.create({"w": torch.zeros(3)})
    >>> slot, seq = block.write({"w": torch.ones(3)}, version=1)
    >>> reader = SharedTensorBlock.attach(block.name)
    >>> out = {"w": torch.empty(3)}
    >>> reader.read_into(out, slot, seq)
    1
    >>> out["w"]
    tensor([1., 1., 1.])
    >>> reader.close(); block.close(); block.unlink()
    """

    def __init__(self, name: str, mapped: mmap.mmap, *, owner: bool,
                 layout: list[tuple[str, torch.dtype, tuple[int, ...], int]],
                 data_offset: int, slot_size: int, slots: int, fd: int = -1) -> None:
        self.name = name
        self.owner = owner
        #: Closes the creator's memfd (a sealed block): the name others open it by.
        self._fd_closer = weakref.finalize(self, os.close, fd) if fd >= 0 else None
        self.slots = slots
        self.slot_size = slot_size
        self._mm: mmap.mmap | None = mapped
        self._unlinked = False
        self._ctrl = np.frombuffer(mapped, dtype=np.int64, count=_CTRL_INTS + _SLOT_STRIDE * slots)
        self._layout = layout
        self._views = [self._slot_views(data_offset + i * slot_size) for i in range(slots)]

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def create(cls, tensors: Mapping[str, torch.Tensor], *, slots: int = 2,
               name: str | None = None, sealed: bool = True) -> SharedTensorBlock:
        """A new segment sized for ``tensors`` (their dtypes and shapes; values are not copied).

        ``sealed`` (the default): a memfd whose size nobody can change (see the module
        docstring); ``sealed=False``: a ``/dev/shm`` segment called ``name`` (a fresh
        one by default), for a creator that trusts every process that can open it.
        """
        plan = plan_segment(tensors, slots)
        if sealed:
            if name is not None:
                raise ValueError("a sealed block has no /dev/shm name to choose: its name says "
                                 "where others open it; pass sealed=False to name a segment")
            name, fd = create_sealed(plan.size)
            try:
                mapped = mmap.mmap(fd, plan.size)
            except BaseException:
                os.close(fd)
                raise
        else:
            name, fd = name or new_name(), -1
            mapped = _map(name, create=plan.size)
        mapped[:len(plan.header)] = plan.header
        return cls(name, mapped, owner=True, layout=plan.layout, fd=fd,
                   data_offset=plan.data_offset, slot_size=plan.slot_size, slots=slots)

    @property
    def sealed(self) -> bool:
        """True for a memfd block whose size nobody can change (see the module docstring)."""
        return _SEALED_NAME.match(self.name) is not None

    @classmethod
    def attach(cls, name: str) -> SharedTensorBlock:
        """Map the segment ``name`` created by another process (or this one).

        Raises :class:`ProtocolError` if the name is not one of ours or the
        segment's header or layout is malformed.
        """
        if not (isinstance(name, str) and name.startswith(NAME_PREFIX) and len(name) < 250
                and "/" not in name):
            raise ProtocolError(f"shared-memory name {name!r} is not an asyncrl block name")
        try:
            mapped = _map(name)
        except FileNotFoundError:
            raise TransportError(
                f"shared-memory block {name!r} does not exist: the trainer that created it "
                "has closed it or runs on another host (use the ZeroMQ scheme across hosts)"
            ) from None
        try:
            header = _read_header(mapped, len(mapped))
        except BaseException:
            mapped.close()  # no view exists yet
            raise
        return cls(name, mapped, owner=False, **header)

    # -- info ---------------------------------------------------------------------------------
    @property
    def layout(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """``{key: (dtype, shape)}`` of the tensors held in each slot."""
        return {key: (dtype, shape) for key, dtype, shape, _ in self._layout}

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data per slot."""
        return self.slot_size

    def region(self) -> tuple[int, int]:
        """``(address, length)`` of the whole mapping in this process (to pin it for DMA)."""
        mapped = self._mm
        if mapped is None:
            raise TransportError(f"shared-memory block {self.name} is closed")
        return int(self._ctrl.ctypes.data), len(mapped)

    @property
    def closed(self) -> bool:
        return self._mm is None

    def matches(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        """True if ``tensors`` have exactly this block's keys, dtypes and shapes."""
        layout = self.layout
        return tensors.keys() == layout.keys() and all(
            (t.dtype, tuple(t.shape)) == layout[k] for k, t in tensors.items()
        )

    def latest(self) -> tuple[int, int, int] | None:
        """``(slot, seq, version)`` of the last complete write, or None before the first."""
        ctrl = self._require_open()
        slot = int(ctrl[8])
        if not 0 <= slot < self.slots:
            return None
        seq, version = self.slot_state(slot)
        return slot, seq, version

    def slot_state(self, slot: int) -> tuple[int, int]:
        """``(seq, version)`` of ``slot``; an odd ``seq`` means a write is in progress."""
        ctrl = self._require_open()
        base = _CTRL_INTS + _SLOT_STRIDE * self._check_slot(slot)
        seq = int(ctrl[base])
        return seq, int(ctrl[base + 1])

    def control(self, slot: int) -> memoryview:
        """``slot``'s control line as int64 words ``[seq, version]``, read live.

        For a waiter that polls a slot's sequence number (a request or an answer
        written by another process): one index per poll, no call, no allocation.
        """
        mapped = self._mm
        if mapped is None:
            raise TransportError(f"shared-memory block {self.name} is closed")
        start = (_CTRL_INTS + _SLOT_STRIDE * self._check_slot(slot)) * 8
        return memoryview(mapped)[start:start + 16].cast("q")

    # -- writer -------------------------------------------------------------------------------
    def write(self, tensors: Mapping[str, torch.Tensor], version: int, *,
              slot: int | None = None) -> tuple[int, int]:
        """Copy ``tensors`` into a slot as ``version``; return ``(slot, seq)`` to publish.

        By default the slot after the latest one is used, so the latest complete
        version stays readable during the write. One writer per block.
        """
        ctrl = self._require_open()
        if slot is None:
            slot = (int(ctrl[8]) + 1) % self.slots
        base = _CTRL_INTS + _SLOT_STRIDE * self._check_slot(slot)
        self._check_tensors(tensors)
        seq = int(ctrl[base])
        if seq % 2:
            seq += 1  # a writer died mid-write: the slot holds garbage, start a clean round
        ctrl[base] = seq + 1  # odd: readers of this slot will see the tear
        for key, view in self._views[slot].items():
            copy_into(view, tensors[key])
        ctrl[base + 1] = version
        ctrl[base] = seq + 2
        ctrl[8] = slot
        return slot, seq + 2

    # -- reader -------------------------------------------------------------------------------
    def read_into(self, destination: Mapping[str, torch.Tensor], slot: int,
                  seq: int | None = None) -> int:
        """Copy ``slot`` into ``destination`` (same keys) and return its version.

        ``seq`` is the sequence number published with the slot; when given, a
        slot rewritten since then counts as torn. Raises :class:`TornReadError`
        when the slot changed before or during the copy: ``destination`` may then
        hold a mix and must be read again (e.g. from :meth:`latest`).
        """
        ctrl = self._require_open()
        base = _CTRL_INTS + _SLOT_STRIDE * self._check_slot(slot)
        if destination.keys() != self._views[slot].keys():
            raise KeyError("destination keys differ from the block's layout: "
                           f"{sorted(set(destination) ^ set(self._views[slot]))}")
        before = int(ctrl[base])
        if before % 2 or (seq is not None and before != seq):
            raise TornReadError(f"slot {slot} of {self.name} was overwritten (seq {before}, "
                                f"expected {seq}); read the latest slot instead")
        version = int(ctrl[base + 1])
        for key, view in self._views[slot].items():
            copy_into(destination[key], view)
        after = int(ctrl[base])
        if after != before:
            raise TornReadError(f"slot {slot} of {self.name} was rewritten during the read "
                                f"(seq {before} -> {after}); read the latest slot instead")
        return version

    def slot_views(self, slot: int) -> dict[str, torch.Tensor]:
        """``{key: tensor}`` viewing ``slot``'s memory itself (no copy).

        A zero-copy reader points its own tensors at these; it must not use them
        past the point where the writer may rewrite the slot (the caller's
        protocol decides when that is: the seqlock does not protect a view).
        """
        self._require_open()
        return self._views[self._check_slot(slot)]

    def read(self, slot: int, seq: int | None = None) -> tuple[int, dict[str, torch.Tensor]]:
        """``(version, {key: private copy})`` of ``slot``; see :meth:`read_into`."""
        out = {k: torch.empty(shape, dtype=dtype) for k, (dtype, shape) in self.layout.items()}
        return self.read_into(out, slot, seq), out

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Drop this block's mapping (idempotent); it is unmapped once no view uses it."""
        # Never mmap.close(): numpy does not hold a buffer export, so an explicit
        # unmap would leave live tensors pointing at nothing.
        self._views = []
        self._ctrl = None  # type: ignore[assignment]
        self._mm = None
        if self._fd_closer is not None:  # a sealed block: nobody attaches any more
            self._fd_closer()

    def unlink(self) -> None:
        """Remove the segment's name (creator only; idempotent). Mappings stay valid.

        A sealed block's name is the creator's descriptor: closing it is the unlink.
        """
        if not self.owner:
            raise TransportError(f"only the creator unlinks {self.name}")
        if self._unlinked:
            return
        self._unlinked = True
        if self._fd_closer is not None:
            self._fd_closer()
        else:
            remove_segment(self.name)

    def __enter__(self) -> SharedTensorBlock:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
        if self.owner:
            self.unlink()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._layout)} tensors x {self.slots} slots"
        return f"SharedTensorBlock({self.name!r}, {state}, {self.slot_size} bytes/slot)"

    def __reduce__(self) -> Any:
        raise TypeError("a SharedTensorBlock does not pickle: send its name and attach()")

    # -- internals ----------------------------------------------------------------------------
    def _require_open(self) -> np.ndarray:
        if self._mm is None:
            raise TransportError(f"shared-memory block {self.name} is closed")
        return self._ctrl

    def _check_slot(self, slot: int) -> int:
        if type(slot) is not int or not 0 <= slot < self.slots:
            raise ProtocolError(f"slot {slot!r} out of range for a block of {self.slots} slots")
        return slot

    def _check_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        layout = self.layout
        if tensors.keys() != layout.keys():
            raise KeyError(f"keys differ from the block's layout: "
                           f"{sorted(set(tensors) ^ set(layout))}")
        for key, tensor in tensors.items():
            if tuple(tensor.shape) != layout[key][1]:
                raise ValueError(f"{key}: shape {list(tensor.shape)}, block holds "
                                 f"{list(layout[key][1])}")

    def _slot_views(self, start: int) -> dict[str, torch.Tensor]:
        assert self._mm is not None
        views = {}
        for key, dtype, shape, offset in self._layout:
            nbytes = math.prod(shape) * dtype.itemsize
            # frombuffer keeps a reference to the mmap object: it outlives every view.
            raw = np.frombuffer(self._mm, dtype=np.uint8, count=nbytes, offset=start + offset)
            views[key] = torch.from_numpy(raw).view(dtype).view(shape)
        return views


#: Below this many elements torch copies on one thread (its intra-op grain size).
PARALLEL_COPY_GRAIN = 32768


def copy_into(destination: torch.Tensor, source: torch.Tensor) -> None:
    """``destination.copy_(source)``, as one plain memcpy when both are CPU, contiguous, same dtype.

    torch spreads a large copy over its intra-op thread pool; on a machine whose
    cores are busy (workers stepping envs) that pool waits for descheduled
    threads and a 4 MB copy can take 30 times longer than a single memcpy.
    A copy below torch's grain runs on one thread anyway, and ``copy_`` costs
    a third of numpy's views there (a small policy's weights: every layer).
    """
    if (destination.dtype == source.dtype and destination.shape == source.shape
            and destination.device.type == "cpu" and source.device.type == "cpu"
            and destination.is_contiguous() and source.is_contiguous()
            and not source.is_conj() and not source.is_neg() and destination.numel()):
        if destination.numel() < PARALLEL_COPY_GRAIN:
            destination.detach().copy_(source)
            return
        np.copyto(destination.detach().view(-1).view(torch.uint8).numpy(),
                  source.detach().view(-1).view(torch.uint8).numpy())
    else:
        with torch.no_grad():
            destination.copy_(source)


def _map(name: str, *, create: int = 0) -> mmap.mmap:
    """Map ``/dev/shm/name``: a new segment of ``create`` bytes, or the existing one."""
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


class SegmentPlan(NamedTuple):
    """A new segment's layout, sizes and first bytes (header, slot control lines, layout)."""

    layout: list[tuple[str, torch.dtype, tuple[int, ...], int]]
    slot_size: int
    data_offset: int
    size: int
    header: bytes


def plan_segment(tensors: Mapping[str, torch.Tensor], slots: int) -> SegmentPlan:
    """What :meth:`SharedTensorBlock.create` writes for ``tensors`` in ``slots`` slots."""
    if not 1 <= slots <= MAX_SLOTS:
        raise ValueError(f"slots must be between 1 and {MAX_SLOTS}, got {slots}")
    layout, slot_size = _plan(tensors)
    packed = msgpack.packb([[k, _TORCH_NAMES[d], list(s), o] for k, d, s, o in layout])
    layout_offset = _CTRL_INTS * 8 + _SLOT_STRIDE * 8 * slots
    data_offset = _round_up(layout_offset + len(packed), 4096)
    ctrl = np.zeros(layout_offset // 8, dtype="<i8")
    ctrl[:9] = [MAGIC, len(packed), layout_offset, data_offset, slot_size, slots, 0, 0, -1]
    return SegmentPlan(layout, slot_size, data_offset, data_offset + slots * slot_size,
                       ctrl.tobytes() + packed)


def new_name() -> str:
    """A fresh segment name: ``asyncrl_<pid>_<random>``."""
    return f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"


def slot_control_offset(slot: int) -> int:
    """Where ``slot``'s control line (``[seq, version]``, int64) starts in the segment."""
    return (_CTRL_INTS + _SLOT_STRIDE * slot) * 8


def _plan(tensors: Mapping[str, torch.Tensor]
          ) -> tuple[list[tuple[str, torch.dtype, tuple[int, ...], int]], int]:
    layout = []
    offset = 0
    for key, tensor in tensors.items():
        if not isinstance(key, str) or not isinstance(tensor, torch.Tensor):
            raise TypeError(f"a block holds {{str: Tensor}}, got {key!r}: {type(tensor)}")
        if tensor.dtype not in _TORCH_NAMES:
            raise TypeError(f"{key}: dtype {tensor.dtype} cannot live in a block")
        layout.append((key, tensor.dtype, tuple(tensor.shape), offset))
        offset = _round_up(offset + tensor.numel() * tensor.element_size(), _ALIGN)
    return layout, max(offset, _ALIGN)


def _read_header(buffer: Any, size: int, dtypes: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
    """The segment's layout (each dtype looked up by name in ``dtypes``: torch's by default)
    and sizes, checked against ``size``; ProtocolError if malformed."""
    if size < _CTRL_INTS * 8:
        raise ProtocolError(f"shared-memory segment of {size} bytes is too small for a block")
    head = np.frombuffer(buffer, dtype=np.int64, count=9)
    magic, layout_len, layout_offset, data_offset, slot_size, slots = (int(x) for x in head[:6])
    del head
    if magic != MAGIC:
        raise ProtocolError("shared-memory segment is not an asyncrl tensor block (bad magic)")
    if not 1 <= slots <= MAX_SLOTS or not 0 < layout_len <= MAX_LAYOUT_BYTES:
        raise ProtocolError(f"block header is malformed (slots={slots}, layout={layout_len} B)")
    if (layout_offset != _CTRL_INTS * 8 + _SLOT_STRIDE * 8 * slots
            or data_offset < layout_offset + layout_len or slot_size < 0
            or data_offset % _ALIGN or slot_size % _ALIGN
            or data_offset + slots * slot_size > size):
        raise ProtocolError("block header's offsets do not fit the segment")
    try:
        entries = msgpack.unpackb(buffer[layout_offset:layout_offset + layout_len], raw=False,
                                  use_list=True)
    except Exception as exc:
        raise ProtocolError(f"block layout is not valid msgpack: {exc}") from None
    return {"layout": _check_layout(entries, slot_size,
                                    _TORCH_DTYPES if dtypes is None else dtypes),
            "data_offset": data_offset,
            "slot_size": slot_size, "slots": slots}


def _check_layout(entries: Any, slot_size: int, dtypes: Mapping[str, Any]
                  ) -> list[tuple[str, Any, tuple[int, ...], int]]:
    if not isinstance(entries, list):
        raise ProtocolError("block layout must be a list")
    layout = []
    end = 0
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)):
            raise ProtocolError(f"block layout entry {entry!r} is not [key, dtype, shape, offset]")
        key, dtype_name, shape, offset = entry
        dtype = dtypes.get(dtype_name) if isinstance(dtype_name, str) else None
        if dtype is None or not isinstance(shape, list) or len(shape) > 32 or not all(
                type(d) is int and 0 <= d < (1 << 48) for d in shape):
            raise ProtocolError(f"block layout entry {key!r} has a bad dtype or shape")
        nbytes = math.prod(shape) * dtype.itemsize
        if (type(offset) is not int or offset < end or offset % _ALIGN
                or offset + nbytes > slot_size):
            raise ProtocolError(f"block layout entry {key!r} lies outside its slot or overlaps")
        end = offset + nbytes
        layout.append((key, dtype, tuple(shape), offset))
    return layout


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple
