"""The policy served from a dedicated process (``server_backend="process"``): the trainer's side.

:class:`ProcessPolicyServer` starts the process (:mod:`asyncrl._inference.
inference_process`), waits until it serves, sends it weights, back-pressure and
remote env hosts' requests over the collector's hub, and keeps the version it
serves and its latest statistics. The collector routes the process's messages
here (:meth:`ProcessPolicyServer.receive`) and reports a failure through
:meth:`ProcessPolicyServer.abort`.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping
from multiprocessing.process import BaseProcess
from typing import Any

import anyio
import anyio.abc
import torch
from tensordict import TensorDictBase
from torch import nn

from transports import ErrorPayload, Hub, Message, PeerEvent, ProtocolError, random_identity

from .._errors import BadBatchError, CollectorError, WorkerLostError, rebuild_remote_exception
from .._protocol import EnvClose, Observations, decode
from .._protocol.central_inference import ERROR_KIND, dtype_name
from .._protocol.inference_process import (
    RemoteAnswer,
    RemoteRequest,
    ServerApplied,
    ServerGo,
    ServerHeld,
    ServerHold,
    ServerReady,
    ServerStatistics,
    ServerWeights,
)
from .._spawn.processes import WorkerProcesses, describe_exit
from .inference_loop import InferenceStatistics
from .inference_process import ServerConfig, inference_server_main
from .policy_server import PolicyCopy, PolicyServer, ServerHooks, ServingSetup
from .served_weights import weight_loader

log = logging.getLogger("asyncrl.collectors")

#: Seconds the process may take to build its policy and map the blocks.
START_TIMEOUT = 120.0


class ProcessPolicyServer(PolicyServer):
    """One dedicated inference process, seen from the trainer.

    >>> server = ProcessPolicyServer.create(setup, policy_copy)  # doctest: +SKIP
    >>> await server.start(task_group, hub, "asyncio", hooks)
    >>> version = await server.update(policy)   # once the next call uses them
    """

    pickles_policy = True

    def __init__(self, config: ServerConfig, *, blocks: Mapping[int, Any], start_method: str,
                 shadow: nn.Module | None = None) -> None:
        self.config = config
        self.identity = random_identity("inference")
        self._version = config.version
        # Every slot's blocks (the collector's dict): a remote answer is written there.
        self._blocks = blocks
        # A CPU copy of the served module: any weights the user gives (module, state
        # dict, TensorDict) are loaded here first, so that a mismatch is raised in the
        # trainer, and what travels is always a plain state dict.
        self._shadow = shadow
        self._stats = InferenceStatistics(0, 0, {})
        self._ready = anyio.Event()
        self._held = anyio.Event()  # the process answered the last "hold"
        self._applied: anyio.Event | None = None
        self._answer: ServerApplied | None = None
        self._error: BaseException | None = None
        self._update_lock = anyio.Lock()
        self._room = True
        self.start_method = start_method
        self.processes: WorkerProcesses | None = None
        self._hub: Hub | None = None
        self._hooks: ServerHooks | None = None

    @staticmethod
    def copy_device(device: torch.device | None) -> torch.device | None:
        # The trainer's copy (on the CPU) only finds the outputs' layout and checks
        # weights; the process builds the served one on ``device``.
        return None

    @classmethod
    def create(cls, setup: ServingSetup, policy: PolicyCopy) -> ProcessPolicyServer:
        """The process serving ``policy`` (a CPU module, the trainer's copy) to the local
        env workers whose blocks and doorbells ``setup`` holds, and (from
        ``setup.first_remote_slot`` on) to remote env hosts, whose requests the trainer
        forwards (:meth:`submit_remote`)."""
        first_remote = setup.first_remote_slot
        assert setup.threads is not None  # the trainer's cap is set before the server is made
        config = ServerConfig(
            blocks={slot: (b.rows, b.obs.name, b.act.name) for slot, b in setup.blocks.items()
                    if first_remote is None or slot < first_remote},
            request_bell=setup.request_bell, answer_bells=dict(setup.answer_bells),
            # The factory when given (the process builds its own, as TorchRL's), else a
            # CPU copy of its own: torch sends a tensor to a child as shared memory, and
            # the shadow below changes with every update, outside the server's lock.
            policy=None if policy.factory is not None else copy.deepcopy(policy.module),
            policy_factory=policy.factory, action_spec=policy.action_spec,
            exploration_type=policy.exploration_type, obs_paths=setup.obs_paths,
            outputs=setup.outputs, device=setup.device, max_batch_size=setup.max_batch_size,
            min_batch_size=setup.min_batch_size, server_timeout=setup.server_timeout,
            version=setup.version, threads=setup.threads, heartbeat_interval=setup.heartbeat[0],
            peer_timeout=setup.heartbeat[1], obs_spec=list(setup.obs_spec), spin=setup.spin,
            first_remote_slot=first_remote, static_batch_size=setup.static_batch_size,
            curve=setup.local_keys)
        shadow = policy.module if isinstance(policy.module, nn.Module) else None
        return cls(config, blocks=setup.blocks, start_method=setup.start_method, shadow=shadow)

    @property
    def version(self) -> int:
        """The version of the weights the process serves."""
        return self._version

    @property
    def pid(self) -> int | None:
        pids = self.processes.pids if self.processes is not None else []
        return pids[0] if pids else None

    @property
    def gone(self) -> bool:
        return self.pid is None

    def owns(self, peer: bytes) -> bool:
        return peer == self.identity

    async def start(self, tg: anyio.abc.TaskGroup, hub: Hub, backend: str,
                    hooks: ServerHooks) -> None:
        """Start the process; return once it serves (its blocks mapped, its hub bound)."""
        self._hub, self._hooks = hub, hooks
        parent, endpoint = os.getpid(), hub.endpoint
        self.processes = WorkerProcesses(
            1, inference_server_main,
            lambda slot, identity: (endpoint, identity, self.config, backend, parent),
            identity=lambda slot: self.identity, start_method=self.start_method,
            threads=self.config.threads, name="asyncrl-inference")
        await tg.start(self.processes.run, self._on_exit)
        with anyio.move_on_after(START_TIMEOUT):
            await self._ready.wait()
        if self._error is not None:
            raise self._error
        if not self._ready.is_set():
            raise CollectorError(f"the inference process did not start serving within "
                                 f"{START_TIMEOUT:.0f} s (building its policy, mapping the "
                                 "env workers' blocks)")

    async def _on_exit(self, slot: int, process: BaseProcess) -> bool:
        assert self._hooks is not None
        if not self._hooks.closing():
            self._hooks.fail(self.exit_error(process))
        return False

    async def receive(self, item: Message | PeerEvent) -> None:
        """A message (or event) from the process: a remote answer, or one for :meth:`handle`."""
        assert self._hooks is not None
        if isinstance(item, Message) and item.kind == RemoteAnswer.KIND:
            await self._remote_answered(item.body)
            return
        error = self.check(item, peer_timeout=self.config.peer_timeout)
        if error is not None:
            self._hooks.fail(error)

    async def _remote_answered(self, body: Any) -> None:
        """The process answered remote slot ``body["slot"]``: on to its host."""
        assert self._hooks is not None and self._hooks.answered is not None
        first = self.config.first_remote_slot

        def layout(slot: int) -> dict[str, tuple[str, tuple[int, ...]]] | None:
            blocks = self._blocks.get(slot)
            if first is None or slot < first or blocks is None:
                return None
            return {k: (dtype_name(d), tuple(s)) for k, (d, s) in blocks.act.layout.items()}

        try:
            answer = decode(RemoteAnswer, body, layout=layout)
        except ProtocolError as exc:  # our own child: a bug, stop the run
            self._hooks.fail(BadBatchError(f"the inference process sent a malformed remote "
                                           f"answer: {exc}"))
            return
        slot, version = answer.slot, answer.answer.version
        self._blocks[slot].act.write(answer.answer.arrays, version=version)
        await self._hooks.answered(slot, version)

    def check(self, item: Message | PeerEvent, *, peer_timeout: float) -> BaseException | None:
        """A message (or event) from the process; the error that must stop the run, if any."""
        if isinstance(item, PeerEvent):
            if item.event != "lost":
                return None
            return WorkerLostError(f"the inference process went silent for {peer_timeout} s "
                                   "(peer_timeout): it is stuck")
        if item.kind == ERROR_KIND:
            try:
                payload = ErrorPayload.from_body(item.body, "inference process error")
            except ProtocolError as exc:
                return BadBatchError(f"the inference process sent a malformed error report: "
                                     f"{exc}")
            return rebuild_remote_exception(payload, peer="the inference process")
        try:
            self.handle(item)
        except ProtocolError as exc:  # our own child: a bug, stop the run
            return BadBatchError(f"the inference process sent a malformed message: {exc}")
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
        if message.kind == ServerReady.KIND:
            decode(ServerReady, body)
            self._ready.set()
        elif message.kind == ServerHeld.KIND:
            decode(ServerHeld, body)
            self._held.set()
        elif message.kind == ServerApplied.KIND:
            self._answer = decode(ServerApplied, body)
            if self._applied is not None:
                self._applied.set()
        elif message.kind == ServerStatistics.KIND:
            stats = decode(ServerStatistics, body)
            self._stats = InferenceStatistics(stats.calls, stats.observations, dict(stats.sizes))

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

    async def update(self, weights: Any) -> int:
        """Send ``weights`` to the process; return the new version once the next call uses it."""
        state = self._state_dict(weights)
        hub = self._hub
        assert hub is not None  # the collector is open
        async with self._update_lock:
            if self._error is not None:
                raise self._error
            self._applied = anyio.Event()
            await hub.send(self.identity, state, kind=ServerWeights.KIND)
            await self._applied.wait()
            self._applied = None
            if self._error is not None:
                raise self._error
            answer, self._answer = self._answer, None
            if answer is None or answer.version is None:
                raise CollectorError(f"the inference process could not load the weights: "
                                     f"{answer.error if answer is not None else 'no answer'}")
            self._version = answer.version
            return self._version

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

    async def submit_remote(self, slot: int) -> None:
        """Forward a remote env host's request (its observations, already checked)."""
        if self._error is not None or self._hub is None:
            return  # the run failed: nobody serves, and nobody waits for an answer
        obs = self._blocks[slot].obs.tensors
        request = RemoteRequest(slot, Observations(dict(obs)))
        await self._hub.send(self.identity, request.to_body(), kind=RemoteRequest.KIND)

    async def set_room(self, room: bool, *, wait: bool = False) -> None:
        """Back-pressure: no answers to the env workers while the trainer's buffer is full.

        ``wait``: return once the process holds (a pause), not as soon as it is told.
        """
        hub = self._hub
        if hub is None or self._error is not None or (room == self._room and not wait):
            return
        self._room = room
        if not room:
            self._held = anyio.Event()
        try:
            await hub.send(self.identity, None, kind=ServerGo.KIND if room else ServerHold.KIND)
        except Exception:  # the process is gone: its exit fails the run
            return
        if wait and not room:
            await self._held.wait()

    async def close(self) -> None:
        """Ask the process to stop, then make sure it did (idempotent)."""
        hub = self._hub
        if hub is not None and self.pid is not None:
            with anyio.move_on_after(1):
                try:
                    await hub.send(self.identity, None, kind=EnvClose.KIND)
                except Exception:  # gone already
                    pass
        if self.processes is not None:
            await self.processes.stop(grace=2.0)


__all__ = ["START_TIMEOUT", "ProcessPolicyServer"]
