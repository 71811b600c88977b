"""Multi-process collectors: a coordinator in the trainer, workers in other processes."""

from __future__ import annotations

import inspect
import logging
import secrets
import shutil
import socket
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Literal, Self, overload

import anyio
import anyio.lowlevel
import torch
from tensordict import TensorDictBase

from transports import CurveServer, Hub, PeerLostError, RemoteError

from .. import _logs
from .._batches import assemble, drop_env_dim
from .._coordinator import Coordinator, OnWorkerLoss, WorkerInfo
from .._devices import DeviceLayout
from .._envs import make_env_pool
from .._errors import CollectorError, CollectorStopped, WorkerLostError, rebuild_remote_exception
from .._events import CollectorEvent
from .._forkserver import worker_context
from .._process_main import likely_causes, local_worker_processes
from .._processes import WorkerProcesses, describe_exit
from .._rollout_options import RolloutOptions
from .._statistics import WorkerStatistics
from .._threads import TrainerThreads
from .._worker import EXIT_ERROR, EXIT_OK
from .._worker_spec import WorkerSpec
from ..weights import WeightSender, ZmqWeightSyncScheme
from ..weights._torchrl import as_weight_sync_schemes
from ._base import BaseCollector
from ._config import (
    ThreadOptions,
    WorkerLayout,
    check_cat_results,
    check_int,
    check_on_worker_loss,
    check_preemptive_threshold,
    check_total_frames,
    split_frames,
)
from ._docs import share_parameters, show_init_signature
from ._env_factories import LocalSpecsCheck, check_picklable, travelling, worker_envs
from ._limits import listening_hub_limits
from ._torchrl_args import MULTI_COLLECTOR, check_torchrl_options
from ._updates import weight_updates

log = logging.getLogger("asyncrl.collectors")


class MultiCollector(BaseCollector):
    """Collect with ``num_workers`` processes; ``sync=True`` on-policy, ``False`` off-policy.

    ``MultiCollector(..., sync=True)`` builds a :class:`MultiSyncCollector`
    (every worker contributes one share to every batch) and ``sync=False`` a
    :class:`MultiAsyncCollector` (each batch comes from one worker, first come
    first served, each worker at most ``prefetch`` batches ahead).

    ``on_worker_loss`` says what a lost worker does to the run, the same for
    local and remote workers (a local worker is lost when its process ends, with
    its exit code or signal, or when it is silent for ``peer_timeout``):
    ``"raise"`` (default) fails the run naming the worker; ``"continue"`` goes
    on with the others (``total_frames`` stays exact in async mode; in sync mode
    later rounds ask only the workers needed to reach it); ``"wait"`` makes sync
    rounds wait for a replacement share (a remote newcomer, or the dropped worker
    itself: one that speaks again is told to rejoin), and fails at once when a
    dead local worker cannot be replaced; ``"restart"`` respawns a local worker's
    slot (a silent one is killed first), at most ``max_restarts`` times in a row
    without a delivered batch, and waits for a remote one as ``"wait"`` does.

    Batches, with TorchRL's meaning (shapes: ``docs/batch_shapes.md``):
    ``replay_buffer`` is extended with every batch's frames, flat, and iteration
    yields None; ``extend_buffer`` must stay True (whole batches are written);
    ``trajs_per_batch`` yields batches of that many complete trajectories;
    ``traj_format`` lays them out ``"padded"`` (``[n, max_len]`` with
    ``("collector", "mask")``) or ``"cat"`` (flat, along time).

    Threads, with TorchRL's meaning: each worker runs torch with
    ``num_sub_threads`` intra-op threads (default 1), and the trainer's process
    with ``num_threads`` while the collector is open (default: the machine's
    threads minus the local workers, at least 1; restored at close). Local
    workers are forked from a warm fork server (``start_method="forkserver"``,
    the default) or spawned (``"spawn"``).

    >>> async with MultiCollector("CartPole-v1", policy=None, num_workers=2,   # doctest: +SKIP
    ...                           frames_per_batch=1000, total_frames=10_000, sync=True) as c:
    ...     async for batch in c:
    ...         loss = train(batch)
    ...         await c.update_policy_weights()

    TorchRL 0.14 arguments beyond the above (``**torchrl_options``; the table and
    messages are in ``asyncrl/collectors/_torchrl_args.py``):

    - ``collector_class``: None or TorchRL's ``Collector`` (what a worker is); others refused.
    - ``use_buffers``: None / True (asyncrl always preallocates); False refused.
    - ``track_policy_version``: True / False; frames always carry
      ``("collector", "policy_version")``.
    - ``auto_register_policy_transforms``: None / False; True refused (add the transforms in
      ``create_env_fn``).
    - ``no_cuda_sync``: False; True refused (no extra synchronisation to skip).
    - ``weight_sync_schemes``: TorchRL's ``MultiProcessWeightSyncScheme`` becomes
      ``ZmqWeightSyncScheme``, ``SharedMemWeightSyncScheme`` and ``NoWeightSyncScheme`` their
      asyncrl namesakes; ``sync=False``, ``per_worker_weights=True``, RPC / distributed / Ray
      schemes are refused naming the replacement.
    - Refused, naming the asyncrl way: ``trust_policy``, ``compile_policy`` and
      ``cudagraph_policy`` (wrap the policy in ``policy_factory``), ``weight_updater`` and
      ``weight_recv_schemes`` (``weight_sync_schemes``), ``worker_idx``, ``trajs_per_write``,
      ``init_fn`` (``create_env_fn`` / ``policy_factory``), ``pre_collect_hook`` /
      ``post_collect_hook`` / ``compact_obs`` (``postproc``).
    - Methods with TorchRL's names: ``update_policy_weights(policy_or_weights, *, weights,
      policy, worker_ids, model_id, weights_dict)`` and ``update_policy_weights_`` (awaited),
      ``shutdown()`` / ``async_shutdown()`` (``aclose``); ``set_seed`` seeds each worker's torch
      and numpy RNGs too; a plain ``for`` loop raises a TypeError naming ``async for`` and
      :class:`~asyncrl.BlockingCollector`.

    Devices (TorchRL's meaning; checked here, a device this machine lacks is an error;
    ``docs/devices.md``):
    ``device``: the default of the three below (``"cuda"`` is ``"cuda:<current>"``).
    ``policy_device``: where each local worker's policy runs (remote hosts: ``--device``).
    ``env_device``: where env outputs live: the host, or the policy's device.
    ``storing_device``: where the trainer stores the batches it receives.

    Logging: INFO lines when it opens, when each worker joins and when it closes; a
    lost worker is a WARNING. Workers log with the trainer's level and format (the
    ``asyncrl`` logger's level, the root handler's format). A local worker that gets
    SIGTERM stops the run as a normal stop: ``async for`` ends and later calls raise
    :class:`~asyncrl.CollectorStopped` (systemd stops a service's whole process group).

    Parameters
    ----------
    create_env_fn
        What each worker steps: a gymnasium id (``"CartPole-v1"``), an import path
        (``"pkg.mod:make_env"``), a callable returning a gymnasium or TorchRL env, or a
        list with one of those per local worker.
    policy
        An ``nn.Module``, a ``TensorDictModule``, a callable from observations to
        actions, or None (random actions). Each worker gets a copy; a module's weights
        are then kept in sync (``update_policy_weights``, ``weight_sync_schemes``).
    num_workers
        Local worker processes (default: one per entry of a ``create_env_fn`` list,
        else required unless ``remote_workers`` join instead).
    sync
        Only on ``MultiCollector``: True (default) builds a ``MultiSyncCollector``,
        False a ``MultiAsyncCollector``.
    policy_factory
        A callable (or ``"pkg.mod:factory"`` import path) each worker calls to build its
        own policy, instead of pickling ``policy``.
    frames_per_batch
        Frames per yielded batch; in sync mode split over the workers (or one int per
        worker), in async mode each worker's batch size.
    total_frames
        Frames to collect before the iteration ends; -1 or None: no end.
    create_env_kwargs
        Keyword arguments for ``create_env_fn``: one dict, or a list of one dict per
        local worker.
    envs_per_worker
        Envs each worker steps together, as one vector env (TorchRL's batched envs).
    max_frames_per_traj
        Truncate a trajectory after this many steps (``("next", "truncated")`` set).
    init_random_frames
        Frames collected with random actions before the policy is used (split over the
        workers).
    reset_at_each_iter
        Reset every env at the start of each batch.
    reset_when_done
        Reset an env when its episode ends (TorchRL's default True).
    split_trajs
        Split each batch into padded trajectories (TorchRL's ``split_trajectories``).
    postproc
        A callable applied to each batch before it is yielded.
    set_truncated
        Mark the last step of each batch's trajectories as truncated.
    exploration_type
        TorchRL's exploration type the policy runs under (``"random"``, ``"mode"``,
        ``"mean"``, ``"deterministic"``, or None: leave it as it is).
    cat_results
        Sync mode: how shares are joined: ``"stack"`` or None (default, as TorchRL: a
        new leading workers dimension), 0 (along envs), 1 or -1 (along time); see
        ``docs/batch_shapes.md``.
    preemptive_threshold
        Sync mode: once this fraction of the workers delivered, the others are cut short
        (TorchRL's meaning; None: never).
    update_at_each_batch
        Call ``update_policy_weights()`` before each batch.
    replay_buffer
        Anything with ``.extend(td)``: iteration yields None and the collector extends
        it with each batch's frames (TorchRL's meaning); ``start()`` does the same in
        the background.
    weight_sync_schemes
        ``{model_id: scheme}`` (:mod:`asyncrl.weights`); by default ``"policy"`` syncs
        over ZeroMQ when ``policy`` is a module.
    prefetch
        Async mode: batches each worker may run ahead of the trainer (back-pressure).
    device, policy_device, env_device, storing_device
        TorchRL's device arguments with TorchRL's meaning (see Devices above and
        ``docs/devices.md``).
    on_worker_loss
        ``"raise"`` (default), ``"continue"``, ``"wait"`` or ``"restart"``: see above.
    backend
        The anyio backend of the workers' event loops (default: the trainer's).
    heartbeat_interval
        Seconds between heartbeats on every trainer-worker connection.
    peer_timeout
        Seconds of silence after which a peer counts as lost (a worker exits, the
        coordinator applies ``on_worker_loss``).
    listen
        Bind the coordinator here (``"tcp://0.0.0.0:5555"``; port 0 picks one, see
        ``endpoint``) so that ``asyncrl worker`` hosts can join; default: a private
        ``ipc://`` socket for the local workers only.
    remote_workers
        Remote workers to wait for (``asyncrl worker --connect ...``) besides the local
        ones.
    curve_keys
        A directory made by ``asyncrl keys generate``: CURVE encryption and
        authentication on ``listen``.
    max_message_bytes
        Largest message a listening coordinator accepts (default: derived from the batch
        and the policy's size).
    num_threads
        Torch threads of the trainer's process while the collector is open (default:
        the machine's threads minus the local workers, at least 1).
    num_sub_threads
        Torch threads of each worker (TorchRL's name, default 1).
    start_method
        ``"forkserver"`` (default: a warm fork server) or ``"spawn"``.
    trajs_per_batch, traj_format, extend_buffer
        Batches of whole trajectories (``"padded"`` with ``("collector", "mask")``, or
        ``"cat"``) and how a replay buffer is written, with TorchRL 0.14's meaning
        (``docs/batch_shapes.md``).
    **torchrl_options
        TorchRL 0.14's other collector arguments: accepted with effect or refused, see
        above.
    """

    sync: bool = True
    #: ``on_worker_loss="restart"``: how many times in a row a local slot may die
    #: before it delivered a batch; one more death fails the run (a crash loop).
    max_restarts: int = 3

    #: ``help()`` shows ``__init__``'s parameters, not ``__new__``'s (set below the classes).
    __signature__: ClassVar[Any]

    # ``MultiCollector(..., sync=False)`` is a MultiAsyncCollector, to type checkers too.
    @overload
    def __new__(cls, *args: Any, sync: Literal[False], **kwargs: Any) -> MultiAsyncCollector: ...
    @overload
    def __new__(cls, *args: Any, sync: Literal[True], **kwargs: Any) -> MultiSyncCollector: ...
    @overload
    def __new__(cls, *args: Any, sync: None = None, **kwargs: Any) -> Self: ...

    def __new__(cls, *args: Any, sync: bool | None = None, **kwargs: Any) -> Any:
        if cls is MultiCollector:
            cls = MultiSyncCollector if sync in (None, True) else MultiAsyncCollector
        elif sync is not None and bool(sync) != cls.sync:
            other = "MultiSyncCollector" if sync else "MultiAsyncCollector"
            raise ValueError(f"{cls.__name__}(sync={sync!r}) contradicts its class: use "
                             f"{other}(...) or MultiCollector(..., sync={sync!r})")
        return super().__new__(cls)

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        num_workers: int | None = None,
        sync: bool | None = None,
        policy_factory: Callable[[], Any] | str | None = None,
        frames_per_batch: int | Sequence[int],
        total_frames: int | None = -1,
        create_env_kwargs: dict[str, Any] | None = None,
        envs_per_worker: int = 1,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        reset_when_done: bool = True,
        split_trajs: bool = False,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        set_truncated: bool = False,
        exploration_type: Any = "random",
        cat_results: str | int | None = None,
        preemptive_threshold: float | None = None,
        update_at_each_batch: bool = False,
        replay_buffer: Any = None,
        extend_buffer: bool = True,
        trajs_per_batch: int | None = None,
        traj_format: str | None = None,
        weight_sync_schemes: dict[str, Any] | None = None,
        prefetch: int = 1,
        device: Any = None,
        policy_device: Any = None,
        env_device: Any = None,
        storing_device: Any = None,
        on_worker_loss: OnWorkerLoss = "raise",
        backend: str | None = None,
        heartbeat_interval: float = 1.0,
        peer_timeout: float = 10.0,
        listen: str | None = None,
        remote_workers: int = 0,
        curve_keys: str | None = None,
        max_message_bytes: int | None = None,
        num_threads: int | None = None,
        num_sub_threads: int = 1,
        start_method: str | None = None,
        **torchrl_options: Any,
    ) -> None:
        check_torchrl_options(type(self).__name__, torchrl_options, MULTI_COLLECTOR,
                              known=inspect.signature(MultiCollector.__init__).parameters)
        layout = WorkerLayout.check(create_env_fn, num_workers=num_workers,
                                    remote_workers=remote_workers,
                                    envs_per_worker=envs_per_worker, listen=listen)
        prefetch = check_int("prefetch", prefetch, minimum=1)
        on_worker_loss = check_on_worker_loss(on_worker_loss)  # type: ignore[assignment]
        check_total_frames(total_frames)
        threads = ThreadOptions.check(num_threads, num_sub_threads, start_method)
        cat_results = check_cat_results(cat_results)
        preemptive_threshold = check_preemptive_threshold(preemptive_threshold)
        frames_per_worker = split_frames(frames_per_batch, layout.total, layout.envs_per_worker,
                                         sync=self.sync)
        devices = DeviceLayout.resolve(device=device, policy_device=policy_device,
                                       env_device=env_device, storing_device=storing_device)
        rollout = RolloutOptions(
            max_frames_per_traj=max_frames_per_traj, reset_at_each_iter=reset_at_each_iter,
            reset_when_done=reset_when_done, set_truncated=set_truncated,
            exploration_type=exploration_type, **devices.for_worker().as_options())

        #: policy / env / storing devices; batches are moved to ``storing_device`` here.
        self.devices = devices
        self.num_workers = layout.num_workers
        self.remote_workers = layout.remote_workers
        self.envs_per_worker = layout.envs_per_worker
        self.prefetch = prefetch
        self.cat_results = cat_results
        self.preemptive_threshold = preemptive_threshold
        self.on_worker_loss = on_worker_loss
        self.listen = listen
        self.curve_keys = curve_keys  # a directory made by `asyncrl keys generate`
        # Largest message a listening hub takes (None: derived from what is asked, see
        # _inbound_limit); ZeroMQ holds a whole message before anyone sees its sender.
        self.max_message_bytes = max_message_bytes
        self.backend = backend
        self.num_threads = threads.num_threads
        self.num_sub_threads = threads.num_sub_threads
        self.start_method = threads.start_method
        self._threads_cap: TrainerThreads | None = None
        self._heartbeat = (heartbeat_interval, peer_timeout)
        self.frames_per_worker = frames_per_worker
        batch_frames = sum(frames_per_worker) if self.sync else frames_per_worker[0]
        super().__init__(total_frames=total_frames, batch_frames=batch_frames,
                         split_trajs=split_trajs, postproc=postproc,
                         replay_buffer=replay_buffer, update_at_each_batch=update_at_each_batch,
                         trajs_per_batch=trajs_per_batch, traj_format=traj_format,
                         extend_buffer=extend_buffer, discard_partial_trajs=reset_at_each_iter)
        self.frames_per_batch = batch_frames
        self.init_random_frames = int(init_random_frames or 0)
        self.policy = policy
        schemes = as_weight_sync_schemes(weight_sync_schemes)  # TorchRL's objects too
        if "policy" not in schemes and isinstance(policy, torch.nn.Module):
            schemes["policy"] = ZmqWeightSyncScheme()
        self.weight_sync_schemes = schemes
        envs = worker_envs(layout.create_env_fn, create_env_kwargs, layout.num_workers)
        self._spec = WorkerSpec(
            create_env_fn=envs[0][0], create_env_kwargs=envs[0][1],
            envs_per_worker=layout.envs_per_worker,
            policy=policy if policy_factory is None else None, policy_factory=policy_factory,
            rollout=rollout, weight_sync_schemes=schemes, torch_threads=threads.num_sub_threads,
        )
        # One spec per local worker (its own env factory and kwargs; the rest shared).
        self._worker_specs = [replace(self._spec, create_env_fn=fn, create_env_kwargs=kwargs)
                              for fn, kwargs in envs[:layout.num_workers]]
        if layout.num_workers:
            check_picklable(travelling(self._spec, layout.create_env_fn, create_env_kwargs,
                                       envs[:layout.num_workers]),
                            start_method=threads.start_method)
        self._senders: dict[str, WeightSender] = {}
        self._hub: Hub | None = None
        self._workers: WorkerProcesses | None = None
        self._coordinator: Coordinator | None = None
        self._tmpdir: str | None = None
        self._ready = False
        self._background: anyio.CancelScope | None = None
        self._background_done: anyio.Event | None = None
        self._restart_streak: dict[int, int] = {}  # slot -> deaths since its last batch
        if layout.num_workers and threads.start_method == "forkserver":
            # Started now (a few ms: it imports in its own process), it is warm by the
            # time the collector is opened, if the trainer has anything else to set up.
            worker_context(threads.start_method)

    def _create_async_state(self) -> None:
        super()._create_async_state()
        self._background = anyio.CancelScope()
        self._background_done = anyio.Event()

    # -- life cycle ----------------------------------------------------------------------
    async def _open(self) -> None:
        # As TorchRL: the trainer keeps the cores its local workers do not use.
        self._threads_cap = TrainerThreads.cap(self.num_threads, self.num_workers)
        await self._task_group.start(self._run_background)

    async def _run_background(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Owns the hub, the coordinator and the process watchers, in one task."""
        backend = self.backend or anyio.lowlevel.current_token().__class__.__module__
        backend = "trio" if "trio" in backend else "asyncio"
        endpoint = self.listen
        if endpoint is None or self.num_workers:
            # Private (0700): the coordinator's socket (unless `listen`) and the local
            # workers' spec; removed at close, or by the workers if the trainer dies.
            self._tmpdir = tempfile.mkdtemp(prefix="asyncrl-")
        if endpoint is None:
            endpoint = f"ipc://{self._tmpdir}/coordinator"
        interval, timeout = self._heartbeat
        token = secrets.token_hex(16)
        assert self._background is not None and self._background_done is not None
        try:
            with self._background:
                curve = CurveServer.from_dir(self.curve_keys) if self.curve_keys else None
                specs = await self._reference_specs() if self.remote_workers else None
                async with Hub(endpoint, heartbeat_interval=interval, peer_timeout=timeout,
                               curve=curve, **self._hub_limits(specs)) as hub:
                    self._hub = hub
                    coordinator = self._coordinator = self._make_coordinator(hub, token, specs)
                    for model_id, scheme in self.weight_sync_schemes.items():
                        model = self.policy if model_id == "policy" else None
                        sender = self._senders[model_id] = scheme.init_on_sender(
                            model_id, model=model, hub=hub, workers=coordinator.worker_peers)
                        sender.on_applied = self._on_weights_applied  # events, metrics
                        coordinator.attach(sender)  # relay routes, catch-up, batch counts
                    workers = self._workers = local_worker_processes(
                        hub.endpoint, self._worker_specs, self.num_workers, token=token,
                        backend=backend,
                        options={"heartbeat_interval": interval, "peer_timeout": timeout,
                                 "curve_keys": self.curve_keys,
                                 "log_config": _logs.capture()},
                        directory=self._tmpdir or "", start_method=self.start_method)
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(coordinator.run)  # hellos are answered while others spawn
                        for sender in self._senders.values():
                            tg.start_soon(sender.run)  # queued versions go out once acked
                        await tg.start(workers.run, self._on_process_death)
                        log.info("%s opened at %s: %d local worker(s) starting, %d remote "
                                 "expected", type(self).__name__, hub.endpoint,
                                 self.num_workers, self.remote_workers)
                        task_status.started()
        finally:
            self._background_done.set()

    async def _reference_specs(self) -> dict[str, Any] | None:
        """The specs remote workers must match: from one env built here, if it builds."""
        spec = self._spec

        def build() -> dict[str, Any]:
            pool = make_env_pool(spec.create_env_fn, create_env_kwargs=spec.create_env_kwargs,
                                 num_envs=spec.envs_per_worker)
            try:
                return pool.specs.to_dict()
            finally:
                pool.close()

        try:
            return await anyio.to_thread.run_sync(build)
        except Exception as exc:  # the first worker's specs become the reference
            log.warning("could not build the env here to check remote workers' specs: %s", exc)
            return None

    def _hub_limits(self, specs: dict[str, Any] | None) -> dict[str, Any]:
        if self.listen is None:
            return {}  # a private ipc socket: only our own workers can reach it
        policy = self.policy if isinstance(self.policy, torch.nn.Module) else None
        return listening_hub_limits(specs, frames=max(self.frames_per_worker), policy=policy,
                                    max_message_bytes=self.max_message_bytes)

    def _make_coordinator(self, hub: Hub, token: str,
                          specs: dict[str, Any] | None) -> Coordinator:
        return Coordinator(
            hub, sync=self.sync, frames_per_worker=self.frames_per_worker,
            prefetch=self.prefetch, preemptive_threshold=self.preemptive_threshold,
            init_random_frames=self.init_random_frames
            // max(1, self.num_workers + self.remote_workers),
            check_specs=LocalSpecsCheck(lambda: self._coordinator, bool(self.remote_workers)),
            token=token, accept_remote=self.remote_workers > 0,
            on_worker_loss=self.on_worker_loss, on_lost=self._on_worker_silent,
            on_leaving=self._on_worker_leaving,
            batch_budget=self._batch_budget(), first_remote_index=self.num_workers,
            scheme_configs={model_id: scheme.to_config()
                            for model_id, scheme in self.weight_sync_schemes.items()},
            max_remote_workers=self.remote_workers, specs=specs, publish=self._publish,
            paused=self.paused,
        )

    def _batch_budget(self) -> int | None:
        if self.sync or self.total_frames < 0:
            return None
        return self.total_frames // self.frames_per_batch

    async def _on_process_death(self, slot: int, process: Any) -> bool:
        """A local worker's process ended (reaped); returns True to respawn its slot."""
        coordinator = self._coordinator
        if self._closed or coordinator is None or coordinator.failed:
            return False
        pid, exitcode = process.pid, process.exitcode
        # statistics() and events() show it lost with its exit code, whatever follows.
        coordinator.registry.exited(pid, exitcode, f"{describe_exit(exitcode)}")
        assert self._workers is not None
        peer = self._workers.identities[process]
        if exitcode in (EXIT_ERROR, EXIT_OK):
            # It may have reported its error (type, traceback), or that it stops on
            # SIGTERM, just before exiting: that report must win, and it may still be
            # on its way. A peer the hub never heard from has nothing on its way (the
            # grace is a safety margin).
            hub = self._hub
            connected = hub is not None and (peer in hub.peers or peer in coordinator.workers)
            await coordinator.settle(peer, self._heartbeat[1] + 1.0 if connected else 1.0)
        if self._closed or coordinator.failed:
            return False
        worker = coordinator.workers.get(peer)
        if worker is not None and worker.delivered:
            self._restart_streak[slot] = 0
        restart = self.on_worker_loss == "restart"
        error = WorkerLostError(
            f"worker {slot} (pid {pid}) {describe_exit(exitcode)} before the collector was "
            f"closed: {likely_causes(exitcode)}")
        streak = self._restart_streak.get(slot, 0)
        if restart and streak >= self.max_restarts:
            coordinator.fail(WorkerLostError(
                f"worker slot {slot} died {streak + 1} times in a row without delivering a "
                f"batch (on_worker_loss='restart', max_restarts={self.max_restarts}); its "
                f"last process: {error}"))
            return False
        log.warning("%s", error)
        await coordinator.worker_exited(peer, error,
                                        replaceable=restart or self.remote_workers > 0)
        if not restart or coordinator.failed:
            return False
        self._restart_streak[slot] = streak + 1
        log.warning("restarting worker slot %d", slot)
        self._publish(CollectorEvent("restarted", worker=slot, pid=pid, exit_code=exitcode,
                                     reason=describe_exit(exitcode)))
        return True

    def _on_worker_leaving(self, worker: WorkerInfo, reason: str) -> None:
        """A worker stops on a signal: a local one stops the run (systemd's group SIGTERM)."""
        if worker.index >= self.num_workers or self._coordinator is None:
            return  # a remote host leaving: a loss, as on_worker_loss says
        worker.alive = False
        log.info("worker %d (pid %d) got %s: the collector stops", worker.index, worker.pid,
                 reason or "a signal")
        self._coordinator.fail(CollectorStopped(
            f"the collector was stopped: worker {worker.index} (pid {worker.pid}) got "
            f"{reason or 'a signal'} (systemd and `kill -TERM -PGID` stop a whole process "
            "group); make a new collector to collect again"))

    def _on_worker_silent(self, worker: WorkerInfo) -> None:
        """A worker went silent for ``peer_timeout``: "restart" replaces a local one."""
        if self.on_worker_loss != "restart" or self._workers is None or self._closed:
            return
        process = self._workers.slots.get(worker.index)
        if process is not None and process.pid == worker.pid and process.is_alive():
            # Hung or frozen: kill it; its slot's watcher respawns it (RLlib restarts
            # unhealthy env runners the same way).
            log.warning("worker %d (pid %d) is silent: killing it to restart its slot",
                        worker.index, worker.pid)
            process.kill()

    async def _ensure_ready(self) -> Coordinator:
        """The coordinator, once the run's workers have joined."""
        coordinator = self._coordinator
        if coordinator is None:
            raise CollectorError("the collector is not open: use 'async with'")
        if not self._ready:
            await coordinator.wait_for_workers(self.num_workers + self.remote_workers)
            self._ready = True
        coordinator.raise_if_failed()  # e.g. stopped (SIGTERM): every later call says so
        return coordinator

    async def _close(self) -> None:
        log.info("%s closing after %d frames", type(self).__name__, self.frames_collected)
        if self._coordinator is not None:
            await self._coordinator.close()  # wakes waiters, tells the workers to stop
        for sender in self._senders.values():
            await sender.aclose()
        if self._background is not None:
            self._background.cancel()
        if self._hub is not None and self._background_done is not None:
            with anyio.move_on_after(10):
                await self._background_done.wait()
        if self._workers is not None:
            await self._workers.stop()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        if self._threads_cap is not None:
            self._threads_cap.restore()
        log.info("%s closed", type(self).__name__)

    # -- public API ------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        """The address workers connect to (``listen``, with the real port once bound)."""
        if self._hub is None:
            raise CollectorError("the collector is not open yet: use 'async with'")
        return self._hub.endpoint

    def _worker_statistics(self) -> list[WorkerStatistics]:
        """Every admitted worker (lost ones too), then local processes still joining."""
        coordinator = self._coordinator
        if coordinator is None:
            return []
        workers = self._workers
        joining = [] if workers is None else [
            (slot, process.pid, socket.gethostname()) for slot, process in workers.slots.items()
            if process.pid is not None and process.is_alive()]
        return coordinator.registry.statistics(
            heard=coordinator.heard, routes=coordinator.relay_routes(), joining=joining)

    async def _wait_ready(self) -> None:
        await self._ensure_ready()

    def _not_ready_message(self, timeout: float | None) -> str:
        expected = self.num_workers + self.remote_workers
        coordinator = self._coordinator
        joined = 0 if coordinator is None else len(coordinator.live_workers)
        return (f"{joined} of {expected} workers joined within {timeout} s "
                f"({self.num_workers} local, {self.remote_workers} remote expected); "
                "statistics() shows who is still joining")

    @property
    def refused_peers(self) -> int:
        """Connections refused for an unauthorized CURVE key (see ``curve_keys``)."""
        return self._hub.refused_peers if self._hub is not None else 0

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the local workers (for monitoring and tests)."""
        return self._workers.pids if self._workers is not None else []

    @property
    def policy_version(self) -> int:
        """Latest version of the ``"policy"`` weights sent to the workers (0: initial)."""
        sender = self._senders.get("policy")
        return sender.version if sender is not None else 0

    def weight_sender(self, model_id: str = "policy") -> WeightSender:
        """The :class:`~asyncrl.weights.WeightSender` of ``model_id``."""
        try:
            return self._senders[model_id]
        except KeyError:
            raise KeyError(f"no weight sync scheme for model {model_id!r}; known: "
                           f"{sorted(self._senders)}; pass weight_sync_schemes="
                           "{model_id: ZmqWeightSyncScheme()}") from None

    async def update_policy_weights(self, policy_or_weights: Any = None, *, weights: Any = None,
                                    policy: Any = None, worker_ids: Any = None,
                                    model_id: str | None = None,
                                    weights_dict: dict[str, Any] | None = None) -> None:
        """Send weights to the workers and return once every targeted worker applied them.

        TorchRL's spellings: the weights (an ``nn.Module``, a TensorDict or a state
        dict; None: the registered model's) positionally or as ``weights=`` /
        ``policy=``; ``weights_dict={model_id: weights}`` for several models;
        ``{worker_index: weights}`` for per-worker weights.

        A worker lost meanwhile is handled by ``on_worker_loss``: under ``"raise"`` the
        run's error (naming the worker and how it ended) is raised; otherwise the update
        counts for the workers still in the run, and a replacement or a worker that
        rejoins gets the latest weights before its first frame.
        """
        updates = weight_updates(policy_or_weights, weights=weights, policy=policy,
                                 worker_ids=worker_ids, model_id=model_id,
                                 weights_dict=weights_dict)
        await self._ensure_ready()
        try:
            for update in updates:
                await self.weight_sender(update.model_id).send(update.weights,
                                                               worker_ids=update.worker_ids)
        except PeerLostError as exc:
            await self._after_loss_during_update(exc)

    async def _after_loss_during_update(self, error: PeerLostError) -> None:
        coordinator = self._coordinator
        assert coordinator is not None
        # The coordinator hears of the loss on its own path (the process's exit status,
        # the hub's silence): let it apply on_worker_loss first, so that the error the
        # user sees names the cause, and "continue" really continues.
        with anyio.move_on_after(self._heartbeat[1] + 1.0):
            for peer in error.peers:
                await coordinator.settle(peer, self._heartbeat[1] + 1.0)
        coordinator.raise_if_failed()
        if self.on_worker_loss == "raise":
            raise error
        log.info("weights applied by every worker still in the run; lost: %s",
                 ", ".join(p.decode(errors="replace") for p in error.peers))

    async def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every worker (TorchRL semantics); returns the next free seed.

        Worker i gets the seed the previous one returned (its envs get it plus
        their index), and seeds its torch and numpy RNGs with it, so a policy's
        sampling repeats too.
        """
        coordinator = await self._ensure_ready()
        for worker in coordinator.live_workers:
            seed = await coordinator.control(worker, "seed", seed=seed, static_seed=static_seed)
        return seed

    async def reset(self, reset_idx: Sequence[bool] | None = None) -> None:
        """Reset the envs of every worker (or of the workers flagged in ``reset_idx``)."""
        coordinator = await self._ensure_ready()
        for worker in coordinator.live_workers:
            if reset_idx is None or reset_idx[worker.index]:
                await coordinator.control(worker, "reset")
        self._trajectories_reset(partial=reset_idx is not None)

    async def state_dict(self) -> dict[str, Any]:
        """``{"worker0": {...}, ...}`` with each worker's policy state dict."""
        coordinator = await self._ensure_ready()
        return {f"worker{w.index}": await coordinator.control(w, "state_dict")
                for w in coordinator.live_workers}

    async def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        coordinator = await self._ensure_ready()
        for worker in coordinator.live_workers:
            await coordinator.control(worker, "load_state_dict",
                                      **state_dict[f"worker{worker.index}"])

    async def getattr_policy(self, attr: str) -> Any:
        """An attribute of worker 0's policy, or of its first sub-module that has it.

        ``attr`` may be dotted (``"module.0.out_features"``). Values come back as
        plain values, tensors, numpy arrays or TensorDicts (see
        :func:`asyncrl._reach.wire_value`); anything else raises a TypeError
        naming its type.
        """
        return await self._getattr("getattr_policy", attr)

    async def getattr_env(self, attr: str) -> Any:
        """An attribute of worker 0's env: the user's env, through gymnasium wrappers and
        TorchRL transforms (then asyncrl's pool: ``num_envs``); values as ``getattr_policy``."""
        return await self._getattr("getattr_env", attr)

    async def _getattr(self, op: str, attr: str) -> Any:
        coordinator = await self._ensure_ready()
        try:
            return await coordinator.control(coordinator.live_workers[0], op, attr=attr)
        except RemoteError as exc:  # the worker's AttributeError / TypeError, as such
            raise rebuild_remote_exception(exc) from exc

    def get_model(self, model_id: str = "policy") -> Any:
        """The trainer-side model registered for ``model_id``."""
        if model_id == "policy" and self.policy is not None:
            return self.policy
        return self.weight_sender(model_id).model

    async def _set_paused(self, paused: bool) -> None:
        if self._coordinator is not None:
            await self._coordinator.set_paused(paused)


class MultiSyncCollector(MultiCollector):
    """On-policy: every batch holds one share from every worker, all with the same weights.

    Workers wait for the trainer between batches, so each batch yielded after
    ``await update_policy_weights()`` returned was collected entirely with
    those weights. Shares are stacked (``cat_results="stack"`` or None, the
    default as in TorchRL: ``[workers, envs, time]``, ``[workers, time]`` with one
    env per worker) or concatenated along ``cat_results`` (0: ``[workers * envs,
    time]``; -1: ``[envs, workers * time]``; ``[workers * time]`` with one env).

    >>> async with MultiSyncCollector("CartPole-v1", num_workers=2,  # doctest: +SKIP
    ...                               envs_per_worker=4, frames_per_batch=800,
    ...                               total_frames=8000) as c:
    ...     async for batch in c:
    ...         batch.batch_size   # [workers, envs, time], as TorchRL's "stack"
    torch.Size([2, 4, 100])
    """

    sync = True

    async def _next_batch(self) -> TensorDictBase:
        coordinator = await self._ensure_ready()
        # Ask only for what total_frames still allows: a round that shrank (a lost
        # worker, on_worker_loss="continue") is made up without overshooting.
        left = self.total_frames - self.frames_collected if self.total_frames >= 0 else None
        round_ = await coordinator.next_round(left)
        return self.devices.store(assemble([frames for _, frames in round_], self.cat_results))


class MultiAsyncCollector(MultiCollector):
    """Off-policy: each batch comes from one worker, first come first served.

    Each worker runs at most ``prefetch`` batches ahead of the trainer; frames
    carry the policy version that produced them in ``("collector",
    "policy_version")``. A batch is one worker's: ``[envs, time]``, or ``[time]``
    with one env per worker (TorchRL's shapes).

    >>> async with MultiAsyncCollector("CartPole-v1", num_workers=2,    # doctest: +SKIP
    ...                                frames_per_batch=200, total_frames=2000) as c:
    ...     async for batch in c:
    ...         print(batch.batch_size, batch["collector", "policy_version"].min())
    """

    sync = False

    async def _next_batch(self) -> TensorDictBase:
        coordinator = await self._ensure_ready()
        _, frames = await coordinator.next_batch()
        # One env per worker: [time], as TorchRL's.
        return self.devices.store(drop_env_dim(frames))


for _cls in (MultiCollector, MultiSyncCollector, MultiAsyncCollector):
    show_init_signature(_cls)
for _cls in (MultiSyncCollector, MultiAsyncCollector):
    share_parameters(_cls, MultiCollector)
