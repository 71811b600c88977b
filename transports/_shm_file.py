"""A shared-memory block its creator never maps: read and written through the descriptor.

A process that may write a segment may also shrink it. ``ftruncate`` needs only a
read-write descriptor, and any process of the same user gets one: ``shm_open`` of
the name, or ``/proc/PID/fd/N`` of the creator once the name is gone. A process
that then touches a mapped page past the new end gets SIGBUS, which Python
cannot catch: the interpreter dies without a traceback. A block whose writer is
less trusted than its creator (the trainer's batch slots, written by a local
worker that runs the user's env code) is therefore never mapped by its creator:
:class:`SharedTensorFile` copies a slot with ``preadv`` straight into the
destination tensor's own memory and writes a control word with ``pwrite``. The
kernel answers a segment shrunk before or during the copy with a short read,
which is a :class:`ProtocolError` naming the slot; a hole punched into it reads
as zeros. Nothing the writer does to the file reaches the reader as a signal.

The alternatives do not hold. Checking the size with ``fstat`` after a copy from
a mapping is too late: a truncate during the copy faults first. Sealing
(``memfd`` with ``F_SEAL_SHRINK``) stops a shrink but still lets the writer punch
holes, whose pages a mapping must fault in again; and it gives up the
``/dev/shm`` names that workers attach by and the page reservation that makes a
full ``/dev/shm`` an error at creation. Unlinking the name after the writer attached
leaves ``/proc/PID/fd``.

What it costs: the kernel's copy runs at about half memcpy's speed on these
machines (a 58 MB pixel batch: see ``docs/data_plane.md``); it releases the GIL.

The segment's format is :class:`~transports.SharedTensorBlock`'s (:mod:`._shm_format`): the
writer attaches with :meth:`SharedTensorBlock.attach` and writes through its
mapping as before (a writer that shrinks the segment only hurts itself).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import torch

from ._errors import ProtocolError, TransportError
from ._shm_format import plan_segment, slot_control_offset
from ._shm_segment import new_name, open_segment, remove_segment

__all__ = ["SharedTensorFile"]


class SharedTensorFile:
    """A :class:`~transports.SharedTensorBlock` segment its creator reads through its
    file descriptor only (see the module docstring): no mapping, so no SIGBUS.

    >>> block = SharedTensorFile.create({"x": torch.zeros(2, 3), "held": torch.zeros(1)})
    >>> from transports import SharedTensorBlock
    >>> writer = SharedTensorBlock.attach(block.name)
    >>> writer.slot_views(1)["x"].copy_(torch.arange(6.0).view(2, 3))[:, :2].tolist()
    [[0.0, 1.0], [3.0, 4.0]]
    >>> out = torch.empty(2, 2)
    >>> block.read_into(out, 1, "x")  # the first 2 entries along dim 1
    >>> out.tolist()
    [[0.0, 1.0], [3.0, 4.0]]
    >>> writer.close(); block.close(); block.unlink()
    """

    def __init__(self, name: str, fd: int, *,
                 layout: list[tuple[str, torch.dtype, tuple[int, ...], int]],
                 data_offset: int, slot_size: int, slots: int) -> None:
        self.name = name
        self.slots = slots
        self.slot_size = slot_size
        self._fd = fd
        self._unlinked = False
        self._data_offset = data_offset
        self._entries = {key: (dtype, shape, offset) for key, dtype, shape, offset in layout}
        self._size = data_offset + slots * slot_size

    @classmethod
    def create(cls, tensors: Mapping[str, torch.Tensor], *, slots: int = 2,
               name: str | None = None) -> SharedTensorFile:
        """A new segment sized for ``tensors`` (dtypes and shapes only), pages reserved
        (:class:`~transports.SharedMemoryFullError` if ``/dev/shm`` has no room)."""
        plan = plan_segment(tensors, slots)
        name = name or new_name()
        fd = open_segment(name, create=plan.size)
        try:
            # No other process knows the name yet, but a write still cannot fault.
            _write_exact(fd, plan.header, 0)
        except BaseException:
            os.close(fd)
            remove_segment(name)
            raise
        return cls(name, fd, layout=plan.layout, data_offset=plan.data_offset,
                   slot_size=plan.slot_size, slots=slots)

    # -- info ---------------------------------------------------------------------------------
    @property
    def layout(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """``{key: (dtype, shape)}`` of the tensors held in each slot."""
        return {key: (dtype, shape) for key, (dtype, shape, _) in self._entries.items()}

    @property
    def closed(self) -> bool:
        return self._fd < 0

    # -- control words ------------------------------------------------------------------------
    def slot_state(self, slot: int) -> tuple[int, int]:
        """``(seq, version)`` of ``slot``'s control line (the writer's seqlock; odd: writing)."""
        raw = self._read_bytes(16, slot_control_offset(self._check_slot(slot)), slot, "control")
        return (int.from_bytes(raw[:8], "little", signed=True),
                int.from_bytes(raw[8:], "little", signed=True))

    def read_word(self, slot: int, key: str) -> int:
        """The first element of ``key`` (an int64 tensor) in ``slot``."""
        raw = self._read_bytes(8, self._start(slot, key, torch.int64), slot, key)
        return int.from_bytes(raw, "little", signed=True)

    def write_word(self, slot: int, key: str, value: int) -> None:
        """Set the first element of ``key`` (an int64 tensor) in ``slot``.

        A write past a shrunk end grows the file again (sparse); it never faults.
        """
        _write_exact(self._require_open(), value.to_bytes(8, "little", signed=True),
                     self._start(slot, key, torch.int64))

    # -- tensors ------------------------------------------------------------------------------
    def read_into(self, destination: torch.Tensor, slot: int, key: str) -> None:
        """Copy ``key`` of ``slot`` into ``destination``, which has its dtype and shape, or
        for a tensor of 2 or more dimensions its first ``destination.shape[1]`` entries
        along dim 1 (a share cut short: ``[N, t, ...]`` of ``[N, T, ...]``).

        Raises :class:`ProtocolError` naming the slot if the segment ends before the
        data does (its writer shrank it): ``destination`` then holds a partial copy.
        """
        dtype, shape, _ = self._entry(key)
        start = self._start(slot, key, dtype)
        got = tuple(destination.shape)
        narrowed = (len(shape) >= 2 and len(got) == len(shape) and got[0] == shape[0]
                    and got[1] <= shape[1] and got[2:] == shape[2:])
        if destination.dtype != dtype or not (got == shape or narrowed):
            raise ValueError(f"{key}: destination {destination.dtype} {list(got)} does not fit "
                             f"the block's {dtype} {list(shape)}")
        if destination.numel() == 0:
            return
        if got == shape:
            self._read_tensor(destination, start, slot, key)
            return
        row = shape[1] * math.prod(shape[2:]) * dtype.itemsize  # bytes per entry of dim 0
        for index in range(got[0]):
            self._read_tensor(destination[index], start + index * row, slot, key)

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Close the descriptor (idempotent); the segment lives on until unlinked."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def unlink(self) -> None:
        """Remove the segment's name (idempotent); a writer's mapping stays valid."""
        if not self._unlinked:
            self._unlinked = True
            remove_segment(self.name)

    def __enter__(self) -> SharedTensorFile:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
        self.unlink()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._entries)} tensors x {self.slots} slots"
        return f"SharedTensorFile({self.name!r}, {state}, {self.slot_size} bytes/slot)"

    def __reduce__(self) -> Any:
        raise TypeError("a SharedTensorFile does not pickle: send its name and attach()")

    # -- internals ----------------------------------------------------------------------------
    def _require_open(self) -> int:
        if self._fd < 0:
            raise TransportError(f"shared-memory block {self.name} is closed")
        return self._fd

    def _check_slot(self, slot: int) -> int:
        if type(slot) is not int or not 0 <= slot < self.slots:
            raise ProtocolError(f"slot {slot!r} out of range for a block of {self.slots} slots")
        return slot

    def _entry(self, key: str) -> tuple[torch.dtype, tuple[int, ...], int]:
        entry = self._entries.get(key)
        if entry is None:
            raise KeyError(f"{key!r} is not in the block's layout: {sorted(self._entries)}")
        return entry

    def _start(self, slot: int, key: str, dtype: torch.dtype) -> int:
        held, _, offset = self._entry(key)
        if held != dtype:
            raise TypeError(f"{key} holds {held}, not {dtype}")
        return self._data_offset + self._check_slot(slot) * self.slot_size + offset

    def _read_tensor(self, destination: torch.Tensor, start: int, slot: int, key: str) -> None:
        if not destination.is_contiguous():  # a region of a bigger batch: rows are rare
            staging = torch.empty(destination.shape, dtype=destination.dtype)
            self._read_tensor(staging, start, slot, key)
            destination.copy_(staging)
            return
        buffer = destination.detach().view(-1).view(torch.uint8).numpy().data
        self._read_exact(buffer, start, slot, key)

    def _read_bytes(self, count: int, start: int, slot: int, what: str) -> bytes:
        buffer = bytearray(count)
        self._read_exact(memoryview(buffer), start, slot, what)
        return bytes(buffer)

    def _read_exact(self, buffer: memoryview, start: int, slot: int, what: str) -> None:
        fd, done, total = self._require_open(), 0, len(buffer)
        while done < total:  # a regular file reads whole, but at most 2 GiB per call
            count = os.preadv(fd, [buffer[done:]], start + done)
            if count == 0:
                raise ProtocolError(
                    f"shared-memory segment {self.name} ends at {os.fstat(fd).st_size} bytes, "
                    f"inside slot {slot} ({what} needs bytes up to {start + total}; the "
                    f"segment was made {self._size} bytes): its writer shrank it")
            done += count


def _write_exact(fd: int, data: bytes, start: int) -> None:
    view, done = memoryview(data), 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], start + done)
