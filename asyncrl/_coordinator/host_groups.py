"""Places held for a host's workers, so that a host joins whole or not at all.

A worker host (``asyncrl worker --workers K``) names its group and its K workers
in each worker's hello. The first of them admitted takes its place and holds the
places of its siblings still to come; a worker of another host finds them taken
and is refused as full. Two hosts racing for the last places therefore do not
end half admitted each (half-capacity hosts that are never ready): one gets all
its places, the other none, asks again, and joins whole once enough are free.
A hold is bounded (:data:`HOLD` seconds): a sibling that never says hello (its
process died while it built its envs) frees its place.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HOLD", "HostGroups"]

#: How long the places of a host's siblings stay held after its first worker joined (s).
#: Siblings start together; what separates their hellos is building their envs.
HOLD = 60.0


@dataclass
class _Hold:
    places: int  # siblings not admitted yet
    until: float  # the clock's time at which the places are freed


class HostGroups:
    """The places held for the siblings of admitted workers, by host group.

    >>> groups = HostGroups(clock=lambda: 0.0)
    >>> groups.admitted("host-a", size=2, present=0)   # a's first worker: one place held
    >>> groups.held(), groups.holds_for("host-a"), groups.held(besides="host-a")
    (1, True, 0)
    >>> groups.admitted("host-a", size=2, present=1)   # its sibling takes it
    >>> groups.held()
    0
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 hold: float = HOLD) -> None:
        self._clock = clock
        self._hold = hold
        self._holds: dict[str, _Hold] = {}

    def held(self, *, besides: str = "") -> int:
        """Places held for siblings still to come (of every group but ``besides``)."""
        self._expire()
        return sum(h.places for group, h in self._holds.items() if group != besides)

    def holds_for(self, group: str) -> bool:
        """Whether a place is held for a worker of ``group``."""
        self._expire()
        return bool(group) and group in self._holds

    def admitted(self, group: str, *, size: int, present: int) -> None:
        """A worker of ``group`` (``size`` workers, ``present`` admitted before it) joined."""
        if not group:
            return
        hold = self._holds.get(group)
        if hold is not None:
            hold.places -= 1
            if hold.places <= 0:
                del self._holds[group]
        elif size - present - 1 > 0:
            self._holds[group] = _Hold(size - present - 1, self._clock() + self._hold)

    def _expire(self) -> None:
        now = self._clock()
        for group in [g for g, h in self._holds.items() if h.until <= now]:
            del self._holds[group]
