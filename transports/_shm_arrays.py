"""A :class:`~transports.SharedTensorBlock` attached as numpy arrays: no torch in the process.

A torch-free env worker (:mod:`._torch_free`) reads and writes the blocks the
trainer made (requests, answers, its chunk ring) through these views. The
segment, its header and its slots' control words are the same as
:mod:`._shm`'s (:mod:`._shm_format`); only the views differ. A dtype numpy
lacks (``bfloat16``) is viewed as the unsigned integer of its size: the bytes
are carried, never interpreted, which is all an env worker does with a policy
output.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._errors import ProtocolError, TransportError
from ._shm_format import read_header, slot_control_offset
from ._shm_segment import checked_name, map_segment

__all__ = ["SharedArrayBlock"]

_NAMES = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")
#: A block's dtype names and the numpy dtype each is viewed as.
_STORAGE: dict[str, np.dtype] = {name: np.dtype(name) for name in _NAMES}
_STORAGE["bfloat16"] = np.dtype(np.uint16)


class _Entry:
    """One layout entry, its dtype kept by name (what the header says) for :attr:`layout`."""

    __slots__ = ("itemsize", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.itemsize = _STORAGE[name].itemsize


_ENTRIES = {name: _Entry(name) for name in _STORAGE}


class SharedArrayBlock:
    """Attach-only, numpy-only twin of :class:`~transports.SharedTensorBlock`.

    ``layout`` gives ``{key: (dtype name, shape)}``; :meth:`slot_views` the
    slot's arrays (in the shared memory itself); :meth:`control` its live
    ``[seq, version]`` words. Writes follow the block's seqlock, by the caller.

    >>> from transports import SharedTensorBlock
    >>> import torch
    >>> block = SharedTensorBlock.create({"o": torch.zeros(2, 3),
    ...                                   "h": torch.ones(2, dtype=torch.bfloat16)})
    >>> arrays = SharedArrayBlock.attach(block.name)
    >>> arrays.layout
    {'o': ('float32', (2, 3)), 'h': ('bfloat16', (2,))}
    >>> arrays.slot_views(1)["o"][:] = 7
    >>> float(block.slot_views(1)["o"].sum()), arrays.slot_views(0)["h"].dtype.name
    (42.0, 'uint16')
    >>> arrays.close(); block.close(); block.unlink()
    """

    def __init__(self, name: str, mapped: Any, layout: list[tuple[str, Any, tuple[int, ...], int]],
                 data_offset: int, slot_size: int, slots: int) -> None:
        self.name = name
        self.slots = slots
        self.slot_size = slot_size
        self._mm: Any = mapped
        self._layout = [(key, entry.name, shape, offset) for key, entry, shape, offset in layout]
        self._views = [self._slot_views(data_offset + k * slot_size) for k in range(slots)]

    @classmethod
    def attach(cls, name: str) -> SharedArrayBlock:
        """Map the block ``name`` (made by another process); ProtocolError if malformed."""
        try:
            mapped = map_segment(checked_name(name))
        except FileNotFoundError:
            raise TransportError(f"shared-memory block {name!r} does not exist: the trainer "
                                 "that created it has closed it") from None
        try:
            header = read_header(mapped, len(mapped), _ENTRIES)
        except BaseException:
            mapped.close()  # no view exists yet
            raise
        return cls(name, mapped, **header)

    @staticmethod
    def storage_dtype(name: str) -> np.dtype:
        """The numpy dtype an array of the block dtype ``name`` is held in (KeyError: none).

        >>> SharedArrayBlock.storage_dtype("bfloat16"), SharedArrayBlock.storage_dtype("bool")
        (dtype('uint16'), dtype('bool'))
        """
        return _STORAGE[name]

    @property
    def layout(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """``{key: (dtype name, shape)}`` of the arrays held in each slot."""
        return {key: (dtype, shape) for key, dtype, shape, _ in self._layout}

    @property
    def closed(self) -> bool:
        return self._mm is None

    def slot_views(self, slot: int) -> dict[str, np.ndarray]:
        """``{key: array}`` viewing ``slot``'s memory itself (no copy)."""
        self._require_open()
        return self._views[self._check_slot(slot)]

    def control(self, slot: int) -> memoryview:
        """``slot``'s control line as int64 words ``[seq, version]``, read live."""
        mapped = self._require_open()
        start = slot_control_offset(self._check_slot(slot))
        return memoryview(mapped)[start:start + 16].cast("q")

    def close(self) -> None:
        """Drop this mapping (idempotent); it is unmapped once no view uses it."""
        self._views = []
        self._mm = None

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._layout)} arrays x {self.slots} slots"
        return f"SharedArrayBlock({self.name!r}, {state}, {self.slot_size} bytes/slot)"

    def __reduce__(self) -> Any:
        raise TypeError("a SharedArrayBlock does not pickle: send its name and attach()")

    def _require_open(self) -> Any:
        if self._mm is None:
            raise TransportError(f"shared-memory block {self.name} is closed")
        return self._mm

    def _check_slot(self, slot: int) -> int:
        if type(slot) is not int or not 0 <= slot < self.slots:
            raise ProtocolError(f"slot {slot!r} out of range for a block of {self.slots} slots")
        return slot

    def _slot_views(self, start: int) -> dict[str, np.ndarray]:
        views = {}
        for key, dtype, shape, offset in self._layout:
            storage = _STORAGE[dtype]
            count = math.prod(shape)
            # frombuffer keeps a reference to the mmap object: it outlives every view.
            views[key] = np.frombuffer(self._mm, dtype=storage, count=count,
                                       offset=start + offset).reshape(shape)
        return views
