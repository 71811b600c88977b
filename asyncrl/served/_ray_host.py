"""A served module hosted in a Ray actor (``ServedModule(..., server_backend="ray")``).

TorchRL's ``RayModuleTransform`` keeps its module in a Ray actor (``RayActorTransport``).
Here the actor is the host process of :mod:`._process_host`, placed by Ray instead of
forked: it runs the same :func:`~asyncrl._inference.inference_process.run_inference_server`
(the same :class:`~asyncrl._inference.inference_loop.InferenceLoop`) over the blocks and
named-pipe bells the trainer made, and talks to the trainer over the same private hub
(``ipc://`` in the module's 0700 directory). Only the start, the watch and the stop differ:

- **start**: ``ServedModuleActor.options(**ray_options).remote()``; the actor says where
  it runs (pid, host, node) before it serves. Its calls come through shared memory, so
  it must run on the trainer's host: by default it is pinned to the trainer's Ray node;
  placed elsewhere by ``ray_options`` (``resources``, ``scheduling_strategy``) it must
  still land on a raylet of this host, or it is stopped and the open refused, saying so;
- **watch**: the actor's ``serve`` call is watched (``ray.wait``): an actor that dies
  (killed, its node lost, out of memory) fails every caller at once with Ray's reason;
- **stop**: the host is asked to close, then the actor is killed (``ray.kill``, no
  restart) and its process waited for (bounded), so no actor outlives ``aclose()``.

The actor is never restarted (``max_restarts=0``): a new one would serve the module's
original weights under the version the callers last saw; open a new ``ServedModule``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc
from torch import nn

try:
    import ray
except ImportError as exc:  # pragma: no cover - depends on the optional extra
    raise ImportError("ServedModule(..., server_backend='ray') needs Ray: pip install "
                      "'asyncrl[ray]' (or use server_backend='process', a process of its "
                      "own without Ray)") from exc

from transports import Hub

from .._errors import CollectorError
from .._inference.inference_process import ServerConfig, run_inference_server
from .._inference.policy_server import ServerHooks
from .._inference.process_server import START_TIMEOUT, ProcessPolicyServer
from .._inference.worker_blocks import WorkerBlocks
from .._protocol import EnvClose
from ..launch._ray_handle import actor_info, wait_actors_gone
from ._errors import ServedModuleError
from ._process_host import _REPORT_GRACE, ProcessHost

__all__ = ["RayHost", "RayPolicyServer", "ServedModuleActor", "actor_options",
           "check_ray_options"]

log = logging.getLogger("asyncrl.served")

#: Seconds between two looks at the actor's ``serve`` call (how soon a death is seen).
WATCH_INTERVAL = 0.1
#: Seconds ``close()`` gives the actor's process to be gone once killed.
STOP_TIMEOUT = 15.0


@ray.remote
class ServedModuleActor:
    """A served module's host process, as a Ray actor (one per ``ServedModule``)."""

    def where(self) -> tuple[int, str, str]:
        """(pid, host name, Ray node id): the trainer checks it can reach this process."""
        return os.getpid(), socket.gethostname(), ray.get_runtime_context().get_node_id()

    def serve(self, endpoint: str, identity: bytes, config: ServerConfig, backend: str,
              parent_pid: int) -> int:
        """Serve until the trainer says close (0) or goes (0), or this fails (1, reported)."""
        import torch

        from .._spawn.absent_modules import remember_absent_modules

        torch.set_num_threads(config.threads)
        remember_absent_modules()
        return int(anyio.run(run_inference_server, endpoint, identity, config, parent_pid,
                             backend=backend))


def check_ray_options(ray_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``ray_options`` as a dict, refused when they ask for what a served module cannot do."""
    options = dict(ray_options or {})
    if options.get("max_restarts", 0) != 0:
        raise ValueError(f"ray_options={options}: a served module's actor is never restarted "
                         "(a new one would serve the module's first weights under the "
                         "version its callers last saw); leave max_restarts out, and open a "
                         "new ServedModule if it dies")
    return options


def actor_options(ray_options: Mapping[str, Any] | None, threads: int) -> dict[str, Any]:
    """The actor's Ray options: ``ray_options`` over ``num_cpus=threads``, never restarted,
    pinned to this driver's node unless ``resources`` or ``scheduling_strategy`` place it.

    >>> actor_options({"resources": {"gpu_host": 1}}, 2)
    {'num_cpus': 2, 'resources': {'gpu_host': 1}, 'max_restarts': 0}
    >>> actor_options({"max_restarts": 3}, 1)
    Traceback (most recent call last):
    ValueError: ray_options={'max_restarts': 3}: a served module's actor is never restarted ...
    """
    options = check_ray_options(ray_options)
    placed = "resources" in options or "scheduling_strategy" in options
    options = {"num_cpus": threads, **options, "max_restarts": 0}
    if not placed:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = ray.get_runtime_context().get_node_id()
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
    return options


class _ActorProcess:
    """The actor's process as :class:`ProcessHost` looks at a forked one (pid, stop)."""

    def __init__(self, pid: int, stop: Callable[[], None]) -> None:
        self.pid = pid
        self._stop = stop
        self.processes = [self]
        self.exitcodes: list[int | None] = [None]  # Ray says how it ended, not a code

    @property
    def pids(self) -> list[int]:
        return [self.pid]

    async def stop(self, grace: float = 0.0) -> None:
        await anyio.to_thread.run_sync(self._stop)


class RayPolicyServer(ProcessPolicyServer):
    """:class:`ProcessPolicyServer` whose process is a Ray actor: placed, watched, killed."""

    def __init__(self, config: ServerConfig, *, blocks: Mapping[int, WorkerBlocks],
                 shadow: nn.Module | None, name: str,
                 ray_options: Mapping[str, Any] | None) -> None:
        super().__init__(config, blocks=blocks, start_method="forkserver", shadow=shadow)
        self.name = name
        self._ray_options = ray_options
        self.actor: Any = None
        self.node = ""
        self._run: Any = None  # the actor's serve() call
        self._killed = False

    async def start(self, tg: anyio.abc.TaskGroup, hub: Hub, backend: str,
                    hooks: ServerHooks) -> None:
        """Place the actor, check it is on this host, start serving; return once it serves."""
        self._hub, self._hooks = hub, hooks
        options = actor_options(self._ray_options, self.config.threads)
        self.actor = ServedModuleActor.options(**options).remote()  # type: ignore[attr-defined]
        pid, host, self.node = await self._result(self.actor.where.remote(), START_TIMEOUT, (
            f"placed within {START_TIMEOUT:.0f} s: no node of this cluster has what "
            f"ray_options={dict(self._ray_options or {})} asks (and {options['num_cpus']} CPU) "
            "free"))
        self.processes = _ActorProcess(pid, self.kill)  # type: ignore[assignment]
        if host != socket.gethostname():
            await anyio.to_thread.run_sync(self.kill)
            raise ServedModuleError(
                f"served module {self.name!r}: Ray placed its actor on host {host!r} (node "
                f"{self.node}); the envs and the trainer reach it through shared memory of "
                f"this host, {socket.gethostname()!r}: place it on a raylet of this host "
                "(leave scheduling_strategy and resources out of ray_options: it is pinned to "
                "the trainer's node), or use server_backend='process'")
        self._run = self.actor.serve.remote(hub.endpoint, self.identity, self.config, backend,
                                            os.getpid())
        tg.start_soon(self._watch)
        with anyio.move_on_after(START_TIMEOUT):
            await self._ready.wait()
        if self._error is not None:
            raise self._error
        if not self._ready.is_set():
            raise CollectorError(f"served module {self.name!r}: its Ray actor (pid {pid}) did "
                                 f"not start serving within {START_TIMEOUT:.0f} s (building "
                                 "the module, mapping the blocks)")

    @property
    def pid(self) -> int | None:
        return None if self.processes is None else self.processes.pids[0]

    async def _result(self, ref: Any, timeout: float, late: str) -> Any:
        """``ray.get(ref)`` without holding this loop (cancellable), bounded by ``timeout``."""
        deadline = time.monotonic() + timeout
        while not await anyio.to_thread.run_sync(_done, ref):
            if time.monotonic() > deadline:
                await anyio.to_thread.run_sync(self.kill)
                raise ServedModuleError(f"served module {self.name!r}: its Ray actor was not "
                                        f"{late}")
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as exc:
            await anyio.to_thread.run_sync(self.kill)
            raise ServedModuleError(f"served module {self.name!r}: its Ray actor did not "
                                    f"start: {_first_line(exc)}") from None

    async def _watch(self) -> None:
        """Fail the callers at once when the actor's ``serve`` ends while it should serve."""
        while not await anyio.to_thread.run_sync(_done, self._run):
            pass
        assert self._hooks is not None
        if self._hooks.closing():
            return
        where = f"its Ray actor (pid {self.pid}, node {self.node[:12]})"
        try:
            code = ray.get(self._run)
        except ray.exceptions.RayError as exc:
            self._hooks.fail(ServedModuleError(f"{where} died: {_first_line(exc)}"))
            return
        if code == 1:  # it failed, and sent its report: that is the reason
            await anyio.sleep(_REPORT_GRACE)
            if self._hooks.closing():
                return
        self._hooks.fail(ServedModuleError(f"{where} stopped serving (code {code})"))

    def kill(self) -> None:
        """Kill the actor (no restart) and wait, bounded, until its process is gone."""
        if self._killed or self.actor is None:
            return
        self._killed = True
        info = actor_info(self.actor)
        try:
            ray.kill(self.actor, no_restart=True)
        except Exception as exc:  # gone already, or Ray is shut down
            log.debug("ray.kill(%s): %r", self.name, exc)
        left = wait_actors_gone([self.actor], [info], STOP_TIMEOUT)
        if left:
            log.warning("served module %r: its Ray actor's process %s still runs %.0f s after "
                        "it was killed", self.name, left, STOP_TIMEOUT)

    async def close(self) -> None:
        """Ask the actor to stop serving, then kill it (idempotent, bounded)."""
        hub = self._hub
        if hub is not None and self._run is not None and not self._killed:
            with anyio.move_on_after(1):
                try:
                    await hub.send(self.identity, None, kind=EnvClose.KIND)
                except Exception:  # gone already
                    pass
            with anyio.move_on_after(2):
                while not await anyio.to_thread.run_sync(_done, self._run):
                    pass
        await anyio.to_thread.run_sync(self.kill)


def _done(ref: Any) -> bool:
    done, _ = ray.wait([ref], num_returns=1, timeout=WATCH_INTERVAL)
    return bool(done)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


class RayHost(ProcessHost):
    """:class:`ProcessHost` whose process is a Ray actor (:class:`RayPolicyServer`).

    >>> host = RayHost("rm", config, blocks, shadow, on_fail, {"num_gpus": 1})  # doctest: +SKIP
    >>> pid = host.start("asyncio", "ipc:///tmp/d/hub")  # blocking (a thread)   # doctest: +SKIP
    """

    def __init__(self, name: str, config: ServerConfig, blocks: Mapping[int, WorkerBlocks],
                 shadow: nn.Module | None, on_fail: Callable[[str], None],
                 ray_options: Mapping[str, Any] | None) -> None:
        super().__init__(name, config, blocks, shadow, "forkserver", on_fail)
        self.ray_options = check_ray_options(ray_options)
        device = config.device
        if device is not None and device.type == "cuda" and not self.ray_options.get("num_gpus"):
            raise ValueError(f"served module {name!r} runs on {device} in a Ray actor, which "
                             "sees no GPU unless it asks for one: give ray_options={'num_gpus': "
                             "1} (or a fraction, to share the GPU with the trainer)")
        if not ray.is_initialized():
            raise ServedModuleError(f"served module {name!r}: server_backend='ray' places its "
                                    "host in the Ray cluster this process is connected to, "
                                    "and there is none: call ray.init() (address=... for a "
                                    "running cluster) before opening it")

    def _make_server(self) -> ProcessPolicyServer:
        blocks, _, shadow = self._server_args
        return RayPolicyServer(self.config, blocks=blocks, shadow=shadow, name=self.name,
                               ray_options=self.ray_options)
