"""Same-host weights through shared memory: only (block, slot, seq) travel over ZeroMQ.

:class:`SharedMemWeightSyncScheme` (safe, zero-copy) with its two ends,
:class:`SharedMemWeightSender` and :class:`SharedMemWeightReceiver`.
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

The live variant is in :mod:`._live_shared_memory`.
"""

from __future__ import annotations

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

from .._protocol import WeightsApplied, decode
from ._newest import Queued
from ._receiver import PendingUpdate, WeightReceiver
from ._scheme import WeightSyncScheme
from ._sender import THREAD_COPY_BYTES, WeightSender
from ._staging import Stage
from ._strategy import WeightFormat, WeightStrategy, check_compatible, flat_tensors

__all__ = [
    "BlockCache",
    "SharedBuffer",
    "SharedMemWeightReceiver",
    "SharedMemWeightSender",
    "SharedMemWeightSyncScheme",
    "shareable",
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


class SharedBuffer:
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
        self._buffers: list[SharedBuffer] = []
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
        if not self.codec.identity:
            flat = dict(self.codec.encode(flat))
        buffer = await self._free_buffer(flat)
        buffer.version, buffer.tickets = 0, []  # nobody reads it: see _free_buffer
        if buffer.block.nbytes > THREAD_COPY_BYTES:
            seq = await anyio.to_thread.run_sync(self._write, buffer, flat, version)
        else:
            seq = self._write(buffer, flat, version)
        buffer.version = version
        self._release(keep=buffer)
        return {"block": buffer.block.name, "slot": 0, "seq": seq}, {"buffer": buffer}

    def _write(self, buffer: SharedBuffer, flat: Mapping[str, torch.Tensor], version: int) -> int:
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
        used.update(queued.version for queued in self._lanes.queued())
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

    async def _free_buffer(self, flat: Mapping[str, torch.Tensor]) -> SharedBuffer:
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

    def _new_buffer(self, flat: Mapping[str, torch.Tensor]) -> SharedBuffer:
        buffer = SharedBuffer(SharedTensorBlock.create(flat, slots=1))
        self._buffers.append(buffer)
        return buffer

    def _release(self, keep: SharedBuffer) -> None:
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
        return decode(WeightsApplied, result).version
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

    def _apply(self, update: PendingUpdate) -> int:
        name, slot, seq = update.payload
        block = self._attach(name)
        if not self.codec.identity:  # what came is not the model's tensors: decode, copy
            version, received = block.read(slot, seq)
            self.strategy.apply_weights(self.model, self._decoded(received))
            self._blocks.use(block.name)
            return version
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
            if shareable(target, view):
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


def shareable(target: torch.Tensor, view: torch.Tensor) -> bool:
    # Parameters only: a worker never writes them, while buffers (running statistics)
    # may be updated in place, which would write into every worker's weights.
    return (isinstance(target, nn.Parameter) and target.dtype == view.dtype
            and target.device.type == "cpu")


class SharedMemWeightSyncScheme(WeightSyncScheme):
    """Same host, safe and zero-copy: one memcpy per send, none on the workers.

    A send writes the weights into a free shared-memory buffer (one copy) and
    only ``(block, slot, seq)`` travels; each worker points its parameters at
    that buffer at a step boundary (``param.data = view``, no copy) and acks.
    A buffer is rewritten only once no worker can be stepping with it (the
    acks say which version each worker holds), so the weights that produce a
    frame are exactly those of its stamped version, whole. The pool holds
    ``slots`` buffers; while a worker holds on to an old version longer than
    ``slot_timeout`` seconds a send adds a buffer instead of waiting (memory,
    never a torn read). ``zero_copy=False`` copies into the workers' own
    tensors instead (for modules that cache tensors derived from their
    parameters); buffers (running statistics) are always copied.

    >>> SharedMemWeightSyncScheme(slots=4)
    SharedMemWeightSyncScheme(slots=4)
    """

    name = "shared_mem"
    _sender_class = SharedMemWeightSender
    _receiver_class = SharedMemWeightReceiver
    _default_slots = 3

    def __init__(self, strategy: WeightFormat | WeightStrategy = "tensordict", *,
                 max_interval: int = 0, slots: int | None = None, slot_timeout: float = 1.0,
                 zero_copy: bool = True) -> None:
        super().__init__(strategy, max_interval=max_interval)
        slots = self._default_slots if slots is None else slots
        if not 1 <= slots <= 8:
            raise ValueError(f"slots must be between 1 and 8, got {slots}")
        self.slots = slots
        self.slot_timeout = slot_timeout
        self.zero_copy = zero_copy

    def _options(self) -> dict[str, Any]:
        options = super()._options()
        if self.slots != self._default_slots:
            options["slots"] = self.slots
        if self.slot_timeout != 1.0:
            options["slot_timeout"] = self.slot_timeout
        if not self.zero_copy:
            options["zero_copy"] = False
        return options

    def _sender_options(self) -> dict[str, Any]:
        return {"slots": self.slots, "slot_timeout": self.slot_timeout}

    def _receiver_options(self) -> dict[str, Any]:
        return {"zero_copy": self.zero_copy}
