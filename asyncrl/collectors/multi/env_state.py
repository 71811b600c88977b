"""A MultiCollector's env state across its workers: read, written, merged, carried.

``state_dict()`` asks every live worker for its policy's and its envs' state
(``{"worker0": {"policy_state_dict": ..., "env_state_dict": ...}, ...}``, TorchRL's
keys; the env part as :mod:`asyncrl._rollout.env_state` reads it);
``sync_env_statistics()`` merges the workers' ``obs_rms`` and writes the merge
back (:mod:`asyncrl.collectors._env_statistics`). The last env state read from
or loaded into each worker index is kept, and a worker that replaces a lost one
(``on_worker_loss="restart"`` or ``"wait"``) is given it after its catch-up
weights and before its first batch, then resets its envs, so that its first
observation is normalised with it. A worker that was only dropped and rejoined
(the same process) keeps its own.

>>> state = WorkerEnvState()                       # doctest: +SKIP
>>> await state.sync(coordinator)                  # doctest: +SKIP
{'mean': array([...]), 'var': array([...]), 'count': 2048.0002}
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from typing import Any

from transports import PeerLostError, RemoteError

from ..._coordinator.coordinator import Coordinator, WorkerInfo
from ..._errors import rebuild_remote_exception
from ..._protocol import Control
from .._env_statistics import EnvStatistics

__all__ = ["WorkerEnvState"]

log = logging.getLogger("asyncrl.collectors")


def _process(worker: WorkerInfo) -> tuple[str, str, int]:
    return worker.name, worker.host, worker.pid


class WorkerEnvState:
    """The env side of ``state_dict``, ``load_state_dict``, ``getattr_env`` and
    ``sync_env_statistics``, and the carry to replacements."""

    def __init__(self) -> None:
        self.statistics = EnvStatistics()
        self._read_from: dict[int, tuple[str, str, int]] = {}  # the process each state is of
        self._hooked: Coordinator | None = None

    async def state_dict(self, coordinator: Coordinator) -> dict[str, Any]:
        self._hook(coordinator)
        answers = {}
        for worker in coordinator.live_workers:
            answer = await coordinator.control(worker, "state_dict")
            self._remember(worker, answer.get("env_state_dict"))
            answers[f"worker{worker.index}"] = answer
        return answers

    async def load_state_dict(self, coordinator: Coordinator, state_dict: dict[str, Any]) -> None:
        self._hook(coordinator)
        for worker in coordinator.live_workers:
            key = f"worker{worker.index}"
            if key not in state_dict:
                raise KeyError(f"load_state_dict: no {key!r} in the state dict (it has "
                               f"{sorted(state_dict)}); pass what state_dict() returned")
            state = state_dict[key]
            await coordinator.control(worker, "load_state_dict", **state)
            self._remember(worker, state.get("env_state_dict"), loaded=True)

    async def getattr_env(self, coordinator: Coordinator, attr: str,
                          worker_ids: Sequence[int] | None) -> Any:
        live = coordinator.live_workers
        if worker_ids is None:
            return await _getattr(coordinator, live[0], attr)
        by_index = {worker.index: worker for worker in live}
        missing = [i for i in worker_ids if i not in by_index]
        if missing:
            raise ValueError(f"getattr_env({attr!r}, worker_ids={list(worker_ids)}): no live "
                             f"worker {missing}; the live workers are {sorted(by_index)}")
        return [await _getattr(coordinator, by_index[i], attr) for i in worker_ids]

    async def sync(self, coordinator: Coordinator) -> dict[str, Any]:
        """Merge every live worker's ``obs_rms``, write the merge back to each; return it."""
        self._hook(coordinator)
        workers = list(coordinator.live_workers)
        states: dict[Hashable, tuple[int, Any]] = {}
        for worker in workers:
            answer = await coordinator.control(worker, "state_dict", env_only=True)
            states[worker.peer] = (worker.index, answer.get("env_state_dict", {}))
        merged, updates = self.statistics.merge(states)
        for worker in workers:
            await coordinator.control(worker, "load_state_dict",
                                      env_state_dict=updates[worker.peer])
            self._read_from[worker.index] = _process(worker)
        self.statistics.merged(merged, states)
        return merged.to_stats()

    # -- the carry to a replacement ------------------------------------------------------------
    def _remember(self, worker: WorkerInfo, state: Any, *, loaded: bool = False) -> None:
        if isinstance(state, dict):
            self.statistics.remember(worker.index, worker.peer, state, loaded=loaded)
            self._read_from[worker.index] = _process(worker)

    def _hook(self, coordinator: Coordinator) -> None:
        if self._hooked is not coordinator:  # one coordinator per open collector
            self._hooked = coordinator
            coordinator.catch_up_hooks.append(self._carry)

    async def _carry(self, worker: WorkerInfo) -> None:
        """Called by the coordinator for a newcomer, before its first collect order."""
        if self._read_from.get(worker.index) in (None, _process(worker)):
            return  # nothing kept, or the same process back: it has its own state
        state = self.statistics.carry(worker.index, worker.peer)
        if state is None or self._hooked is None:
            return
        self._read_from[worker.index] = _process(worker)
        control = Control("load_state_dict", {"env_state_dict": state, "reset_envs": True})
        try:
            # Ahead of its first collect on the same socket; nobody waits for the ack (the
            # coordinator's loop runs this): a failure is logged by the worker.
            await self._hooked.hub.send_async(
                [worker.peer], control.to_body(), kind=Control.KIND)
        except PeerLostError:
            return
        log.info("worker %d (pid %d) is given the env state of the worker it replaces",
                 worker.index, worker.pid)


async def _getattr(coordinator: Coordinator, worker: WorkerInfo, attr: str) -> Any:
    try:
        return await coordinator.control(worker, "getattr_env", attr=attr)
    except RemoteError as exc:  # the worker's AttributeError / TypeError, as such
        raise rebuild_remote_exception(exc) from exc
