"""The in-process collector: envs and policy in the trainer's process, stepped in a thread."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar, Literal, Self, overload

import anyio
import torch
from tensordict import TensorDictBase

from .._errors import CollectorError
from .._rollout.devices import place_policy
from .._rollout.env_state import env_roots, load_env_state, read_env_state
from .._rollout.envs import make_env_pool
from .._rollout.loop import Rollout
from .._rollout.plain_policies import NestedKey
from .._rollout.reach import env_attr, policy_attr
from .._rollout.seeding import seed_global_rngs
from .._worker.spec import WorkerSpec
from ..weights import InProcessWeightSyncScheme, WeightApplier, WeightSender
from ._assemble import drop_env_dim
from ._base import RB, BaseCollector
from ._config import (
    check_in_process_frames,
    check_rollout,
    constructor_arguments,
)
from ._docs import add_parameters, show_init_signature
from ._env_statistics import EnvStatistics
from ._parameters import IN_PROCESS_PARAMETERS
from ._started import started_at_call
from ._torchrl_args import IN_PROCESS_COLLECTOR, check_torchrl_options
from ._torchrl_dispatch import dispatch
from ._updates import weight_updates


class Collector(BaseCollector[RB]):
    """Collect in the caller's process: ``async for batch in Collector(...)``.

    The rollout runs in a worker thread so the event loop stays free. The
    policy object is shared with the trainer: ``update_policy_weights()``
    without weights only bumps the version (no copy); with weights it copies
    them in. ``weight_sender()`` gives the same sends as a
    :class:`~asyncrl.weights.WeightSender` (``send_async`` / ``wait_ack``,
    over :class:`~asyncrl.weights.InProcessWeightSyncScheme`): an update is
    applied at the next step boundary of a batch in progress, or at once
    between batches, and acked with its version. ``replay_buffer``,
    ``trajs_per_batch`` and ``traj_format`` as in :class:`MultiCollector`.

    >>> async with Collector("CartPole-v1", frames_per_batch=200,    # doctest: +SKIP
    ...                      total_frames=1000) as collector:
    ...     async for batch in collector:
    ...         print(batch["next", "reward"].sum())

    TorchRL's ``Collector`` arguments: ``return_same_td=True`` yields the rollout's
    own buffers (rewritten by the next batch) instead of a copy; ``backend="direct"``
    is this collector; as in TorchRL 0.14, ``backend="process"`` or
    ``num_collectors=N`` builds a worker-process collector instead:
    ``Collector(..., num_collectors=N, sync=True)`` is a :class:`MultiSyncCollector`
    with N workers, ``sync=False`` (TorchRL's default) a :class:`MultiAsyncCollector`
    (``_torchrl_dispatch.py``); ``interruptor`` is refused naming
    ``preemptive_threshold``; the rest as in :class:`MultiCollector` (table in
    ``_torchrl_args.py``). ``set_seed`` seeds this process's torch and numpy RNGs too.

    ``device`` / ``policy_device`` / ``env_device`` / ``storing_device`` as in
    :class:`MultiCollector` (``docs/devices.md``); a trainer's module that is not
    on ``policy_device`` stays where it is and the rollout steps with a copy there.
    """

    # The Parameters section of help(): IN_PROCESS_PARAMETERS (_parameters.py), added below.

    #: ``help()`` shows ``__init__``'s parameters, not ``__new__``'s (set below the class).
    __signature__: ClassVar[Any]

    # TorchRL 0.14's front door: backend="process" / num_collectors=N give a MultiCollector.
    @overload
    def __new__(cls, *args: Any, backend: Literal["direct"] | None = None,
                num_collectors: Literal[1] | None = None, sync: None = None,
                backend_options: None = None, **kwargs: Any) -> Self: ...
    @overload
    def __new__(cls, *args: Any, backend: str | None = None, num_collectors: int | None = None,
                sync: bool | None = None, backend_options: dict[str, Any] | None = None,
                **kwargs: Any) -> Any: ...

    def __new__(cls, *args: Any, backend: str | None = None, num_collectors: int | None = None,
                sync: bool | None = None, backend_options: dict[str, Any] | None = None,
                **kwargs: Any) -> Any:
        if cls is Collector:
            built = dispatch(args, kwargs, backend=backend, num_collectors=num_collectors,
                             sync=sync, backend_options=backend_options)
            if built is not None:
                return built  # not a Collector: Python does not call __init__ again
        return super().__new__(cls)

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        policy_factory: Callable[[], Any] | str | None = None,
        policy_in_keys: Sequence[NestedKey] | None = None,
        policy_out_keys: Sequence[NestedKey] | None = None,
        policy_method: str | None = None,
        info_keys: Sequence[NestedKey] | Mapping[NestedKey, Any] | None = None,
        frames_per_batch: int,
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
        update_at_each_batch: bool = False,
        replay_buffer: RB | None = None,
        extend_buffer: bool = True,
        trajs_per_batch: int | None = None,
        traj_format: str | None = None,
        device: Any = None,
        policy_device: Any = None,
        env_device: Any = None,
        storing_device: Any = None,
        return_same_td: bool = False,
        compact_obs: bool = False,
        **torchrl_options: Any,
    ) -> None:
        arguments = constructor_arguments(locals())  # first: only the arguments
        check_torchrl_options(type(self).__name__, torchrl_options, IN_PROCESS_COLLECTOR,
                              known=inspect.signature(Collector.__init__).parameters)
        frames_per_batch, envs_per_worker = check_in_process_frames(frames_per_batch,
                                                                    envs_per_worker)
        devices, rollout = check_rollout(arguments, worker_devices=False)
        #: policy / env / storing devices (batches are stored on ``storing_device``).
        self.devices = devices

        super().__init__(total_frames=total_frames, frames_per_batch=frames_per_batch,
                         split_trajs=split_trajs, postproc=postproc,
                         replay_buffer=replay_buffer, update_at_each_batch=update_at_each_batch,
                         trajs_per_batch=trajs_per_batch, traj_format=traj_format,
                         extend_buffer=extend_buffer, discard_partial_trajs=reset_at_each_iter)
        self.frames_per_batch = frames_per_batch
        self.compact_obs = compact_obs  # checked by the setter (BaseCollector)
        self.init_random_frames = int(init_random_frames or 0)
        self._spec = WorkerSpec(
            create_env_fn=create_env_fn, create_env_kwargs=create_env_kwargs,
            envs_per_worker=envs_per_worker, policy=policy, policy_factory=policy_factory,
            rollout=rollout,
        )
        self.policy = policy
        # TorchRL's meaning: yield the rollout's own tensordict, rewritten in place by
        # the next batch (no copy); by default each batch is the trainer's to keep.
        self.return_same_td = bool(return_same_td)
        #: The policy the rollout steps with: ``policy`` itself, or its copy on policy_device.
        self.rollout_policy: Any = None
        self.rollout: Rollout | None = None
        self._env_statistics = EnvStatistics()  # the base of sync_env_statistics' merges
        self._lock: anyio.Lock | None = None  # held while a batch is collected
        self._scheme = InProcessWeightSyncScheme()
        self._sender: WeightSender | None = None
        self._applier: WeightApplier | None = None  # with a sender: an nn.Module policy

    def _create_async_state(self) -> None:
        super()._create_async_state()
        self._lock = anyio.Lock()

    def _locked(self) -> anyio.Lock:
        if self._lock is None:
            raise RuntimeError("the collector is not open: use 'async with Collector(...)'")
        return self._lock

    @property
    def policy_version(self) -> int:
        """The version stamped on the frames collected next (0 until the first update)."""
        return 0 if self.rollout is None else self.rollout.policy_version

    async def _open(self) -> None:
        self.rollout = await anyio.to_thread.run_sync(self._build)
        if isinstance(self.policy, torch.nn.Module):
            # Updates are read from the trainer's module and copied into the rollout's
            # (nothing to copy when the two are one object).
            self._sender = self._scheme.init_on_sender("policy", model=self.policy)
            self._sender.on_applied = self._on_weights_applied  # events(), metrics
            receiver = self._scheme.init_on_worker("policy", model=self.rollout_policy,
                                                   deliver=self._on_weights)
            assert receiver.link is not None
            # Applied at once while no batch runs, else at the batch's next step boundary.
            self._applier = WeightApplier(receiver.link, busy=self._locked().locked)
            self._applier.add(receiver)
            self._applier.attach(self.rollout)
            self._task_group.start_soon(self._applier.send_acks)

    def _on_weights(self, message: Any) -> None:
        # Called inside the sender's send_async, in the event loop.
        assert self._applier is not None
        self._applier.deliver(message)

    def _build(self) -> Rollout:
        spec = self._spec
        pool = make_env_pool(spec.create_env_fn, create_env_kwargs=spec.create_env_kwargs,
                             num_envs=spec.envs_per_worker)
        if self.policy is None:
            self.policy = spec.make_policy()  # our own: moved to policy_device in place
        # The trainer's module stays where it is (as in TorchRL): a copy on policy_device.
        policy = self.rollout_policy = place_policy(self.policy, self.devices.policy_device,
                                                    copy_module=True)
        return Rollout(pool, policy, self.frames_per_batch, worker_index=0,
                       init_random_frames=self.init_random_frames, options=spec.rollout)

    async def _close(self) -> None:
        if self._applier is not None:
            self._applier.close()
        if self.rollout is not None:
            self.rollout.close()

    async def _next_batch(self) -> TensorDictBase:
        rollout = self.rollout
        if rollout is None:
            raise CollectorError("the collector is not open: iterate inside "
                                 "'async with Collector(...) as collector:'")
        async with self._locked():
            # The rollout reuses its buffers: hand out a copy the trainer may keep (one
            # moved to storing_device is already a copy).
            moved = self.devices.storing_device not in (None, torch.device("cpu"))
            collect = rollout.collect if self.return_same_td or moved else (
                lambda: rollout.collect().clone())
            batch = await anyio.to_thread.run_sync(collect)
            batch = drop_env_dim(batch)  # one env: [time], as TorchRL's unbatched env
            if self._applier is not None:
                self._applier.after_batch()
            return batch

    def _weight_senders(self) -> dict[str, Any]:
        return {} if self._sender is None else {self._sender.model_id: self._sender}

    def weight_sender(self, model_id: str = "policy") -> WeightSender:
        """The :class:`~asyncrl.weights.WeightSender` of the policy (an ``nn.Module``)."""
        if model_id != "policy":
            raise KeyError(f"the in-process collector has only the 'policy' model, "
                           f"not {model_id!r} (a served module has no sender: "
                           f"update_policy_weights(w, model_id={model_id!r}) updates the "
                           "one open in this process)")
        if self._sender is None:
            raise KeyError("no weight sender: the collector is not open yet, or its policy is "
                           f"not an nn.Module ({type(self.policy).__name__}); "
                           "update_policy_weights() still bumps the version")
        return self._sender

    @started_at_call("update")
    async def update_policy_weights(self, policy_or_weights: Any = None, *, weights: Any = None,
                                    policy: Any = None, worker_ids: Any = None,
                                    model_id: str | None = None,
                                    weights_dict: dict[str, Any] | None = None) -> None:
        """Apply the weights (or nothing, when the trainer updates this very policy).

        Returns once the collector applied them: at once between batches, at the
        next step boundary while a batch is being collected. TorchRL's spellings
        (``weights=``, ``policy=``, ``weights_dict=``) are accepted.

        ``model_id=name`` (or ``weights_dict={name: w}``) with any other name than
        ``"policy"`` updates the :class:`~asyncrl.ServedModule` open in this process under
        that name (a reward model the envs call), as a MultiCollector's
        ``ServedModuleScheme`` does; ``info_keys=[served.handle.info_key]`` records its
        version in every frame.

        >>> await collector.update_policy_weights(reward_model, model_id=name)  # doctest: +SKIP
        """
        from ..served._by_name import update_served_by_name

        rest = await update_served_by_name(policy_or_weights, weights=weights, policy=policy,
                                           worker_ids=worker_ids, model_id=model_id,
                                           weights_dict=weights_dict)
        if rest is None:
            return  # served modules only
        for update in weight_updates(rest.policy_or_weights, weights=rest.weights,
                                     policy=rest.policy, worker_ids=rest.worker_ids,
                                     model_id=rest.model_id, weights_dict=rest.weights_dict):
            await self._update_policy(update.model_id, update.weights)

    async def _update_policy(self, model_id: str, weights: Any) -> None:
        if model_id != "policy":
            raise KeyError(f"the in-process collector has only the 'policy' model, "
                           f"not {model_id!r}")
        if self._sender is not None:
            await self._sender.send(None if weights is self.policy else weights)
            return
        if self.rollout is None:
            raise RuntimeError("the collector is not open: use 'async with Collector(...)'")
        self.rollout.policy_version += 1  # a policy without weights: a new version

    @started_at_call("barrier")
    async def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the envs (env i: ``seed + i``) and this process's torch and numpy RNGs.

        The global RNGs are seeded so that a stochastic policy's sampling repeats
        (two runs with the same seed give the same batches); returns the next seed.
        """
        async with self._locked():
            assert self.rollout is not None
            seed_global_rngs(seed)
            return self.rollout.set_seed(seed, static_seed)

    @started_at_call("barrier")
    async def reset(self, reset_idx: Any = None) -> None:
        assert self.rollout is not None
        async with self._locked():
            self.rollout.reset(reset_idx)
        self._trajectories_reset(partial=reset_idx is not None)

    @started_at_call("query")
    async def getattr_env(self, attr: str, worker_ids: Sequence[int] | None = None) -> Any:
        """An attribute of the user's env, reached as ``MultiCollector.getattr_env`` does.

        In process, the object itself comes back (nothing crosses a wire). This
        collector is worker 0: ``worker_ids=[0]`` gives ``[value]``.
        """
        rollout = self._open_rollout()
        if worker_ids is not None and any(i != 0 for i in worker_ids):
            raise ValueError(f"getattr_env({attr!r}, worker_ids={list(worker_ids)}): an "
                             "in-process Collector is worker 0 alone; use worker_ids=[0]")
        async with self._locked():
            value = env_attr(rollout.env_pool, attr)
        return value if worker_ids is None else [value for _ in worker_ids]

    @started_at_call("query")
    async def sync_env_statistics(self) -> dict[str, Any]:
        """Merge the running observation statistics of this collector's envs (one
        ``NormalizeObservation`` per env) and write the merge back to each; returns it.

        As :meth:`MultiCollector.sync_env_statistics` (docs/gymnasium.md).
        """
        rollout = self._open_rollout()
        async with self._locked():
            roots = env_roots(rollout.env_pool)
            states: dict[Hashable, tuple[int, Any]] = {0: (0, read_env_state(roots))}
            merged, updates, _ = self._env_statistics.merge(states)  # raises if refused
            load_env_state(roots, updates[0])
            self._env_statistics.merged(merged, states)
        return merged.to_stats()

    @started_at_call("query")
    async def getattr_policy(self, attr: str) -> Any:
        """An attribute of the policy (or of its first sub-module that has it)."""
        rollout = self._open_rollout()
        return policy_attr(self.policy if self.policy is not None else rollout.stepped_policy,
                           attr)

    def _open_rollout(self) -> Rollout:
        if self.rollout is None:
            raise RuntimeError("the collector is not open: use 'async with Collector(...)'")
        return self.rollout

    def get_model(self, model_id: str = "policy") -> Any:
        if model_id != "policy":
            raise KeyError(model_id)
        return self.policy

    def state_dict(self) -> dict[str, Any]:
        """TorchRL's keys: ``policy_state_dict`` (a module policy's) and, once open,
        ``env_state_dict`` (wrappers' running statistics, :mod:`asyncrl._rollout.env_state`)."""
        policy = self.policy
        state: dict[str, Any] = {"policy_state_dict": policy.state_dict()} if isinstance(
            policy, torch.nn.Module) else {}
        if self.rollout is not None:
            env_state = read_env_state(env_roots(self.rollout.env_pool))
            if any(env_state.values()):
                state["env_state_dict"] = env_state
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "env_state_dict" in state_dict:
            load_env_state(env_roots(self._open_rollout().env_pool),
                           state_dict["env_state_dict"])
        if isinstance(self.policy, torch.nn.Module) and "policy_state_dict" in state_dict:
            self.policy.load_state_dict(state_dict["policy_state_dict"])
            if self.rollout_policy is not None and self.rollout_policy is not self.policy:
                self.rollout_policy.load_state_dict(state_dict["policy_state_dict"])


add_parameters(Collector, IN_PROCESS_PARAMETERS)
show_init_signature(Collector)
