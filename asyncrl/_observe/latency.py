"""A fixed-bucket latency histogram with Prometheus' cumulative layout, no dependency.

A :class:`~asyncrl.weights.WeightSender` observes each send's time from the
send to its last acknowledgement; :mod:`asyncrl.metrics` exports it at scrape
time as ``asyncrl_weight_sync_seconds``.
"""

from __future__ import annotations

import bisect

#: Upper bounds in seconds (``+Inf`` is implied), from a same-host push to a slow network.
DEFAULT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)


class LatencyHistogram:
    """Counts per bucket, their sum and count; ``observe`` is O(log buckets).

    >>> h = LatencyHistogram((0.1, 1.0))
    >>> h.observe(0.05); h.observe(0.5); h.observe(3.0)
    >>> h.cumulative(), h.count
    ([(0.1, 1), (1.0, 2), (inf, 3)], 3)
    """

    def __init__(self, buckets: tuple[float, ...] = DEFAULT_BUCKETS) -> None:
        self.buckets = tuple(sorted(buckets))
        self._counts = [0] * (len(self.buckets) + 1)
        self.count = 0
        self.sum = 0.0
        self.last: float | None = None

    def observe(self, seconds: float) -> None:
        self._counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.count += 1
        self.sum += seconds
        self.last = seconds

    def cumulative(self) -> list[tuple[float, int]]:
        """``[(upper bound, observations <= it), ..., (inf, count)]``."""
        out, total = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self._counts, strict=True):
            total += count
            out.append((bound, total))
        return out


__all__ = ["DEFAULT_BUCKETS", "LatencyHistogram"]
