"""Same-host weights through shared memory: only (block, slot, seq) travel over ZeroMQ."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import anyio
import torch

from transports import Message, ProtocolError, SharedTensorBlock, Ticket, TornReadError

from ._in_flight import Queued
from ._receiver import WeightReceiver, _Update
from ._sender import THREAD_COPY_BYTES, WeightSender
from ._staging import Stage
from ._strategy import check_compatible, flat_tensors

__all__ = ["SharedMemWeightReceiver", "SharedMemWeightSender"]

#: Torn reads tolerated before an apply fails (each retry reads the newest slot).
MAX_READ_ATTEMPTS = 16


class SharedMemWeightSender(WeightSender):
    """A :class:`WeightSender` that writes weights into a shared-memory block.

    Each version goes to the slot after the latest one. Before a slot is
    rewritten the sender waits (up to ``slot_timeout`` seconds) for the workers
    to acknowledge the version it held, so a reader is normally never
    disturbed; if one is (a stuck worker), its seqlock check catches the tear
    and it reads the newest slot instead. The block is unlinked by ``aclose()``.

    >>> scheme = SharedMemWeightSyncScheme(slots=2)                     # doctest: +SKIP
    >>> sender = scheme.init_on_sender("policy", hub=hub, model=policy,
    ...                                workers=lambda: peers)            # doctest: +SKIP
    >>> version = await sender.send()   # written to a slot; (block, slot, seq) travels  # doctest: +SKIP
    """

    relayable = False  # the block lives on the trainer's host: nothing for a relay to carry

    def __init__(self, model_id: str, hub: Any, *, slots: int = 2,
                 slot_timeout: float = 1.0, **kwargs: Any) -> None:
        super().__init__(model_id, hub, **kwargs)
        self.slots = slots
        self.slot_timeout = slot_timeout
        self.block: SharedTensorBlock | None = None
        self._slot_tickets: list[list[Ticket]] = [[] for _ in range(slots)]
        self._pinned: Stage | None = None  # CUDA weights: staged here, then one memcpy

    async def _prepare(self, source: Any, version: int) -> tuple[Any, dict[str, Any]]:
        flat = flat_tensors(source)
        if self.block is None or not self.block.matches(flat):
            await self._replace_block(flat)
        block = self.block
        assert block is not None
        latest = block.latest()
        slot = 0 if latest is None else (latest[0] + 1) % self.slots
        await self._wait_slot(slot)
        if block.nbytes > THREAD_COPY_BYTES:
            seq = await anyio.to_thread.run_sync(self._write, block, flat, version, slot)
        else:
            seq = self._write(block, flat, version, slot)
        return {"block": block.name, "slot": slot, "seq": seq}, {"slot": slot}

    def _write(self, block: SharedTensorBlock, flat: Mapping[str, torch.Tensor], version: int,
               slot: int) -> int:
        """One copy of the weights into ``slot`` (CPU), or device -> pinned -> slot (CUDA)."""
        if any(t.device.type == "cuda" for t in flat.values()):
            # Shared memory is pageable: a direct device copy would be synchronous and
            # staged by the driver per tensor. One asynchronous DMA copy into a pinned
            # buffer, one wait, then one memcpy into the slot.
            if self._pinned is None or not self._pinned.matches(flat):
                self._pinned = Stage(flat)
            self._pinned.fill(flat)
            flat = self._pinned.views
        return block.write(flat, version, slot=slot)[1]

    def _latest_extra(self) -> dict[str, Any]:
        return {"slot": self._latest["slot"]} if self._latest else {}

    def _on_transmit(self, queued: Queued, ticket: Ticket) -> None:
        # The slot is rewritten only once the versions transmitted from it are acked.
        self._slot_tickets[queued.extra["slot"]].append(ticket)

    async def _wait_slot(self, slot: int) -> None:
        tickets = [t for t in self._slot_tickets[slot] if t.pending]
        with anyio.move_on_after(self.slot_timeout):
            for ticket in tickets:
                await ticket.done.wait()
        self._slot_tickets[slot] = [t for t in tickets if t.pending]

    async def _replace_block(self, flat: Mapping[str, torch.Tensor]) -> None:
        for slot in range(self.slots):
            await self._wait_slot(slot)
        self._close_block()
        self.block = SharedTensorBlock.create(flat, slots=self.slots)
        self._slot_tickets = [[] for _ in range(self.slots)]

    def _close_block(self) -> None:
        if self.block is not None:
            block, self.block = self.block, None
            block.close()
            block.unlink()

    async def aclose(self) -> None:
        await super().aclose()
        self._close_block()
        self._pinned = None


class SharedMemWeightReceiver(WeightReceiver):
    """A :class:`WeightReceiver` that copies whole snapshots out of a shared-memory block.

    Built on the worker by the scheme; ``torn_reads`` counts how often the
    seqlock caught a slot being rewritten while it was copied.

    >>> receiver = SharedMemWeightSyncScheme().init_on_worker("policy", root=worker)  # doctest: +SKIP
    >>> receiver.torn_reads                                                          # doctest: +SKIP
    0
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.block: SharedTensorBlock | None = None
        self.torn_reads = 0  # observability: how often the seqlock caught a rewrite

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
        for _ in range(MAX_READ_ATTEMPTS):
            try:
                return block.read_into(targets, slot, seq)
            except TornReadError:
                self.torn_reads += 1
                latest = block.latest()
                if latest is None:
                    raise
                slot, seq, _ = latest
        raise TornReadError(f"{self.model_id!r}: block {name} was rewritten during "
                            f"{MAX_READ_ATTEMPTS} reads in a row; the trainer writes faster "
                            "than this worker can copy")

    def _attach(self, name: str) -> SharedTensorBlock:
        if self.block is None or self.block.name != name:
            self._detach()
            self.block = SharedTensorBlock.attach(name)
        return self.block

    def _detach(self) -> None:
        if self.block is not None:
            block, self.block = self.block, None
            block.close()

    def close(self) -> None:
        super().close()
        self._detach()
