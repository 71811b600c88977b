"""The served policy behind one interface: :class:`PolicyServer`, in a thread or a process.

AsyncBatchedCollector serves its policy either from a thread of the trainer's
process (:class:`~asyncrl._inference.thread_server.ThreadPolicyServer`) or from a
dedicated process (:class:`~asyncrl._inference.process_server.ProcessPolicyServer`).
Both serve the same env workers through the same shared-memory blocks and
doorbells (:class:`ServingSetup`) with the same
:class:`~asyncrl._inference.inference_loop.InferenceLoop`; the collector holds one
:class:`PolicyServer` and never asks which. What a server tells its collector
(the run failed, a remote env host's answer is ready) goes through
:class:`ServerHooks`, not through the collector's fields.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio.abc
import torch
from torch import nn

from transports import CurveClient, Hub, Message, PeerEvent

from .._rollout.policies import ExplorationType, PolicyAdapter, torch_dtype
from .doorbell import EventFd
from .inference_loop import InferenceStatistics
from .outputs import OutputLayout, discover_outputs
from .worker_blocks import WorkerBlocks

Path = tuple[str, ...]


@dataclass(frozen=True)
class ServingSetup:
    """What a server serves: the env workers' blocks and bells, the layouts, the batching.

    ``blocks`` is the collector's own dict: a remote env host's slot is added to it
    when the host is admitted (and made again for its next occupant).
    """

    blocks: dict[int, WorkerBlocks]
    request_bell: EventFd  # rung by every local env worker after its request
    answer_bells: dict[int, EventFd]  # slot -> rung by the loop after its answer
    obs_paths: Sequence[Path]
    #: (dtype, per-env shape) of each observation (there may be no block: remote hosts only)
    obs_spec: Sequence[tuple[torch.dtype, tuple[int, ...]]]
    outputs: OutputLayout
    device: torch.device | None  # where the policy runs (None: the CPU)
    max_batch_size: int
    min_batch_size: int
    server_timeout: float
    static_batch_size: int | None  # rows of the CUDA graph (None: eager calls)
    version: int  # of the weights served first
    threads: int | None  # torch threads for the policy's calls (None: leave them)
    spin: float  # seconds the loop spins on its bell before it blocks
    first_remote_slot: int | None  # slots from here on are remote env hosts' (None: none)
    heartbeat: tuple[float, float]  # (heartbeat_interval, peer_timeout) of a process
    start_method: str  # of a process
    #: The trainer's own processes' key for a CURVE hub (``listen`` with keys), else None
    local_keys: CurveClient | None = None


@dataclass(frozen=True)
class PolicyCopy:
    """The trainer's own copy of the policy to serve, built on the server's
    :meth:`~PolicyServer.copy_device`, and how the user gave it."""

    module: Any  # the copy: an nn.Module, or the user's callable
    adapter: PolicyAdapter  # the copy, as the loop calls it
    factory: Callable[[], Any] | None  # the user's policy_factory (a process builds its own)
    action_spec: Any
    exploration_type: ExplorationType | str | None

    @classmethod
    def make(cls, policy: Any, factory: Callable[[], Any] | None, *,
             device: torch.device | None, action_spec: Any,
             exploration_type: ExplorationType | str | None,
             obs: dict[Path, torch.Tensor]) -> tuple[PolicyCopy, OutputLayout]:
        """The copy on ``device``, and what it writes: it is called once on ``obs`` (a
        batch of one observation) for the outputs' layout."""
        module = cls.build(policy, factory, device)
        adapter = PolicyAdapter(module, action_spec=action_spec,
                                exploration_type=exploration_type,
                                observation_keys=[p[0] if len(p) == 1 else p for p in obs])
        action = (torch_dtype(action_spec.dtype), tuple(action_spec.shape))
        device_obs = {p: v.to(device) if device is not None else v for p, v in obs.items()}
        outputs = discover_outputs(adapter, device_obs, action)
        return cls(module, adapter, factory, action_spec, exploration_type), outputs

    @staticmethod
    def build(policy: Any, factory: Callable[[], Any] | None,
              device: torch.device | None) -> Any:
        """The served copy: the trainer's optimiser steps never change the weights under a
        running call; ``update_policy_weights`` copies them in, versioned."""
        if factory is not None:
            served = factory()
        elif isinstance(policy, nn.Module):
            served = copy.deepcopy(policy)
        else:
            served = policy
        if isinstance(served, nn.Module):
            served = served.to(device if device is not None else "cpu")
        return served


@dataclass(frozen=True)
class ServerHooks:
    """What a server calls back in its collector (all from the collector's event loop)."""

    #: The run must stop with this error (the policy raised, the process died...).
    fail: Callable[[BaseException], None]
    #: Whether the collector is closing: a server's exit is expected then.
    closing: Callable[[], bool]
    #: A remote env host's slot was answered ``(slot, version)``: send it on (None: no
    #: remote env hosts).
    answered: Callable[[int, int], Awaitable[None]] | None


class PolicyServer(ABC):
    """One policy served to every env worker, batched; versions change between calls.

    Built in a worker thread (:meth:`create`), started on the collector's task group
    with its hub (:meth:`start`), closed once (:meth:`close`, idempotent).

    >>> server = ThreadPolicyServer.create(setup, policy_copy)   # doctest: +SKIP
    >>> await server.start(task_group, hub, "asyncio", hooks)
    >>> version = await server.update(module)   # once the next call uses it
    """

    #: Whether the policy is pickled for another process (the collector checks it can be).
    pickles_policy = False

    @staticmethod
    @abstractmethod
    def copy_device(device: torch.device | None) -> torch.device | None:
        """Where the trainer builds its copy of the policy (None: the CPU)."""

    @classmethod
    @abstractmethod
    def create(cls, setup: ServingSetup, policy: PolicyCopy) -> PolicyServer:
        """The server for ``setup`` (run in a worker thread: it may build a CUDA graph)."""

    @property
    @abstractmethod
    def version(self) -> int:
        """The version of the weights the next call uses."""

    @abstractmethod
    def statistics(self) -> InferenceStatistics:
        """Policy calls so far, observations served, calls per batch size."""

    @property
    def pid(self) -> int | None:
        """The id of the process that serves (None: a thread of this one)."""
        return None

    @property
    def gone(self) -> bool:
        """Whether the serving process has ended (its own report is then the run's cause)."""
        return False

    def owns(self, peer: bytes) -> bool:
        """Whether the hub's ``peer`` is this server (its messages go to :meth:`receive`)."""
        return False

    async def receive(self, item: Message | PeerEvent) -> None:
        """A message (or event) from this server's own peer on the hub."""
        raise AssertionError(f"{type(self).__name__} has no peer on the hub")

    @abstractmethod
    async def start(self, tg: anyio.abc.TaskGroup, hub: Hub, backend: str,
                    hooks: ServerHooks) -> None:
        """Serve from now on (on ``tg``); return once it serves."""

    @abstractmethod
    async def submit_remote(self, slot: int) -> None:
        """A remote env host's observations are in ``blocks[slot].obs``: serve them."""

    @abstractmethod
    async def set_room(self, room: bool, *, wait: bool = False) -> None:
        """Back-pressure: answer the env workers (True) or hold them (False).

        ``wait``: return once no call is under way (a pause), not as soon as it is told.
        """

    @abstractmethod
    async def update(self, weights: Any) -> int:
        """Load ``weights`` between two calls; the new version, once the next call uses it."""

    def abort(self, error: BaseException) -> None:  # noqa: B027 (most servers have no waiter)
        """The run failed: wake whoever waits on the server."""

    @abstractmethod
    async def close(self) -> None:
        """Stop serving and release what the server holds (idempotent)."""


__all__ = ["PolicyCopy", "PolicyServer", "ServerHooks", "ServingSetup"]
