"""The trainer's side of a dedicated inference process (``server_backend="process"``).

:class:`InferenceProcess` starts the process (:mod:`asyncrl._inference.server`),
waits until it serves, sends it weights and back-pressure, and keeps the
version it serves and its latest statistics. The collector routes the
process's messages here (:meth:`InferenceProcess.handle`) and reports a
failure or an exit through :meth:`InferenceProcess.abort`.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

import anyio
import anyio.abc
import torch
from tensordict import TensorDictBase
from torch import nn

from transports import ErrorPayload, Hub, Message, PeerEvent, ProtocolError, random_identity

from ..._errors import BadBatchError, CollectorError, WorkerLostError, rebuild_remote_exception
from ..._inference.doorbell import DEFAULT_SPIN, EventFd
from ..._inference.env_stepper import CLOSE, ERROR
from ..._inference.loop import InferenceStatistics, OutputLayout, WorkerBlocks
from ..._inference.server import (
    APPLIED,
    GO,
    HELD,
    HOLD,
    READY,
    REMOTE_ACT,
    REMOTE_OBS,
    STATS,
    WEIGHTS,
    ServerConfig,
    inference_server_main,
)
from ..._rollout.policies import ExplorationType
from ..._spawn.processes import OnExit, WorkerProcesses, describe_exit
from .config import BatchingConfig
from .weights import weight_loader

log = logging.getLogger("asyncrl.collectors")

#: Seconds the process may take to build its policy and map the blocks.
START_TIMEOUT = 120.0


class InferenceProcess:
    """One dedicated inference process, seen from the trainer.

    >>> server = InferenceProcess(config, start_method="forkserver")  # doctest: +SKIP
    >>> await server.start(task_group, hub.endpoint, "asyncio", on_exit)
    >>> version = await server.update(hub, policy)   # once the next call uses them
    """

    def __init__(self, config: ServerConfig, *, start_method: str,
                 shadow: nn.Module | None = None) -> None:
        self.config = config
        self.identity = random_identity("inference")
        #: The version of the weights the process serves.
        self.version = config.version
        # A CPU copy of the served module: any weights the user gives (module, state
        # dict, TensorDict) are loaded here first, so that a mismatch is raised in the
        # trainer, and what travels is always a plain state dict.
        self._shadow = shadow
        self._stats = InferenceStatistics(0, 0, {})
        self._ready = anyio.Event()
        self._held = anyio.Event()  # the process answered the last "hold"
        self._applied: anyio.Event | None = None
        self._answer: dict[str, Any] = {}
        self._error: BaseException | None = None
        self._update_lock = anyio.Lock()
        self._room = True
        self.start_method = start_method
        self.processes: WorkerProcesses | None = None

    @classmethod
    def for_collector(cls, *, bells: tuple[EventFd, Mapping[int, EventFd]],
                      blocks: Mapping[int, WorkerBlocks], policy: Any,
                      policy_factory: Callable[[], Any] | None, action_spec: Any,
                      exploration_type: ExplorationType | str | None,
                      obs_paths: Sequence[tuple[str, ...]], outputs: OutputLayout,
                      device: torch.device | None, batching: BatchingConfig, version: int,
                      threads: int, heartbeat: tuple[float, float],
                      start_method: str, obs_spec: Sequence[tuple[torch.dtype, tuple[int, ...]]],
                      spin: float = DEFAULT_SPIN,
                      first_remote_slot: int | None = None) -> InferenceProcess:
        """The process serving ``policy`` (a CPU module, the trainer's copy) to the env
        workers whose ``blocks`` and doorbells (``bells``: request, answers) it is given,
        and (``first_remote_slot``: the slots from there on) to remote env hosts, whose
        requests the trainer forwards (:meth:`submit_remote`)."""
        config = ServerConfig(
            blocks={slot: (b.rows, b.obs.name, b.act.name) for slot, b in blocks.items()
                    if first_remote_slot is None or slot < first_remote_slot},
            request_bell=bells[0], answer_bells=dict(bells[1]),
            # The factory when given (the process builds its own, as TorchRL's), else a
            # CPU copy of its own: torch sends a tensor to a child as shared memory, and
            # the shadow below changes with every update, outside the server's lock.
            policy=None if policy_factory is not None else copy.deepcopy(policy),
            policy_factory=policy_factory, action_spec=action_spec,
            exploration_type=exploration_type, obs_paths=obs_paths, outputs=outputs,
            device=device, max_batch_size=batching.max_batch_size,
            min_batch_size=batching.min_batch_size, server_timeout=batching.server_timeout,
            version=version, threads=threads, heartbeat_interval=heartbeat[0],
            peer_timeout=heartbeat[1], obs_spec=list(obs_spec), spin=spin,
            first_remote_slot=first_remote_slot, static_batch_size=batching.static_batch_size)
        shadow = policy if isinstance(policy, nn.Module) else None
        return cls(config, start_method=start_method, shadow=shadow)

    @property
    def pid(self) -> int | None:
        pids = self.processes.pids if self.processes is not None else []
        return pids[0] if pids else None

    async def start(self, tg: anyio.abc.TaskGroup, trainer_endpoint: str, backend: str,
                    on_exit: OnExit) -> None:
        """Start the process; return once it serves (its blocks mapped, its hub bound)."""
        parent = os.getpid()
        self.processes = WorkerProcesses(
            1, inference_server_main,
            lambda slot, identity: (trainer_endpoint, identity, self.config, backend, parent),
            identity=lambda slot: self.identity, start_method=self.start_method,
            threads=self.config.threads, name="asyncrl-inference")
        await tg.start(self.processes.run, on_exit)
        with anyio.move_on_after(START_TIMEOUT):
            await self._ready.wait()
        if self._error is not None:
            raise self._error
        if not self._ready.is_set():
            raise CollectorError(f"the inference process did not start serving within "
                                 f"{START_TIMEOUT:.0f} s (building its policy, mapping the "
                                 "env workers' blocks)")

    def receive(self, item: Message | PeerEvent, *, peer_timeout: float) -> BaseException | None:
        """A message (or event) from the process; the error that must stop the run, if any."""
        if isinstance(item, PeerEvent):
            if item.event != "lost":
                return None
            return WorkerLostError(f"the inference process went silent for {peer_timeout} s "
                                   "(peer_timeout): it is stuck")
        if item.kind == ERROR:
            try:
                payload = ErrorPayload.from_body(item.body, "inference process error")
            except ProtocolError as exc:
                return BadBatchError(f"the inference process sent a malformed error report: "
                                     f"{exc}")
            return rebuild_remote_exception(payload, peer="the inference process")
        self.handle(item)
        return None

    @staticmethod
    def exit_error(process: BaseProcess) -> WorkerLostError:
        """What the run fails with when the process ends while serving."""
        return WorkerLostError(
            f"the inference process (pid {process.pid}) {describe_exit(process.exitcode)} "
            "while serving; the env workers have no policy, so this collector stops. If it "
            "failed before reporting an error, look at its stderr.")

    def handle(self, message: Message) -> None:
        """A message from the process other than an error (ready, applied, statistics)."""
        body = message.body
        if message.kind == READY:
            self._ready.set()
        elif message.kind == HELD:
            self._held.set()
        elif message.kind == APPLIED and isinstance(body, dict):
            self._answer = body
            if self._applied is not None:
                self._applied.set()
        elif message.kind == STATS and isinstance(body, dict):
            try:
                self._stats = InferenceStatistics(
                    int(body["calls"]), int(body["observations"]),
                    {int(size): int(count) for size, count in body["sizes"]})
            except (KeyError, TypeError, ValueError):  # our own child: a bug, not an attack
                log.warning("the inference process sent malformed statistics: %.200r", body)

    def abort(self, error: BaseException) -> None:
        """The run failed (or the process ended): wake whoever waits on the process."""
        if self._error is None:
            self._error = error
        self._ready.set()
        self._held.set()
        if self._applied is not None:
            self._applied.set()

    def statistics(self) -> InferenceStatistics:
        """The process's latest report (at most ``STATS_INTERVAL`` seconds old)."""
        return self._stats

    async def update(self, hub: Hub, weights: Any) -> int:
        """Send ``weights`` to the process; return the new version once the next call uses it."""
        state = self._state_dict(weights)
        async with self._update_lock:
            if self._error is not None:
                raise self._error
            self._applied = anyio.Event()
            await hub.send(self.identity, state, kind=WEIGHTS)
            await self._applied.wait()
            self._applied = None
            if self._error is not None:
                raise self._error
            answer, self._answer = self._answer, {}
            if "error" in answer:
                raise CollectorError(f"the inference process could not load the weights: "
                                     f"{str(answer['error'])[:2000]}")
            self.version = int(answer["version"])
            return self.version

    def _state_dict(self, weights: Any) -> dict[str, torch.Tensor]:
        shadow = self._shadow
        if shadow is None:
            raise CollectorError("the served policy is not an nn.Module: it has no weights "
                                 "to update (give an nn.Module)")
        if not isinstance(weights, (nn.Module, TensorDictBase, Mapping)):
            raise TypeError(f"weights must be None, an nn.Module, a state dict or a "
                            f"TensorDict, got {type(weights).__name__}")
        weight_loader(shadow, weights)()  # raises here on a mismatch, naming the keys
        return {k: v.detach().cpu() for k, v in shadow.state_dict().items()}

    async def submit_remote(self, hub: Hub, slot: int, obs: Mapping[str, torch.Tensor]) -> None:
        """Forward a remote env host's request (its observations, already checked)."""
        if self._error is not None:
            return  # the run failed: nobody serves, and nobody waits for an answer
        await hub.send(self.identity, {"slot": slot, "obs": dict(obs)}, kind=REMOTE_OBS)

    async def set_room(self, hub: Hub, room: bool, *, wait: bool = False) -> None:
        """Back-pressure: no answers to the env workers while the trainer's buffer is full.

        ``wait``: return once the process holds (a pause), not as soon as it is told.
        """
        if self._error is not None or (room == self._room and not wait):
            return
        self._room = room
        if not room:
            self._held = anyio.Event()
        try:
            await hub.send(self.identity, None, kind=GO if room else HOLD)
        except Exception:  # the process is gone: its exit fails the run
            return
        if wait and not room:
            await self._held.wait()

    async def close(self, hub: Hub | None) -> None:
        """Ask the process to stop, then make sure it did (idempotent)."""
        if hub is not None and self.pid is not None:
            with anyio.move_on_after(1):
                try:
                    await hub.send(self.identity, None, kind=CLOSE)
                except Exception:  # gone already
                    pass
        if self.processes is not None:
            await self.processes.stop(grace=2.0)


__all__ = ["REMOTE_ACT", "START_TIMEOUT", "InferenceProcess"]
