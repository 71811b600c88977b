"""A weight version cut into bounded chunk messages, and put back together on the worker.

The sender walks the tensors of a snapshot in order and cuts their bytes into
chunks of at most ``chunk_bytes`` (:func:`plan_chunks`); each chunk message
carries its :class:`~asyncrl._protocol.WeightChunk` meta (index, count, and
per piece ``(key, byte offset, bytes)``) and the pieces as uint8 frames, views
of the snapshot (nothing is copied to send them). Chunk 0 also carries the
layout: every key with its dtype and shape.

The first transmission fills the snapshot chunk by chunk as the chunks go out
(:class:`ChunkFilling`), so the copy of the next one overlaps the wire.

On the worker a :class:`ChunkAssembly` takes the chunks of one stream in
order and writes each piece into a preallocated receive buffer (one per
layout, reused from version to version), checking everything against the
layout the worker's own model has: the stream must cover every byte of every
tensor exactly once, in order, so a hostile, lost or reordered chunk is
refused with a :class:`~transports.ProtocolError` before it writes anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import torch

from transports import ProtocolError

from .._protocol import WeightChunk
from ._errors import WeightMismatchError
from ._sender import THREAD_COPY_BYTES

__all__ = ["DEFAULT_CHUNK_BYTES", "ChunkAssembly", "ChunkFilling", "Layout", "chunk_bodies",
           "layout_of", "plan_chunks", "streamable", "total_nbytes"]

#: Default size of one chunk: big enough that per-message costs vanish, small
#: enough that the worker copies a chunk while the next one is on the wire.
DEFAULT_CHUNK_BYTES = 16 << 20

#: dtypes a streamed layout may name (the codec's whitelist of plain numeric types).
_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
                 "float32", "float64", "complex64", "complex128")
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}

#: ``((key, dtype name, shape), ...)`` in stream order.
Layout = tuple[tuple[str, str, tuple[int, ...]], ...]


def streamable(views: Mapping[str, torch.Tensor]) -> bool:
    """True if ``views`` can be cut into byte ranges: contiguous CPU tensors of known dtypes."""
    return bool(views) and all(
        t.device.type == "cpu" and t.is_contiguous() and t.dtype in _NAMES
        and not t.is_conj() and not t.is_neg() for t in views.values())


def layout_of(views: Mapping[str, torch.Tensor]) -> Layout:
    return tuple((key, _NAMES[t.dtype], tuple(t.shape)) for key, t in views.items())


def plan_chunks(views: Mapping[str, torch.Tensor], chunk_bytes: int) -> list[WeightChunk]:
    """The chunks of a stream of ``views`` (see :func:`streamable`), each <= ``chunk_bytes``."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    chunks: list[list[tuple[str, int, int]]] = [[]]
    room = chunk_bytes
    for key, tensor in views.items():
        size, offset = _nbytes(tensor), 0
        while offset < size:
            if room == 0:
                chunks.append([])
                room = chunk_bytes
            take = min(room, size - offset)
            chunks[-1].append((key, offset, take))
            offset += take
            room -= take
    layout = layout_of(views)
    return [WeightChunk(i, len(chunks), tuple(parts), layout if i == 0 else ())
            for i, parts in enumerate(chunks)]


def chunk_bodies(views: Mapping[str, torch.Tensor], chunk: WeightChunk) -> list[torch.Tensor]:
    """The frames of ``chunk``: uint8 views of ``views`` (no copy)."""
    return [_bytes_of(views[key])[offset:offset + size] for key, offset, size in chunk.parts]


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).view(torch.uint8)


class ChunkFilling:
    """A snapshot filled chunk by chunk, in the order the chunks go out."""

    def __init__(self, payload: Any, source: Mapping[str, torch.Tensor],
                 views: Mapping[str, torch.Tensor], chunks: list[WeightChunk]) -> None:
        self.payload = payload
        self.chunks = chunks
        self._pairs = [(_bytes_of(views[key]), _bytes_of(source[key])) for key in views]
        self._index = {key: i for i, key in enumerate(views)}
        self.filled = -1  # chunks copied so far: 0..filled

    @property
    def done(self) -> bool:
        return self.filled == len(self.chunks) - 1

    async def upto(self, index: int) -> None:
        """Copy the chunks up to ``index`` from the model into the snapshot (once each)."""
        while self.filled < index:
            chunk = self.chunks[self.filled + 1]
            if sum(size for _, _, size in chunk.parts) > THREAD_COPY_BYTES:
                # A thread keeps the event loop (heartbeats, acks) running during the copy.
                await anyio.to_thread.run_sync(self._copy, chunk)
            else:  # a few ms: cheaper inline than a thread hop
                self._copy(chunk)
                await anyio.lowlevel.checkpoint()
            self.filled = chunk.index

    def _copy(self, chunk: WeightChunk) -> None:
        for key, offset, size in chunk.parts:
            into, source = self._pairs[self._index[key]]
            np.copyto(into[offset:offset + size].numpy(), source[offset:offset + size].numpy())


def total_nbytes(flat: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in flat.values())


class ChunkAssembly:
    """One stream being received: checks each chunk and writes it into ``buffers``.

    ``layout`` is the stream's (from chunk 0), already checked against the
    worker's model by :func:`check_layout`; ``buffers`` hold one tensor per
    key in that layout (the receive buffer). Chunks must come in order and
    cover each tensor's bytes exactly once; anything else raises
    ``ProtocolError`` and nothing of that chunk is written.
    """

    def __init__(self, version: int, count: int, layout: Layout,
                 buffers: dict[str, torch.Tensor]) -> None:
        self.version = version
        self.count = count
        self.layout = layout
        self.buffers = buffers
        self.next_index = 0
        self._keys = iter(self._nonempty())
        first = next(self._keys, None)
        #: The next piece due: (key, byte offset); None once every byte was written.
        self._expect: tuple[str, int] | None = None if first is None else (first, 0)

    def _nonempty(self) -> Iterator[str]:
        for key, _, _ in self.layout:
            if _nbytes(self.buffers[key]):
                yield key

    @property
    def complete(self) -> bool:
        return self.next_index == self.count and self._expect is None

    def write(self, chunk: WeightChunk, body: Any) -> None:
        """Check ``chunk`` (and its frames ``body``) continues the stream, then copy it in."""
        if chunk.index != self.next_index or chunk.count != self.count:
            raise ProtocolError(
                f"weights chunk {chunk.index} of {chunk.count} of version {self.version}: "
                f"expected chunk {self.next_index} of {self.count} (chunks lost or reordered)")
        if not isinstance(body, list) or len(body) != len(chunk.parts):
            raise ProtocolError(f"weights chunk {chunk.index} must carry one frame per part "
                                f"({len(chunk.parts)}), got {type(body).__name__}"
                                + (f" of {len(body)}" if isinstance(body, list) else ""))
        writes = self._check(chunk, body)
        last = chunk.index == chunk.count - 1
        if last and self._expect is not None:
            raise ProtocolError(f"the last weights chunk of version {self.version} leaves "
                                f"{self._expect[0]!r} from byte {self._expect[1]} unwritten")
        for target, frame in writes:
            np.copyto(target.numpy(), frame.numpy())
        self.next_index += 1

    def _check(self, chunk: WeightChunk, body: Sequence[Any]
               ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The (destination, source) byte views of ``chunk``; advances the expected piece."""
        writes = []
        expect = self._expect
        for (key, offset, size), frame in zip(chunk.parts, body, strict=True):
            if expect is None:
                raise ProtocolError(f"weights chunk {chunk.index} of version {self.version} "
                                    f"carries {key!r} past the end of the layout")
            want_key, want_offset = expect
            room = _nbytes(self.buffers[want_key]) - want_offset
            if key != want_key or offset != want_offset or size > room:
                raise ProtocolError(
                    f"weights chunk {chunk.index} of version {self.version} carries {key!r} "
                    f"bytes {offset}..{offset + size}; expected {want_key!r} from byte "
                    f"{want_offset} (at most {room} bytes)")
            if not (isinstance(frame, torch.Tensor) and frame.dtype == torch.uint8
                    and frame.dim() == 1 and frame.numel() == size):
                raise ProtocolError(f"weights chunk {chunk.index}: the frame of {key!r} must be "
                                    f"{size} bytes (uint8), got {_describe(frame)}")
            writes.append((_bytes_of(self.buffers[key])[offset:offset + size], frame))
            if size == room:
                following = next(self._keys, None)
                expect = None if following is None else (following, 0)
            else:
                expect = (key, offset + size)
        self._expect = expect
        return writes


def check_layout(layout: Layout, targets: Mapping[str, torch.Tensor], what: str) -> None:
    """Raise unless a stream of ``layout`` fits the worker's tensors ``targets`` (keys, shapes)."""
    bad = [(key, dtype) for key, dtype, _ in layout if dtype not in _DTYPES]
    if bad:
        raise ProtocolError(f"{what}: dtypes {bad[:5]} are not streamable; known: "
                            f"{sorted(_DTYPES)}")
    keys = [key for key, _, _ in layout]
    if len(set(keys)) != len(keys):
        raise ProtocolError(f"{what}: the layout names a key twice")
    sources = dict.fromkeys(keys)
    missing = [k for k in targets if k not in sources]
    unexpected = [k for k in keys if k not in targets]
    wrong = [(k, tuple(targets[k].shape), shape) for k, _, shape in layout
             if k in targets and tuple(targets[k].shape) != shape]
    if missing or unexpected or wrong:
        raise WeightMismatchError(missing=missing, unexpected=unexpected, wrong_shape=wrong,
                                  what=what)


def empty_buffers(layout: Layout) -> dict[str, torch.Tensor]:
    """A receive buffer for ``layout``: one contiguous tensor per key (values unset)."""
    return {key: torch.empty(shape, dtype=_DTYPES[dtype]) for key, dtype, shape in layout}


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _describe(frame: Any) -> str:
    if isinstance(frame, torch.Tensor):
        return f"{frame.dtype} of shape {tuple(frame.shape)}"
    return type(frame).__name__
