"""The local env workers' shared memory and doorbells, made together and closed together.

Each local env worker (a slot) has two blocks, its observations and the policy's
outputs (:func:`~asyncrl._inference.worker_blocks.make_blocks`), an answer bell
the inference loop rings, a chunk ring it writes its transitions into
(:mod:`.chunk_ring`, read by the trainer) and a room bell the trainer rings when
it frees a slot of that ring. Every worker rings the one request bell (the
loop's) and the one chunk bell (the trainer's). A remote env host's slot adds
inline blocks to :attr:`LocalChannels.blocks` (:mod:`.remote_env_hosts`), and
nothing else. :meth:`LocalChannels.read_chunks` hands the chunks in the rings to
the trainer's :class:`~.chunk_buffer.ChunkBuffer` (which cuts batches straight out of
their slots).
"""

from __future__ import annotations

import math
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
import torch

from transports._shm_format import MAX_SLOTS

from .chunk_buffer import ChunkBuffer
from .chunk_ring import ChunkReader, ChunkRing, chunk_layout
from .doorbell import EventFd
from .env_stepper import build_pool
from .info_columns import InfoColumn, learn_columns
from .outputs import OutputLayout
from .worker_blocks import WorkerBlocks, make_blocks

Path = tuple[str, ...]


def probe_env(factory: Any, create_env_kwargs: Mapping[str, Any], info_keys: Any = None
              ) -> tuple[dict[Path, torch.Tensor], Any, list[InfoColumn]]:
    """Build one env (in the trainer, once), reset it: its first observations (a batch
    of one) by path, its action spec and the info columns of ``info_keys`` (normalised;
    :func:`~.info_columns.learn_columns`): the layouts the channels are made for."""
    probe = build_pool([factory], dict(create_env_kwargs))
    try:
        infos = learn_columns(probe, info_keys)
        probe.reset()
        obs = {tuple(p): torch.from_numpy(a.copy())
               for p, a in zip(probe.obs_paths, probe.obs_arrays, strict=True)}
        return obs, probe.specs.action, infos
    finally:
        probe.close()


def ring_slots(frames_per_batch: int, *, workers: int, envs: int, chunk_steps: int) -> int:
    """Chunk slots of a local worker's ring: its share of one batch (``workers`` rings,
    ``envs`` x ``chunk_steps`` frames a chunk) and one more, at least two, at most
    ``MAX_SLOTS``.

    The ring is where its worker's frames wait until a batch is copied out of them
    (:mod:`.chunk_buffer`): when a batch is cut, about its share of the batch is held,
    and the chunk the worker finishes meanwhile goes into the slot beyond. A ring whose
    slots are all held while the trainer's buffer has room (a worker ahead of the
    others, a trainer slower than the envs, a share over ``MAX_SLOTS``) has its oldest
    chunk copied out, so a worker waits for a slot only once that buffer is full
    (about two batches: back-pressure). Two batches' share, as before, held a whole
    batch of slots nobody used while the trainer kept up.

    >>> ring_slots(1024, workers=8, envs=1, chunk_steps=64)   # benchmarks.atari's
    3
    """
    share = frames_per_batch / workers
    return min(MAX_SLOTS, max(2, math.ceil(share / (envs * chunk_steps)) + 1))


class LocalChannels:
    """Blocks, bells and chunk rings of the local env workers (empty until :meth:`make`).

    >>> channels = LocalChannels()
    >>> channels.blocks, channels.request_bell
    ({}, None)
    >>> channels.close()   # idempotent, and fine on what was only partly made
    """

    def __init__(self) -> None:
        #: Every slot's blocks: the local workers', then each remote host's (inline).
        self.blocks: dict[int, WorkerBlocks] = {}
        self.request_bell: EventFd | None = None
        self.answer_bells: dict[int, EventFd] = {}
        self.rings: dict[int, ChunkRing] = {}
        self.readers: dict[int, ChunkReader] = {}
        self.chunk_bell: EventFd | None = None
        self.room_bells: dict[int, EventFd] = {}

    def make(self, rows: Sequence[int], obs: Mapping[Path, torch.Tensor],
             outputs: OutputLayout, *, splits: int, chunk_steps: int,
             frames_per_batch: int, flat: bool, infos: Sequence[InfoColumn] = (),
             next_observations: bool = True) -> None:
        """Make each worker's channels (``rows``: its number of envs), its ring sized for
        batches of ``frames_per_batch`` (:func:`ring_slots`); ``flat``: chunks are read
        as ``[E * C]`` frames (not cut into trajectories); ``infos``: the info columns
        of its chunks;
        ``next_observations=False`` (``compact_obs=True``): its chunks hold no
        ``("next", obs)`` twins."""
        self.blocks.update(make_blocks(list(rows), dict(obs), outputs, splits=splits))
        self.request_bell = EventFd()
        self.answer_bells = {slot: EventFd() for slot in range(len(rows))}
        layout = chunk_layout([(p, t.dtype, tuple(t.shape[1:])) for p, t in obs.items()],
                              outputs, infos=infos, next_observations=next_observations)
        self.chunk_bell = EventFd()
        for slot, envs in enumerate(rows):
            ring = self.rings[slot] = ChunkRing.create(
                layout, rows=envs, steps=chunk_steps,
                slots=ring_slots(frames_per_batch, workers=len(rows), envs=envs,
                                 chunk_steps=chunk_steps))
            bell = self.room_bells[slot] = EventFd()
            # a worker whose slots are all full waits for this bell
            self.readers[slot] = ChunkReader(ring, flat=flat, on_release=bell.ring)

    async def read_chunks(self, frames: ChunkBuffer,
                          after: Callable[[], Awaitable[None]]) -> None:
        """Hand the workers' new chunks in their rings to ``frames`` whenever the chunk
        bell rings (forever: cancel to stop); ``after()`` once some were taken.

        Raises :class:`~.chunk_ring.TornChunkError` for a chunk its worker rewrote.
        """
        bell, readers = self.chunk_bell, self.readers
        if bell is None or not readers:
            return
        fd = bell.fd
        order = list(readers.items())
        while True:
            await anyio.wait_readable(fd)
            os.eventfd_read(fd)  # readable: returns at once (the count: any number of rings)
            # (a slot freed rings its worker's room bell: ChunkReader's on_release)
            taken = frames.fill_from(order)
            order.append(order.pop(0))  # the first ring a different one each time
            if taken:
                await after()

    def close(self) -> None:
        """Unmap and unlink the blocks and rings, close the bells (idempotent)."""
        for blocks in self.blocks.values():
            blocks.close()
        self.blocks.clear()
        for reader in self.readers.values():
            reader.close()
        for ring in self.rings.values():
            ring.close()
        self.readers, self.rings = {}, {}
        for bell in [self.request_bell, self.chunk_bell, *self.answer_bells.values(),
                     *self.room_bells.values()]:
            if bell is not None:
                bell.close()
        self.request_bell, self.answer_bells = None, {}
        self.chunk_bell, self.room_bells = None, {}


__all__ = ["LocalChannels", "probe_env", "ring_slots"]
