"""A local env worker's finished chunks, handed to the trainer through shared memory.

An env worker records its steps into chunk buffers ``[E, C]`` (:mod:`.env_stepper`).
A remote one sends each finished chunk as a message; a local one writes it into
a **ring** of ``slots`` chunk slots (one :class:`transports.SharedTensorBlock`),
the chunk numbered ``n`` (from 1) into slot ``(n - 1) % slots``, and rings the
trainer's **chunk bell** (one eventfd for every local worker). The trainer's
event loop wakes, takes each ring's next chunks in order (a clone of views made
once) and counts them in the ring's ``taken`` word; a worker whose slots are all
full waits on its **room bell**, which the trainer rings after each take.

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
only after the trainer has taken the chunk in it (``taken``), so a reader that
saw the chunk's number reads a slot nobody writes meanwhile.

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

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from transports import SharedTensorBlock

from .._errors import BadBatchError
from .chunk_writer import ChunkWriter, Layout, Path, chunk_layout

__all__ = ["ChunkReader", "ChunkRing", "ChunkWriter", "TornChunkError", "chunk_buffers",
           "chunk_layout"]

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


class ChunkReader:
    """The trainer's end: :meth:`take` returns the ring's next chunk (a clone) or None.

    ``flat=True``: the chunk as ``[E * C]`` frames, env by env (what the batches are
    cut from); False: as ``[E, C]`` (trajectories are cut per env).
    """

    def __init__(self, ring: ChunkRing, *, flat: bool) -> None:
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
        #: Chunks taken so far.
        self.taken = 0

    def take(self) -> TensorDictBase | None:
        """The next chunk, copied out of its slot (which is then free); None: not yet written."""
        number = self.taken + 1
        k = (number - 1) % len(self._words)
        word = self._words[k]
        seq = word[0]
        if seq & 1 or word[1] != number:  # being written, or still the chunk before
            return None
        chunk = self._views[k].clone()
        if word[0] != seq:
            raise TornChunkError(f"chunk {number} was rewritten while it was read: its env "
                                 "worker wrote a slot the trainer had not taken")
        self.taken = number
        self._taken[0] = number
        return chunk

    def close(self) -> None:
        """Drop the views of the ring's memory (the ring's owner unmaps it)."""
        for word in self._words:
            if isinstance(word, memoryview):
                word.release()
        self._words, self._views, self._taken = [], [], None
