"""The update-to-data (UTD) ratio: at most ``ratio`` gradient updates per collected frame.

Off-policy training (SAC, TD3, DQN) samples a replay buffer the collector keeps
filling; how many updates it makes per frame collected is the UTD ratio. With
collection running ahead (``MultiAsyncCollector``, ``AsyncCollector``,
``start()``), counting it by hand means polling ``rb.write_count``.
:class:`UpdateRatio` counts it exactly, in whole updates, with no float drift:
give it the frames collected so far and it says how many updates are due.

>>> utd = UpdateRatio(0.5, start_after=100)   # one update per 2 frames, after 100 frames
>>> utd.take(80)                              # still warming up: no update
range(0, 0)
>>> len(utd.take(150)), len(utd.take(151)), len(utd.take(152)), utd.updates
(25, 0, 1, 26)
"""

from __future__ import annotations

from fractions import Fraction

__all__ = ["UpdateRatio"]


class UpdateRatio:
    """At most ``ratio`` updates per frame collected after ``start_after`` frames.

    ``due(frames)`` is how many updates the frames collected so far still
    allow; ``take(frames, most=None)`` counts them as done and returns a
    ``range`` to loop over. The count is exact: after ``take(F)``, exactly
    ``floor((F - start_after) * ratio)`` updates were handed out, whatever the
    batch sizes. Pass the collector's ``frames_collected`` (frames handed to the
    trainer, also those ``start()`` wrote to a replay buffer) or your own count.
    Not thread-safe: one training loop owns it.

    >>> utd = UpdateRatio(2)                      # two updates per frame
    >>> for _ in utd.take(frames=3):
    ...     pass                                  # six updates
    >>> utd.updates, utd.due(3), utd.due(4)
    (6, 0, 2)
    """

    def __init__(self, ratio: float | Fraction, *, start_after: int = 0) -> None:
        if ratio <= 0:
            raise ValueError(f"UpdateRatio(ratio={ratio!r}): the ratio of updates per frame "
                             "must be positive")
        if start_after < 0:
            raise ValueError(f"UpdateRatio(start_after={start_after!r}) must be >= 0")
        # 0.1 as the fraction 1/10, not its binary float: counts stay exact.
        self.ratio = Fraction(ratio).limit_denominator(1_000_000)
        self.start_after = int(start_after)
        #: Updates handed out by :meth:`take` so far.
        self.updates = 0

    def __repr__(self) -> str:
        return (f"UpdateRatio({float(self.ratio):g}, start_after={self.start_after}, "
                f"updates={self.updates})")

    def allowed(self, frames: int) -> int:
        """Updates ``frames`` collected frames allow in all (0 while warming up)."""
        return max(0, int((int(frames) - self.start_after) * self.ratio))

    def due(self, frames: int) -> int:
        """Updates still allowed after the ones already taken."""
        return max(0, self.allowed(frames) - self.updates)

    def take(self, frames: int, most: int | None = None) -> range:
        """Count the due updates (at most ``most``) as done; loop over the returned range."""
        count = self.due(frames)
        if most is not None:
            count = min(count, max(0, int(most)))
        self.updates += count
        return range(count)
