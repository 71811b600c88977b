"""The env worker's end of the chunk ring (:mod:`.chunk_ring`): its layout and its writes.

Torch-free: a local env worker imports neither torch nor tensordict
(:mod:`asyncrl._spawn.torch_free`). It attaches the ring the trainer made as
numpy arrays (:class:`transports.SharedArrayBlock`) and records its steps into
numpy chunk buffers laid out by the same :func:`chunk_layout` as the trainer's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from transports import SharedArrayBlock

from .block_io import Copy, SlotArrays, array_of

__all__ = ["ChunkWriter", "Layout", "Path", "chunk_layout"]

Path = tuple[str, ...]
#: A chunk entry per env and step: ``path -> (dtype, shape)``.
Layout = dict[Path, tuple[Any, tuple[int, ...]]]


def _torch_dtype(name: str) -> Any:
    import torch  # the trainer's layouts (it has torch); a worker gives its own dtype_of

    return getattr(torch, name)


def chunk_layout(obs: Sequence[tuple[Path, Any, tuple[int, ...]]], outputs: Any, *,
                 infos: Sequence[tuple[Path, str, tuple[int, ...]]] = (),
                 dtype_of: Callable[[str], Any] = _torch_dtype,
                 next_observations: bool = True) -> Layout:
    """Every entry of a chunk, per env and step, in TorchRL's key order.

    ``obs`` is each observation's path, dtype and per-env shape; ``outputs`` the
    policy's :class:`~asyncrl._inference.outputs.OutputLayout` (``action`` and extras);
    ``infos`` the info leaves asked (:mod:`.info_columns`: path, dtype name, per-env
    shape), each at ``("next", *path)``.
    The flags, reward and collector entries get ``dtype_of("bool")``, ``("float32")`` and
    ``("int64")``: torch's dtypes by default, numpy's in an env worker. Ended episodes are
    reset in place, so the root ``done`` flags stay False.
    ``next_observations=False`` (the collector's ``compact_obs=True``): no
    ``("next", obs)`` twins, neither written by the worker nor held by the ring.
    """
    flag, reward, count = dtype_of("bool"), dtype_of("float32"), dtype_of("int64")
    layout: Layout = {}
    for path, dtype, shape in obs:
        layout[tuple(path)] = (dtype, tuple(shape))
        if next_observations:
            layout[("next", *path)] = (dtype, tuple(shape))
    layout[("action",)] = (outputs.action[0], tuple(outputs.action[1]))
    for path, dtype, shape in outputs.extras:
        layout[tuple(path)] = (dtype, tuple(shape))
    for name in ("done", "terminated", "truncated"):
        layout[(name,)] = (flag, (1,))
    layout[("next", "reward")] = (reward, (1,))
    for name in ("done", "terminated", "truncated"):
        layout[("next", name)] = (flag, (1,))
    for path, dtype_name, shape in infos:
        layout[("next", *path)] = (dtype_of(dtype_name), tuple(shape))
    for name in ("traj_ids", "policy_version", "worker_id"):
        layout[("collector", name)] = (count, ())
    return layout


class ChunkWriter:
    """The worker's end: :meth:`publish` copies its buffers into the next slot.

    ``buffers`` are the worker's chunk buffers (``[E, C, *shape]`` per path, the
    ring's layout and order: numpy arrays, or tensors numpy can view); the copies
    are made once, here. Or a chunk is recorded in its slot itself (no copy):
    :meth:`begin_in_place` once the slot is free, :meth:`end_in_place` when written.
    """

    def __init__(self, names: tuple[str, str], buffers: Mapping[Path, Any]) -> None:
        self.block = SharedArrayBlock.attach(names[0])
        self.taken_block = SharedArrayBlock.attach(names[1])
        try:
            self._paths = list(buffers)
            sources = [array_of(t) for t in buffers.values()]
            self._slots = [SlotArrays(self.block, k) for k in range(int(self.block.slots))]
            self._copies: list[list[Copy]] = [s.copies_from(sources) for s in self._slots]
            for _, dst, src in self._copies[0]:
                if tuple(dst.shape) != tuple(src.shape) or str(dst.dtype) != str(src.dtype):
                    raise ValueError(f"chunk buffer {tuple(src.shape)} {src.dtype} does not "
                                     f"match the ring's {tuple(dst.shape)} {dst.dtype}")
            self._taken: Any = self.taken_block.slot_views(0)["taken"]
        except BaseException:
            self.close()
            raise
        #: Chunks published so far.
        self.published = 0
        self._open: tuple[int, int] | None = None  # (slot, seq) of a chunk written in place

    def has_room(self) -> bool:
        """Whether the next chunk has a free slot (the trainer took the one it replaces)."""
        return self.published - int(self._taken[0]) < len(self._slots)

    def publish(self) -> int:
        """Copy the buffers into the next slot (:meth:`has_room` must be true); its number."""
        number = self.published + 1
        k = (number - 1) % len(self._slots)
        self._slots[k].publish(self._copies[k], version=number)
        self.published = number
        return number

    def slot_buffers(self) -> list[dict[Path, Any]]:
        """Each slot's arrays by path (the buffers' paths and order): where a chunk is
        recorded in place. Drop them before :meth:`close`."""
        return [dict(zip(self._paths, slot.arrays, strict=True)) for slot in self._slots]

    def begin_in_place(self) -> int:
        """Open the next chunk's slot for writing in place, if the trainer took the chunk
        it held: that slot (then :meth:`end_in_place`); -1: not free yet (record the
        chunk in the buffers, then :meth:`publish`). A slot open for writing is read by
        nobody: the reader wants the next chunk's number there, stored at the end."""
        if not self.has_room():
            return -1
        k = self.published % len(self._slots)
        self._open = (k, self._slots[k].begin())
        return k

    def end_in_place(self) -> int:
        """Publish the chunk written in the slot :meth:`begin_in_place` opened; its number."""
        assert self._open is not None, "end_in_place without begin_in_place"
        (k, seq), self._open = self._open, None
        number = self.published + 1
        self._slots[k].end(seq, version=number)
        self.published = number
        return number

    def close(self) -> None:
        """Let the mappings go (idempotent)."""
        for slot in getattr(self, "_slots", []):
            slot.release()
        self._slots, self._copies = [], []
        self._taken = None
        for block in (getattr(self, "block", None), getattr(self, "taken_block", None)):
            if block is not None and not block.closed:
                block.close()
