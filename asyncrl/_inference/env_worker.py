"""A local env worker's process: its link to the trainer, its join, its life and its end.

The process that :class:`~asyncrl.AsyncBatchedCollector` starts per group of envs
(``env_worker_main``, from the torch-free fork server: :mod:`asyncrl._spawn.torch_free`):
it connects one :class:`transports.Link` to the trainer's hub, joins with the one hello
(``role="env"``, its slot and spawn token), builds its
:class:`~asyncrl._inference.env_stepper.EnvStepper` and steps it in a thread until the
trainer says ``close`` or is gone. Its link then carries only heartbeats, errors and
``close``: observations, actions and chunks go through shared memory
(:mod:`.env_stepper`). What the stepping does is the stepper's; this module is the
process around it (:func:`serve_linked` is also the dedicated inference process's).

Torch-free, as the stepper: neither this module nor what it imports needs torch.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from transports import ErrorPayload, Link, PeerLostError, ProtocolError

from .._errors import RefusedError
from .._protocol import PROTOCOL, EnvClose, EnvWelcome, Hello, Refuse, decode
from .._protocol.central_inference import ERROR_KIND
from .._spawn.child import exit_process, wait_parent_gone
from .env_stepper import EnvStepper, EnvWorkerConfig, one_torch_thread

log = logging.getLogger("asyncrl.env_worker")


async def run_env_worker(endpoint: str, identity: bytes, config: EnvWorkerConfig,
                         parent_pid: int | None = None) -> int:
    """The worker's life: connect, build, step; 0 on a requested close, 1 on an error."""
    return await serve_linked(endpoint, identity, config, parent_pid,
                              lambda link: _serve(link, config))


async def serve_linked(endpoint: str, identity: bytes, config: Any, parent_pid: int | None,
                       serve: Callable[[Link], Awaitable[int]]) -> int:
    """A child of the trainer's life: one Link to it, ``serve`` over it, until it returns
    (its exit code) or the trainer is gone. ``config`` gives the link's
    ``heartbeat_interval``, ``peer_timeout`` and ``curve`` (its key for a CURVE hub)."""
    async with Link(endpoint, identity=identity, heartbeat_interval=config.heartbeat_interval,
                    peer_timeout=config.peer_timeout, curve=config.curve) as link:
        code = 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_parent, parent_pid, tg.cancel_scope)
            code = await serve(link)
            tg.cancel_scope.cancel()
        return code


async def join_locally(link: Link, config: EnvWorkerConfig) -> bool:
    """A local env worker's join: the one hello (``role="env"``, its slot and spawn
    token), then its welcome. False: the collector closed before it came."""
    hello = Hello(protocol=PROTOCOL, name=link.identity.decode(errors="replace"),
                  host=socket.gethostname()[:200], pid=os.getpid(), specs={},
                  slot=config.slot, token=config.token, role="env")
    await link.send(hello.to_body(), kind=Hello.KIND)
    message = await link.recv()
    if message.kind == EnvClose.KIND:
        return False
    if message.kind == Refuse.KIND:
        raise RefusedError(f"the collector refused env worker {config.slot}: "
                           f"{decode(Refuse, message.body).reason}")
    if message.kind != EnvWelcome.KIND:
        raise ProtocolError(f"expected {EnvWelcome.KIND!r} or {Refuse.KIND!r}, got "
                            f"{str(message.kind)[:64]!r}")
    welcome = decode(EnvWelcome, message.body)
    if welcome.slot != config.slot:
        raise ProtocolError(f"welcomed as slot {welcome.slot}, spawned for {config.slot}")
    return True


async def _serve(link: Link, config: EnvWorkerConfig) -> int:
    stepper: EnvStepper | None = None
    try:
        if not await join_locally(link, config):
            return 0
        stepper = await anyio.to_thread.run_sync(EnvStepper, config)
        await _step_locally(stepper, link, config)
        return 0
    except PeerLostError:
        return 0  # the collector is gone: nothing to report to
    except Exception as exc:
        log.debug("env worker %d failed", config.slot, exc_info=True)
        with anyio.move_on_after(2):
            await link.send(ErrorPayload.from_exception(exc).to_body(), kind=ERROR_KIND)
        return 1
    finally:
        if stepper is not None:
            stepper.stop()
            # The thread may be mid-step (a cancel abandons it): the envs stay open until it
            # has returned, which the next wait makes it do.
            stepper.wait_stopped(5.0)
            stepper.close()


async def _step_locally(stepper: EnvStepper, link: Link, config: EnvWorkerConfig) -> None:
    """Step in a thread (chunks go through the ring); here, the trainer's link: close in."""
    error: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_read_trainer, link, tg.cancel_scope, stepper)
        try:
            await anyio.to_thread.run_sync(stepper.run_local, abandon_on_cancel=True)
        except Exception as exc:  # the envs' (raised below, out of the task group)
            error = exc
        finally:
            stepper.stop()
        tg.cancel_scope.cancel()
    if error is not None:
        raise error


async def _read_trainer(link: Link, scope: anyio.CancelScope, stepper: EnvStepper) -> None:
    # The trainer's "close" (or its loss) stops the stepping.
    try:
        while True:
            message = await link.recv()
            if message.kind == EnvClose.KIND:
                break
    except PeerLostError:
        pass
    stepper.stop()
    scope.cancel()


async def watch_parent(parent_pid: int | None, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once the trainer is gone (none: never)."""
    # A worker must not outlive its trainer, even one killed without a goodbye.
    if parent_pid is None:
        return
    await wait_parent_gone(parent_pid)
    scope.cancel()


def env_worker_main(endpoint: str, identity: bytes, config: EnvWorkerConfig, backend: str,
                    parent_pid: int) -> None:
    """Entry point of an env worker process (started by ``WorkerProcesses``)."""
    logging.basicConfig(level=logging.WARNING, format="env worker %(process)d: %(message)s")
    one_torch_thread()
    run: Callable[[], Any] = lambda: run_env_worker(endpoint, identity, config, parent_pid)  # noqa: E731
    exit_process(anyio.run(run, backend=backend))


__all__ = ["env_worker_main", "join_locally", "run_env_worker", "serve_linked", "watch_parent"]
