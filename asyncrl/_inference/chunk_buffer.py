"""AsyncBatchedCollector's frames between the env workers' chunks and the trainer's batches.

Env workers hand over ``[E, C]`` chunks: a remote one as a message, which
:class:`ChunkBuffer` checks against what its worker agreed to send; a local one
through its shared-memory ring, whose layout is fixed. The buffer keeps them in
arrival order and cuts batches of ``frames_per_batch`` (or, with
``yield_completed_trajectories``, whole trajectories, joined across chunks) out of
them. ``buffered`` and ``full`` are what back-pressure reads.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from tensordict import TensorDictBase

from .chunk_ring import TornChunkError


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
        self._items: collections.deque[TensorDictBase] = collections.deque()
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

    def fill_from(self, rings: Sequence[tuple[int, Any]]) -> list[int]:
        """Take chunks from local workers' rings (``(slot, ChunkReader)``, in this order)
        while there is room: one chunk per ring per pass, so that when the room runs out
        no worker's chunks always come last. Returns the slot of each chunk taken.

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
                try:
                    chunk = reader.take()
                except TornChunkError as exc:
                    raise TornChunkError(f"env worker {slot}: {exc}") from None
                if chunk is not None:
                    self.add_local(slot, chunk)
                    taken.append(slot)
                    more = True
        return taken

    def _count(self, slot: int, frames: int) -> None:
        before = self.counts.get(slot, SlotCounts())
        self.counts[slot] = SlotCounts(before.chunks + 1, before.frames + frames,
                                       time.monotonic())

    def _append(self, frames: TensorDictBase) -> None:
        self._items.append(frames)
        self.buffered += frames.numel()

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
        """The next ``frames`` frames, in arrival order (``ready(frames)`` must be true)."""
        if self.trajectories:
            batch = self._items.popleft()
            self.buffered -= batch.numel()
            return batch
        pieces, left = [], frames
        while left:
            head = self._items[0]
            if head.numel() <= left:
                pieces.append(self._items.popleft())
                left -= head.numel()
            else:
                pieces.append(head[:left])
                self._items[0] = head[left:]
                left = 0
        self.buffered -= frames
        return torch.cat(pieces, 0) if len(pieces) > 1 else pieces[0]


def auto_chunk_steps(frames_per_batch: int, num_envs: int) -> int:
    """Steps per chunk: up to 64 (TorchRL's figure), at most one batch's share per env."""
    return max(1, min(64, math.ceil(frames_per_batch / num_envs)))


__all__ = ["ChunkBuffer", "SlotCounts", "auto_chunk_steps"]
