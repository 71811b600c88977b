"""AsyncBatchedCollector's frames between the env workers' chunks and the trainer's batches.

Env workers hand over ``[E, C]`` chunks: a remote one as a message, which
:class:`ChunkBuffer` checks against what its worker agreed to send; a local one
through its shared-memory ring, whose layout is fixed. The buffer keeps them in
arrival order and cuts batches of ``frames_per_batch`` (or, with
``yield_completed_trajectories``, whole trajectories, joined across chunks) out of
them. ``buffered`` and ``full`` are what back-pressure reads.

A local worker's chunk stays in its ring slot until a batch is cut from it
(:meth:`~.chunk_ring.ChunkReader.hold`): the batch is allocated once and each piece
copied into it straight from its slot, which is then released. So the trainer holds
no copy of what the rings hold, and a frame is copied once here (it was twice: out of
the ring, then by ``torch.cat``). A ring whose slots all hold chunks the batches have
not reached yet, while the buffer has room, gives its oldest one a copy of its own
(its worker would wait for a slot, and a ring with fewer slots than a batch's share,
``MAX_SLOTS``, would never let a batch fill); trajectories are cut from copies.
"""

from __future__ import annotations

import collections
import math
import mmap
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from transports import copy_into

from .chunk_ring import ChunkReader, HeldChunk, TornChunkError

#: A local worker's chunk held in its ring slot (the worker's slot, the chunk).
Held = tuple[int, HeldChunk]


class SlotCounts(NamedTuple):
    """What one env worker slot sent: chunks, their frames, and when the last came."""

    chunks: int = 0
    frames: int = 0
    last: float | None = None  # time.monotonic() of its last chunk


class ChunkBuffer:
    """Checked chunks in arrival order, cut into batches or trajectories.

    >>> buffer = ChunkBuffer(chunk_steps=2, capacity=8, trajectories=False)
    >>> buffer.buffered, buffer.full
    (0, False)
    """

    def __init__(self, *, chunk_steps: int, capacity: int, trajectories: bool) -> None:
        self.chunk_steps = chunk_steps
        #: Frames held before back-pressure stops the env workers.
        self.capacity = capacity
        self.trajectories = trajectories
        #: Frames held, not yet taken.
        self.buffered = 0
        #: Arrival order: chunks of their own (remote, copied), or held in a ring slot.
        self._items: collections.deque[TensorDictBase | Held] = collections.deque()
        self._keys: dict[int, set[Any]] = {}  # slot -> its chunks' keys (set by the first)
        self._partial: dict[tuple[int, int], list[TensorDictBase]] = {}  # (slot, env) -> pieces
        #: Per slot, what its worker sent (accepted chunks only).
        self.counts: dict[int, SlotCounts] = {}

    @property
    def full(self) -> bool:
        return self.buffered >= self.capacity

    def ready(self, frames: int) -> bool:
        """Whether :meth:`take` (or :meth:`take_trajectory`) can answer now."""
        return bool(self._items) and self.buffered >= (1 if self.trajectories else frames)

    def forget(self, slot: int) -> None:
        """A new occupant of ``slot`` (or none): its keys are learnt again, its pieces lost."""
        self._keys.pop(slot, None)
        self.counts.pop(slot, None)
        for key in [k for k in self._partial if k[0] == slot]:
            del self._partial[key]

    def add(self, slot: int, chunk: Any, rows: int) -> str | None:
        """Keep ``chunk`` from worker ``slot`` (``rows`` envs); or say what is wrong with it."""
        if (not isinstance(chunk, TensorDictBase)
                or tuple(chunk.batch_size) != (rows, self.chunk_steps)):
            got = tuple(chunk.batch_size) if isinstance(chunk, TensorDictBase) else type(chunk)
            return (f"env worker {slot} sent a chunk of {got}, expected a TensorDict of batch "
                    f"size {(rows, self.chunk_steps)}")
        keys = set(chunk.keys(include_nested=True, leaves_only=True))
        expected = self._keys.setdefault(slot, keys)
        if keys != expected:
            return (f"env worker {slot} sent a chunk with keys "
                    f"{sorted(map(str, keys ^ expected))} changed")
        self.add_local(slot, chunk if self.trajectories else chunk.reshape(-1))
        return None

    def add_local(self, slot: int, chunk: TensorDictBase) -> None:
        """Keep a local env worker's chunk, taken from its ring (:mod:`asyncrl._inference.
        chunk_ring`): its layout is the ring's, nothing to check. ``[E * C]`` frames, or
        ``[E, C]`` when cutting trajectories."""
        if self.trajectories:
            self._add_trajectories(slot, chunk)
        else:
            self._append(chunk)
        self._count(slot, chunk.numel())

    def fill_from(self, rings: Sequence[tuple[int, ChunkReader]]) -> list[int]:
        """Take chunks from local workers' rings (``(slot, ChunkReader)``, in this order)
        while there is room: one chunk per ring per pass, so that when the room runs out
        no worker's chunks always come last. Returns the slot of each chunk taken.

        Batches are cut from a chunk in its slot (held, not copied: released once a
        batch has all of it); trajectories from a copy.
        A full buffer takes nothing: the chunks stay in their rings and their workers
        stop once their slots are full (back-pressure that needs no message).
        """
        taken: list[int] = []
        more = True
        while more and not self.full:
            more = False
            for slot, reader in rings:
                if self.full:
                    break
                if self.trajectories:
                    try:
                        chunk = reader.take()
                    except TornChunkError as exc:
                        raise TornChunkError(f"env worker {slot}: {exc}") from None
                    if chunk is None:
                        continue
                    self.add_local(slot, chunk)
                else:
                    held = reader.hold()
                    if held is None:
                        continue
                    self._append((slot, held))
                    self._count(slot, held.frames.numel())
                taken.append(slot)
                more = True
        if not self.full and not self.trajectories:
            for slot, reader in rings:
                if reader.all_held:  # its worker waits for a slot, and there is room
                    self._copy_oldest(slot, reader)
        return taken

    def _copy_oldest(self, slot: int, reader: ChunkReader) -> None:
        """Give ``reader``'s oldest held chunk a copy of its own and release its slot."""
        for i, item in enumerate(self._items):
            if isinstance(item, tuple) and item[1].reader is reader:
                held = item[1]
                frames = held.frames.clone()
                self._check(slot, held)
                self._items[i] = frames
                reader.release(held)
                return

    @staticmethod
    def _check(slot: int, held: HeldChunk) -> None:
        try:
            held.reader.check(held)
        except TornChunkError as exc:
            raise TornChunkError(f"env worker {slot}: {exc}") from None

    def let_go(self) -> None:
        """Forget the chunks held in rings (the collector closes: its rings are unmapped)."""
        kept = [item for item in self._items if not isinstance(item, tuple)]
        self.buffered -= sum(item[1].frames.numel() for item in self._items
                             if isinstance(item, tuple))
        self._items = collections.deque(kept)

    def _count(self, slot: int, frames: int) -> None:
        before = self.counts.get(slot, SlotCounts())
        self.counts[slot] = SlotCounts(before.chunks + 1, before.frames + frames,
                                       time.monotonic())

    def _append(self, item: TensorDictBase | Held) -> None:
        self._items.append(item)
        self.buffered += (item[1].frames if isinstance(item, tuple) else item).numel()

    def _add_trajectories(self, slot: int, chunk: TensorDictBase) -> None:
        done = chunk["next", "done"][..., 0]
        for env in range(chunk.shape[0]):
            row, ends = chunk[env], done[env].nonzero().flatten().tolist()
            start = 0
            for end in ends:
                pieces = self._partial.pop((slot, env), [])
                pieces.append(row[start:end + 1])
                self._append(torch.cat(pieces, 0) if len(pieces) > 1 else pieces[0])
                start = end + 1
            if start < row.shape[0]:
                self._partial.setdefault((slot, env), []).append(row[start:])

    def take(self, frames: int) -> TensorDictBase:
        """The next ``frames`` frames, in arrival order (``ready(frames)`` must be true).

        One batch allocated, each piece copied into it once (from its ring slot, or from
        a chunk of its own); a batch that is one chunk of its own is that chunk.
        """
        if self.trajectories:
            batch = self._items.popleft()
            assert not isinstance(batch, tuple)  # (trajectories are cut from copies)
            self.buffered -= batch.numel()
            return batch
        pieces: list[TensorDictBase] = []
        held: list[tuple[int, HeldChunk, bool]] = []  # (slot, chunk, all of it read)
        left = frames
        while left:
            head = self._items[0]
            chunk = head[1].frames if isinstance(head, tuple) else head
            whole = chunk.shape[0] <= left
            if whole:
                self._items.popleft()
                pieces.append(chunk)
                left -= chunk.shape[0]
            else:
                pieces.append(chunk[:left])
                if isinstance(head, tuple):
                    head[1].frames = chunk[left:]
                else:
                    self._items[0] = chunk[left:]
                left = 0
            if isinstance(head, tuple):
                held.append((head[0], head[1], whole))
        self.buffered -= frames
        if len(pieces) == 1 and not held:
            return pieces[0]
        batch = gather(pieces, frames)
        for slot, chunk, whole in held:
            self._check(slot, chunk)  # (the copies made, the slots not yet released)
            if whole:
                chunk.reader.release(chunk)
        return batch


#: A batch's leaf of at least this many bytes is a memory mapping of its own.
OWN_MAPPING = 1 << 20
HUGE_PAGES = getattr(mmap, "MADV_HUGEPAGE", None)


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype)``; one of :data:`OWN_MAPPING` bytes or more in an
    anonymous mapping of its own, unmapped when the tensor is freed.

    glibc maps a large block and unmaps it when freed, but each such free raises its
    threshold to that size (up to 32 MiB): the next batches then come from its heap, and
    a batch the trainer dropped stays in this process's memory (benchmarks.atari's
    default layout: 45-70 MB more trainer PSS, docs/benchmarks.md). The price is the
    pages faulted in again for each batch: about 9 ms of CPU per 58 MB batch with 2 MiB
    pages (``MADV_HUGEPAGE``, where the system allows it; 20 ms with 4 KiB pages),
    against the 14 ms that copying each frame once instead of twice saves.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < OWN_MAPPING:
        return torch.empty(shape, dtype=dtype)
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if HUGE_PAGES is not None:
        memory.madvise(HUGE_PAGES)  # a fault per 2 MiB, not per 4 KiB (where the system lets)
    # the array holds the mapping (no buffer export): unmapped with the tensor's storage
    return torch.from_numpy(np.frombuffer(memory, dtype=np.uint8)).view(dtype).view(shape)


def gather(pieces: Sequence[TensorDictBase], frames: int) -> TensorDictBase:
    """``torch.cat(pieces)`` (``frames`` in all), each leaf allocated once and each piece
    copied into it (one memcpy per contiguous piece, :func:`transports.copy_into`);
    pieces whose keys, dtypes or shapes differ go to ``torch.cat`` (which says why, or
    promotes, as before)."""
    first = pieces[0]
    keys = list(first.keys(include_nested=True, leaves_only=True))
    names = set(keys)
    sources: list[list[Any]] = []
    for piece in pieces:
        if piece is not first and set(piece.keys(include_nested=True,
                                                  leaves_only=True)) != names:
            return torch.cat(list(pieces), 0)
        sources.append([piece.get(key) for key in keys])
    leaves = sources[0]
    for leaf, *others in zip(*sources, strict=True):
        if type(leaf) is not torch.Tensor or leaf.device.type != "cpu" or any(
                type(t) is not torch.Tensor or t.dtype != leaf.dtype or t.device != leaf.device
                or t.shape[1:] != leaf.shape[1:] for t in others):
            return torch.cat(list(pieces), 0)
    device = first.device
    if any(piece.device != device for piece in pieces):
        device = None
    batch = TensorDict({}, batch_size=[frames], device=device)
    outs = []
    for key, leaf in zip(keys, leaves, strict=True):
        out = empty((frames, *leaf.shape[1:]), leaf.dtype)
        batch.set(key, out)
        outs.append(out)
    start = 0
    for piece, tensors in zip(pieces, sources, strict=True):
        stop = start + piece.shape[0]
        for out, tensor in zip(outs, tensors, strict=True):
            copy_into(out[start:stop], tensor)
        start = stop
    return batch


def auto_chunk_steps(frames_per_batch: int, num_envs: int) -> int:
    """Steps per chunk: up to 64 (TorchRL's figure), at most one batch's share per env."""
    return max(1, min(64, math.ceil(frames_per_batch / num_envs)))


__all__ = ["ChunkBuffer", "SlotCounts", "auto_chunk_steps", "gather"]
