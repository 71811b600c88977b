"""Multi-process collectors: a coordinator in the trainer, workers in other processes."""

from __future__ import annotations

import functools
import inspect
import logging
import shutil
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Literal, Self, overload

import anyio
from tensordict import TensorDictBase

from transports import PeerLostError, RemoteError

from ..._coordinator.coordinator import Coordinator
from ..._coordinator.loss_policy import OnWorkerLoss
from ..._errors import CollectorError, rebuild_remote_exception
from ..._observe.statistics import CollectorStatistics, WorkerStatistics
from ..._rollout.plain_policies import NestedKey
from ..._spawn.forkserver import worker_context
from ..._worker.spec import WorkerSpec
from ...weights import WeightSender
from .._assemble import InfoCheck, drop_env_dim
from .._base import RB, BaseCollector
from .._config import constructor_arguments
from .._docs import add_parameters, share_parameters, show_init_signature
from .._parameters import MULTI_PARAMETERS
from .._staleness import StalePolicyWatch
from .._started import started_at_call
from .._torchrl_args import MULTI_COLLECTOR, check_torchrl_options
from .._updates import weight_updates
from .config import MultiConfig, config_view, default_schemes
from .env_state import WorkerEnvState
from .losses import WorkerLosses
from .run import MultiRun, run_background

log = logging.getLogger("asyncrl.collectors")


class MultiCollector(BaseCollector[RB]):
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
    dead local worker cannot be replaced (a wait is bounded by ``replacement_timeout``,
    and says so while it lasts); ``"restart"`` respawns a local worker's
    slot (a silent one is killed first), at most ``max_restarts`` times in a row
    without a delivered batch, and waits for a remote one as ``"wait"`` does.
    A worker that owes a batch and steps no env for ``sample_timeout`` seconds
    (its env's ``step()`` or its policy hangs, while its heartbeats go on) is lost
    the same way; a slow batch whose steps return is not.

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
    messages are in ``asyncrl/collectors/_torchrl_args.py``). Every argument that changes
    what the collector does is in the signature (``help()``, ``inspect.signature``); these
    are taken only at values that change nothing here, or refused:

    - ``collector_class``: None or TorchRL's ``Collector`` (what a worker is); others refused.
    - ``use_buffers``: None / True (asyncrl always preallocates); False refused.
    - ``track_policy_version``: True / False; frames always carry
      ``("collector", "policy_version")``.
    - ``auto_register_policy_transforms``: None / False; True refused (add the transforms in
      ``create_env_fn``).
    - ``no_cuda_sync``: False; True refused (no extra synchronisation to skip).
    - ``weight_sync_schemes``: TorchRL's ``MultiProcessWeightSyncScheme`` becomes
      ``ZmqWeightSyncScheme``, ``SharedMemWeightSyncScheme``, ``DistributedWeightSyncScheme``
      and ``NoWeightSyncScheme`` their asyncrl namesakes; ``sync=False``,
      ``per_worker_weights=True``, RPC / Ray schemes are refused naming the replacement.
    - Refused, naming the asyncrl way: ``trust_policy``, ``compile_policy`` and
      ``cudagraph_policy`` (wrap the policy in ``policy_factory``), ``weight_updater`` and
      ``weight_recv_schemes`` (``weight_sync_schemes``), ``worker_idx``, ``trajs_per_write``,
      ``init_fn`` (``create_env_fn`` / ``policy_factory``), ``pre_collect_hook`` /
      ``post_collect_hook`` (``postproc``).
    - Methods with TorchRL's names: ``update_policy_weights(policy_or_weights, *, weights,
      policy, worker_ids, model_id, weights_dict)`` and ``update_policy_weights_``,
      ``shutdown()`` / ``async_shutdown()`` (``aclose``), ``set_seed``, ``reset``: each starts
      when called, awaited or not (``_started.py``); ``set_seed`` seeds each worker's torch
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
    """

    # The Parameters section of help(): MULTI_PARAMETERS (_parameters.py), added below.

    sync: bool = True
    #: ``on_worker_loss="restart"``: how many times in a row a local slot may die
    #: before it delivered a batch; one more death fails the run (a crash loop).
    max_restarts: int = 3

    #: ``help()`` shows ``__init__``'s parameters, not ``__new__``'s (set below the classes).
    __signature__: ClassVar[Any]

    # ``MultiCollector(..., sync=False)`` is a MultiAsyncCollector, to type checkers too.
    @overload
    def __new__(cls, *args: Any, sync: Literal[False],
                **kwargs: Any) -> MultiAsyncCollector[RB]: ...
    @overload
    def __new__(cls, *args: Any, sync: Literal[True], **kwargs: Any) -> MultiSyncCollector[RB]: ...
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
        policy_in_keys: Sequence[NestedKey] | None = None,
        policy_out_keys: Sequence[NestedKey] | None = None,
        policy_method: str | None = None,
        info_keys: Sequence[NestedKey] | Mapping[NestedKey, Any] | None = None,
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
        replay_buffer: RB | None = None,
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
        sample_timeout: float | None = 60.0,
        replacement_timeout: float | None = 300.0,
        startup_timeout: float | None = 300.0,
        listen: str | None = None,
        remote_workers: int = 0,
        curve_keys: str | None = None,
        max_message_bytes: int | None = None,
        shared_memory_batches: bool = True,
        compact_obs: bool = False,
        num_threads: int | None = None,
        num_sub_threads: int = 1,
        start_method: str | None = None,
        **torchrl_options: Any,
    ) -> None:
        arguments = constructor_arguments(locals())  # first: only the arguments
        check_torchrl_options(type(self).__name__, torchrl_options, MULTI_COLLECTOR,
                              known=inspect.signature(MultiCollector.__init__).parameters)
        #: The arguments, checked once (:class:`~.config.MultiConfig`, frozen): the run and
        #: the coordinator read it whole; the attributes below are views of it.
        self.config = config = MultiConfig.check(type(self).__name__, self.sync, arguments)
        super().__init__(total_frames=total_frames, frames_per_batch=config.frames_per_batch,
                         split_trajs=split_trajs, postproc=postproc,
                         replay_buffer=replay_buffer, update_at_each_batch=update_at_each_batch,
                         trajs_per_batch=trajs_per_batch, traj_format=traj_format,
                         extend_buffer=extend_buffer, discard_partial_trajs=reset_at_each_iter)
        self.frames_per_batch = config.frames_per_batch
        self.compact_obs = config.coordinator.compact_obs  # as the welcomes will say
        self.policy = policy
        self._info_check = InfoCheck(config.rollout.info_keys)  # what workers send, checked
        self.weight_sync_schemes = default_schemes(weight_sync_schemes, policy)
        self._stale_watch = StalePolicyWatch.for_collector(policy, self.weight_sync_schemes,
                                                           type(self).__name__)
        config.plan_schemes(self.weight_sync_schemes)  # before the specs are pickled
        spec, worker_specs = config.worker_specs(
            policy=policy, policy_factory=policy_factory, create_env_kwargs=create_env_kwargs,
            schemes=self.weight_sync_schemes)
        self._run = MultiRun(
            config, spec=spec, worker_specs=worker_specs, schemes=self.weight_sync_schemes,
            policy=policy, publish=self._publish, on_weights_applied=self._on_weights_applied,
            max_restarts=lambda: self.max_restarts)
        self._losses = WorkerLosses(self._run)  # on_worker_loss, applied
        self._env_state = WorkerEnvState()  # env state read, merged, carried to replacements
        self._ready = False
        if config.layout.num_workers and config.threads.start_method == "forkserver":
            # Started now (a few ms: it imports in its own process), it is warm by the
            # time the collector is opened, if the trainer has anything else to set up.
            worker_context(config.threads.start_method)

    # -- the arguments, as checked (views of ``config``) ------------------------------------
    num_workers = config_view(lambda c: c.layout.num_workers)
    remote_workers = config_view(lambda c: c.layout.remote_workers)
    envs_per_worker = config_view(lambda c: c.layout.envs_per_worker)
    share_frames = config_view(lambda c: list(c.coordinator.share_frames))
    prefetch = config_view(lambda c: c.coordinator.prefetch)
    cat_results = config_view(lambda c: c.coordinator.cat_results)
    preemptive_threshold = config_view(lambda c: c.coordinator.preemptive_threshold)
    on_worker_loss = config_view(lambda c: c.coordinator.loss_policy.on_worker_loss)
    init_random_frames = config_view(lambda c: c.init_random_frames)
    devices = config_view(lambda c: c.devices)
    listen = config_view(lambda c: c.listen)
    curve_keys = config_view(lambda c: c.curve_keys)
    max_message_bytes = config_view(lambda c: c.max_message_bytes)
    backend = config_view(lambda c: c.backend)
    num_threads = config_view(lambda c: c.threads.num_threads)
    num_sub_threads = config_view(lambda c: c.threads.num_sub_threads)
    start_method = config_view(lambda c: c.threads.start_method)

    def _create_async_state(self) -> None:
        super()._create_async_state()
        self._run.background = anyio.CancelScope()
        self._run.background_done = anyio.Event()

    @property
    def _spec(self) -> WorkerSpec:
        """The spec every worker shares (as :class:`~asyncrl.Collector`'s own)."""
        return self._run.spec

    def _workers_drop_twins(self) -> bool:
        return self.config.coordinator.compact_obs  # every welcome says so (compact_obs=True)

    # -- life cycle ----------------------------------------------------------------------
    async def _open(self) -> None:
        run = functools.partial(run_background, self._run, self._losses, type(self).__name__,
                                self.paused)
        await self._open_with_workers(run, num_threads=self.num_threads,
                                      local_workers=self.num_workers)

    async def _ensure_ready(self) -> Coordinator:
        """The coordinator, once the run's workers have joined."""
        coordinator = self._run.coordinator
        if coordinator is None:
            raise CollectorError("the collector is not open: use 'async with'")
        if not self._ready:
            await coordinator.wait_for_workers(self.num_workers + self.remote_workers)
            self._ready = True
        coordinator.raise_if_failed()  # e.g. stopped (SIGTERM): every later call says so
        return coordinator

    async def _close(self) -> None:
        log.info("%s closing after %d frames", type(self).__name__, self.frames_collected)
        run = self._run
        run.closing = True
        if run.coordinator is not None:
            # Wakes waiters, tells the workers to stop: to go home if the run is over,
            # else (SIGTERM, an error, a close before the end) to wait for the next trainer.
            finished = 0 <= self.total_frames <= self.frames_collected
            await run.coordinator.close(finished=finished)
        for sender in run.senders.values():
            await sender.aclose()
        if run.background is not None:
            run.background.cancel()
        if run.hub is not None and run.background_done is not None:
            with anyio.move_on_after(10):
                await run.background_done.wait()
        if run.workers is not None:
            await run.workers.stop()
        if run.tmpdir is not None:
            shutil.rmtree(run.tmpdir, ignore_errors=True)
        log.info("%s closed", type(self).__name__)

    # -- public API ------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        """The address workers connect to (``listen``, with the real port once bound)."""
        if self._run.hub is None:
            raise CollectorError("the collector is not open yet: use 'async with'")
        return self._run.hub.endpoint

    def statistics(self) -> CollectorStatistics:
        stats = super().statistics()
        coordinator = self._run.coordinator  # how batches came: shared memory, the socket
        return stats if coordinator is None else replace(stats, **coordinator.batches.counts())

    def _served_refusals(self) -> dict[str, int]:
        router = self._run.served_router
        return router.refusals.counts() if router is not None else {}

    def _worker_statistics(self) -> list[WorkerStatistics]:
        """Every admitted worker (lost ones too), then local processes still joining."""
        coordinator = self._run.coordinator
        if coordinator is None:
            return []
        workers = self._run.workers
        joining = [] if workers is None else [
            (slot, process.pid, socket.gethostname()) for slot, process in workers.slots.items()
            if process.pid is not None and process.is_alive()]
        return coordinator.registry.statistics(
            heard=coordinator.heard, routes=coordinator.roster.relay_routes(), joining=joining,
            waiting=coordinator.state.losses.waiting_for())

    def _run_failed(self) -> bool:
        coordinator = self._run.coordinator
        return coordinator is not None and coordinator.run_failed

    def _waiting_for_workers(self) -> bool:
        coordinator = self._run.coordinator
        if coordinator is None:
            return False
        losses = coordinator.state.losses
        return (losses.expected > 0 and losses.missing_workers() > 0) or bool(losses.waiting_for())

    async def _wait_ready(self) -> None:
        await self._ensure_ready()

    def _not_ready_message(self, timeout: float | None) -> str:
        expected = self.num_workers + self.remote_workers
        coordinator = self._run.coordinator
        joined = 0 if coordinator is None else len(coordinator.roster.live_workers)
        return (f"{joined} of {expected} workers joined within {timeout} s "
                f"({self.num_workers} local, {self.remote_workers} remote expected); "
                "statistics() shows who is still joining")

    @property
    def refused_peers(self) -> int:
        """Connections refused for an unauthorized CURVE key (see ``curve_keys``)."""
        hub = self._run.hub
        return hub.refused_peers if hub is not None else 0

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the local workers (for monitoring and tests)."""
        workers = self._run.workers
        return workers.pids if workers is not None else []

    @property
    def policy_version(self) -> int:
        """Latest version of the ``"policy"`` weights sent to the workers (0: initial)."""
        sender = self._run.senders.get("policy")
        return sender.version if sender is not None else 0

    def _weight_senders(self) -> dict[str, Any]:
        return dict(self._run.senders)

    def weight_sender(self, model_id: str = "policy") -> WeightSender:
        """The :class:`~asyncrl.weights.WeightSender` of ``model_id``."""
        try:
            return self._run.senders[model_id]
        except KeyError:
            raise KeyError(f"no weight sync scheme for model {model_id!r}; known: "
                           f"{sorted(self._run.senders)}; pass weight_sync_schemes="
                           "{model_id: ZmqWeightSyncScheme()}") from None

    @started_at_call("update")
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
            await self._losses.during_update(exc)

    @started_at_call("barrier")
    async def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every worker (TorchRL semantics); returns the next free seed.

        Worker i gets the seed the previous one returned (its envs get it plus
        their index), and seeds its torch and numpy RNGs with it, so a policy's
        sampling repeats too.
        """
        coordinator = await self._ensure_ready()
        for worker in coordinator.roster.live_workers:
            seed = await coordinator.control(worker, "seed", seed=seed, static_seed=static_seed)
        return seed

    @started_at_call("barrier")
    async def reset(self, reset_idx: Sequence[bool] | None = None) -> None:
        """Reset the envs of every worker (or of the workers flagged in ``reset_idx``)."""
        coordinator = await self._ensure_ready()
        for worker in coordinator.roster.live_workers:
            if reset_idx is None or reset_idx[worker.index]:
                await coordinator.control(worker, "reset")
        self._trajectories_reset(partial=reset_idx is not None)

    @started_at_call("query")
    async def state_dict(self) -> dict[str, Any]:
        """``{"worker0": {"policy_state_dict": ..., "env_state_dict": ...}, ...}`` (TorchRL's
        keys): each live worker's policy and env state (wrappers' running statistics,
        see :mod:`asyncrl._rollout.env_state`). The env state read last is given to a
        worker that replaces that one, before its first batch."""
        return await self._env_state.state_dict(await self._ensure_ready())

    @started_at_call("barrier")
    async def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Write what :meth:`state_dict` returned (or a part of each entry) into the workers."""
        await self._env_state.load_state_dict(await self._ensure_ready(), state_dict)

    @started_at_call("query")
    async def sync_env_statistics(self) -> dict[str, Any]:
        """Merge every worker's running observation statistics (``NormalizeObservation``'s
        ``obs_rms``) and send the merge back to each; returns it (``mean``, ``var``, ``count``).

        As RLlib's synchronised filters: call it between batches (docs/gymnasium.md).
        """
        return await self._env_state.sync(await self._ensure_ready())

    @started_at_call("query")
    async def getattr_policy(self, attr: str) -> Any:
        """An attribute of worker 0's policy, or of its first sub-module that has it.

        ``attr`` may be dotted (``"module.0.out_features"``). Values come back as
        plain values, tensors, numpy arrays or TensorDicts (see
        :func:`asyncrl._rollout.reach.wire_value`); anything else raises a TypeError
        naming its type.
        """
        return await self._getattr("getattr_policy", attr)

    @started_at_call("query")
    async def getattr_env(self, attr: str, worker_ids: Sequence[int] | None = None) -> Any:
        """An attribute of worker 0's env: the user's env, through gymnasium wrappers and
        TorchRL transforms (then asyncrl's pool: ``num_envs``); values as ``getattr_policy``,
        a ``RunningMeanStd`` (``obs_rms``) as a dict of its ``mean``, ``var`` and ``count``.
        ``worker_ids``: a list with each named worker's answer, in that order (as
        gymnasium's ``VectorEnv.get_attr``)."""
        return await self._env_state.getattr_env(await self._ensure_ready(), attr, worker_ids)

    async def _getattr(self, op: str, attr: str) -> Any:
        coordinator = await self._ensure_ready()
        try:
            return await coordinator.control(coordinator.roster.live_workers[0], op, attr=attr)
        except RemoteError as exc:  # the worker's AttributeError / TypeError, as such
            raise rebuild_remote_exception(exc) from exc

    def get_model(self, model_id: str = "policy") -> Any:
        """The trainer-side model registered for ``model_id``."""
        if model_id == "policy" and self.policy is not None:
            return self.policy
        return self.weight_sender(model_id).model

    async def _set_paused(self, paused: bool) -> None:
        if self._run.coordinator is not None:
            await self._run.coordinator.set_paused(paused)


class MultiSyncCollector(MultiCollector[RB]):
    """On-policy: every batch holds one share from every worker, all with the same weights.

    Workers wait for the trainer between batches, so each batch yielded after
    ``await update_policy_weights()`` returned was collected entirely with
    those weights. Shares are stacked (``cat_results="stack"`` or None, the
    default as in TorchRL: ``[workers, envs, time]``, ``[workers, time]`` with one
    env per worker) or concatenated along ``cat_results`` (0: ``[workers * envs,
    time]``; -1: ``[envs, workers * time]``; ``[workers * time]`` with one env).

    ``frames_per_batch`` is the whole yielded batch: each worker collects its share,
    ``frames_per_batch / workers`` (local and remote; or one int per worker).

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
        for worker, frames in round_:
            self._info_check.check(f"worker {worker.index}", frames)
        return self.devices.store(coordinator.batches.join([frames for _, frames in round_]))


class MultiAsyncCollector(MultiCollector[RB]):
    """Off-policy: each batch comes from one worker, first come first served.

    Each worker runs at most ``prefetch`` batches ahead of the trainer; frames
    carry the policy version that produced them in ``("collector",
    "policy_version")``. A batch is one worker's: ``[envs, time]``, or ``[time]``
    with one env per worker (TorchRL's shapes).

    ``frames_per_batch`` is per worker, not split as in :class:`MultiSyncCollector`:
    each yielded batch is one worker's ``frames_per_batch`` frames, and every worker
    collects that many per batch (TorchRL's meaning). Two workers with
    ``frames_per_batch=200`` yield batches of 200, each from one of them.

    >>> async with MultiAsyncCollector("CartPole-v1", num_workers=2,    # doctest: +SKIP
    ...                                frames_per_batch=200, total_frames=2000) as c:
    ...     async for batch in c:
    ...         print(batch.batch_size, batch["collector", "policy_version"].min())
    """

    sync = False
    sync_updates = False

    async def _next_batch(self) -> TensorDictBase:
        coordinator = await self._ensure_ready()
        worker, frames = await coordinator.next_batch()
        self._info_check.check(f"worker {worker.index}", frames)
        # One env per worker: [time], as TorchRL's.
        return self.devices.store(drop_env_dim(frames))


add_parameters(MultiCollector, MULTI_PARAMETERS)
for _cls in (MultiCollector, MultiSyncCollector, MultiAsyncCollector):
    show_init_signature(_cls)
for _cls in (MultiSyncCollector, MultiAsyncCollector):
    share_parameters(_cls, MultiCollector)
