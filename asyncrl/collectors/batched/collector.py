"""AsyncBatchedCollector: env worker processes, one batched policy in the trainer's process.

SEED RL's layout (Sample Factory's policy workers; TorchRL's
``AsyncBatchedCollector``): the env workers (:mod:`asyncrl._inference.env_stepper`) only
step envs; the policy lives once, here, behind a :class:`~asyncrl._inference.policy_server.
PolicyServer` that batches whatever requests are ready, from a thread of its own
(:mod:`asyncrl._inference.thread_server`) or, with ``server_backend="process"``, a
dedicated process (:mod:`asyncrl._inference.process_server`). Observations and actions go
through shared memory, requests and answers through eventfd doorbells
(:mod:`asyncrl._inference.doorbell`); so do the local env workers' chunks of
transitions (:mod:`asyncrl._inference.chunk_ring`), which are cut here into
batches of ``frames_per_batch``. ZeroMQ (one :class:`transports.Hub`) carries
errors and close, and a remote env host's requests and chunks.

This module is the collector's face: its arguments, opening (the server, the hub, the
env worker processes), its batches, weights and properties. The env workers on the
hub (their admission, their records in the registry behind ``statistics()`` and
``events()``, what they send, how they end) are :mod:`.env_hub`'s.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import torch
from anyio.abc import TaskGroup
from tensordict import TensorDictBase
from torch import nn

from transports import CurveClient, Hub

from ..._errors import BadBatchError, CollectorError
from ..._inference.chunk_buffer import ChunkBuffer, auto_chunk_steps
from ..._inference.chunk_ring import TornChunkError
from ..._inference.doorbell import spin_for
from ..._inference.inference_loop import InferenceStatistics
from ..._inference.info_columns import InfoColumn
from ..._inference.local_channels import LocalChannels, probe_env
from ..._inference.outputs import OutputLayout
from ..._inference.policy_server import PolicyCopy, PolicyServer, ServerHooks, ServingSetup
from ..._inference.remote_env_hosts import RemoteEnvWorkers, hub_keys
from ..._inference.served_weights import ServedWeights, given_weights
from ..._observe.statistics import WorkerStatistics
from ..._rollout.infos import normalise_info_keys
from ..._rollout.keys import NestedKey
from ..._rollout.policies import ExplorationType
from ..._spawn.forkserver import check_start_method
from ..._spawn.processes import WorkerProcesses
from .._base import RB, BaseCollector
from .._config import check_int
from .._env_factories import check_picklable
from .._limits import listening_hub_limits
from .._started import started_at_call
from .arguments import (
    BatchingConfig,
    check_env_kwargs,
    check_policy,
    check_remote,
    check_server_backend,
    check_serving_device,
    env_factories,
    from_server_config,
    policy_server_type,
    refuse_torchrl_only,
    split_envs,
)
from .env_hub import EnvHub, FaceHooks
from .local_workers import LocalEnvWorkers

Path = tuple[str, ...]


class AsyncBatchedCollector(BaseCollector[RB]):
    """Env workers in processes, the policy once in this process, batched across workers.

    Choose it when the policy is big (or on a GPU) and envs are cheap: one call on
    ``max_batch_size`` observations instead of one small call per worker. TorchRL's
    arguments: ``create_env_fn`` is a list of env factories (one per env), or one
    factory / gym id with ``num_envs``; ``policy`` or ``policy_factory``;
    ``max_batch_size`` / ``min_batch_size`` (observations per policy call) and
    ``server_timeout`` (seconds to wait for ``min_batch_size``);
    ``static_batch_size`` (TorchRL's ``InferenceServerConfig`` field, with
    ``device="cuda"``): the policy is captured once in a CUDA graph of that many
    rows and every call, padded to it, is one replay (``max_batch_size`` defaults
    to it); ``envs_per_worker``
    envs share a process and a request, or ``worker_num_splits`` equal requests
    (Sample Factory's double buffering: one split steps while the policy serves
    another); with ``listen="tcp://HOST:PORT"`` and
    ``remote_workers=K``, up to K ``asyncrl worker --role env`` processes on other
    hosts join at a time (a dropped one's slot goes to the next to join; their
    observations travel inline, checked; ``num_envs=0``: remote env hosts only;
    ``curve_keys``: a directory made by
    ``asyncrl keys generate`` encrypts and authenticates them); ``num_threads`` caps
    torch's threads in this process while open (default: the cores the env workers
    leave). ``server_backend="process"`` serves the policy from a dedicated process
    (TorchRL's ``InferenceServerConfig(service_backend="process")``, accepted as
    ``server_config``; it serves remote env hosts too): collection goes on while a
    training step holds this process's event loop. Batches are flat
    ``[frames_per_batch]`` TensorDicts in TorchRL's layout: ``frames_per_batch`` counts
    the transitions of all envs together, in the order they complete (not per env nor
    per worker), every frame stamped with the version of the weights that chose its
    action (``("collector", "policy_version")``). ``compact_obs=True``: batches without
    the ``("next", K)`` twins of observation keys (TorchRL's meaning, as on the other
    collectors); the env workers, remote hosts too (their welcome says so), then neither
    write them into their chunks nor hold them in their rings, and the trainer's chunk
    buffer holds each observation once. With
    ``replay_buffer`` (anything with ``.extend(td)``), as in TorchRL, iteration writes
    each batch there and yields None; ``start()`` fills it in the background.
    ``info_keys`` (as on the other collectors, ``docs/gymnasium.md``): the named entries
    of the envs' ``info`` dicts, ``batch["next", k][t]`` the info of the step that
    produced frame t; their specs are learned from one step of the env built for the
    layouts (or given) and reach every env worker, remote hosts too in their welcome.

    Every env worker, local or remote, is a row of ``statistics().workers`` and its
    joins, refusals, departures and losses are ``events()``, as a MultiSyncCollector's
    workers are (the same registry): index ``SLOT`` and name ``env-SLOT`` (the
    ``worker_id`` of its frames), ``frames`` and ``batches`` what it sent (frames, chunks),
    ``"collecting"`` from its admission, ``"lost"`` once its process ended (with its exit
    code) or its host was lost, ``"left"`` when a host said goodbye.

    Processes: ``num_envs / envs_per_worker`` env workers; ``envs_per_worker=1`` by
    default, one process per env, as TorchRL's ``AsyncBatchedCollector`` steps each env
    on its own worker. Kept because it is what batching across envs is for: an env
    that is slow for a step (a reset, a long physics step) holds back only itself while
    the policy serves the others, and the layout (processes, ``traj_ids``,
    ``statistics()`` rows) is the same on every machine. Its cost is a process per env
    (they share the fork server's imported pages; each holds its own env). With more
    envs than cores, pass ``envs_per_worker=None``: one process per core, its envs in
    two splits so that one half steps while the policy serves the other (measured on
    real Atari, 8 envs on 2 cores: 11 % more frames/s, less CPU and memory;
    ``docs/inference.md``); ``docs/gymnasium.md`` (Atari) says which collector suits
    which machine.

    >>> async with AsyncBatchedCollector("Pendulum-v1", num_envs=4,          # doctest: +SKIP
    ...                                  policy=policy, frames_per_batch=256,
    ...                                  total_frames=2048) as collector:
    ...     async for batch in collector:
    ...         train(batch)
    ...         await collector.update_policy_weights()   # returns once they are in use
    """

    _drop_next_obs = False  # (read by the compact_obs setter, before __init__ sets it)

    def __init__(
        self,
        create_env_fn: Any,
        *,
        policy: Callable[..., Any] | nn.Module | None = None,
        policy_factory: Callable[[], Any] | None = None,
        frames_per_batch: int,
        total_frames: int | None = -1,
        num_envs: int | None = None,
        device: torch.device | str | None = None,
        max_batch_size: int | None = None,
        min_batch_size: int | None = None,
        server_timeout: float | None = None,
        static_batch_size: int | None = None,
        envs_per_worker: int | None = 1,
        worker_num_splits: int | None = 1,
        transition_chunk_size: int | str = "auto",
        replay_buffer: RB | None = None,
        yield_completed_trajectories: bool = False,
        exploration_type: ExplorationType | str | None = ExplorationType.RANDOM,
        create_env_kwargs: Mapping[str, Any] | None = None,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        post_collect_hook: Callable[[TensorDictBase], None] | None = None,
        split_trajs: bool = False,
        policy_version: int = 0,
        verbose: bool = False,
        num_threads: int | None = None,
        start_method: str | None = None,
        heartbeat_interval: float = 1.0,
        peer_timeout: float = 10.0,
        listen: str | None = None,
        remote_workers: int = 0,
        curve_keys: str | None = None,
        server_backend: str = "thread",
        server_config: Any = None,
        compact_obs: bool = False,
        info_keys: Sequence[NestedKey] | Mapping[NestedKey, Any] | None = None,
        **torchrl_options: Any,
    ) -> None:
        if server_config is not None:
            (server_backend, max_batch_size, min_batch_size, server_timeout,
             static_batch_size) = from_server_config(
                server_config, server_backend=server_backend,
                max_batch_size=max_batch_size, min_batch_size=min_batch_size,
                server_timeout=server_timeout, static_batch_size=static_batch_size)
        self.compact_obs = compact_obs  # checked by the setter (BaseCollector)
        refuse_torchrl_only(torchrl_options)
        check_policy(policy, policy_factory)
        self.frames_per_batch = check_int("frames_per_batch", frames_per_batch, minimum=1)
        self.remote_workers = check_int("remote_workers", remote_workers, minimum=0)
        self.factories = env_factories(create_env_fn, num_envs,
                                       remote_workers=self.remote_workers)
        # The env built once here for the layouts (num_envs=0: remote env hosts only).
        self._probe_factory = self.factories[0] if self.factories else create_env_fn
        self.num_envs = len(self.factories)
        self.batching = BatchingConfig.check(
            num_envs=self.num_envs, max_batch_size=max_batch_size,
            min_batch_size=min_batch_size, server_timeout=server_timeout,
            envs_per_worker=envs_per_worker, transition_chunk_size=transition_chunk_size,
            worker_num_splits=worker_num_splits, static_batch_size=static_batch_size)
        self.create_env_kwargs = check_env_kwargs(create_env_kwargs)
        #: The info entries each frame records (normalised: ``((path, spec or None), ...)``).
        self.info_keys = normalise_info_keys(info_keys)
        self.device = check_serving_device(device, self.batching.static_batch_size)
        self.policy = policy
        self.policy_factory = policy_factory
        self.exploration_type = exploration_type
        self.yield_completed_trajectories = bool(yield_completed_trajectories)
        self.post_collect_hook = post_collect_hook
        self.start_method = check_start_method(start_method)
        self.num_threads = None if num_threads is None else check_int(
            "num_threads", num_threads, minimum=1)
        self.verbose = verbose
        self._heartbeat = (heartbeat_interval, peer_timeout)
        self._weights = ServedWeights(
            version=check_int("policy_version", policy_version, minimum=0), verbose=verbose)
        check_remote(listen, self.remote_workers, curve_keys)
        self.listen, self.curve_keys = listen, curve_keys
        self.server_backend = check_server_backend(server_backend)
        self._server_type = policy_server_type(self.server_backend)
        if self._server_type.pickles_policy:
            check_picklable([("policy_factory", policy_factory), ("policy", policy)],
                            start_method=self.start_method)
        self._server: PolicyServer | None = None
        self._info_columns: list[InfoColumn] = []  # decided once open (_build_server)
        super().__init__(total_frames=total_frames, frames_per_batch=self.frames_per_batch,
                         split_trajs=split_trajs, postproc=self._postprocess,
                         replay_buffer=replay_buffer)
        self._user_postproc = postproc
        self.groups = split_envs(self.factories, self.batching.envs_per_worker)
        self.num_workers = len(self.groups)
        # The local env workers and the loop wait on each other: spin only if each has a core.
        self._spin = spin_for(self.num_workers + 1)
        # (remote env hosts only: at least one env per remote worker)
        self.chunk_steps = self.batching.chunk_steps or auto_chunk_steps(
            self.frames_per_batch, self.num_envs or self.remote_workers)
        self._channels = LocalChannels()  # the local env workers' blocks, bells, rings
        self._frames = ChunkBuffer(
            chunk_steps=self.chunk_steps, trajectories=self.yield_completed_trajectories,
            capacity=max(2 * self.frames_per_batch, 2 * self.num_envs * self.chunk_steps))
        #: The env workers on the hub: admission, roster, registry (statistics() rows and
        #: events), their messages, chunks, errors and exits.
        self._env_hub = EnvHub(
            num_workers=self.num_workers, chunk_steps=self.chunk_steps,
            peer_timeout=peer_timeout, frames=self._frames, channels=self._channels,
            publish=self._publish, face=FaceHooks(
                fail=self._fail, wake=self._wake, closing=lambda: self._closing,
                room=self._room_for_more, update_room=self._update_room))
        self._local = LocalEnvWorkers(
            groups=self.groups, create_env_kwargs=self.create_env_kwargs,
            chunk_steps=self.chunk_steps, heartbeat=self._heartbeat, spin=self._spin,
            splits=self.batching.splits, start_method=self.start_method,
            token=self._env_hub.token)
        # Set once open:
        self._workers: WorkerProcesses | None = None
        self._hub: Hub | None = None
        self._tmpdir: str | None = None
        self._local_keys: CurveClient | None = None  # its processes' key for a CURVE hub
        self._error: BaseException | None = None
        self._closing = False
        self._arrived: anyio.Event | None = None
        self._background: anyio.CancelScope | None = None
        self._background_done: anyio.Event | None = None

    # -- life cycle ----------------------------------------------------------------------------
    def _create_async_state(self) -> None:
        super()._create_async_state()
        self._arrived = anyio.Event()
        self._background = anyio.CancelScope()
        self._background_done = anyio.Event()

    async def _open(self) -> None:
        await self._open_with_workers(self._run_background, num_threads=self.num_threads,
                                      local_workers=self.num_workers)

    async def _run_background(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        assert self._background is not None and self._background_done is not None
        backend = anyio.lowlevel.current_token().__class__.__module__
        backend = "trio" if "trio" in backend else "asyncio"
        try:
            with self._background:
                self._tmpdir = tempfile.mkdtemp(prefix="asyncrl-")
                curve, self._local_keys = hub_keys(self.listen, self.curve_keys)
                obs_paths, outputs, server = await anyio.to_thread.run_sync(self._build_server)
                interval, timeout = self._heartbeat
                endpoint, limits = f"ipc://{self._tmpdir}/inference", {}
                if self.listen is not None:  # remote env hosts join: admission, bounded sizes
                    endpoint, limits = self.listen, listening_hub_limits(
                        None, frames=self.batching.max_batch_size * self.chunk_steps,
                        policy=None)
                    limits["curve"] = curve
                async with Hub(endpoint, heartbeat_interval=interval,
                               peer_timeout=timeout, **limits) as hub:
                    self._hub = self._env_hub.hub = hub
                    env_hub = self._env_hub
                    self._workers = self._local.processes(
                        hub.endpoint, backend, obs_paths, outputs, self._channels,
                        env_hub.peer_of, self._local_keys, self._info_columns,
                        next_observations=not self._drop_next_obs)
                    async with anyio.create_task_group() as tg:
                        if env_hub.remote is not None:
                            self._serve_remote_calls(env_hub.remote, hub, tg)
                        tg.start_soon(env_hub.dispatch, hub)
                        tg.start_soon(env_hub.read_local_chunks)
                        hooks = ServerHooks(
                            fail=self._fail, closing=lambda: self._closing,
                            answered=env_hub.reply_remote if env_hub.remote is not None
                            else None)
                        await server.start(tg, hub, backend, hooks)
                        await tg.start(self._workers.run, env_hub.on_process_exit)
                        task_status.started()
        finally:
            self._background_done.set()

    def _workers_drop_twins(self) -> bool:
        return self._drop_next_obs  # opened with compact_obs=True: no chunk holds the twins

    def _serve_remote_calls(self, remote: RemoteEnvWorkers, hub: Hub, tg: TaskGroup) -> None:
        """Remote env hosts call the served modules open in this process now, over their
        link (their welcome names them): as a MultiCollector's remote hosts do."""
        from ...served._remote_calls import open_module_calls

        router = self._served_router = open_module_calls(hub, self._publish)
        if router is None:
            return
        remote.served_routes = [calls.route.to_config() for calls in router.modules.values()]
        remote.served_call = router.on_message
        for calls in router.modules.values():
            tg.start_soon(calls.run)

    def _build_server(self) -> tuple[list[Path], OutputLayout, PolicyServer]:
        """In a thread: one env for the layouts, the server's policy, the env workers'
        channels, the remote env hosts' slots, and the server (not started yet).

        With ``server_backend="process"`` the policy built here (on the CPU) only finds
        the outputs' layout and checks weights; the loop runs in the inference process.
        """
        obs, spec, infos = probe_env(self._probe_factory, self.create_env_kwargs,
                                     self.info_keys)
        self._info_columns = infos
        # compact_obs as it is when opened: the env workers' chunks then hold no
        # ("next", obs) twins, in their rings, messages and this process's chunk buffer.
        self._drop_next_obs = self.compact_obs
        policy, outputs = PolicyCopy.make(
            self.policy, self.policy_factory, device=self._server_type.copy_device(self.device),
            action_spec=spec, exploration_type=self.exploration_type, obs=obs)
        self._channels.make(
            [len(g) for g in self.groups], obs, outputs, splits=self.batching.splits,
            chunk_steps=self.chunk_steps, frames_per_batch=self.frames_per_batch,
            flat=not self.yield_completed_trajectories, infos=infos,
            next_observations=not self._drop_next_obs)
        self._env_hub.setup(obs, outputs, max_envs=self.batching.max_batch_size,
                            remote_workers=self.remote_workers, env_id=self._probe_factory,
                            submit_remote=self._submit_remote,
                            version=lambda: self.policy_version, infos=infos,
                            compact_obs=self._drop_next_obs)
        server = self._server = self._server_type.create(self._serving_setup(obs, outputs),
                                                         policy)
        self._weights.server = self._env_hub.server = server
        return list(obs), outputs, server

    def _serving_setup(self, obs: dict[Path, torch.Tensor],
                       outputs: OutputLayout) -> ServingSetup:
        channels, b = self._channels, self.batching
        assert channels.request_bell is not None
        return ServingSetup(
            blocks=channels.blocks, request_bell=channels.request_bell,
            answer_bells=channels.answer_bells, obs_paths=list(obs),
            obs_spec=[(t.dtype, tuple(t.shape[1:])) for t in obs.values()], outputs=outputs,
            device=self.device, max_batch_size=b.max_batch_size,
            min_batch_size=b.min_batch_size, server_timeout=b.server_timeout,
            static_batch_size=b.static_batch_size, version=self._weights.initial_version,
            threads=None if self._threads_cap is None else self._threads_cap.now,
            spin=self._spin, first_remote_slot=self.num_workers if self.remote_workers else None,
            heartbeat=self._heartbeat, start_method=self.start_method,
            local_keys=self._local_keys)

    async def _close(self) -> None:
        self._closing = True
        hub = self._hub
        if hub is not None and self._server is not None:
            with anyio.move_on_after(1):
                await self._env_hub.say_close(hub)
        if self._workers is not None:
            await self._workers.stop(grace=2.0)
            self._env_hub.processes_ended(self._workers)  # their rows: lost, exit codes
        if self._server is not None:  # a thread's loop has left once close() returns (or 5 s)
            await self._server.close()
        if self._background is not None:
            self._background.cancel()
        if self._background_done is not None and self._hub is not None:
            with anyio.move_on_after(10):
                await self._background_done.wait()
        self._frames.let_go()  # chunks held in the rings: unmapped now
        self._channels.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        self._wake()

    async def _submit_remote(self, slot: int) -> None:
        """A remote env host's request (its observations, checked, in its inline block)."""
        if self._server is not None:
            await self._server.submit_remote(slot)

    # -- failures and wake-ups -----------------------------------------------------------------
    def _fail(self, error: BaseException) -> None:
        if self._error is None and not self._closing:
            self._error = error
        if self._server is not None:
            self._server.abort(self._error or error)
        self._wake()

    def _wake(self) -> None:
        if self._arrived is not None:
            self._arrived.set()

    def _worker_statistics(self) -> list[WorkerStatistics]:
        """Every env worker admitted, local and remote, lost ones too, by slot; and the
        local processes still joining (:meth:`.env_hub.EnvHub.rows`)."""
        return self._env_hub.rows(self._workers, self._hub)

    def _room_for_more(self) -> bool:
        """Whether the env workers may be answered: room for frames, and not paused."""
        return not self._frames.full and not self.paused

    async def _set_paused(self, paused: bool) -> None:
        # Paused, the server answers no more requests (past the call under way): the
        # env workers wait at their next step; what was answered is collected and held.
        await self._update_room(wait=paused)

    async def _update_room(self, *, wait: bool = False) -> None:
        if self._server is not None and self._hub is not None:
            await self._server.set_room(self._room_for_more(), wait=wait)

    # -- batches --------------------------------------------------------------------------------
    async def _next_batch(self) -> TensorDictBase:
        if self._task_group is None:
            raise CollectorError("the collector is not open: use 'async with'")
        while not self._frames.ready(self.frames_per_batch):
            if self._error is not None:
                raise self._error
            if self._closing:
                raise CollectorError("the collector is closed")
            self._arrived = anyio.Event()
            await self._arrived.wait()
        if self._error is not None:
            raise self._error
        try:
            batch = self._frames.take(self.frames_per_batch)
        except TornChunkError as exc:  # (copied out of a ring slot its worker rewrote)
            self._fail(BadBatchError(str(exc)))
            raise self._error or BadBatchError(str(exc)) from None
        if self._channels.chunk_bell is not None and self._channels.readers:
            self._channels.chunk_bell.ring()  # room again: chunks left in the rings are taken now
        if self.split_trajs:
            # A trajectory's chunks may lie apart in the batch (other workers' between
            # them): bring each one's frames together, in order, before splitting.
            order = torch.argsort(batch["collector", "traj_ids"], stable=True)
            batch = batch[order]
        await self._update_room()
        return batch

    async def _anext(self) -> TensorDictBase | None:
        batch = await super()._anext()
        # (None: a base collector that fills the buffer itself already did)
        if batch is not None and self.replay_buffer is not None and not self._running_free:
            # TorchRL's meaning: with a replay buffer, iteration writes into it and
            # yields None (start() writes there itself, in the background).
            self.replay_buffer.extend(batch)
            return None
        return batch

    def _postprocess(self, batch: TensorDictBase) -> TensorDictBase:
        if self._user_postproc is not None:
            batch = self._user_postproc(batch)
        if self.post_collect_hook is not None:
            self.post_collect_hook(batch)
        return batch

    # -- weights and statistics ----------------------------------------------------------------
    #: An update started without ``await`` does not hold the next batch: its frames
    #: carry the version that chose their actions.
    sync_updates = False

    @property
    def policy_version(self) -> int:
        """The version of the weights the inference loop uses now."""
        return self._weights.version

    def inference_statistics(self) -> InferenceStatistics:
        """Policy calls so far, observations served, and how many calls had each batch size.

        With ``server_backend="process"``: the process's latest report (at most 0.2 s old).
        """
        return self._weights.statistics()

    # The signature of the multi-process collectors (TorchRL's names, asyncrl's weights=).
    @started_at_call("update")
    async def update_policy_weights(self, policy_or_weights: Any = None, *, weights: Any = None,
                                    policy: Any = None, worker_ids: Any = None,
                                    model_id: str | None = None,
                                    weights_dict: dict[str, Any] | None = None) -> None:
        """Load new weights into the served policy between two calls; return once in use.

        The weights (positionally, or as ``weights=`` / ``policy=``, TorchRL's names):
        None (copy them from the ``policy`` given to the constructor, the one you
        train), an ``nn.Module``, a state dict, or a TensorDict of parameters
        (``TensorDict.from_module``). Every frame whose action the next calls choose
        is stamped with the new version (see :attr:`policy_version`).

        ``model_id=name`` (or ``weights_dict={name: w}``) with any other name than
        ``"policy"`` updates the :class:`~asyncrl.ServedModule` open under that name (a
        reward model the envs call), as a MultiCollector's ``ServedModuleScheme`` does.

        >>> await collector.update_policy_weights(policy)   # doctest: +SKIP
        >>> collector.policy_version, collector.inference_statistics().calls  # doctest: +SKIP
        (1, 412)
        """
        from ...served._by_name import update_served_by_name

        rest = await update_served_by_name(policy_or_weights, weights=weights, policy=policy,
                                           worker_ids=worker_ids, model_id=model_id,
                                           weights_dict=weights_dict)
        if rest is None:
            return  # served modules only
        weights = given_weights(rest.policy_or_weights, weights=rest.weights,
                                policy=rest.policy, worker_ids=rest.worker_ids,
                                model_id=rest.model_id, weights_dict=rest.weights_dict)
        await self._weights.update(weights, trained=self.policy, run_error=self._error)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live env workers, in slot order."""
        return self._workers.pids if self._workers is not None else []

    @property
    def inference_pid(self) -> int | None:
        """The dedicated inference process's id (None: served from a thread of this one)."""
        return self._server.pid if self._server is not None else None

    @property
    def endpoint(self) -> str:
        """The address remote env workers connect to (``listen``, its real port once open)."""
        if self._hub is None:
            raise CollectorError("the collector is not open yet: use 'async with'")
        return self._hub.endpoint

    def _served_refusals(self) -> dict[str, int]:
        router = getattr(self, "_served_router", None)  # (set once remote hosts are served)
        return router.refusals.counts() if router is not None else {}

    @property
    def remote_refusals(self) -> list[str]:
        """Why each refused or dropped remote env worker was (the run went on without it)."""
        remote = self._env_hub.remote
        return list(remote.refusals) if remote is not None else []


__all__ = ["AsyncBatchedCollector"]
