"""The trainer's side of local workers' batches in shared memory.

A local worker's first batch crosses the socket as usual; it is checked like
any batch and its layout (keys, dtypes, ``[N, T, ...]`` shapes, ``T`` from the
worker's share) becomes the segment the trainer creates for that worker, with
two slots. The worker is offered the segment (:class:`~asyncrl._protocol.BatchSlots`)
and from then on writes each batch into a slot and sends a small
:class:`~asyncrl._protocol.SharedBatch`. The trainer copies the slot out at
receipt (one copy: the batch it hands on owns its memory, so the worker never
waits on the trainer's training step) and clears the slot's ``held`` word,
which the worker waits on before it writes that slot again.

Why two slots (``prefetch + 1``, at least 2): with one, the worker's next
batch would wait for the trainer to read the previous one (its event loop may
be busy with the trainer's step); with two, the worker writes batch k+1 while
batch k is read. In async mode a worker may have ``prefetch`` batches unread,
so one more slot than that never makes it wait.

Why the worker still copies (not the rollout's buffers living in the segment):
the rollout reuses its buffers for the next batch at once, so they would need
one set per slot and a re-planned hot loop per batch; the copy into the slot
replaces the message's ``.clone()`` at the same cost, and what this removes is
the socket's copies, the codec and the receive buffers (measured in
``benchmarks/pixels_throughput.py``).

In sync mode (``MultiSyncCollector``) a notice's share is copied from its slot
straight into its place in the round's batch (:mod:`.round_gather`, placed by the
:class:`~.batch_sink.BatchSink` that owns these segments): one copy of each frame
from the worker's slot to the batch the trainer gets. Each local worker a full
``/dev/shm`` kept on the socket is counted here (``statistics()``).

A notice is hostile input: its segment must be the one made for that worker,
its slot in range and written (``held``), its steps at most the layout's ``T``;
shapes come from the trainer's layout only. A worker lost, re-admitted or
expelled has its segment unlinked; :meth:`SharedBatches.close` unlinks them all.
A full ``/dev/shm`` turns the feature off for the run with one WARNING.

The segment itself is hostile input too: the worker runs the user's env code,
which can shrink the file or write a slot while the trainer copies it. So the
trainer never maps it (:class:`~transports.SharedTensorFile`: the copy is a
``preadv`` into the batch's own memory, and a shrunk segment is a short read,
never a SIGBUS), and each slot has a seqlock: the worker makes the slot's
sequence number odd before it writes and even after, with the request it
answers; the trainer copies only from an even number and refuses the batch if
the number moved during its copy. Either refusal is a :class:`SlotError` (a
:class:`ProtocolError` naming the slot): the worker is refused as for any bad
batch and its segment unlinked; a batch is never delivered torn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase

from transports import ProtocolError, SharedMemoryFullError, SharedTensorFile

from .._protocol import Batch, BatchSlots, SharedBatch
from .._protocol.shared_batches import MAX_BATCH_SLOTS
from .config import CoordinatorConfig
from .records import WorkerInfo
from .round_gather import Fill, Key

#: Where a slot's share goes: ``place(shapes, device, fill)`` fills views of a batch made
#: elsewhere and returns the share as those views, or None (the share gets its own memory).
Place = Callable[[dict[Key, torch.Tensor], str | None, Fill], TensorDictBase | None]

log = logging.getLogger("asyncrl.coordinator")

#: Slots per worker segment in sync mode (see the module docstring).
SLOTS = 2


class SlotError(ProtocolError):
    """A slot's contents cannot be trusted (its segment shrunk, or the slot written during
    the copy): the batch is refused as a bad batch, never delivered."""


@dataclass(eq=False)
class _Segment:
    block: SharedTensorFile  # never mapped here: read through its descriptor
    keys: list[tuple[str, ...]]
    shapes: list[tuple[torch.dtype, tuple[int, ...]]]  # per key: dtype, [N, T, ...]
    envs: int
    steps: int
    device: str | None


class SharedBatches:
    """Segments of the local workers, by peer.

    ``config`` (a :class:`~.config.CoordinatorConfig`) says whether local workers'
    batches go through shared memory (``shared_memory_batches``), each worker's share
    and ``prefetch`` (slots).

    >>> from .config import CoordinatorConfig
    >>> shared = SharedBatches(CoordinatorConfig(sync=False, share_frames=[4],
    ...                                          shared_memory_batches=True))
    >>> shared.names(), shared.slots
    ([], 2)
    >>> shared.close()
    """

    def __init__(self, config: CoordinatorConfig) -> None:
        self.enabled = config.shared_memory_batches
        #: Slots of each segment: ``prefetch + 1``, at least 2, at most 8.
        self.slots = max(SLOTS, min(1 + config.prefetch, MAX_BATCH_SLOTS))
        self._share_frames = config.share_frames
        self._local: set[bytes] = set()
        self._segments: dict[bytes, _Segment] = {}
        #: The local workers a full ``/dev/shm`` kept on the socket (``statistics()``).
        self.fallbacks = 0
        self._full = False  # /dev/shm was full: the run went to the socket

    def names(self) -> list[str]:
        """The segments alive now (tests and ``statistics`` read it)."""
        return [s.block.name for s in self._segments.values()]

    def admitted(self, peer: bytes, *, local: bool) -> None:
        """A (re-)admitted worker starts on the wire; a local one may be offered a segment."""
        self.forget(peer)
        if local:
            self._local.add(peer)

    def forget(self, peer: bytes) -> None:
        """Lost, expelled or admitted again: its segment (if any) is unlinked."""
        self._local.discard(peer)
        segment = self._segments.pop(peer, None)
        if segment is not None:
            _drop(segment)

    def close(self) -> None:
        """Unlink every segment (idempotent); a worker's mapping stays valid until it exits."""
        self._local.clear()
        while self._segments:
            _drop(self._segments.popitem()[1])

    # -- offer -------------------------------------------------------------------------------
    def offer(self, worker: WorkerInfo, frames: TensorDictBase) -> BatchSlots | None:
        """After a local worker's first accepted wire batch: its segment's offer, or None."""
        peer = worker.peer
        if peer not in self._local or peer in self._segments:
            return None
        self._local.discard(peer)  # one attempt per admission
        if not self.enabled:
            self.fallbacks += self._full  # kept on the socket by a full /dev/shm
            return None
        layout = _layout(frames, self._share(worker.index))
        if layout is None:
            return None
        keys, examples, steps = layout
        tensors = {f"t{i}": t for i, t in enumerate(examples)}
        tensors["held"] = torch.zeros(1, dtype=torch.int64)
        try:
            block = SharedTensorFile.create(tensors, slots=self.slots)
        except TypeError:  # a dtype a block cannot hold: this worker stays on the wire
            return None
        except SharedMemoryFullError as exc:
            self.enabled, self._full = False, True
            self.fallbacks += 1
            log.warning("batches go over the socket for the rest of this run: %s (or pass "
                        "shared_memory_batches=False to silence this)", exc)
            return None
        shapes = [(t.dtype, tuple(t.shape)) for t in examples]
        device = None if frames.device is None else "cpu"
        self._segments[peer] = _Segment(block, keys, shapes, frames.batch_size[0], steps, device)
        return BatchSlots(block.name, keys)

    def _share(self, index: int) -> int:
        shares = self._share_frames
        return shares[index] if 0 <= index < len(shares) else shares[0]

    # -- receipt -------------------------------------------------------------------------------
    def receive(self, worker: WorkerInfo, notice: SharedBatch, place: Place | None = None
                ) -> Batch:
        """The batch a notice points at, copied out of its slot (which is then free again):
        into the views ``place`` gives (a round's batch, see :class:`~.round_gather.RoundGather`),
        or into memory of its own when it gives none.

        Raises :class:`ProtocolError` for a notice that does not match what this
        trainer made for ``worker``, and :class:`SlotError` for a slot whose contents
        cannot be trusted (see the module docstring).
        """
        segment = self._segments.get(worker.peer)
        if segment is None or segment.block.name != notice.name:
            made = "none" if segment is None else segment.block.name
            raise ProtocolError(f"shared batch in segment {notice.name!r}: worker {worker.index}"
                                f"'s segment is {made}; a worker writes only into the segment "
                                "the trainer offered it")
        block, slot = segment.block, notice.slot
        if not 0 <= slot < block.slots:
            raise ProtocolError(f"shared batch slot {slot}: the segment has slots "
                                f"0..{block.slots - 1}")
        if not 0 <= notice.steps <= segment.steps:
            raise ProtocolError(f"shared batch of {notice.steps} steps: worker {worker.index}'s "
                                f"share has at most {segment.steps}")
        with _untrusted(slot):
            held = block.read_word(slot, "held")
            seq, request = block.slot_state(slot)
        if held != 1:
            raise ProtocolError(f"shared batch in slot {slot}, which the worker has not "
                                "written (or which was read already)")
        if seq % 2:
            raise SlotError(f"shared batch in slot {slot} of {block.name}: the worker is "
                            f"still writing it (sequence number {seq} is odd); refused")
        if request != notice.request:
            raise ProtocolError(f"shared batch in slot {slot}: the slot holds the batch for "
                                f"request {request}, the notice says {notice.request}")
        shapes = {key: torch.empty((segment.envs, notice.steps, *shape[2:]), dtype=dtype,
                                   device="meta")
                  for key, (dtype, shape) in zip(segment.keys, segment.shapes, strict=True)}

        def fill(destinations: dict[Key, torch.Tensor]) -> None:
            with _untrusted(slot):
                for index, key in enumerate(segment.keys):
                    block.read_into(destinations[key], slot, f"t{index}")
                after = block.slot_state(slot)[0]
            if after != seq:  # what was copied may mix two batches: never delivered
                raise SlotError(f"shared batch in slot {slot} of {block.name} was rewritten "
                                f"while the trainer copied it (sequence number {seq} -> "
                                f"{after}); refused")

        frames = None if place is None else place(shapes, segment.device, fill)
        if frames is None:
            frames = _gather(segment.envs, notice.steps, shapes, segment.device, fill)
        # After the copy: the worker may write the slot again.
        with _untrusted(slot):
            block.write_word(slot, "held", 0)
        return Batch(notice.request, frames)


def _layout(frames: TensorDictBase, share: int
            ) -> tuple[list[tuple[str, ...]], list[torch.Tensor], int] | None:
    """The batch's leaves and ``[N, T, ...]`` examples, or None if it cannot be shared."""
    if frames.batch_dims != 2 or frames.batch_size[0] == 0 or share % frames.batch_size[0]:
        return None
    envs, steps = frames.batch_size[0], share // frames.batch_size[0]
    keys: list[tuple[str, ...]] = []
    examples: list[torch.Tensor] = []
    for key, value in frames.items(include_nested=True, leaves_only=True):
        if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
            return None
        keys.append((key,) if isinstance(key, str) else tuple(key))
        # Meta tensors: the block reads dtypes and shapes only.
        examples.append(torch.empty((envs, steps, *value.shape[2:]), dtype=value.dtype,
                                    device="meta"))
    return (keys, examples, steps) if keys else None


def _gather(envs: int, steps: int, shapes: Mapping[Key, torch.Tensor], device: str | None,
            fill: Callable[[dict[Key, torch.Tensor]], None]) -> TensorDict:
    """A batch of its own memory in ``shapes``' layout, filled from the slot by ``fill``."""
    copies = {key: torch.empty(part.shape, dtype=part.dtype) for key, part in shapes.items()}
    fill(copies)
    out = TensorDict({}, batch_size=[envs, steps], device=device)
    for key, copy in copies.items():
        out.set(key if len(key) > 1 else key[0], copy)
    return out


@contextmanager
def _untrusted(slot: int) -> Iterator[None]:
    """Reading or writing a worker's segment: a short read (it shrank the segment) or an OS
    error (growing a shrunk one back on a full ``/dev/shm``) is a :class:`SlotError`."""
    try:
        yield
    except SlotError:
        raise
    except (ProtocolError, OSError) as exc:
        raise SlotError(f"shared batch in slot {slot} refused: {exc}") from None


def _drop(segment: _Segment) -> None:
    segment.block.close()
    segment.block.unlink()


__all__ = ["SLOTS", "Place", "SharedBatches", "SlotError"]
