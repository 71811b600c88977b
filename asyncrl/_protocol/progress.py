"""A collecting worker's progress: how many env steps it has returned so far.

A batch can take longer than ``sample_timeout`` while every step returns: the
stall watchdog judges a worker on steps, not on batches. While it owes a batch a
worker sends its step count about once a second when it moved; a worker that
never sends one (``asyncrl.testing``'s simulated workers) is judged on its
batches, as before.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Any, ClassVar, Self

from msgspec import Meta

from .decoding import read

#: The largest step count a progress message may carry (an int64's range).
MAX_STEPS = (1 << 63) - 1


@dataclass(slots=True)
class Progress:
    """Worker -> coordinator: collecting ``request``, ``steps`` env steps returned so far.

    ``steps`` counts every step of the worker's rollout since it was built, so it
    only grows: the coordinator notes the time whenever it does, while the worker
    owes ``request``. More than its batches can hold (``(delivered + 1) x share``)
    refuses the worker (see :mod:`asyncrl._coordinator.watchdog`).

    >>> Progress.from_body(Progress(request=3, steps=120).to_body())
    Progress(request=3, steps=120)
    """

    KIND: ClassVar[str] = "progress"
    request: int
    steps: Annotated[int, Meta(ge=0, le=MAX_STEPS)]

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return read(cls, body, "progress")


__all__ = ["MAX_STEPS", "Progress"]
