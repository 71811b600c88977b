"""The bytes of a shared-memory block: its header, its slots' control lines, its layout.

One format serves every view of a block: :class:`~transports.SharedTensorBlock`
(mapped, torch tensors), :class:`~transports.SharedArrayBlock` (mapped, numpy
arrays, no torch) and :class:`~transports.SharedTensorFile` (read through the
descriptor, never mapped). A block holds ``slots`` copies of a fixed set of
tensors (a flat ``{key: tensor}`` layout); a reader finds that layout in the
segment itself, so only the block's name, a slot index and a sequence number
travel over ZeroMQ.

Segment format (all integers little-endian int64)::

    [0, 64)                 magic, layout length, layout offset, data offset, slot size, slots
    [64, 128)               latest slot written (-1 before the first write)
    [128 + 64 i, +16)       slot i: sequence number, version
    [layout offset, ...)    msgpack [[key, dtype, shape, offset], ...] (offsets inside a slot)
    [data offset + i * slot size, ...)   slot i's tensors, each 64-byte aligned

The header is written by whoever made the segment, which for a reader may be a
less trusted process: :func:`read_header` checks every size and offset against
the segment's length before a single view is made, and refuses anything else
with a :class:`~transports.ProtocolError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack
import numpy as np

from ._codec import TORCH_DTYPES, TORCH_NAMES
from ._errors import ProtocolError
from ._torch_free import TORCH_FREE

if TYPE_CHECKING or not TORCH_FREE:  # a torch-free process reads headers for SharedArrayBlocks
    import torch

__all__ = ["LATEST_SLOT", "MAGIC", "MAX_SLOTS", "SegmentPlan", "plan_segment", "read_header",
           "slot_control_index", "slot_control_offset"]

MAGIC = int.from_bytes(b"ARLSHM01", "little")
MAX_SLOTS = 8
MAX_LAYOUT_BYTES = 16 << 20
_ALIGN = 64
_CTRL_INTS = 16  # bytes [0, 128): header and the latest slot
#: Where the latest slot written is, in int64s from the segment's start.
LATEST_SLOT = 8
_SLOT_STRIDE = 8  # int64s per slot control line (64 bytes)


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
    packed = msgpack.packb([[k, TORCH_NAMES[d], list(s), o] for k, d, s, o in layout])
    layout_offset = _CTRL_INTS * 8 + _SLOT_STRIDE * 8 * slots
    data_offset = _round_up(layout_offset + len(packed), 4096)
    ctrl = np.zeros(layout_offset // 8, dtype="<i8")
    ctrl[:9] = [MAGIC, len(packed), layout_offset, data_offset, slot_size, slots, 0, 0, -1]
    return SegmentPlan(layout, slot_size, data_offset, data_offset + slots * slot_size,
                       ctrl.tobytes() + packed)


def slot_control_index(slot: int) -> int:
    """Where ``slot``'s control line (``[seq, version]``) starts, in int64s from the start.

    ``slot_control_index(slots)`` counts the int64s of the header and every control line.
    """
    return _CTRL_INTS + _SLOT_STRIDE * slot


def slot_control_offset(slot: int) -> int:
    """Where ``slot``'s control line (``[seq, version]``, int64) starts in the segment."""
    return slot_control_index(slot) * 8


def _plan(tensors: Mapping[str, torch.Tensor]
          ) -> tuple[list[tuple[str, torch.dtype, tuple[int, ...], int]], int]:
    layout = []
    offset = 0
    for key, tensor in tensors.items():
        if not isinstance(key, str) or not isinstance(tensor, torch.Tensor):
            raise TypeError(f"a block holds {{str: Tensor}}, got {key!r}: {type(tensor)}")
        if tensor.dtype not in TORCH_NAMES:
            raise TypeError(f"{key}: dtype {tensor.dtype} cannot live in a block")
        layout.append((key, tensor.dtype, tuple(tensor.shape), offset))
        offset = _round_up(offset + tensor.numel() * tensor.element_size(), _ALIGN)
    return layout, max(offset, _ALIGN)


def read_header(buffer: Any, size: int, dtypes: Mapping[str, Any] | None = None
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
                                    TORCH_DTYPES if dtypes is None else dtypes),
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
