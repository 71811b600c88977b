"""The local env workers' shared memory and doorbells, made together and closed together.

Each local env worker (a slot) has two blocks, its observations and the policy's
outputs (:func:`~asyncrl._inference.worker_blocks.make_blocks`), an answer bell
the inference loop rings, a chunk ring it writes its transitions into
(:mod:`.chunk_ring`, read by the trainer) and a room bell the trainer rings when
it took chunks from that ring. Every worker rings the one request bell (the
loop's) and the one chunk bell (the trainer's). A remote env host's slot adds
inline blocks to :attr:`LocalChannels.blocks` (:mod:`.remote_env_hosts`), and
nothing else. :meth:`LocalChannels.read_chunks` moves the chunks from the rings into
the trainer's :class:`~.chunk_buffer.ChunkBuffer`.
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
             outputs: OutputLayout, *, splits: int, chunk_steps: int, capacity: int,
             flat: bool, infos: Sequence[InfoColumn] = (),
             next_observations: bool = True) -> None:
        """Make each worker's channels (``rows``: its number of envs). ``capacity``: the
        frames the trainer's buffer holds; ``flat``: chunks are read as ``[E * C]``
        frames (not cut into trajectories); ``infos``: the info columns of its chunks;
        ``next_observations=False`` (``compact_obs=True``): its chunks hold no
        ``("next", obs)`` twins."""
        self.blocks.update(make_blocks(list(rows), dict(obs), outputs, splits=splits))
        self.request_bell = EventFd()
        self.answer_bells = {slot: EventFd() for slot in range(len(rows))}
        layout = chunk_layout([(p, t.dtype, tuple(t.shape[1:])) for p, t in obs.items()],
                              outputs, infos=infos, next_observations=next_observations)
        self.chunk_bell = EventFd()
        for slot, envs in enumerate(rows):
            # Each worker's share of the trainer's buffer, in chunks (at least two: one
            # being taken, one being written). Both server backends: the loop answers
            # without waiting for this event loop, so chunks not yet taken here are
            # bounded by the slots, not by the loop's room alone.
            # A ring holds at most MAX_SLOTS chunks: a larger share (a big batch of short
            # chunks) only waits in the worker, which a full ring stops until one is taken.
            share = capacity / len(rows)
            slots = min(MAX_SLOTS, max(2, math.ceil(share / (envs * chunk_steps))))
            ring = self.rings[slot] = ChunkRing.create(layout, rows=envs, steps=chunk_steps,
                                                       slots=slots)
            self.readers[slot] = ChunkReader(ring, flat=flat)
            self.room_bells[slot] = EventFd()

    async def read_chunks(self, frames: ChunkBuffer,
                          after: Callable[[], Awaitable[None]]) -> None:
        """Move the workers' chunks from their rings into ``frames`` whenever the chunk
        bell rings (forever: cancel to stop); ``after()`` once some were taken.

        Raises :class:`~.chunk_ring.TornChunkError` for a chunk its worker rewrote.
        """
        bell, readers = self.chunk_bell, self.readers
        if bell is None or not readers:
            return
        fd, bells = bell.fd, self.room_bells
        order = list(readers.items())
        while True:
            await anyio.wait_readable(fd)
            os.eventfd_read(fd)  # readable: returns at once (the count: any number of rings)
            taken = frames.fill_from(order)
            order.append(order.pop(0))  # the first ring a different one each time
            for slot in taken:
                bells[slot].ring()  # a worker waiting for a slot goes on
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


__all__ = ["LocalChannels", "probe_env"]
