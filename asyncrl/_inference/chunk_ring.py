"""A local env worker's finished chunks, handed to the trainer through shared memory.

An env worker records its steps into chunk buffers ``[E, C]`` (:mod:`.env_stepper`).
A remote one sends each finished chunk as a message; a local one writes it into
a **ring** of ``slots`` chunk slots (one :class:`transports.SharedTensorBlock`),
the chunk numbered ``n`` (from 1) into slot ``(n - 1) % slots``, and rings the
trainer's **chunk bell** (one eventfd for every local worker). The trainer's
event loop wakes and **holds** each ring's next chunks in order (:meth:`ChunkReader.hold`:
views made once, nothing copied); a batch is copied straight out of the slots it
is cut from, which are then released, counted in the ring's ``taken`` word. So a
frame is copied once in the trainer, into the batch, and the rings are the trainer's
only store of local workers' frames (:mod:`.chunk_buffer`). :meth:`ChunkReader.take`
copies a chunk out at once instead (trajectories are cut from such copies). A worker
whose slots are all full waits on its **room bell**, which the trainer rings after
each release.

So a chunk costs no encoding, no ZeroMQ message, no decoding and no credit
message: measured on 2 cores, those cost the trainer's event loop about 0.5 ms
per chunk of Python, which the central inference thread (sharing the GIL) waited
for (benchmarks/LOG.md). The layout is fixed when the ring is made
(:func:`~.chunk_writer.chunk_layout`, the same function the worker allocates its
buffers with; the worker's end, torch-free, is :mod:`.chunk_writer`):
a chunk cannot come with other keys, shapes or dtypes.

The slots follow the request blocks' seqlock (:mod:`.block_io`): the writer
makes the slot's sequence number odd, copies, stores the chunk's number as the
slot's version, makes the sequence even again. A writer writes slot ``k`` again
only after the trainer has released the chunk in it (``taken``), so a reader that
saw the chunk's number reads a slot nobody writes meanwhile (checked after each
read: :class:`TornChunkError`).

>>> import torch
>>> from asyncrl._inference.outputs import OutputLayout
>>> layout = chunk_layout([(("observation",), torch.float32, (3,))],
...                       OutputLayout(action=(torch.float32, (1,))))
>>> ring = ChunkRing.create(layout, rows=2, steps=4, slots=2)
>>> buffers = chunk_buffers(layout, rows=2, steps=4)
>>> writer = ChunkWriter(ring.names, buffers)
>>> _ = buffers[("observation",)].fill_(1.0)
>>> writer.has_room(), writer.publish()
(True, 1)
>>> reader = ChunkReader(ring, flat=True)
>>> chunk = reader.take()
>>> chunk.batch_size, chunk["observation"].sum().item(), reader.take()
(torch.Size([8]), 24.0, None)
>>> writer.close(); reader.close(); ring.close()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from transports import SharedTensorBlock

from .._errors import BadBatchError
from .chunk_writer import ChunkWriter, Layout, Path, chunk_layout

__all__ = ["ChunkReader", "ChunkRing", "ChunkWriter", "HeldChunk", "TornChunkError",
           "chunk_buffers", "chunk_layout"]

class TornChunkError(BadBatchError, RuntimeError):
    """A chunk slot was rewritten while the trainer read it (its writer broke the protocol).

    A :class:`~asyncrl.BadBatchError` (asyncrl's tree), and a ``RuntimeError`` as before.
    """


def chunk_buffers(layout: Layout, *, rows: int, steps: int) -> dict[Path, torch.Tensor]:
    """Zeroed ``[rows, steps, *shape]`` tensors of ``layout`` (torch dtypes)."""
    return {path: torch.zeros((rows, steps, *shape), dtype=dtype)
            for path, (dtype, shape) in layout.items()}


def _key(path: Path) -> Any:
    return path[0] if len(path) == 1 else path


class ChunkRing:
    """The shared memory of one local env worker's chunks: the slots and ``taken``.

    Made (and unlinked) by the trainer; the worker attaches by :attr:`names`.
    """

    def __init__(self, block: SharedTensorBlock, taken: SharedTensorBlock, layout: Layout,
                 rows: int, steps: int) -> None:
        self.block = block
        self.taken_block = taken
        self.layout = layout
        self.rows = rows
        self.steps = steps
        self.paths = list(layout)

    @classmethod
    def create(cls, layout: Layout, *, rows: int, steps: int, slots: int) -> ChunkRing:
        if slots < 1:
            raise ValueError(f"a chunk ring needs at least one slot, got {slots}")
        example = {f"c{i}": t for i, t in enumerate(
            chunk_buffers(layout, rows=rows, steps=steps).values())}
        block = SharedTensorBlock.create(example, slots=slots)
        try:
            taken = SharedTensorBlock.create({"taken": torch.zeros(1, dtype=torch.int64)},
                                             slots=1)
        except BaseException:
            block.close()
            block.unlink()
            raise
        return cls(block, taken, layout, rows, steps)

    @property
    def names(self) -> tuple[str, str]:
        """What a worker attaches to: the slots' block, then the ``taken`` word's."""
        return self.block.name, self.taken_block.name

    @property
    def slots(self) -> int:
        return int(self.block.slots)

    def close(self) -> None:
        """Close and unlink both blocks (the trainer's; idempotent)."""
        for block in (self.block, self.taken_block):
            if not block.closed:
                block.close()
                block.unlink()


class HeldChunk:
    """A chunk the trainer holds in its ring slot (:meth:`ChunkReader.hold`): its frames
    are read where the worker wrote them, and the slot stays the trainer's until
    :meth:`ChunkReader.release`.

    ``frames`` are the chunk's frames not yet cut into a batch (a view of the slot).
    """

    __slots__ = ("frames", "number", "reader", "seq")

    def __init__(self, reader: ChunkReader, number: int, seq: int,
                 frames: TensorDictBase) -> None:
        self.reader, self.number, self.seq, self.frames = reader, number, seq, frames


class ChunkReader:
    """The trainer's end: :meth:`take` returns the ring's next chunk (a clone) or None;
    :meth:`hold` the next chunk in its slot (a view, kept until :meth:`release`).

    ``flat=True``: the chunk as ``[E * C]`` frames, env by env (what the batches are
    cut from); False: as ``[E, C]`` (trajectories are cut per env). ``on_release``:
    called once a slot is free again (the worker's room bell: a worker whose slots are
    all full waits on it).
    """

    def __init__(self, ring: ChunkRing, *, flat: bool,
                 on_release: Callable[[], None] | None = None) -> None:
        self.ring = ring
        block = ring.block
        self._words = [block.control(k) for k in range(ring.slots)]
        self._views: list[TensorDictBase] = []
        for k in range(ring.slots):
            views = block.slot_views(k)
            chunk = TensorDict({}, batch_size=[ring.rows, ring.steps])
            for i, path in enumerate(ring.paths):
                chunk.set(_key(path), views[f"c{i}"])
            self._views.append(chunk.reshape(-1) if flat else chunk)
        self._taken: Any = ring.taken_block.slot_views(0)["taken"].numpy()
        self._on_release = on_release
        #: Chunks taken so far (their slots free again).
        self.taken = 0
        #: Chunks handed out so far: taken, or held in their slots (:meth:`hold`).
        self.seen = 0

    @property
    def held(self) -> int:
        """Chunks held in their slots (:meth:`hold`), not released yet."""
        return self.seen - self.taken

    @property
    def all_held(self) -> bool:
        """Whether every slot holds a chunk the trainer holds: its worker waits for one."""
        return self.seen - self.taken >= len(self._words)

    def hold(self) -> HeldChunk | None:
        """The next chunk, left in its slot (a view: nothing copied); None: not yet written.

        Its slot is not written again until :meth:`release`: read its frames, then
        :meth:`check` that they were not rewritten meanwhile (a writer breaking the
        protocol), then release it. Chunks are released in the order they were held.
        """
        number = self.seen + 1
        k = (number - 1) % len(self._words)
        word = self._words[k]
        if word[1] != number:  # still the chunk before (or being written)
            return None
        # The sequence read after the chunk's number (the writer stores the number, then
        # makes the sequence even): read first, it could be the one before that write
        # began, and the check after the read would call a whole chunk torn.
        seq = word[0]
        if seq & 1:  # being written again (a writer breaking the protocol, or killed)
            return None
        self.seen = number
        return HeldChunk(self, number, seq, self._views[k])

    def check(self, chunk: HeldChunk) -> None:
        """Raise :class:`TornChunkError` if ``chunk``'s slot was written since it was held."""
        word = self._words[(chunk.number - 1) % len(self._words)]
        if word[0] != chunk.seq or word[1] != chunk.number:
            raise TornChunkError(f"chunk {chunk.number} was rewritten while it was read: its "
                                 "env worker wrote a slot the trainer had not taken")

    def release(self, chunk: HeldChunk) -> None:
        """``chunk``'s slot is free again (its worker may write it); rings ``on_release``."""
        if chunk.number != self.taken + 1:
            raise RuntimeError(f"chunks are released in the order held: chunk "
                               f"{self.taken + 1} first, not {chunk.number}")
        self.taken = chunk.number
        self._taken[0] = chunk.number
        if self._on_release is not None:
            self._on_release()

    def take(self) -> TensorDictBase | None:
        """The next chunk, copied out of its slot (which is then free); None: not yet written."""
        if self.held:
            raise RuntimeError(f"{self.held} chunks are held: release them before a take")
        held = self.hold()
        if held is None:
            return None
        try:
            chunk = held.frames.clone()
            self.check(held)
        except BaseException:
            self.seen -= 1  # not taken
            raise
        self.release(held)
        return chunk

    def close(self) -> None:
        """Drop the views of the ring's memory (the ring's owner unmaps it)."""
        for word in self._words:
            if isinstance(word, memoryview):
                word.release()
        self._words, self._views, self._taken = [], [], None
