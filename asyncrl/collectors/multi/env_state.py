"""A MultiCollector's env state across its workers: read, written, merged, carried.

``state_dict()`` asks every live worker for its policy's and its envs' state
(``{"worker0": {"policy_state_dict": ..., "env_state_dict": ...}, ...}``, TorchRL's
keys; the env part as :mod:`asyncrl._rollout.env_state` reads it);
``sync_env_statistics()`` merges the workers' ``obs_rms`` and writes the merge
back (:mod:`asyncrl.collectors._env_statistics`): every worker's state is checked
before any worker is written (a worker's hostile statistics are left out of the
merge), and a worker whose write fails is named with what each holds. The last env state read from
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
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from transports import PeerLostError, RemoteError

from ..._coordinator.coordinator import Coordinator, WorkerInfo
from ..._errors import CollectorError, rebuild_remote_exception
from ..._protocol import Control
from ..._rollout.env_state import OBS_STATS
from .._env_statistics import Ceiling, EnvStatistics, obs_entries, refusal

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
        for worker in coordinator.roster.live_workers:
            answer = await coordinator.control(worker, "state_dict")
            self._remember(worker, answer.get("env_state_dict"))
            answers[f"worker{worker.index}"] = answer
        return answers

    async def load_state_dict(self, coordinator: Coordinator, state_dict: dict[str, Any]) -> None:
        """Every live worker's entry is checked before any is written; a worker whose write
        fails is named, with the workers that hold the new state (the others are written)."""
        self._hook(coordinator)
        workers = list(coordinator.roster.live_workers)
        states = {worker.index: _entry(state_dict, worker.index) for worker in workers}
        failed = await _write_each(coordinator, workers, lambda worker: states[worker.index])
        for worker in workers:
            if worker.index not in failed:
                self._remember(worker, states[worker.index].get("env_state_dict"), loaded=True)
        if failed:
            raise CollectorError(_partly_written(
                "load_state_dict", "the state dict's state", workers, failed))

    async def getattr_env(self, coordinator: Coordinator, attr: str,
                          worker_ids: Sequence[int] | None) -> Any:
        live = coordinator.roster.live_workers
        if worker_ids is None:
            return await _getattr(coordinator, live[0], attr)
        by_index = {worker.index: worker for worker in live}
        missing = [i for i in worker_ids if i not in by_index]
        if missing:
            raise ValueError(f"getattr_env({attr!r}, worker_ids={list(worker_ids)}): no live "
                             f"worker {missing}; the live workers are {sorted(by_index)}")
        return [await _getattr(coordinator, by_index[i], attr) for i in worker_ids]

    async def sync(self, coordinator: Coordinator) -> dict[str, Any]:
        """Merge every live worker's ``obs_rms``, write the merge back to each; return it.

        A worker whose statistics are refused (see :func:`refusal`) is named in one
        warning, left out of the merge and not written back to; the others merge."""
        self._hook(coordinator)
        workers = list(coordinator.roster.live_workers)
        states: dict[Hashable, tuple[int, Any]] = {}
        for worker in workers:
            answer = await coordinator.control(worker, "state_dict", env_only=True)
            states[worker.peer] = (worker.index, answer.get("env_state_dict", {})
                                   if isinstance(answer, dict) else None)
        result = self.statistics.merge(
            states, {worker.peer: _ceiling(coordinator, worker) for worker in workers})
        if result.refused:
            log.warning("sync_env_statistics(): refused %s", "; ".join(
                f"worker {index}'s{' statistics (not merged, not written back)' if i == 0 else ''}"
                f": {why}" for i, (index, why) in enumerate(result.refused.values())))
        merged = [worker for worker in workers if worker.peer in result.updates]
        failed = await _write_each(coordinator, merged, lambda worker: {
            "env_state_dict": result.updates[worker.peer]})
        for worker in merged:
            if worker.index not in failed:
                self._read_from[worker.index] = _process(worker)
        self.statistics.merged(result.merged, {w.peer: states[w.peer] for w in merged},
                               written={w.peer for w in merged if w.index not in failed})
        if failed:
            raise CollectorError(_partly_written(
                "sync_env_statistics()", "the merged statistics", merged, failed))
        return result.merged.to_stats()

    # -- the carry to a replacement ------------------------------------------------------------
    def _remember(self, worker: WorkerInfo, state: Any, *, loaded: bool = False) -> None:
        if isinstance(state, dict):
            self.statistics.remember(worker.index, worker.peer, state, loaded=loaded)
            self._read_from[worker.index] = _process(worker)

    def _hook(self, coordinator: Coordinator) -> None:
        if self._hooked is not coordinator:  # one coordinator per open collector
            self._hooked = coordinator
            coordinator.outbox.catch_up_hooks.append(self._carry)

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


def _ceiling(coordinator: Coordinator, worker: WorkerInfo) -> Ceiling:
    """How far ``worker``'s counts may have grown: from the frames it collected (see
    :class:`Ceiling`), which the coordinator counted, not the worker."""
    record = coordinator.registry.record(worker)
    share = coordinator.config.share_of(worker.index)
    return Ceiling(delivered=record.frames if record is not None else 0,
                   owed=worker.ahead * share, share=share)


def _entry(state_dict: Any, index: int) -> Mapping[str, Any]:
    """Worker ``index``'s entry of a ``load_state_dict`` argument, checked before any write."""
    key = f"worker{index}"
    if not isinstance(state_dict, Mapping) or key not in state_dict:
        got = sorted(state_dict) if isinstance(state_dict, Mapping) else type(state_dict).__name__
        raise KeyError(f"load_state_dict: no {key!r} in the state dict (it has {got}); pass "
                       "what state_dict() returned; nothing was loaded into any worker")
    state = state_dict[key]
    if not isinstance(state, Mapping):
        raise TypeError(f"load_state_dict: {key!r} is a dict {{'policy_state_dict': ..., "
                        f"'env_state_dict': ...}}, got {type(state).__name__}; nothing was "
                        "loaded into any worker")
    for env_key, wrapper_key, stats in obs_entries(state.get("env_state_dict")):
        why = refusal(stats)
        if why is not None:
            raise CollectorError(f"load_state_dict: {key}'s {env_key} {wrapper_key}."
                                 f"{OBS_STATS}: {why}; nothing was loaded into any worker")
    return state


async def _write_each(coordinator: Coordinator, workers: Sequence[WorkerInfo],
                      args_of: Callable[[WorkerInfo], Mapping[str, Any]]
                      ) -> dict[int, Exception]:
    """``load_state_dict`` into each of ``workers``; those that failed, by index, with why.

    One worker's failure does not keep the others from theirs: what each holds is then
    known (the new state, or its own) and the error says it."""
    failed: dict[int, Exception] = {}
    for worker in workers:
        try:
            await coordinator.control(worker, "load_state_dict", **args_of(worker))
        except Exception as exc:
            failed[worker.index] = exc
    return failed


def _partly_written(call: str, what: str, workers: Sequence[WorkerInfo],
                    failed: Mapping[int, Exception]) -> str:
    held = [worker.index for worker in workers if worker.index not in failed]
    holders = ("no worker holds" if not held else f"worker {held[0]} holds" if len(held) == 1
               else f"workers {held} hold")
    why = "; ".join(f"worker {index} does not (it keeps its own): "
                    + (str(exc) if isinstance(exc, RemoteError)
                       else f"{type(exc).__name__}: {exc}")
                    for index, exc in failed.items())
    return f"{call}: {holders} {what}; {why}"


async def _getattr(coordinator: Coordinator, worker: WorkerInfo, attr: str) -> Any:
    try:
        return await coordinator.control(worker, "getattr_env", attr=attr)
    except RemoteError as exc:  # the worker's AttributeError / TypeError, as such
        raise rebuild_remote_exception(exc) from exc
