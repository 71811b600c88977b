"""Trajectory ids: unique per run, allocated by each env-stepping process on its own.

An id is ``tag << 32 | counter``: the tag is the worker's (or env worker's)
slot, the counter counts the trajectories it started. No two processes share a
tag, so ids never clash and no process asks another for one (TorchRL's
``("collector", "traj_ids")``, unique across workers).
"""

from __future__ import annotations

import numpy as np

__all__ = ["TRAJ_ID_BITS", "TrajectoryIds"]

#: Bits of the per-process counter; the tag sits above them.
TRAJ_ID_BITS = 32


class TrajectoryIds:
    """The current trajectory id of each of ``n`` envs, and fresh ones on demand.

    >>> ids = TrajectoryIds(3, tag=1)
    >>> ids.current.tolist() == [(1 << 32) + i for i in range(3)]
    True
    >>> ids.renew(np.array([False, True, False])); int(ids.current[1]) - (1 << 32)
    3
    """

    __slots__ = ("_base", "_counter", "current")

    def __init__(self, n: int, *, tag: int) -> None:
        self._base = tag << TRAJ_ID_BITS
        self.current = np.arange(n, dtype=np.int64) + self._base
        self._counter = n  # the first n ids are the envs' first trajectories

    def renew(self, mask: np.ndarray, *, first: int = 0) -> None:
        """Give every env where ``mask`` is True a new trajectory id (an episode ended).

        ``mask`` covers envs ``first .. first + len(mask) - 1`` (one split of them).
        """
        k = int(mask.sum())
        if self._counter + k > 1 << TRAJ_ID_BITS:
            raise OverflowError("more than 2**32 trajectories on one worker: traj_ids would clash")
        self.current[first:first + len(mask)][mask] = self._base + np.arange(
            self._counter, self._counter + k, dtype=np.int64)
        self._counter += k
