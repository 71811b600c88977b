"""The policy served from a thread of the trainer's process (``server_backend="thread"``).

:class:`ThreadPolicyServer` runs the :class:`~asyncrl._inference.inference_loop.
InferenceLoop` on the trainer's own copy of the policy, in a thread of its own:
weights are loaded into that copy between two calls, and a policy error stops
the run with that error.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc
import torch
from torch import nn

from transports import Hub

from .._errors import CollectorError
from .inference_loop import InferenceLoop, InferenceStatistics
from .policy_server import PolicyCopy, PolicyServer, ServerHooks, ServingSetup
from .served_weights import weight_loader

#: Seconds :meth:`ThreadPolicyServer.close` waits for its serving task to end.
_SERVED_TIMEOUT = 10.0


class ThreadPolicyServer(PolicyServer):
    """The inference loop in a thread of this process, on the trainer's copy of the policy.

    >>> server = ThreadPolicyServer.create(setup, policy_copy)   # doctest: +SKIP
    >>> await server.start(task_group, hub, "asyncio", hooks)
    """

    def __init__(self, loop: InferenceLoop) -> None:
        self.loop = loop
        self._scope: anyio.CancelScope | None = None
        self._served: anyio.Event | None = None  # set once the serving task ended

    @staticmethod
    def copy_device(device: torch.device | None) -> torch.device | None:
        return device  # the copy is the one served

    @classmethod
    def create(cls, setup: ServingSetup, policy: PolicyCopy) -> ThreadPolicyServer:
        return cls(InferenceLoop(
            policy.adapter, setup.blocks, obs_paths=list(setup.obs_paths),
            outputs=setup.outputs, device=setup.device, max_batch_size=setup.max_batch_size,
            min_batch_size=setup.min_batch_size, server_timeout=setup.server_timeout,
            version=setup.version, request_bell=setup.request_bell,
            answer_bells=setup.answer_bells, obs_spec=setup.obs_spec, spin=setup.spin,
            threads=setup.threads, static_batch_size=setup.static_batch_size))

    @property
    def version(self) -> int:
        return self.loop.version

    def statistics(self) -> InferenceStatistics:
        return self.loop.statistics()

    async def start(self, tg: anyio.abc.TaskGroup, hub: Hub, backend: str,
                    hooks: ServerHooks) -> None:
        self._scope, self._served = anyio.CancelScope(), anyio.Event()
        tg.start_soon(self._serve, hooks)

    async def _serve(self, hooks: ServerHooks) -> None:
        """Serve until closed (or cancelled); a policy error fails the run."""
        assert self._scope is not None and self._served is not None
        try:
            with self._scope:
                await self.loop.run(hooks.answered)
        except Exception as exc:
            exc.add_note("(raised by the policy in AsyncBatchedCollector's inference thread)")
            hooks.fail(exc)
        finally:
            self._served.set()

    async def submit_remote(self, slot: int) -> None:
        self.loop.submit(slot)

    async def set_room(self, room: bool, *, wait: bool = False) -> None:
        self.loop.set_room(room)
        if wait and not room:
            await self.loop.held()

    async def update(self, weights: Any) -> int:
        return await self.loop.update(weight_loader(self._module(), weights))

    def _module(self) -> nn.Module:
        policy = self.loop.adapter.policy
        if not isinstance(policy, nn.Module):
            raise CollectorError(f"the served policy is a {type(policy).__name__}, which has "
                                 "no weights to update (give an nn.Module)")
        return policy

    async def close(self) -> None:
        """Stop the serving task, then the loop: its thread has left once this returns
        (or after 5 s: a call that long leaves it to the process's exit)."""
        if self._scope is not None and self._served is not None:
            self._scope.cancel()
            with anyio.move_on_after(_SERVED_TIMEOUT):
                await self._served.wait()
        await anyio.to_thread.run_sync(self.loop.close)


__all__ = ["ThreadPolicyServer"]
