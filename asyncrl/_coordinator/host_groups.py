"""Places held for a host's workers, so that a host joins whole or not at all.

A worker host (``asyncrl worker --workers K``) names its group and its K workers
in each worker's hello. The first of them admitted takes its place and holds the
places of its siblings still to come; a worker of another host finds them taken
and is refused as full. Two hosts racing for the last places therefore do not
end half admitted each (half-capacity hosts that are never ready): one gets all
its places, the other none, asks again, and joins whole once enough are free.

A hello is hostile until proven otherwise (without keys anyone may send one), so
a hold is bounded, and the bound is the one docs/multihost.md names:

* it ends when the group's last admitted worker leaves or is lost (the roster says
  who is alive: :meth:`HostGroups.keep_only`), so a hello that leaves at once
  holds nothing for long;
* it ends :data:`HOLD` seconds after the group's first admission, filled or not
  (a sibling that never says hello, e.g. its process died while it built its
  envs, frees its place);
* a group holds places once: after its hold ended, for whatever reason, its later
  workers each need a free place of their own and hold nothing for others, so no
  hello renews a hold (the groups whose hold ended are remembered, the newest
  :data:`REMEMBERED`);
* after a hold ended unfilled, no group takes a new one for :data:`QUIET` seconds:
  longer than a host refused as full waits between two hellos (its backoff, at
  most ``JOIN_BACKOFF_MAX`` x 1.25 = 10 s), so such a host asks while nothing can be
  held against it, and a stranger cannot chain holds under fresh group names.

So an honest host refused because of held places is admitted within
``HOLD + QUIET`` = 42 s of its first refusal, whatever hellos a stranger sends
(places a stranger's live workers take are taken, as any worker's are without
keys): inside the 60 s a worker host asks by default (``--join-timeout``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass

__all__ = ["HOLD", "QUIET", "REMEMBERED", "HostGroups"]

#: How long the places of a host's siblings stay held after its first worker joined (s):
#: half a worker host's default ``--join-timeout`` (60 s), so that a host refused because
#: of a hold that never fills still joins before it gives up. Siblings start together;
#: what separates their hellos is building their envs.
HOLD = 30.0

#: After a hold ended unfilled, how long no new hold is taken (s): more than the longest
#: pause of a worker refused as full between two hellos (8 s jittered by 1/4: 10 s).
QUIET = 12.0

#: How many groups whose hold ended are remembered (hellos may come from anyone).
REMEMBERED = 4096


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
    >>> groups.held(), groups.held_before("host-a")
    (0, True)
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 hold: float = HOLD, quiet: float = QUIET) -> None:
        self._clock = clock
        self._hold = hold
        self._quiet = quiet
        self._quiet_until = -float("inf")  # no new hold before (a hold ended unfilled)
        self._holds: dict[str, _Hold] = {}
        # Groups whose hold ended (filled, expired, or its workers gone), newest last.
        self._ended: OrderedDict[str, None] = OrderedDict()

    def held(self, *, besides: str = "") -> int:
        """Places held for siblings still to come (of every group but ``besides``)."""
        self._expire()
        return sum(h.places for group, h in self._holds.items() if group != besides)

    def holds_for(self, group: str) -> bool:
        """Whether a place is held for a worker of ``group``."""
        self._expire()
        return bool(group) and group in self._holds

    def held_before(self, group: str) -> bool:
        """Whether ``group`` held places once and no longer does: it may not hold again."""
        self._expire()
        return bool(group) and group in self._ended

    def admitted(self, group: str, *, size: int, present: int) -> None:
        """A worker of ``group`` (``size`` workers, ``present`` admitted before it) joined."""
        if not group:
            return
        hold = self._holds.get(group)
        if hold is not None:
            hold.places -= 1
            if hold.places <= 0:
                self._end(group, filled=True)
        elif size - present - 1 > 0 and not self.held_before(group) \
                and self._clock() >= self._quiet_until:
            self._holds[group] = _Hold(size - present - 1, self._clock() + self._hold)

    def keep_only(self, alive: Collection[str]) -> None:
        """Release the holds of groups none of whose workers is alive any more: a hold
        is for the siblings of an admitted worker, and there is none left."""
        for group in [g for g in self._holds if g not in alive]:
            self._end(group, filled=False)

    def _expire(self) -> None:
        now = self._clock()
        for group in [g for g, h in self._holds.items() if h.until <= now]:
            self._end(group, filled=False, at=self._holds[group].until)

    def _end(self, group: str, *, filled: bool, at: float | None = None) -> None:
        del self._holds[group]
        if not filled:  # hosts refused meanwhile ask again before anyone holds again
            ended = self._clock() if at is None else at
            self._quiet_until = max(self._quiet_until, ended + self._quiet)
        self._ended[group] = None
        self._ended.move_to_end(group)
        while len(self._ended) > REMEMBERED:
            self._ended.popitem(last=False)
