"""TorchRL's ``RayWeightUpdater(policy_weights, remote_collectors, max_interval)``, thinly.

A TorchRL user who pushed weights to Ray collectors with it keeps the same
three arguments; the bytes go through :class:`~asyncrl.weights.RayWeightSyncScheme`
(one ``ray.put`` per version, workers fetch by reference, acks with the version).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._ray import RayWeightSender

__all__ = ["RayWeightUpdater"]


class RayWeightUpdater:
    """Push ``policy_weights`` to collectors whose weights travel by Ray, as TorchRL does.

    ``remote_collectors`` is one asyncrl collector whose workers Ray started
    (a worker id is one of its workers) or a list of them (a worker id is an
    index in the list, as in TorchRL, and names that whole collector); each
    must use ``weight_sync_schemes={"policy": RayWeightSyncScheme()}``.
    ``max_interval`` keeps TorchRL's meaning: each call counts one for every
    targeted worker, and a worker is updated once it has been skipped
    ``max_interval`` times (0: every call). ``await updater()`` (or
    ``push_weights`` / ``update_weights``) returns once every updated worker
    applied the weights (TorchRL's call returns before: here the ack is real).

    >>> updater = RayWeightUpdater(policy_weights, [collector], max_interval=2)  # doctest: +SKIP
    >>> for _ in range(3):
    ...     await updater()              # the 3rd call updates every worker  # doctest: +SKIP
    >>> await updater(new_weights, worker_ids=[0])                              # doctest: +SKIP
    """

    def __init__(self, policy_weights: Any, remote_collectors: Any, max_interval: int = 0) -> None:
        if max_interval < 0:
            raise ValueError(f"max_interval must be >= 0, got {max_interval}")
        self.policy_weights = policy_weights
        self.single = not isinstance(remote_collectors, list | tuple)
        self.remote_collectors = ([remote_collectors] if self.single
                                  else list(remote_collectors))
        self.max_interval = max_interval
        for collector in self.remote_collectors:
            sender = collector.weight_sender("policy")
            if not isinstance(sender, RayWeightSender):
                raise ValueError(
                    f"RayWeightUpdater needs collectors whose 'policy' travels by Ray; "
                    f"{type(collector).__name__} uses {type(sender).__name__}: pass "
                    "weight_sync_schemes={'policy': RayWeightSyncScheme()}, or call "
                    "collector.update_policy_weights() for its own scheme")
        # Calls counted since each worker's last update, from 0 as in TorchRL (so with
        # max_interval=n a worker's first update is at the (n + 1)-th call).
        self._since: dict[int, int] = {}

    def all_worker_ids(self) -> list[int]:
        """TorchRL's name: the ids a call with ``worker_ids=None`` targets."""
        if self.single:
            return sorted(self.remote_collectors[0].weight_sender("policy").workers)
        return list(range(len(self.remote_collectors)))

    async def __call__(self, policy_or_weights: Any = None,
                       worker_ids: int | Iterable[int] | None = None) -> None:
        await self.push_weights(policy_or_weights, worker_ids)

    async def push_weights(self, policy_or_weights: Any = None,
                           worker_ids: int | Iterable[int] | None = None) -> None:
        """Send ``policy_or_weights`` (default: ``policy_weights``) to the due workers."""
        weights = self.policy_weights if policy_or_weights is None else policy_or_weights
        targets = self._targets(worker_ids)
        due = [w for w in targets if not self._skip_update(w)]
        if not due:
            return
        if self.single:
            await self.remote_collectors[0].update_policy_weights(weights, worker_ids=due)
        else:
            for index in due:
                await self.remote_collectors[index].update_policy_weights(weights)
        for worker_id in due:
            self._since[worker_id] = 0

    update_weights = push_weights

    def _targets(self, worker_ids: int | Iterable[int] | None) -> list[int]:
        known = self.all_worker_ids()
        if worker_ids is None:
            return known
        ids = [worker_ids] if isinstance(worker_ids, int) else list(worker_ids)
        unknown = [w for w in ids if w not in known]
        if unknown:
            raise ValueError(f"RayWeightUpdater: unknown worker id(s) {unknown}; known: {known}")
        return ids

    def _skip_update(self, worker_id: int) -> bool:
        # TorchRL's rule: count this call, update once the count passes max_interval.
        count = self._since.get(worker_id, 0) + 1
        self._since[worker_id] = count
        return count <= self.max_interval
