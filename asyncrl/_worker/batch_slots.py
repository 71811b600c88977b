"""A local worker's side of batches in shared memory: write into the trainer's slots.

The trainer offers a segment after the worker's first batch (see
:mod:`asyncrl._coordinator.shared_batches` for the design: two slots, a
``held`` word per slot that the worker sets after its copy and the trainer
clears after its own). :meth:`SlotWriter.write` replaces the copy a batch
message needed (the rollout reuses its buffers) with a copy into the next slot;
only a small :class:`~asyncrl._protocol.SharedBatch` then crosses the socket.

Each write is framed by the slot's seqlock (its control line in the segment):
the sequence number goes odd before the copy and even after, with the request
number; the trainer refuses a batch whose number was odd or moved while it
copied, so a slot written at the wrong time is never delivered torn.

Anything unexpected (a segment that cannot be mapped, a batch whose layout
changed, a slot the trainer has not read for :data:`HELD_WAIT` s) sends that
batch over the socket instead, with one WARNING: the wire path always works.
"""

from __future__ import annotations

import logging
import time

import torch
from tensordict import TensorDictBase

from transports import SharedTensorBlock, TransportError, copy_into

from .._protocol import BatchSlots, SharedBatch

log = logging.getLogger("asyncrl.worker")

#: Longest wait for the trainer to read a slot before the batch goes over the socket.
HELD_WAIT = 10.0
_POLL = 0.0002


class SlotWriter:
    """The segment the trainer offered this worker, if any (None: batches go on the wire).

    >>> writer = SlotWriter()
    >>> writer.attached
    False
    """

    def __init__(self) -> None:
        self._block: SharedTensorBlock | None = None
        self._keys: list[tuple[str, ...]] = []
        self._views: list[list[torch.Tensor]] = []
        self._held: list[torch.Tensor] = []
        self._controls: list[memoryview] = []  # per slot: [seq, request] (int64, live)
        self._next = 0

    @property
    def attached(self) -> bool:
        return self._block is not None

    def attach(self, offer: BatchSlots) -> None:
        """Map the offered segment; on any failure stay on the wire (logged once)."""
        self.detach()
        try:
            block = SharedTensorBlock.attach(offer.name)
        except TransportError as exc:  # ProtocolError included: a malformed segment
            log.warning("batches stay on the socket: %s", exc)
            return
        names = [f"t{i}" for i in range(len(offer.keys))]
        if list(block.layout) != [*names, "held"]:
            log.warning("batches stay on the socket: segment %s holds %d tensors, the offer "
                        "names %d keys", offer.name, len(block.layout) - 1, len(offer.keys))
            block.close()
            return
        self._block, self._keys = block, list(offer.keys)
        self._views = [[block.slot_views(s)[n] for n in names] for s in range(block.slots)]
        self._held = [block.slot_views(s)["held"] for s in range(block.slots)]
        self._controls = [block.control(s) for s in range(block.slots)]
        self._next = 0

    def detach(self) -> None:
        """Forget the segment (a new admission starts on the wire); idempotent."""
        block, self._block = self._block, None
        self._views, self._held, self._keys, self._controls = [], [], [], []
        if block is not None:
            block.close()

    def write(self, frames: TensorDictBase, request: int) -> SharedBatch | None:
        """Copy ``frames`` into the next free slot: the notice to send, or None (the wire).

        Runs in the rollout's thread; waits (rarely, bounded) for the trainer to
        have read that slot's previous batch.
        """
        block = self._block
        if block is None:
            return None
        slot, count = self._next, len(self._views)
        # Ours even if detached meanwhile.
        views, held, control = self._views[slot], self._held[slot], self._controls[slot]
        leaves = self._leaves(frames, views)
        if leaves is None or not self._wait_released(held, slot):
            return None
        steps = frames.batch_size[1]
        seq = control[0] + control[0] % 2  # even: a write cut short left it odd
        control[0] = seq + 1  # odd: a trainer copying this slot now refuses what it read
        for view, leaf in zip(views, leaves, strict=True):
            copy_into(view if steps == view.shape[1] else view[:, :steps], leaf)
        control[1] = request
        control[0] = seq + 2
        held[0] = 1  # after the copy: the trainer reads once told
        self._next = (slot + 1) % count
        return SharedBatch(request, block.name, slot, steps)

    def _leaves(self, frames: TensorDictBase, views: list[torch.Tensor]
                ) -> list[torch.Tensor] | None:
        """The batch's tensors in the segment's order, if they fit it; else None (detached)."""
        leaves = []
        if frames.batch_dims == 2:
            for key, view in zip(self._keys, views, strict=True):
                leaf = frames.get(key if len(key) > 1 else key[0], None)
                if (not isinstance(leaf, torch.Tensor) or leaf.dtype != view.dtype
                        or leaf.device.type != "cpu" or leaf.shape[0] != view.shape[0]
                        or leaf.shape[1] > view.shape[1] or leaf.shape[2:] != view.shape[2:]):
                    break
                leaves.append(leaf)
        count = len(list(frames.keys(include_nested=True, leaves_only=True)))
        if len(leaves) != len(views) or count != len(views):
            log.warning("batches go back to the socket: this batch (%s) does not fit the "
                        "shared-memory layout made from the first one", frames.batch_size)
            self.detach()
            return None
        return leaves

    def _wait_released(self, held: torch.Tensor, slot: int) -> bool:
        if not int(held[0]):
            return True
        deadline = time.monotonic() + HELD_WAIT
        while int(held[0]):
            if time.monotonic() > deadline:
                log.warning("the trainer has not read shared-memory slot %d for %.0f s: this "
                            "batch goes over the socket", slot, HELD_WAIT)
                return False
            time.sleep(_POLL)
        return True


__all__ = ["HELD_WAIT", "SlotWriter"]
