"""A served module hosted in a dedicated process (``ServedModule(..., server_backend="process")``).

The process is central inference's own: :class:`~asyncrl._inference.process_server.
ProcessPolicyServer` starts it (:mod:`asyncrl._spawn`'s :class:`~asyncrl._spawn.processes.
WorkerProcesses`, fork server by default) and it runs :mod:`asyncrl._inference.
inference_process`'s :class:`~asyncrl._inference.inference_process.InferenceServer`:
the same :class:`~asyncrl._inference.inference_loop.InferenceLoop` as the thread host,
over the blocks and named-pipe bells the trainer made (a :class:`~._bells.FifoBell`
pickles as its path). Weights go to it as a state dict over a private hub
(``ipc://`` in the module's 0700 directory) and are acknowledged with the version once
the next call uses them.

:class:`ProcessHost` is the trainer's side. Its hub, the process watcher and the
messages run on an event loop of their own, in a thread (anyio's blocking portal): a
served module is opened and closed by any task, and outlives no task group of the
caller's; and a host that dies is seen at once, and its callers failed with the
reason, even while the trainer's event loop is busy in a training step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import anyio
import anyio.abc
from anyio.from_thread import BlockingPortal
from torch import nn

from transports import Hub

from .._errors import CollectorError, WorkerLostError
from .._inference.inference_loop import InferenceStatistics
from .._inference.inference_process import ServerConfig
from .._inference.policy_server import ServerHooks
from .._inference.process_server import ProcessPolicyServer
from .._inference.worker_blocks import WorkerBlocks
from .._spawn.child import ending_error
from .._spawn.processes import describe_exit
from ._errors import ServedModuleError, ServedModuleTimeout

__all__ = ["ProcessHost"]

log = logging.getLogger("asyncrl.served")

#: Seconds a host that exited with code 1 (it failed and reports why) is given for its
#: report to arrive before its exit is the reason.
_REPORT_GRACE = 1.0


def start_portal(backend: str, name: str) -> tuple[BlockingPortal, threading.Thread]:
    """An event loop in a daemon thread, and its portal (blocking: call it in a thread).

    Not anyio's ``start_blocking_portal``: its thread belongs to an executor that the
    interpreter joins at exit, so a module the user forgot to close would hang the exit;
    a daemon thread does not (the host process then sees its parent gone and exits).
    """
    made: Future[BlockingPortal] = Future()

    async def serve() -> None:
        try:
            async with BlockingPortal() as portal:
                made.set_result(portal)
                await portal.sleep_until_stopped()
        except BaseException as exc:
            if not made.done():
                made.set_exception(exc)
            raise

    thread = threading.Thread(target=anyio.run, args=(serve,), kwargs={"backend": backend},
                              name=name, daemon=True)
    thread.start()
    return made.result(), thread


class ProcessHost:
    """The trainer's side of a served module's host process: start, update, watch, stop.

    ``on_fail(message)`` is called (from the portal's thread) once, when the host fails
    for good (the module raised, the process died or stuck): the served module writes
    its status, so that every caller fails at once with ``message``.

    >>> host = ProcessHost("rm", config, blocks, shadow, "forkserver", on_fail)  # doctest: +SKIP
    >>> pid = host.start("asyncio", "ipc:///tmp/d/hub")  # blocking (a thread)  # doctest: +SKIP
    >>> version = await host.update(state_dict, timeout=60.0)                 # doctest: +SKIP
    >>> host.close()                                     # blocking, idempotent # doctest: +SKIP
    """

    def __init__(self, name: str, config: ServerConfig, blocks: Mapping[int, WorkerBlocks],
                 shadow: nn.Module | None, start_method: str,
                 on_fail: Callable[[str], None]) -> None:
        self.name = name
        self.config = config
        self._server_args = (blocks, start_method, shadow)
        self._server: ProcessPolicyServer | None = None  # made on the portal's loop (its events)
        self._on_fail = on_fail
        #: Why the host serves no more (the module's error, or a ServedModuleError).
        self.error: BaseException | None = None
        self.reason = ""
        self._closing = False
        self._thread: threading.Thread | None = None
        self._portal: BlockingPortal | None = None
        self._future: Future[None] | None = None
        self._stop: anyio.Event | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def server(self) -> ProcessPolicyServer:
        assert self._server is not None, "ProcessHost.start() makes the server"
        return self._server

    @property
    def pid(self) -> int | None:
        return None if self._server is None else self._server.pid

    @property
    def version(self) -> int:
        return self.config.version if self._server is None else self._server.version

    def statistics(self) -> InferenceStatistics:
        """The host's latest report (at most ``STATS_INTERVAL`` seconds old)."""
        if self._server is None:
            return InferenceStatistics(0, 0, {})
        return self._server.statistics()

    # -- life (blocking: call these in a worker thread) ---------------------------------------
    def start(self, backend: str, endpoint: str) -> int:
        """Start the portal, its hub and the process; return the host's pid once it serves."""
        self._portal, self._thread = start_portal(backend, f"asyncrl-served-{self.name}")
        try:
            self._future, _ = self._portal.start_task(self._run, backend, endpoint)
        except BaseException as exc:
            self.close()
            if self.error is not None:  # it failed (and said why, or how it ended)
                raise ServedModuleError(f"served module {self.name!r}: its host process did "
                                        f"not start serving: {self.reason}") from self.error
            raise ending_error(exc) from None
        pid = self.pid
        if pid is None:  # it died between its "ready" and now: its exit says why
            self.close()
            raise ServedModuleError(f"served module {self.name!r}: its host process ended "
                                    f"as it started: {self.reason or 'no reason reported'}")
        return pid

    async def _run(self, backend: str, endpoint: str, *,
                   task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._stop = anyio.Event()
        self._server = self._make_server()
        config = self.config
        try:
            async with Hub(endpoint, heartbeat_interval=config.heartbeat_interval,
                           peer_timeout=config.peer_timeout) as hub, \
                    anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._dispatch, hub)
                hooks = ServerHooks(fail=self._fail, closing=lambda: self._closing,
                                    answered=None)
                await self.server.start(tg, hub, backend, hooks)
                task_status.started()
                await self._stop.wait()
                await self.server.close()  # "close", then SIGTERM / SIGKILL what is left
                tg.cancel_scope.cancel()
        except Exception as exc:  # this loop failed (its start, hub, watcher): nobody watches
            if not self._closing:
                cause = ending_error(exc)
                self._failed(ServedModuleError(f"{type(cause).__name__}: {cause}"))
            raise
        finally:  # whatever ended this loop, the host process ends with it (idempotent)
            self._closing = True
            with anyio.CancelScope(shield=True):
                await self.server.close()

    def _make_server(self) -> ProcessPolicyServer:
        """The trainer's side of the host process (a Ray actor's: :mod:`._ray_host`)."""
        blocks, start_method, shadow = self._server_args
        return ProcessPolicyServer(self.config, blocks=blocks, start_method=start_method,
                                   shadow=shadow)

    async def _dispatch(self, hub: Hub) -> None:
        async for item in hub:  # the socket is private (0700 directory): the host only
            if self.server.owns(item.peer):
                await self.server.receive(item)

    def close(self) -> None:
        """Stop the process, the hub and the portal (idempotent; bounded: a few seconds)."""
        portal, self._portal = self._portal, None
        if portal is None:
            return
        try:
            if self._stop is not None and self._future is not None and not self._future.done():
                portal.call(self._request_stop)
                try:
                    self._future.result(timeout=30)
                except Exception as exc:  # the hub or the watcher failed: logged, it is over
                    log.warning("served module %r: its host's loop ended with %r", self.name,
                                exc)
        finally:
            portal.call(portal.stop, True)  # (an update waiting has been woken: see below)
            if self._thread is not None:
                self._thread.join(10)

    def _request_stop(self) -> None:
        self._closing = True
        assert self._stop is not None
        self._stop.set()
        if self._server is not None:  # an update waiting for its acknowledgement ends
            self._server.abort(ServedModuleError(f"served module {self.name!r} was closed"))

    # -- failures (on the portal's loop) ------------------------------------------------------
    def _fail(self, error: BaseException) -> None:
        if self._closing or self.error is not None:
            return
        if isinstance(error, WorkerLostError):
            processes = self.server.processes
            code = processes.exitcodes[0] if processes is not None and processes.processes \
                else None
            if code == 1 and self._tg is not None:  # it failed: its own report is the reason
                self._tg.start_soon(self._fail_unless_reported, error)
                return
        self._failed(error)

    async def _fail_unless_reported(self, error: BaseException) -> None:
        await anyio.sleep(_REPORT_GRACE)
        if self.error is None and not self._closing:
            self._failed(error)

    def _failed(self, error: BaseException) -> None:
        if self.error is not None:
            return
        pid = self._pid_seen()
        if isinstance(error, WorkerLostError):
            processes = self.server.processes
            code = processes.exitcodes[0] if processes is not None and processes.processes \
                else None
            if code is not None:
                reason = f"its host process (pid {pid}) {describe_exit(code)}"
                if code > 0:  # it ended on an error it could not report
                    reason += (" before it could say why (its stderr has the traceback: a "
                               "module that cannot be unpickled there, a class defined in a "
                               "script without a __main__ guard...)")
            else:
                reason = (f"its host process (pid {pid}) went silent for "
                          f"{self.server.config.peer_timeout} s: it is stuck")
            error = ServedModuleError(reason)
        elif isinstance(error, ServedModuleError):
            reason = str(error)
        else:
            reason = (f"{type(error).__name__}: {error} (raised by the module in its host "
                      f"process, pid {pid})")
        self.fail_with(error, reason)

    def _pid_seen(self) -> int | None:
        processes = self.server.processes
        return processes.processes[0].pid if processes is not None and processes.processes \
            else None

    def fail_with(self, error: BaseException, reason: str) -> None:
        """The host serves no more: record why, wake whoever waits, tell the callers."""
        if self.error is not None:
            return
        self.error, self.reason = error, reason
        log.error("served module %r: %s; it serves no more calls", self.name, reason)
        self.server.abort(error)
        self._on_fail(reason)

    # -- weights -----------------------------------------------------------------------------
    async def update(self, weights: Any, timeout: float) -> int:
        """Load ``weights`` in the host between two calls; the new version, acknowledged.

        Past ``timeout`` seconds (a call stuck in the module), the host is stopped: it
        serves no more, and :class:`ServedModuleTimeout` says so.
        """
        portal = self._portal
        if portal is None:
            raise ServedModuleError(f"served module {self.name!r} is closed")
        return await anyio.to_thread.run_sync(portal.call, self._update, weights, timeout)

    async def _update(self, weights: Any, timeout: float) -> int:
        if self.error is not None or self._closing:
            raise self._gone()
        with anyio.move_on_after(timeout):
            try:
                return await self.server.update(weights)
            except CollectorError as exc:  # the host could not load them: it serves on
                raise ServedModuleError(f"served module {self.name!r}: {exc}") from None
            except Exception as exc:
                if exc is self.error or isinstance(exc, ServedModuleError) or self._closing:
                    raise self._gone() from None
                raise  # the trainer's check of the weights (load_state_dict's error)
        error = ServedModuleTimeout(
            f"served module {self.name!r}: update() waited {timeout} s (update_timeout) for "
            "the call under way in its host process to end; the module is stuck, so the "
            "host was stopped and serves no more calls: fix the module (or raise "
            "ServedModule(..., update_timeout=) for calls that long), and open a new one")
        self.fail_with(error, f"it was stuck in a call for more than update_timeout="
                              f"{timeout} s; its host process was stopped")
        processes = self.server.processes
        if processes is not None:
            await processes.stop(grace=0.0)
        raise error

    def _gone(self) -> ServedModuleError:
        if self.error is None:
            return ServedModuleError(f"served module {self.name!r} was closed while update() "
                                     "waited: the weights may not have been loaded")
        error = ServedModuleError(f"served module {self.name!r} failed and serves no more: "
                                  f"{self.reason}")
        error.__cause__ = self.error
        return error
