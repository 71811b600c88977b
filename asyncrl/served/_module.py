"""The trainer's end of a served module: one copy, batched calls from every env, versioned weights.

:class:`ServedModule` hosts a module (a reward model, a frozen encoder, a reference
policy) once, in a thread of the trainer's process, and serves every env that calls
it through a :class:`~._client.ServedModuleClient` (the gymnasium wrappers of
:mod:`._gym`, the TorchRL transform of :mod:`._torchrl`). It is central inference's
machinery, not a second runtime: the calls are batched by the same
:class:`~asyncrl._inference.inference_loop.InferenceLoop` that batches a policy for
:class:`~asyncrl.AsyncBatchedCollector`, over the same shared-memory blocks
(:func:`~asyncrl._inference.worker_blocks.make_blocks`, one slot of one row per
client) and the same seqlock; only the bells are named pipes
(:mod:`._bells`), because the callers are spawned later by a collector that knows
nothing of the module. Weights go in between two calls under the loop's version
lock (:meth:`ServedModule.update`), so every answer carries the version that
computed it.

With ``server_backend="process"`` the same loop runs in a dedicated process of central
inference's (:mod:`._process_host`): the trainer keeps the blocks, bells and status
(and a CPU copy that checks weights), the process serves. With ``server_backend="ray"``
that process is a Ray actor on the trainer's host (:mod:`._ray_host`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

import anyio
import torch
from torch import nn

from transports import SharedTensorBlock

from .._inference.doorbell import EventFd, spin_for
from .._inference.inference_loop import InferenceLoop, InferenceStatistics
from .._inference.inference_process import ServerConfig
from .._inference.outputs import OutputLayout, discover_outputs
from .._inference.policy_server import PolicyCopy
from .._inference.served_weights import weight_loader
from .._inference.worker_blocks import WorkerBlocks, make_blocks
from .._rollout.policies import PolicyAdapter
from .._spawn.forkserver import check_start_method
from ._bells import FifoBell, make_fifo
from ._client import CLAIMS_FILE, REQUEST_BELL, answer_bell
from ._errors import ServedModuleError, ServedModuleTimeout
from ._handle import ServedModuleHandle
from ._status import CLOSED, FAILED, MESSAGE_BYTES, write_status

__all__ = ["ServedModule"]

log = logging.getLogger("asyncrl.served")

#: Seconds :meth:`ServedModule.aclose` waits for a call under way to end.
_CLOSE_TIMEOUT = 10.0
#: Where the module is served: a thread of the trainer's process, a process of its own,
#: or a Ray actor (a process of its own that Ray places: :mod:`._ray_host`).
SERVER_BACKENDS = ("thread", "process", "ray")


class ServedModule:
    """A module served once to every env that calls it: batched, bounded, versioned.

    ``module`` maps input tensors (positionally, in ``example``'s order, each with a
    batch dimension first) to one output tensor (batch first). ``example`` gives one
    env's inputs (no batch dimension): their names, shapes and dtypes. ``name`` is the
    model id its weights are updated by (``collector.update_policy_weights(w,
    model_id=name)`` with ``weight_sync_schemes={name: ServedModuleScheme(served)}``,
    or :meth:`update`). ``clients``: how many envs may call it at once (one slot
    each); ``call_timeout``: seconds a call waits for its answer before the env step
    fails (:class:`~asyncrl.served.ServedModuleTimeout`); ``update_timeout``: seconds
    :meth:`update` waits for the call under way before it fails.
    ``server_backend``: ``"thread"`` (a thread of the trainer's process),
    ``"process"`` (a dedicated process, off the trainer's GIL; ``start_method`` and
    ``threads`` are its own) or ``"ray"`` (that process as a Ray actor, started with
    ``ray_options``, e.g. ``{"num_gpus": 1}``; see docs/served_modules.md).

    Open it before the collector whose envs call it, and close it after.

    >>> reward_model = torch.nn.Sequential(torch.nn.Linear(5, 1))
    >>> async def main():                                              # doctest: +SKIP
    ...     async with ServedModule(reward_model, name="env.transform[0]",
    ...                             example={"observation": torch.zeros(4),
    ...                                      "action": torch.zeros(1)}) as served:
    ...         make_env = functools.partial(make_cartpole, served.handle)  # plain data
    ...         async with MultiSyncCollector(make_env, ...) as collector:
    ...             version = await served.update(reward_model.state_dict())
    """

    _open: ClassVar[dict[str, ServedModule]] = {}

    def __init__(self, module: Any, *, example: Mapping[str, Any], name: str = "served",
                 clients: int = 64, max_batch_size: int | None = None,
                 call_timeout: float = 10.0, device: torch.device | str | None = None,
                 threads: int | None = None, server_backend: str = "thread",
                 update_timeout: float = 60.0, start_method: str | None = None,
                 ray_options: Mapping[str, Any] | None = None) -> None:
        if not callable(module):
            raise TypeError(f"ServedModule serves a callable (an nn.Module), got "
                            f"{type(module).__name__}")
        if not isinstance(example, Mapping) or not example:
            raise TypeError("example must be {input name: one env's value}, e.g. "
                            "{'observation': torch.zeros(4)}; got "
                            f"{type(example).__name__}")
        if clients < 1:
            raise ValueError(f"clients={clients}: at least one env must be able to call")
        if not call_timeout > 0:
            raise ValueError(f"call_timeout={call_timeout}: a call must be bounded (> 0 s)")
        if not update_timeout > 0:
            raise ValueError(f"update_timeout={update_timeout}: an update must be bounded "
                             "(> 0 s)")
        if server_backend not in SERVER_BACKENDS:
            raise ValueError(f"server_backend={server_backend!r}: expected one of "
                             f"{SERVER_BACKENDS} (a thread of the trainer's process, a "
                             "dedicated process, or a Ray actor)")
        if start_method is not None and server_backend != "process":
            raise ValueError(f"start_method={start_method!r} starts a host process: give "
                             "server_backend='process' with it, or leave it out")
        if ray_options is not None and server_backend != "ray":
            raise ValueError(f"ray_options={dict(ray_options)} start a Ray actor: give "
                             "server_backend='ray' with them, or leave them out")
        self.name = name
        self.module = module  # the user's, which update(None) copies from
        self.example = {str(k): torch.as_tensor(v) for k, v in example.items()}
        self.clients = clients
        self.max_batch_size = clients if max_batch_size is None else max_batch_size
        self.call_timeout = float(call_timeout)
        self.device = None if device is None else torch.device(device)
        self.threads = threads
        self.server_backend = server_backend
        self.update_timeout = float(update_timeout)
        self.start_method = check_start_method(start_method)
        self.ray_options = None if ray_options is None else dict(ray_options)
        self._served: Any = None  # the copy the loop calls (a process host: the checking copy)
        self._host: Any = None  # the ProcessHost (server_backend="process")
        self._config: ServerConfig | None = None  # what the host process is given
        self._loop: InferenceLoop | None = None
        self._blocks: dict[int, WorkerBlocks] = {}
        self._status: SharedTensorBlock | None = None
        self._status_views: dict[str, Any] = {}
        self._bells: list[EventFd] = []
        self._directory: str | None = None
        self._handle: ServedModuleHandle | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = ("closed" if self._closed else "failed" if self.error is not None
                 else "serving" if self._handle is not None else "not open")
        return f"ServedModule({self.name!r}, {state}, version={self.version})"

    # -- what a caller and the trainer read ------------------------------------------------
    @property
    def handle(self) -> ServedModuleHandle:
        """The address the envs call it by (plain data: give it to the env factory)."""
        if self._handle is None:
            raise ServedModuleError(f"served module {self.name!r} is not open: use "
                                    "'async with ServedModule(...)' before asking its handle")
        return self._handle

    @property
    def version(self) -> int:
        """The version of the weights the next call uses (0: the module's own)."""
        if self._host is not None:
            return int(self._host.version)
        return 0 if self._loop is None else self._loop.version

    @property
    def error(self) -> BaseException | None:
        """What the module raised, once it failed (it then serves no more calls); with a
        host process, also its death (a :class:`ServedModuleError` saying how)."""
        if self._host is not None:
            return self._host.error  # type: ignore[no-any-return]
        return self._error

    @property
    def pid(self) -> int:
        """The id of the process that serves (the trainer's, or the host process's)."""
        return self.handle.pid

    def statistics(self) -> InferenceStatistics:
        """Batched calls so far, envs served, calls per batch size."""
        if self._host is not None:
            return self._host.statistics()  # type: ignore[no-any-return]
        return InferenceStatistics(0, 0, {}) if self._loop is None else self._loop.statistics()

    @classmethod
    def named(cls, name: str) -> ServedModule:
        """The module open in this process under ``name`` (what a scheme without one finds)."""
        try:
            return cls._open[name]
        except KeyError:
            raise KeyError(f"no served module named {name!r} is open in this process "
                           f"(open: {sorted(cls._open)}); open ServedModule(..., name="
                           f"{name!r}) before the collector") from None

    # -- lifetime ----------------------------------------------------------------------------
    async def __aenter__(self) -> ServedModule:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Make the blocks and bells and start serving (a thread, or the host process)."""
        if self._thread is not None or self._host is not None or self._closed:
            raise ServedModuleError(f"served module {self.name!r} was opened already; "
                                    "make a new ServedModule to serve again")
        if self.name in ServedModule._open:
            raise ServedModuleError(f"a served module named {self.name!r} is open already in "
                                    "this process: give each one its own name (model id)")
        try:
            await anyio.to_thread.run_sync(self._make)  # a first call of the module
            if self.server_backend != "thread":
                await self._start_host()
            else:
                # A thread of its own, not a task: the module outlives no task group of
                # the caller's, and aclose() may come from any task.
                self._thread = threading.Thread(target=self._serve, daemon=True,
                                                name=f"asyncrl-served-{self.name}")
                self._thread.start()
        except BaseException:
            await self.aclose()
            raise
        ServedModule._open[self.name] = self

    def _make(self) -> None:
        # A host process builds its own copy on the device; this one (on the CPU) finds
        # the output's layout and checks the weights of every update before they travel.
        self._served = PolicyCopy.build(self.module, None, self._copy_device)
        obs: dict[tuple[str, ...], torch.Tensor] = {(k,): v.unsqueeze(0)
                                                    for k, v in self.example.items()}
        outputs = self._output_layout(obs)
        directory = self._directory = tempfile.mkdtemp(prefix="asyncrl-served-")  # 0700
        with open(os.path.join(directory, CLAIMS_FILE), "wb") as claims:
            claims.truncate(self.clients)  # a byte to lock per client slot
        self._blocks = make_blocks([1] * self.clients, obs, outputs)
        status = self._status = SharedTensorBlock.create(
            {"state": torch.zeros(1, dtype=torch.int64),
             "message": torch.zeros(MESSAGE_BYTES, dtype=torch.uint8)}, slots=1)
        self._status_views = {k: v.numpy() for k, v in status.slot_views(0).items()}
        make_fifo(os.path.join(directory, REQUEST_BELL))
        request = FifoBell(os.path.join(directory, REQUEST_BELL))
        self._bells.append(request)
        answers: dict[int, EventFd] = {}
        for slot in range(self.clients):
            path = os.path.join(directory, answer_bell(slot))
            make_fifo(path)
            answers[slot] = FifoBell(path)
            self._bells.append(answers[slot])
        spin = spin_for(self.clients + 1)
        if self.server_backend != "thread":
            self._config = ServerConfig(
                blocks={slot: (b.rows, b.obs.name, b.act.name) for slot, b in
                        self._blocks.items()},
                request_bell=request, answer_bells=answers,
                policy=copy.deepcopy(self._served), policy_factory=None, action_spec=None,
                exploration_type=None, obs_paths=list(obs), outputs=outputs,
                device=self.device, max_batch_size=self.max_batch_size, min_batch_size=1,
                server_timeout=0.0, version=0, threads=self.threads or 1,
                obs_spec=[(v.dtype, tuple(v.shape)) for v in self.example.values()],
                spin=spin)
        else:
            self._loop = InferenceLoop(
                self._adapter(), self._blocks, obs_paths=list(obs), outputs=outputs,
                device=self.device, max_batch_size=self.max_batch_size, min_batch_size=1,
                server_timeout=0.0, request_bell=request, answer_bells=answers, spin=spin,
                threads=self.threads)
        self._handle = ServedModuleHandle(
            name=self.name, host=socket.gethostname(), pid=os.getpid(), directory=directory,
            status=status.name,
            blocks=tuple((b.obs.name, b.act.name) for _, b in sorted(self._blocks.items())),
            inputs=tuple((k, str(v.numpy().dtype), tuple(v.shape))
                         for k, v in self.example.items()),
            output=("output", str(outputs.action[0]).removeprefix("torch."), outputs.action[1]),
            call_timeout=self.call_timeout, spin=spin)

    @property
    def _copy_device(self) -> torch.device | None:
        return None if self.server_backend != "thread" else self.device

    async def _start_host(self) -> None:
        """Start the host process (its hub: a socket in the module's private directory)."""
        from ._process_host import ProcessHost  # its imports (the hub) only when asked for

        assert self._directory is not None and self._handle is not None
        assert self._config is not None
        token = anyio.lowlevel.current_token().__class__.__module__
        backend = "trio" if "trio" in token else "asyncio"
        shadow = self._served if isinstance(self._served, nn.Module) else None
        if self.server_backend == "ray":
            from ._ray_host import RayHost  # Ray (an optional extra) only when asked for

            self._host = RayHost(self.name, self._config, self._blocks, shadow,
                                 self._host_failed, self.ray_options)
        else:
            self._host = ProcessHost(self.name, self._config, self._blocks, shadow,
                                     self.start_method, self._host_failed)
        pid = await anyio.to_thread.run_sync(self._host.start, backend,
                                             f"ipc://{self._directory}/hub")
        self._handle = dataclasses.replace(self._handle, pid=pid,
                                           server_backend=self.server_backend)

    def _host_failed(self, reason: str) -> None:
        self._set_status(FAILED, reason)

    def _adapter(self) -> PolicyAdapter:
        return PolicyAdapter(self._served, exploration_type=None,
                             observation_keys=list(self.example))

    def _output_layout(self, obs: dict[tuple[str, ...], torch.Tensor]) -> OutputLayout:
        """Call the module once on the example (a batch of one): its output's layout."""
        device = self._copy_device
        inputs = [v.to(device) if device is not None else v for v in obs.values()]
        with torch.no_grad():
            out = self._served(*inputs)
        if not isinstance(out, torch.Tensor) or out.dim() < 1 or out.shape[0] != 1:
            got = (f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor)
                   else type(out).__name__)
            raise ServedModuleError(
                f"served module {self.name!r} must return one tensor with the batch first; on "
                f"the example (a batch of 1) it returned {got}: wrap a TensorDictModule's "
                "network (module.module), or return a [batch, ...] tensor")
        example = {p: v.to(device) if device is not None else v for p, v in obs.items()}
        return discover_outputs(self._adapter(), example, (out.dtype, tuple(out.shape[1:])))

    def _serve(self) -> None:
        """Serve until closed; a module error fails every call from then on, with its text."""
        assert self._loop is not None
        try:
            self._loop.serve()
        except Exception as exc:
            self._error = exc
            log.error("served module %r raised %s: %s; it serves no more calls", self.name,
                      type(exc).__name__, exc)
            self._set_status(FAILED, f"{type(exc).__name__}: {exc} (raised by the module in "
                             f"the trainer's process, pid {os.getpid()})")

    def _set_status(self, state: int, message: str = "") -> None:
        if self._status_views:
            write_status(self._status_views, state, message)
        for bell in self._bells[1:]:  # every caller waiting on its answer checks the status
            bell.ring()

    async def update(self, weights: Any = None) -> int:
        """Load ``weights`` (None: the ``module`` given, copied) between two calls.

        Returns the new version once the next call uses it: that is the acknowledgement
        (every answer from then on carries it). ``weights``: an ``nn.Module``, a state
        dict or a TensorDict of parameters.

        Bounded: a call under way that does not end within ``update_timeout`` seconds
        fails the update with :class:`ServedModuleTimeout`. A thread host then loads
        nothing and serves on at its version (a thread cannot be stopped: its stuck call
        may still end); a host process is stopped (it is stuck) and the module fails.
        """
        loop = self._loop
        if (loop is None and self._host is None) or self._closed:
            raise ServedModuleError(f"served module {self.name!r} is not open: update it "
                                    "inside 'async with ServedModule(...)'")
        if self._host is not None:
            version = int(await self._host.update(
                self.module if weights is None else weights, self.update_timeout))
            log.info("served module %r: version %d in use (host pid %s)", self.name, version,
                     self._host.pid)
            return version
        assert loop is not None
        if self._error is not None:
            raise ServedModuleError(f"served module {self.name!r} failed and serves no "
                                    f"more: {type(self._error).__name__}: {self._error}"
                                    ) from self._error
        if weights is None:
            weights = self.module
        if not isinstance(self._served, nn.Module):
            raise ServedModuleError(f"served module {self.name!r} is a "
                                    f"{type(self._served).__name__}, which has no weights")
        try:
            version = await loop.update(weight_loader(self._served, weights),
                                        timeout=self.update_timeout)
        except TimeoutError:
            raise ServedModuleTimeout(
                f"served module {self.name!r}: update() waited {self.update_timeout} s "
                "(update_timeout) for the call under way to end; the weights were not "
                f"loaded and it serves on at version {loop.version}: a call that long is a "
                "stuck module (fix it) or a slow one (raise ServedModule(..., "
                "update_timeout=))") from None
        log.info("served module %r: version %d in use", self.name, version)
        return version

    async def aclose(self) -> None:
        """Stop serving (callers waiting fail at once, saying so), free everything (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if ServedModule._open.get(self.name) is self:
            del ServedModule._open[self.name]
        with anyio.CancelScope(shield=True):
            if self.error is None:
                self._set_status(CLOSED)
            host = self._host
            if host is not None:  # stops the process (bounded: SIGTERM, then SIGKILL)
                await anyio.to_thread.run_sync(host.close)
            loop, thread = self._loop, self._thread
            if loop is not None:  # stops the thread, waits (bounded) for its call to end
                await anyio.to_thread.run_sync(loop.close, _CLOSE_TIMEOUT)
            if thread is not None:
                await anyio.to_thread.run_sync(thread.join, _CLOSE_TIMEOUT)
                if thread.is_alive():  # a call that long: its memory stays mapped till exit
                    log.warning("served module %r: a call still runs after %s s; its "
                                "shared memory is left to the process's exit", self.name,
                                _CLOSE_TIMEOUT)
                    return
            self._release()

    def _release(self) -> None:
        for blocks in self._blocks.values():
            blocks.close()
        self._blocks = {}
        self._status_views = {}
        if self._status is not None:
            self._status.close()
            self._status.unlink()
        for bell in self._bells:
            bell.close()
        self._bells = []
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
