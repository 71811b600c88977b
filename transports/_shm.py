"""Shared-memory tensor blocks: same-host bulk data (weights) that never crosses a socket.

A block is one shared-memory segment holding ``slots`` copies of a fixed
set of tensors (a flat ``{key: tensor}`` layout). One process writes, any number
read. Only the block's *name*, a slot index and a sequence number travel over
ZeroMQ; readers attach by name and find the layout in the segment itself
(its bytes: :mod:`._shm_format`). Where the memory comes from (a sealed memfd
by default, whose size no other process can change, or a ``/dev/shm``
segment), how its pages are reserved and how another process opens it is
:mod:`._shm_segment`'s. :class:`SharedTensorBlock` maps it as torch tensors;
the same segment is read as numpy arrays by :mod:`._shm_arrays` and through
its descriptor by :mod:`._shm_file`.

Each slot is guarded by a seqlock: the writer makes the slot's sequence number
odd, copies, writes the version, then makes it even again. A reader notes the
(even) sequence number, copies, and checks that it did not move; if it did, the
read was torn and :class:`TornReadError` is raised (the caller retries from
:meth:`SharedTensorBlock.latest`). With two slots the writer alternates, so a
reader of version *k* is only disturbed by the write of version *k + 2*.

Every tensor view keeps the mapping alive: ``close()`` drops the block's own
references and the segment is unmapped when the last view goes, never under a
tensor still in use.

The seqlock relies on loads and stores not being reordered across the copy
calls, which holds on x86-64 (TSO) and, in practice, on ARM64 too because every
copy is an opaque call that ends with a thread-pool join.
"""

from __future__ import annotations

import math
import mmap
import os
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ._errors import ProtocolError, TransportError
from ._shm_format import (
    LATEST_SLOT,
    plan_segment,
    read_header,
    slot_control_index,
    slot_control_offset,
)
from ._shm_segment import (
    checked_name,
    create_sealed,
    is_sealed_name,
    map_segment,
    new_name,
    remove_segment,
)
from ._torch_free import TORCH_FREE

if TYPE_CHECKING or not TORCH_FREE:  # a torch-free process attaches SharedArrayBlocks
    import torch

__all__ = ["PARALLEL_COPY_GRAIN", "SharedTensorBlock", "TornReadError", "copy_into"]


class TornReadError(TransportError):
    """A slot was overwritten before or while it was read; retry from ``latest()``."""


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
        # The header and every slot's control line, as int64 words read and written live.
        self._ctrl = np.frombuffer(mapped, dtype=np.int64, count=slot_control_index(slots))
        self._layout = layout
        self._views = [self._slot_views(data_offset + i * slot_size) for i in range(slots)]

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def create(cls, tensors: Mapping[str, torch.Tensor], *, slots: int = 2,
               name: str | None = None, sealed: bool = True) -> SharedTensorBlock:
        """A new segment sized for ``tensors`` (their dtypes and shapes; values are not copied).

        ``sealed`` (the default): a memfd whose size nobody can change (see
        :mod:`._shm_segment`); ``sealed=False``: a ``/dev/shm`` segment called ``name`` (a
        fresh one by default), for a creator that trusts every process that can open it.
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
            mapped = map_segment(name, create=plan.size)
        mapped[:len(plan.header)] = plan.header
        return cls(name, mapped, owner=True, layout=plan.layout, fd=fd,
                   data_offset=plan.data_offset, slot_size=plan.slot_size, slots=slots)

    @property
    def sealed(self) -> bool:
        """True for a memfd block whose size nobody can change (see :mod:`._shm_segment`)."""
        return is_sealed_name(self.name)

    @classmethod
    def attach(cls, name: str) -> SharedTensorBlock:
        """Map the segment ``name`` created by another process (or this one).

        Raises :class:`ProtocolError` if the name is not one of ours or the
        segment's header or layout is malformed.
        """
        try:
            mapped = map_segment(checked_name(name))
        except FileNotFoundError:
            raise TransportError(
                f"shared-memory block {name!r} does not exist: the trainer that created it "
                "has closed it or runs on another host (use the ZeroMQ scheme across hosts)"
            ) from None
        try:
            header = read_header(mapped, len(mapped))
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
        slot = int(ctrl[LATEST_SLOT])
        if not 0 <= slot < self.slots:
            return None
        seq, version = self.slot_state(slot)
        return slot, seq, version

    def slot_state(self, slot: int) -> tuple[int, int]:
        """``(seq, version)`` of ``slot``; an odd ``seq`` means a write is in progress."""
        ctrl = self._require_open()
        base = slot_control_index(self._check_slot(slot))
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
        start = slot_control_offset(self._check_slot(slot))
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
            slot = (int(ctrl[LATEST_SLOT]) + 1) % self.slots
        base = slot_control_index(self._check_slot(slot))
        self._check_tensors(tensors)
        seq = int(ctrl[base])
        if seq % 2:
            seq += 1  # a writer died mid-write: the slot holds garbage, start a clean round
        ctrl[base] = seq + 1  # odd: readers of this slot will see the tear
        for key, view in self._views[slot].items():
            copy_into(view, tensors[key])
        ctrl[base + 1] = version
        ctrl[base] = seq + 2
        ctrl[LATEST_SLOT] = slot
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
        base = slot_control_index(self._check_slot(slot))
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
