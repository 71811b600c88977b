"""The trainer's side of a dedicated inference process (``server_backend="process"``).

:class:`InferenceProcess` starts the process (:mod:`asyncrl._inference_server`),
waits until it serves, sends it weights and back-pressure, and keeps the
version it serves and its latest statistics. The collector routes the
process's messages here (:meth:`InferenceProcess.handle`) and reports a
failure or an exit through :meth:`InferenceProcess.abort`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc
import torch
from tensordict import TensorDictBase
from torch import nn

from transports import Hub, Message, random_identity

from .._env_worker import CLOSE
from .._errors import CollectorError
from .._inference import InferenceStatistics
from .._inference_server import (
    APPLIED,
    GO,
    HOLD,
    READY,
    STATS,
    WEIGHTS,
    ServerConfig,
    inference_server_main,
)
from .._processes import OnExit, WorkerProcesses
from ._batched_weights import weight_loader

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
        self._applied: anyio.Event | None = None
        self._answer: dict[str, Any] = {}
        self._error: BaseException | None = None
        self._update_lock = anyio.Lock()
        self._room = True
        self.start_method = start_method
        self.processes: WorkerProcesses | None = None

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

    def handle(self, message: Message) -> None:
        """A message from the process (errors are the collector's: it calls :meth:`abort`)."""
        body = message.body
        if message.kind == READY:
            self._ready.set()
        elif message.kind == APPLIED and isinstance(body, dict):
            self._answer = body
            if self._applied is not None:
                self._applied.set()
        elif message.kind == STATS and isinstance(body, dict):
            self._stats = InferenceStatistics(
                int(body["calls"]), int(body["observations"]),
                {int(size): int(count) for size, count in body["sizes"]})

    def abort(self, error: BaseException) -> None:
        """The run failed (or the process ended): wake whoever waits on the process."""
        if self._error is None:
            self._error = error
        self._ready.set()
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

    async def set_room(self, hub: Hub, room: bool) -> None:
        """Back-pressure: no answers to the env workers while the trainer's buffer is full."""
        if room == self._room or self._error is not None:
            return
        self._room = room
        try:
            await hub.send(self.identity, None, kind=GO if room else HOLD)
        except Exception:  # the process is gone: its exit fails the run
            pass

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


__all__ = ["START_TIMEOUT", "InferenceProcess"]
