"""Same-host **live** weights, as TorchRL's shared memory: the trainer trains the shared copy.

:class:`LiveSharedMemWeightSyncScheme` with its two ends,
:class:`LiveSharedMemWeightSender` and :class:`LiveSharedMemWeightReceiver`,
built on :mod:`._shared_memory`'s. The trainer's own parameters are moved
into one shared-memory buffer and trained in place; workers point their
parameters at it once (a message, acked); after that a send only writes the
version into a word of that buffer, which each worker reads at its step
boundaries: no message, no ack. As in TorchRL: the workers see every optimiser
step as it happens, mid-rollout, possibly half-written. A frame's version is
then a lower bound on the weights that acted.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from transports import ProtocolError, SharedTensorBlock, Ticket, copy_into

from .._protocol import WeightsApplied, decode
from ._in_flight import Part, Sent
from ._newest import Queued
from ._receiver import PendingUpdate
from ._shared_memory import (
    SharedBuffer,
    SharedMemWeightReceiver,
    SharedMemWeightSender,
    SharedMemWeightSyncScheme,
    shareable,
)
from ._strategy import flat_tensors

__all__ = [
    "LiveSharedMemWeightReceiver",
    "LiveSharedMemWeightSender",
    "LiveSharedMemWeightSyncScheme",
]


class LiveSharedMemWeightSender(SharedMemWeightSender):
    """The trainer's parameters live in shared memory; a send only publishes a version.

    At construction (or at the first send) the model's parameters and buffers
    are moved into one shared-memory block (``param.data`` is swapped: the
    model and its optimiser keep working on the same ``Parameter`` objects).
    Workers point their parameters at it; the trainer's optimiser steps are
    visible to them at once.

    A worker's first update is a message naming the block (applied, acked). Its
    ack says it reads the block's published version word from then on, and every
    later send to it only writes that word: no message, no ack to wait for, its
    acknowledgement is complete when the send returns. Weaker guarantee: see
    :class:`~asyncrl.weights.LiveSharedMemWeightSyncScheme`.
    """

    takes_codecs = False  # it shares the model's own memory: identity only

    def __init__(self, model_id: str, hub: Any, **kwargs: Any) -> None:
        # Per worker: its peer and the ticket of the last message it got (before the base
        # class's __init__, which may add workers). Attached once that ack says so.
        self._attach: dict[int, tuple[bytes, Ticket]] = {}
        super().__init__(model_id, hub, **kwargs)
        self._live: SharedBuffer | None = None
        # The version every attached worker reads at each step boundary: the version word
        # of the block's one slot. The trainer trains the block in place and never
        # rewrites it through write(), so the seqlock's version field is free; workers map
        # the block anyway (no second segment or name to check), and an aligned int64
        # store is never seen half-written.
        self._published: memoryview | None = None
        if self.model is not None:
            self.share(self.model)

    def share(self, model: Any) -> SharedTensorBlock:
        """Move ``model``'s tensors into shared memory (idempotent); return the block."""
        if self._live is not None:
            return self._live.block
        if not isinstance(model, nn.Module):
            raise TypeError("LiveSharedMemWeightSyncScheme trains the model in place: give "
                            f"init_on_sender an nn.Module, not a {type(model).__name__}")
        tensors = flat_tensors(model, live=True)
        devices = sorted({t.device.type for t in tensors.values()} - {"cpu"})
        if devices:
            raise ValueError(f"live shared memory needs the trainer's model on the CPU; it has "
                             f"tensors on {devices}: use SharedMemWeightSyncScheme (one copy "
                             "per send) for a GPU learner")
        block = SharedTensorBlock.create(tensors, slots=1)
        block.write(tensors, 0, slot=0)
        with torch.no_grad():
            for key, view in block.slot_views(0).items():
                tensors[key].data = view
        self._live = SharedBuffer(block)
        self._buffers = [self._live]
        self._published = block.control(0)  # [seq, version]
        return block

    @property
    def attached(self) -> list[int]:
        """Workers that read the published version: a send reaches them without a message."""
        workers = self.workers
        return sorted(w for w, peer in workers.items() if self._attached(w, peer))

    async def _prepare(self, source: Any, version: int) -> tuple[Any, dict[str, Any]]:
        if source is not self.model:
            raise ValueError("LiveSharedMemWeightSyncScheme publishes the trainer's own "
                             "parameters: call send() without weights (use "
                             "SharedMemWeightSyncScheme to send other weights)")
        block = self.share(source)
        live, published = self._live, self._published
        assert live is not None and published is not None
        live.version = version
        # Attached workers stamp it from their next step on (every worker: the word is the
        # block's, and a lower bound of any worker's live weights, targeted or not).
        published[1] = version
        seq = block.slot_state(0)[0]
        return {"block": block.name, "slot": 0, "seq": seq}, {"buffer": live}

    async def _dispatch(self) -> None:
        """Answer the versions queued for attached workers; transmit the others' as usual."""
        self._answer_attached()
        await super()._dispatch()

    def _answer_attached(self) -> None:
        """Acknowledge at once what is queued for workers that read the word: it holds it.

        Under the lock, right after a send queued its version, and whenever the base
        class would transmit queued versions: a version queued while the worker's
        attaching message was in transit is answered too, never sent.
        """
        workers = self.workers
        for gone in [w for w in self._attach if w not in workers]:
            del self._attach[gone]  # lost (its lane goes the same way): nothing to keep
        answered: dict[int, tuple[Sent, dict[bytes, int]]] = {}  # id(send) -> its workers
        for worker_id, lane in self._lanes.items():
            queued = lane.queued
            peer = workers.get(worker_id)
            if queued is None or peer is None or not self._attached(worker_id, peer):
                continue
            for sent in queued.sends:
                sent.waiting.discard(worker_id)
                answered.setdefault(id(sent), (sent, {}))[1][peer] = worker_id
            lane.queued = None
        if not answered:
            return
        peers = frozenset(p for _, members in answered.values() for p in members)
        ticket = Ticket(seq=0, peers=peers)  # never on the wire: resolved here
        ack = WeightsApplied(self.model_id, self._version, published=True).to_body()
        for peer in peers:
            ticket.resolve(peer, result=ack)
        for sent, members in answered.values():
            sent.parts.append(Part(ticket, members))

    def _attached(self, worker_id: int, peer: bytes) -> bool:
        """Whether ``worker_id`` (now ``peer``) acked a message saying it reads the word."""
        record = self._attach.get(worker_id)
        if record is None or record[0] != peer:
            return False
        result = record[1].acks.get(peer)
        if result is None:
            return False
        try:
            return decode(WeightsApplied, result).published
        except ProtocolError:
            return False

    def _in_flight(self, ticket: Ticket, members: dict[bytes, int], relay: bytes | None,
                   queued: Queued) -> None:
        super()._in_flight(ticket, members, relay, queued)
        for peer, worker_id in members.items():
            self._attach[worker_id] = (peer, ticket)

    def _on_transmit(self, queued: Queued, ticket: Ticket) -> None:
        pass  # nothing to free: the one buffer is the trainer's model

    def add_worker(self, worker_id: int, peer: bytes) -> None:
        self._attach.pop(worker_id, None)  # a new incarnation attaches by message again
        super().add_worker(worker_id, peer)

    def remove_worker(self, worker_id: int) -> None:
        self._attach.pop(worker_id, None)
        super().remove_worker(worker_id)

    async def on_worker_joined(self, worker_id: int) -> int | None:
        # A (re)joining worker has not mapped this block, whatever its index or identity
        # did before (a worker restarted with its old identity, a respawned slot).
        self._attach.pop(worker_id, None)
        return await super().on_worker_joined(worker_id)

    async def aclose(self) -> None:
        live, self._live = self._live, None
        self._published = None
        self._attach.clear()
        if live is not None and self.model is not None:
            # The trainer's model keeps its values: back into private memory.
            with torch.no_grad():
                for tensor in flat_tensors(self.model, live=True).values():
                    tensor.data = tensor.data.clone()
        await super().aclose()


def _word(value: int = 0) -> memoryview:
    """A private int64 word, as a one-item view: compared with ``!=`` without an int made."""
    return memoryview(array("q", [value]))


class LiveSharedMemWeightReceiver(SharedMemWeightReceiver):
    """Points the worker's parameters at the trainer's live ones; then reads versions only.

    The first update of a trainer's model is a message: the parameters are pointed
    at its block, the buffers (and parameters of another dtype) copied, and the ack
    says this receiver reads the block's published version word from now on. Each
    later version is that word: :attr:`has_pending` compares it at every step
    boundary with the value last read (two one-word views compared in C: no lock,
    no object made) and :meth:`apply_pending` copies the buffers again and sets
    :attr:`version` when it moved. Nothing is acked for it: the sender answered
    its send when it published.
    """

    reads_published = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The attached block's version word, and the value last read from it. Both are
        # private zeros until attached: they compare equal, nothing to read.
        self._published = _word()
        self._read = _word()

    @property
    def has_pending(self) -> bool:
        """A message waits, or the trainer published another version (every step: cheap)."""
        return self._pending is not None or self._published != self._read

    def apply_pending(self) -> bool:
        """Apply a message (the first update), then the published version if it is newer."""
        changed = super().apply_pending()
        if self._published != self._read:
            changed = self._apply_published() or changed
        return changed

    def _apply_published(self) -> bool:
        with self._apply_lock:
            version = self._published[0]
            self._read[0] = version
            block = self._blocks.latest()
            if version <= self._version or block is None:
                return False  # (a message brought it, or a newer one, already)
            try:
                self._refresh(block)
            except Exception as exc:
                # Nobody waits for an ack of this version: fail the worker's next step
                # (check_whole) rather than step on with buffers half-copied.
                self.last_error = exc
                self.torn = (f"{self.model_id!r}: copying the buffers of published version "
                             f"{version} failed ({type(exc).__name__}: {exc})")
                self._published, self._read = _word(), _word()
                return False
            self._version = version
            if self.on_apply is not None:
                self.on_apply(version)
            return True

    def _refresh(self, block: SharedTensorBlock) -> None:
        """Copy what is not shared (buffers, parameters of another dtype) from the block."""
        targets = flat_tensors(self.model, live=True)
        if self.zero_copy and isinstance(self.model, nn.Module):
            self._share(block, targets, 0, 0)
        else:
            self._copy(block, targets, 0, 0)

    def _share(self, block: SharedTensorBlock, targets: Mapping[str, torch.Tensor],
               slot: int, seq: int) -> int:
        for key, view in block.slot_views(slot).items():
            target = targets[key]
            if shareable(target, view):
                if target.data_ptr() != view.data_ptr():
                    target.data = view
            else:
                copy_into(target, view)
        return -1  # the message's version: see _apply

    def _copy(self, block: SharedTensorBlock, targets: Mapping[str, torch.Tensor],
              slot: int, seq: int) -> int:
        for key, view in block.slot_views(slot).items():
            copy_into(targets[key], view)  # may be torn: the trainer trains in place
        return -1

    def _apply(self, update: PendingUpdate) -> int:
        super()._apply(update)
        block = self._blocks.latest()
        assert block is not None
        self._read[0] = update.version  # a newer word is read right after (apply_pending)
        self._published = block.control(0)[1:]
        return update.version

    def follow(self, instance: str) -> bool:
        if instance and self.instance and instance != self.instance:
            # Before the version drops to 0: the old trainer's word counts in its numbering.
            self._published, self._read = _word(), _word()
        return super().follow(instance)

    def close(self) -> None:
        self._published, self._read = _word(), _word()
        super().close()


class LiveSharedMemWeightSyncScheme(SharedMemWeightSyncScheme):
    """Same host, opt-in **live** weights, as TorchRL's ``SharedMemWeightSyncScheme``.

    The trainer's model is moved into shared memory when the sender is created
    (its parameters and buffers; the ``Parameter`` objects, hence the
    optimiser, stay the same) and trained in place; workers point their
    parameters at it. It is the fastest scheme and the weakest:

    * every optimiser step reaches the workers **immediately, mid-rollout**,
      and a worker may read parameters while the optimiser is writing them
      (**torn reads**: part of step *n*, part of step *n + 1*);
    * a frame's ``policy_version`` is a **lower bound**: the weights that
      acted are those of that version *or newer*, possibly a mix;
    * **an ack is not a message.** A worker's first update (and the first after
      it rejoins or is replaced) is a message naming the block, applied and
      acked. After that a send writes the version into a word of the block and
      returns: ``send()`` / ``wait_ack()`` count such a worker as acknowledged
      at once, and mean only this: every step it *starts* from then on stamps
      its frames with that version or newer (it reads the word at each step
      boundary, and copies the buffers then). A step already under way keeps
      the older stamp (a correct lower bound: the weights are live); an idle
      worker stamps it from its next step; a worker that died meanwhile does
      not delay the send (its loss is the collector's ``on_worker_loss``).

    The word belongs to the block, not to a worker: an attached worker that a
    send did not target (``worker_ids``, ``max_interval``) reads it too, which
    is as true of its live weights. A send copies nothing; buffers (running
    statistics) and parameters of another dtype are copied by each worker at
    the step that sees a new version. Use it when, like TorchRL's users, you
    accept all that; use :class:`SharedMemWeightSyncScheme` for exact
    versions and real acks at the cost of one memcpy per send. CPU models
    only; ``send()`` takes no ``weights``.

    >>> LiveSharedMemWeightSyncScheme()
    LiveSharedMemWeightSyncScheme()
    """

    name = "shared_mem_live"
    _sender_class = LiveSharedMemWeightSender
    _receiver_class = LiveSharedMemWeightReceiver
    _default_slots = 1

    def _sender_options(self) -> dict[str, Any]:
        return {}
