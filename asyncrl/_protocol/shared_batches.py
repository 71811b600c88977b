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
from .fields import MAX_KEY, bounded_list, required

#: Most leaves a batch held in shared memory may have (a policy writes a handful).
MAX_BATCH_KEYS = 4096
#: Longest segment name (POSIX allows 255; ours are ``asyncrl_<pid>_<hex>``).
MAX_SEGMENT_NAME = 200
#: Most slots a batch segment may have (see :mod:`transports._shm`'s MAX_SLOTS).
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


def _paths(body: Any, what: str) -> list[tuple[str, ...]]:
    paths = []
    for entry in bounded_list(body, "keys", MAX_BATCH_KEYS, what):
        if not (isinstance(entry, list) and 0 < len(entry) <= 8
                and all(isinstance(p, str) and 0 < len(p) <= MAX_KEY for p in entry)):
            raise ProtocolError(f"{what} field 'keys' must hold key paths (lists of 1 to 8 "
                                f"strings), got {str(entry)[:60]}")
        paths.append(tuple(entry))
    return paths


@dataclass(slots=True)
class BatchSlots:
    """Trainer -> local worker: write your batches into segment ``name`` from now on.

    ``keys`` are the batch's leaves in the segment's order (slot tensor ``t{i}``
    holds ``keys[i]``); the segment's own layout gives each one's shape and dtype.
    """

    KIND: ClassVar[str] = "batch_slots"
    name: str
    keys: list[tuple[str, ...]]

    def to_body(self) -> dict[str, Any]:
        return {"name": self.name, "keys": [list(k) for k in self.keys]}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return cls(name=segment_name(body, "batch_slots"), keys=_paths(body, "batch_slots"))


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
