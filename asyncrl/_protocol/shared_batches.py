"""Batches through shared memory: the trainer's offer of a segment, a worker's small notice.

A local worker's batch need not cross the socket: the trainer creates a segment
for it (see :mod:`asyncrl._coordinator.shared_batches`) and offers it with
:class:`BatchSlots`; from then on the worker writes each batch into a slot and
sends only a :class:`SharedBatch` (request, segment, slot, steps). Shapes and
dtypes never come from these messages: each side takes them from the segment's
layout, which the trainer wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Self

from msgspec import Meta

from transports import ProtocolError

from .decoding import read
from .fields import MAX_KEY, required

#: Most leaves a batch held in shared memory may have (a policy writes a handful).
MAX_BATCH_KEYS = 4096
#: Longest segment name (POSIX allows 255; ours are ``asyncrl_<pid>_<hex>``).
MAX_SEGMENT_NAME = 200
#: Most slots a batch segment may have (see :mod:`transports._shm_format`'s MAX_SLOTS).
MAX_BATCH_SLOTS = 8
#: Most steps a share may have (a bound only: the trainer checks against its layout).
MAX_STEPS = 1 << 30


def segment_name(body: Any, what: str) -> str:
    name: str = required(body, "name", str, what)
    if not (name.startswith("asyncrl_") and len(name) <= MAX_SEGMENT_NAME and "/" not in name
            and name.isprintable()):
        raise ProtocolError(f"{what} field 'name' must be an asyncrl segment name "
                            f"(asyncrl_..., at most {MAX_SEGMENT_NAME} characters), "
                            f"got {name[:40]!r}")
    return name


#: A leaf's key path in a batch: 1 to 8 names of 1 to MAX_KEY characters.
KeyPath = Annotated[tuple[Annotated[str, Meta(min_length=1, max_length=MAX_KEY)], ...],
                    Meta(min_length=1, max_length=8)]


@dataclass(slots=True)
class BatchSlots:
    """Trainer -> local worker: write your batches into segment ``name`` from now on.

    ``keys`` are the batch's leaves in the segment's order (slot tensor ``t{i}``
    holds ``keys[i]``); the segment's own layout gives each one's shape and dtype.
    """

    KIND: ClassVar[str] = "batch_slots"
    name: Annotated[str, Meta(max_length=MAX_SEGMENT_NAME)]  # and segment_name()'s check
    keys: Annotated[list[KeyPath], Meta(max_length=MAX_BATCH_KEYS)]

    def to_body(self) -> dict[str, Any]:
        return {"name": self.name, "keys": [list(k) for k in self.keys]}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        slots = read(cls, body, "batch_slots")
        segment_name(body, "batch_slots")
        return slots


@dataclass(slots=True)
class SharedBatch:
    """Local worker -> trainer: request ``request``'s batch is in ``slot`` of ``name``,
    its first ``steps`` steps (a preempted share is shorter)."""

    KIND: ClassVar[str] = "shared_batch"
    request: int
    name: str  # checked by segment_name(): an asyncrl segment's
    slot: Annotated[int, Meta(ge=0, le=MAX_BATCH_SLOTS - 1)]
    steps: Annotated[int, Meta(ge=0, le=MAX_STEPS)]

    def to_body(self) -> dict[str, Any]:
        return {"request": self.request, "name": self.name, "slot": self.slot,
                "steps": self.steps}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        notice = read(cls, body, "shared_batch")
        segment_name(body, "shared_batch")
        return notice


__all__ = ["MAX_BATCH_KEYS", "MAX_BATCH_SLOTS", "BatchSlots", "SharedBatch", "segment_name"]
