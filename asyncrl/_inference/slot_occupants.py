"""Who occupies each remote slot of the inference loop, and when a slot is free again.

Who may join is the one admission's to say (:class:`asyncrl._coordinator.admission.Admission`:
``remote_workers=K`` is up to K remote env workers *at a time*, its roster holds them);
where an admitted env worker sits is central inference's own: a slot of the inference
loop, with the blocks the loop reads and writes. A dropped worker's slot is free again
for the next admitted one (a restarted host, or a new one). Two things of the old
occupant must not reach the new one:

* its request still in the inference loop. The loop reads a slot's blocks and
  answers the slot, not a peer; a slot dropped with a request in the loop is
  *draining* until that answer comes (it goes to nobody), and only then is it
  given again, with fresh blocks. An admitted worker that finds no other slot waits
  for it (``queued``: admitted, not welcomed yet); the loop answers within one call,
  or when the trainer takes the batches that hold it back.
* its trajectory ids. Every occupant gets a *traj tag*, the high 32 bits of its
  ``("collector", "traj_ids")``: a slot's first occupant gets the slot number (as a
  local worker), the n-th one ``slot + (n - 1) * slots``, ``slots`` being the
  collector's local and remote slots together. Tags never repeat, and a tag modulo
  ``slots`` is still the slot.
"""

from __future__ import annotations

from typing import Any

from .._protocol.central_inference import MAX_TAG


class SlotOccupants:
    """Slots ``first .. first + count - 1``: occupants, requests in the loop, traj tags."""

    def __init__(self, first: int, count: int) -> None:
        self.first, self.count = first, count
        self.slot_of: dict[bytes, int] = {}
        self.peer_at: dict[int, bytes] = {}
        #: Slots whose occupant has a request in the inference loop (not yet answered).
        self.waiting: set[int] = set()
        #: Slots dropped while their request was in the loop: free once it is answered.
        self.draining: set[int] = set()
        #: Hellos waiting for a draining slot: peer -> (slot, what its hello said).
        self.queued: dict[bytes, tuple[int, Any]] = {}
        #: The traj tag of each slot's current (or last) occupant.
        self.tags: dict[int, int] = {}
        self._admissions: dict[int, int] = {}

    def place(self, peer: bytes, hello: Any) -> tuple[int, bool] | None:
        """A slot for a newly admitted peer: ``(slot, True)`` free now, ``(slot, False)``
        queued behind a draining one (see :meth:`answered`), None when every slot is held
        (the admission, which counts the live workers, lets no more in than there are slots)."""
        for slot in range(self.first, self.first + self.count):
            if slot not in self.peer_at and slot not in self.draining:
                return slot, True
        taken = {s for s, _ in self.queued.values()}
        for slot in sorted(self.draining - taken):
            self.queued[peer] = (slot, hello)
            return slot, False
        return None

    def next_tag(self, slot: int) -> int:
        """The traj tag the next occupant of ``slot`` gets; OverflowError past 2**31."""
        tag = slot + self._admissions.get(slot, 0) * (self.first + self.count)
        if tag > MAX_TAG:
            raise OverflowError(f"slot {slot} was taken {self._admissions[slot]} times: a new "
                                "occupant's traj_ids would clash; restart the collector")
        return tag

    def occupy(self, peer: bytes, slot: int) -> int:
        """``peer`` holds ``slot`` now (free, or just drained); returns its traj tag."""
        assert slot not in self.peer_at and slot not in self.draining, slot
        tag = self.next_tag(slot)
        self._admissions[slot] = self._admissions.get(slot, 0) + 1
        self.tags[slot] = tag
        self.slot_of[peer] = slot
        self.peer_at[slot] = peer
        self.waiting.discard(slot)
        return tag

    def release(self, peer: bytes) -> int | None:
        """Forget ``peer`` (dropped, refused, or a queued hello); the slot it held, if any."""
        self.queued.pop(peer, None)
        slot = self.slot_of.pop(peer, None)
        if slot is None:
            return None
        del self.peer_at[slot]
        if slot in self.waiting:
            self.waiting.discard(slot)
            self.draining.add(slot)  # the loop still reads its blocks and will answer it
        return slot

    def answered(self, slot: int) -> bytes | None:
        """The loop answered ``slot``: the occupant to send it to, or None (it went to a
        dropped occupant: the slot is free now; see :meth:`take_queued`)."""
        if slot in self.draining:
            self.draining.discard(slot)
            return None
        if slot not in self.waiting:
            return None  # nothing asked (never happens: the loop answers requests only)
        self.waiting.discard(slot)
        return self.peer_at.get(slot)

    def take_queued(self, slot: int) -> tuple[bytes, Any] | None:
        """The hello that waited for ``slot`` (now free), if one did."""
        for peer, (queued_slot, hello) in self.queued.items():
            if queued_slot == slot:
                del self.queued[peer]
                return peer, hello
        return None


__all__ = ["MAX_TAG", "SlotOccupants"]
