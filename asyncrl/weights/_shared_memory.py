"""Same-host weights through shared memory: only (block, slot, seq) travel over ZeroMQ.

**Safe, zero-copy** (:class:`SharedMemWeightSender` / :class:`SharedMemWeightReceiver`).
The trainer keeps a small pool of shared-memory buffers, each holding one
whole copy of the weights. A send writes the weights into a *free* buffer (one
memcpy) and publishes its name; a worker applies it by pointing its
parameters at the buffer's memory (``param.data = view``: nothing is copied)
at a step boundary, and acks. A buffer is free once no worker can be using
it: for each live worker the sender knows the newest version it acknowledged
as applied and the one message it has in transit (newest wins keeps it to one),
so the versions a worker may step with are at most those two; the latest
version (what a late joiner receives) and versions queued for a worker are
kept too. Nothing ever rewrites weights a worker steps with, so the weights
that acted are exactly those of the stamped version.

When every buffer is in use the send waits up to ``slot_timeout`` seconds for
an acknowledgement that frees one, then grows the pool with a new buffer
instead of disturbing a reader (a worker stuck in a long step costs memory,
never correctness); buffers beyond ``slots`` are unlinked once free.

Buffers (``register_buffer`` tensors, e.g. running statistics) are copied, not
shared: a worker may update them in place. Parameters whose dtype or device
differ from the trainer's are copied too. ``zero_copy=False`` copies
everything (for modules that cache tensors derived from their parameters).

**Live** (:class:`LiveSharedMemWeightSender` / :class:`LiveSharedMemWeightReceiver`).
The trainer's own parameters are moved into one shared-memory buffer and
trained in place; workers point their parameters at it once (a message, acked);
after that a send only writes the version into a word of that buffer, which
each worker reads at its step boundaries: no message, no ack. As in TorchRL:
the workers see every optimiser step as it happens, mid-rollout, possibly
half-written. A frame's version is then a lower bound on the weights that acted.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any, Generic, Protocol, TypeVar

import anyio
import torch
from torch import nn

from transports import (
    Message,
    ProtocolError,
    SharedTensorBlock,
    Ticket,
    TornReadError,
    copy_into,
)

from .._protocol import WeightsApplied
from ._in_flight import Part, Queued, Sent
from ._receiver import WeightReceiver, _Update
from ._sender import THREAD_COPY_BYTES, WeightSender
from ._staging import Stage
from ._strategy import check_compatible, flat_tensors

__all__ = [
    "LiveSharedMemWeightReceiver",
    "LiveSharedMemWeightSender",
    "SharedMemWeightReceiver",
    "SharedMemWeightSender",
]

#: Torn reads tolerated before a copying apply fails (each retry reads the newest slot).
MAX_READ_ATTEMPTS = 16
#: Blocks a worker keeps mapped for reuse (the trainer's pool rotates through a few).
MAX_ATTACHED = 6

_B = TypeVar("_B", bound="_Closable")


class _Closable(Protocol):
    def close(self) -> None: ...


class BlockCache(Generic[_B]):
    """The blocks a worker keeps open, by name: the trainer's pool rotates through a few.

    ``use(name)`` marks the block the parameters view now and forgets the oldest
    others beyond ``limit`` (views keep a mapping alive on their own: forgetting
    a block only closes this cache's handle).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.blocks: dict[str, _B] = {}
        self.current: str | None = None

    def get(self, name: str, open_block: Callable[[], _B]) -> _B:
        block = self.blocks.get(name)
        if block is None:
            block = self.blocks[name] = open_block()
        return block

    def use(self, name: str) -> None:
        self.current = name
        while len(self.blocks) > self.limit:
            oldest = next(n for n in self.blocks if n != self.current)
            self.blocks.pop(oldest).close()

    def latest(self) -> _B | None:
        return self.blocks.get(self.current) if self.current else None

    def close(self) -> None:
        blocks, self.blocks = self.blocks, {}
        for block in blocks.values():
            block.close()


class _Buffer:
    """One shared-memory copy of the weights and the transmissions that point at it."""

    __slots__ = ("block", "pinned_at", "stale", "tickets", "version")

    def __init__(self, block: SharedTensorBlock) -> None:
        self.block = block
        self.version = 0  # the version it holds (0: none yet)
        self.tickets: list[Ticket] = []  # transmissions of ``version``
        self.stale = False  # of an older layout: unlinked once nobody reads it
        self.pinned_at: int | None = None  # registered with CUDA for DMA (a GPU learner)

    def pin(self) -> bool:
        """Page-lock the block for CUDA (once): device copies then DMA straight into it."""
        if self.pinned_at is None:
            address, length = self.block.region()
            try:
                error = torch.cuda.cudart().cudaHostRegister(  # type: ignore[no-untyped-call]
                    address, length, 0)
            except Exception:  # no CUDA runtime call here: the staged path still works
                return False
            if int(error) != 0:
                return False
            self.pinned_at = address
        return True

    def close(self) -> None:
        if self.pinned_at is not None:  # before the unmap: CUDA still maps the pages
            torch.cuda.cudart().cudaHostUnregister(self.pinned_at)  # type: ignore[no-untyped-call]
            self.pinned_at = None
        self.block.close()
        self.block.unlink()


class SharedMemWeightSender(WeightSender):
    """A :class:`WeightSender` that writes each version into a free shared-memory buffer.

    A buffer is rewritten only once no worker can be stepping with the version
    it holds (see the module docstring); the pool holds ``slots`` buffers and
    grows when a worker holds on to old versions for more than ``slot_timeout``
    seconds. The buffers are unlinked by ``aclose()``.

    >>> scheme = SharedMemWeightSyncScheme()                            # doctest: +SKIP
    >>> sender = scheme.init_on_sender("policy", hub=hub, model=policy,
    ...                                workers=lambda: peers)            # doctest: +SKIP
    >>> version = await sender.send()   # one memcpy; (block, slot, seq) travels  # doctest: +SKIP
    """

    relayable = False  # the block lives on the trainer's host: nothing for a relay to carry

    def __init__(self, model_id: str, hub: Any, *, slots: int = 3,
                 slot_timeout: float = 1.0, **kwargs: Any) -> None:
        super().__init__(model_id, hub, **kwargs)
        self.slots = slots
        self.slot_timeout = slot_timeout
        self._buffers: list[_Buffer] = []
        self._pinned: Stage | None = None  # CUDA weights: staged here, then one memcpy

    @property
    def block(self) -> SharedTensorBlock | None:
        """The block of the latest version (None before the first send)."""
        for buffer in self._buffers:
            if buffer.version == self._version and not buffer.stale:
                return buffer.block
        return None

    @property
    def pool_size(self) -> int:
        """Shared-memory buffers held now (``slots``, more while a worker lags)."""
        return len(self._buffers)

    async def _prepare(self, source: Any, version: int) -> tuple[Any, dict[str, Any]]:
        flat = flat_tensors(source)
        buffer = await self._free_buffer(flat)
        buffer.version, buffer.tickets = 0, []  # nobody reads it: see _free_buffer
        if buffer.block.nbytes > THREAD_COPY_BYTES:
            seq = await anyio.to_thread.run_sync(self._write, buffer, flat, version)
        else:
            seq = self._write(buffer, flat, version)
        buffer.version = version
        self._release(keep=buffer)
        return {"block": buffer.block.name, "slot": 0, "seq": seq}, {"buffer": buffer}

    def _write(self, buffer: _Buffer, flat: Mapping[str, torch.Tensor], version: int) -> int:
        """One copy of the weights into the buffer's block (CPU, or CUDA DMA into it)."""
        block = buffer.block
        if any(t.device.type == "cuda" for t in flat.values()):
            if buffer.pin():
                # The block's pages are locked and known to CUDA: each device copy is
                # one DMA straight into shared memory, no staging, no second memcpy.
                return block.write(flat, version, slot=0)[1]
            # Not registrable here: pageable memory would make each device copy
            # synchronous and staged by the driver. One asynchronous DMA copy into a
            # pinned buffer, one wait, then one memcpy into the block.
            if self._pinned is None or not self._pinned.matches(flat):
                self._pinned = Stage(flat)
            self._pinned.fill(flat)
            flat = self._pinned.views
        return block.write(flat, version, slot=0)[1]

    def _latest_extra(self) -> dict[str, Any]:
        for buffer in self._buffers:
            if buffer.version == self._version and not buffer.stale:
                return {"buffer": buffer}
        return {}

    def _on_transmit(self, queued: Queued, ticket: Ticket) -> None:
        buffer = queued.extra.get("buffer")
        if buffer is not None:
            buffer.tickets.append(ticket)

    # -- which buffers are free ------------------------------------------------------------
    def versions_in_use(self) -> set[int]:
        """Versions a live worker may be stepping with, or that must stay readable.

        Per worker: the newest version it acknowledged as applied and the version
        of its message in transit; plus the latest version (late joiners) and
        the versions queued for a worker.
        """
        peers = set(self.workers.values())
        used = {self._version}
        used.update(lane.queued.version for lane in self._lanes.values()
                    if lane.queued is not None)
        newest: dict[bytes, int] = {}
        for buffer in self._buffers:
            for ticket in buffer.tickets:
                if not ticket.pending.isdisjoint(peers):
                    used.add(buffer.version)
                for peer, result in ticket.acks.items():
                    if peer in peers:
                        applied = _applied_version(result)
                        if applied > newest.get(peer, 0):
                            newest[peer] = applied
        used.update(newest.values())
        used.discard(0)
        return used

    async def _free_buffer(self, flat: Mapping[str, torch.Tensor]) -> _Buffer:
        for buffer in self._buffers:
            if not buffer.stale and not buffer.block.matches(flat):
                buffer.stale = True  # new layout: a new pool; old buffers go once unread
        deadline = anyio.current_time() + self.slot_timeout
        while True:
            used = self.versions_in_use()
            live = [b for b in self._buffers if not b.stale]
            free = [b for b in live if b.version not in used]
            if free:
                return free[0]
            if len(live) < self.slots:
                return self._new_buffer(flat)
            pending = [t for b in self._buffers for t in b.tickets if t.pending]
            remaining = deadline - anyio.current_time()
            if not pending or remaining <= 0:
                # Every buffer is read by a worker that does not answer (in a long
                # step, or not due under max_interval): grow rather than wait or tear.
                return self._new_buffer(flat)
            with anyio.move_on_after(remaining):
                await _first_done(pending)

    def _new_buffer(self, flat: Mapping[str, torch.Tensor]) -> _Buffer:
        buffer = _Buffer(SharedTensorBlock.create(flat, slots=1))
        self._buffers.append(buffer)
        return buffer

    def _release(self, keep: _Buffer) -> None:
        """Unlink stale buffers and those beyond ``slots`` that nobody reads any more."""
        if len(self._buffers) <= self.slots and not any(b.stale for b in self._buffers):
            return  # the common case: nothing to give back
        used = self.versions_in_use()
        live = sum(1 for b in self._buffers if not b.stale)
        kept = []
        for buffer in self._buffers:
            unread = buffer is not keep and buffer.version not in used
            if unread and (buffer.stale or live > self.slots):
                live -= 0 if buffer.stale else 1
                buffer.close()
            else:
                kept.append(buffer)
        self._buffers = kept

    async def aclose(self) -> None:
        await super().aclose()
        buffers, self._buffers = self._buffers, []
        for buffer in buffers:
            buffer.close()
        self._pinned = None


async def _first_done(tickets: list[Ticket]) -> None:
    """Return once any of ``tickets`` is done (an ack that may free a buffer)."""
    async with anyio.create_task_group() as tg:
        async def one(ticket: Ticket) -> None:
            await ticket.done.wait()
            tg.cancel_scope.cancel()

        for ticket in tickets:
            tg.start_soon(one, ticket)


def _applied_version(result: Any) -> int:
    try:
        return WeightsApplied.from_body(result).version
    except ProtocolError:
        return 0


class SharedMemWeightReceiver(WeightReceiver):
    """A :class:`WeightReceiver` that points its model's parameters at the trainer's buffers.

    Built on the worker by the scheme. With ``zero_copy`` (the default) an
    update sets each parameter's ``.data`` to a view of the shared buffer;
    buffers and parameters of another dtype or device are copied. Without it
    (or for a model that is not an ``nn.Module``) everything is copied, under
    the slot's seqlock; ``torn_reads`` counts the retries that caught.

    >>> scheme = SharedMemWeightSyncScheme()                      # doctest: +SKIP
    >>> receiver = scheme.init_on_worker("policy", root=worker)   # doctest: +SKIP
    >>> receiver.torn_reads                                        # doctest: +SKIP
    0
    """

    def __init__(self, *args: Any, zero_copy: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zero_copy = zero_copy
        self.torn_reads = 0  # observability: how often the seqlock caught a rewrite
        self._blocks = BlockCache[SharedTensorBlock](MAX_ATTACHED)  # attached, by name

    @property
    def block(self) -> SharedTensorBlock | None:
        """The block last applied from."""
        return self._blocks.latest()

    def _load(self, message: Message) -> Any:
        body = message.body
        if not (isinstance(body, dict) and isinstance(body.get("block"), str)
                and type(body.get("slot")) is int and type(body.get("seq")) is int):
            raise ProtocolError("shared-memory weights must be {'block': str, 'slot': int, "
                                f"'seq': int}}, got {body!r:.200}")
        return body["block"], body["slot"], body["seq"]

    def _apply(self, update: _Update) -> int:
        name, slot, seq = update.payload
        block = self._attach(name)
        targets = flat_tensors(self.model, live=True)
        layout = block.layout
        check_compatible(targets, {k: SimpleNamespace(shape=s) for k, (_, s) in layout.items()},
                         what=f"shared-memory weights of {self.model_id!r}")
        if self.zero_copy and isinstance(self.model, nn.Module):
            version = self._share(block, targets, slot, seq)
        else:
            version = self._copy(block, targets, slot, seq)
        self._blocks.use(block.name)
        return version

    def _share(self, block: SharedTensorBlock, targets: Mapping[str, torch.Tensor],
               slot: int, seq: int) -> int:
        """Parameters view the slot; the rest is copied. Checks the slot is the one published."""
        before, version = block.slot_state(slot)
        if before != seq:
            # The sender never rewrites a buffer it published to a worker that has not
            # moved on: this is a protocol violation, not a race to retry.
            raise TornReadError(f"{self.model_id!r}: buffer {block.name} holds seq {before}, "
                                f"the message published seq {seq}")
        for key, view in block.slot_views(slot).items():
            target = targets[key]
            if _shareable(target, view):
                target.data = view
            else:
                copy_into(target, view)
        return version

    def _copy(self, block: SharedTensorBlock, targets: Mapping[str, torch.Tensor],
              slot: int, seq: int) -> int:
        for _ in range(MAX_READ_ATTEMPTS):
            try:
                return block.read_into(targets, slot, seq)
            except TornReadError:
                self.torn_reads += 1
                latest = block.latest()
                if latest is None:
                    raise
                slot, seq, _ = latest
        raise TornReadError(f"{self.model_id!r}: block {block.name} was rewritten during "
                            f"{MAX_READ_ATTEMPTS} reads in a row; the trainer writes faster "
                            "than this worker can copy")

    def _attach(self, name: str) -> SharedTensorBlock:
        return self._blocks.get(name, lambda: SharedTensorBlock.attach(name))

    def close(self) -> None:
        super().close()
        self._blocks.close()


def _shareable(target: torch.Tensor, view: torch.Tensor) -> bool:
    # Parameters only: a worker never writes them, while buffers (running statistics)
    # may be updated in place, which would write into every worker's weights.
    return (isinstance(target, nn.Parameter) and target.dtype == view.dtype
            and target.device.type == "cpu")


# ---------------------------------------------------------------------------- live


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

    def __init__(self, model_id: str, hub: Any, **kwargs: Any) -> None:
        # Per worker: its peer and the ticket of the last message it got (before the base
        # class's __init__, which may add workers). Attached once that ack says so.
        self._attach: dict[int, tuple[bytes, Ticket]] = {}
        super().__init__(model_id, hub, **kwargs)
        self._live: _Buffer | None = None
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
        self._live = _Buffer(block)
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
            return WeightsApplied.from_body(result).published
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
            if _shareable(target, view):
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

    def _apply(self, update: _Update) -> int:
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
