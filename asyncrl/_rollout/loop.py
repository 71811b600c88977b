"""The rollout hot loop: step an `EnvPool` with a policy into preallocated buffers.

A step creates no TensorDict, tensor, dict or list of ours: it calls the policy on
the step TensorDict, copies fixed ``(destination, source)`` pairs into ``[N, T]``
buffers and steps the pool in place. What those buffers are and which pairs a step
writes is planned once, at construction (:mod:`asyncrl._rollout.buffers`); this
module runs batches over that plan, resets the episodes that end, and stops at a
step boundary when asked.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torch import nn

from .._errors import SpecMismatchError
from .buffers import Observations, RolloutBuffers
from .device_policy import check_policy_device
from .env_pools import EnvPool, check_action_dtype
from .envs import make_env_pool
from .infos import attach_info_reader
from .options import RolloutOptions
from .policies import PolicyAdapter, RandomPolicy
from .recurrent import RecurrentCarry, describe_states, find_state_keys
from .traj_ids import TrajectoryIds

__all__ = ["Rollout", "RolloutOptions"]

_DEFAULT_OPTIONS = RolloutOptions()


class Rollout:
    """Collects ``frames_per_batch`` frames from an env pool into a reused TensorDict.

    ``collect()`` returns a TensorDict of batch size ``[N, T]`` (``N`` envs,
    ``T = frames_per_batch // N`` steps) in TorchRL's layout, with
    ``("collector", "traj_ids" | "worker_id" | "policy_version")``. It is a view
    of this rollout's buffers: **valid until the next** ``collect()``; copy or
    encode it before collecting again.

    Episodes that end inside a batch are reset at once (``("next", obs)`` is
    the terminal observation, the following frame's ``obs`` the reset one).
    ``options`` (:class:`RolloutOptions`) carries TorchRL's six rollout options,
    checked where they were built. ``before_step``, if set, is called at every step
    boundary before the policy runs; a change of ``policy_version`` made there
    is stamped from that frame on. ``next_observations=False`` (TorchRL's
    ``compact_obs=True``) leaves out ``("next", obs)``: neither kept nor written.

    >>> from asyncrl._rollout.envs import make_env_pool
    >>> rollout = Rollout(make_env_pool("CartPole-v1", num_envs=2), None, frames_per_batch=8)
    >>> _ = rollout.set_seed(0)
    >>> batch = rollout.collect()
    >>> batch.batch_size, batch["next", "reward"].shape
    (torch.Size([2, 4]), torch.Size([2, 4, 1]))
    >>> rollout.close()
    """

    def __init__(
        self,
        env_pool: EnvPool | Any,
        policy: Callable[..., Any] | nn.Module | None,
        frames_per_batch: int,
        *,
        worker_index: int = 0,
        init_random_frames: int | None = 0,
        options: RolloutOptions = _DEFAULT_OPTIONS,
        next_observations: bool = True,
    ) -> None:
        self.next_observations = next_observations  # False: a frame copy per step less
        pool = env_pool if isinstance(env_pool, EnvPool) else make_env_pool(env_pool)
        try:
            self._init(pool, policy, frames_per_batch, worker_index, init_random_frames, options)
        except BaseException:
            if pool is not env_pool:  # we built it: don't leak its envs
                pool.close()
            raise

    def _init(
        self,
        pool: EnvPool,
        policy: Callable[..., Any] | nn.Module | None,
        frames_per_batch: int,
        worker_index: int,
        init_random_frames: int | None,
        options: RolloutOptions,
    ) -> None:
        n = pool.num_envs
        _check_args(frames_per_batch, n, worker_index, init_random_frames)
        if not isinstance(options, RolloutOptions):
            raise TypeError(f"options must be a RolloutOptions, got {type(options).__name__}")
        if options.max_frames_per_traj is not None and not pool.supports_partial_reset:
            raise ValueError(
                "max_frames_per_traj needs an env pool that can reset single envs; "
                f"{type(pool).__name__} cannot"
            )
        self.env_pool = pool
        self.num_envs = n
        self.frames_per_batch = frames_per_batch
        self.steps_per_batch = frames_per_batch // n
        self.worker_index = worker_index
        self.options = options
        self.init_random_frames = init_random_frames or 0
        #: Stamped into every frame; bump it (e.g. in ``before_step``) when weights change.
        self.policy_version: int = 0
        #: Called at each step boundary before the policy runs (weight receivers use it).
        self.before_step: Callable[[], None] | None = None
        #: Env steps returned so far, all batches: another thread reads it (progress).
        self.steps_done = 0

        specs = pool.specs
        # A recurrent policy's state and is_init are the rollout's, even where the
        # env observes them too (a TorchRL env with a primer and InitTracker).
        state_keys = () if policy is None else find_state_keys(policy)
        self._carry = (
            RecurrentCarry(describe_states(policy, state_keys), n) if state_keys else None
        )
        observations = Observations.of(
            pool, self._carry.paths if self._carry is not None else frozenset())
        check_policy_device(policy, options.policy_device)
        if self._carry is not None and options.devices.moves_observations:
            # The carry keeps the state in host buffers the policy reads in place; a copy
            # of the step on another device would leave it behind.
            raise ValueError(
                f"a recurrent policy (state {sorted(map(str, state_keys))}) on "
                f"policy_device={options.policy_device} is not supported yet: run it on the "
                "host (policy_device='cpu'), where its state is carried step to step")
        self._adapter = PolicyAdapter(
            policy,
            action_spec=specs.action,
            exploration_type=options.exploration_type,
            observation_keys=observations.keys,
            in_keys=options.policy_in_keys,
            out_keys=options.policy_out_keys,
            method=options.policy_method,
        )
        # A random policy samples straight into the action buffer, skipping the td;
        # another policy gets a private RandomPolicy for init_random_frames.
        # set_seed seeds the random policies we made, never a user's own.
        self._owns_random = not isinstance(policy, RandomPolicy)
        adapted = self._adapter.policy
        self._random = adapted if isinstance(adapted, RandomPolicy) else RandomPolicy(specs.action)
        self._closed = False
        self._frames = 0  # frames collected so far (init_random_frames counts these)
        self._traj_ids = TrajectoryIds(n, tag=worker_index)
        self._traj_fresh = True  # ids not used by any frame yet: a full reset keeps them
        self._steps = np.zeros(n, dtype=np.int64)
        self._done = np.zeros(n, dtype=bool)
        self._trunc = np.zeros(n, dtype=bool)
        self._hit = np.zeros(n, dtype=bool)

        # request_stop() comes from another thread; it swaps before_step for a hook
        # that raises, so stopping costs the hot loop nothing beyond its None check.
        self._stop_lock = threading.Lock()
        self._stop_armed = False
        self._saved_before_step: Callable[[], None] | None = None

        info = attach_info_reader(pool, options.info_keys)
        pool.reset()
        #: The batch buffers and what each step writes where, planned once.
        self.buffers = RolloutBuffers(
            pool, self._adapter, self._carry, observations, options=options,
            steps=self.steps_per_batch, worker_index=worker_index, info=info,
            next_observations=self.next_observations,
            truncated=self._trunc if options.max_frames_per_traj else pool.truncated)

    # -- collection ------------------------------------------------------------------------

    @property
    def stepped_policy(self) -> Any:
        """What this rollout steps with: the user's policy in its adapter, or the
        RandomPolicy it made for ``policy=None`` (``getattr_policy`` reads it)."""
        return self._adapter

    def collect(self, max_steps: int | None = None) -> TensorDictBase:
        """Run one batch; return ``[N, T]`` frames viewing our buffers (valid until next call).

        After `request_stop`, or past ``max_steps`` steps, the batch ends early:
        ``[N, t]`` with ``t < T`` (``max_steps=0``: an empty batch, envs untouched).
        """
        if self._closed:
            raise RuntimeError("Rollout.collect() after close()")
        options = self.options
        if options.reset_at_each_iter:
            self.reset()
        t_total, n = self.steps_per_batch, self.num_envs
        n_random = t_total
        if not self._adapter.is_random:
            n_random = min(t_total, max(0, math.ceil((self.init_random_frames - self._frames) / n)))
        buffers = self.buffers
        buffers.pv.fill(self.policy_version)
        buffers.traj[...] = self._traj_ids.current[:, None]
        try:
            with self._adapter.exploration():
                steps = self._run(
                    n_random, t_total if max_steps is None else max(0, min(t_total, max_steps))
                )
        finally:
            self._disarm_stop()
        if buffers.flush_extras is not None:
            buffers.flush_extras()
        np.logical_or(buffers.next_terminated, buffers.next_truncated, out=buffers.next_done)
        self._frames += steps * n
        self._traj_fresh = False
        if options.set_truncated and steps:
            # Mark the batch end as a truncation for value bootstrapping; the env
            # itself goes on (TorchRL's set_truncated).
            buffers.next_truncated[:, steps - 1] = True
            buffers.next_done[:, steps - 1] = True
        out = buffers.template.copy()  # fresh structure: keys a consumer adds don't stick
        if steps < t_total:
            out = out[:, :steps]
        device = options.storing_device
        if device is not None:
            out = out.to(device)  # off the host a copy; on it only the td's device is set
        return out

    def request_stop(self) -> None:
        """End the running (or the next) `collect` at a step boundary; thread-safe.

        The batch returned is then shorter (``[N, t]``, maybe ``t == 0``); used
        for preemption. A request made before `collect` starts applies to it, so
        a stop that races with the start of a batch is never lost.
        """
        with self._stop_lock:
            if not self._stop_armed:
                self._stop_armed = True
                self._saved_before_step = self.before_step
                self.before_step = _raise_stop

    def _disarm_stop(self) -> None:
        with self._stop_lock:
            if self._stop_armed:
                self._stop_armed = False
                self.before_step = self._saved_before_step
                self._saved_before_step = None

    def _run(self, n_random: int, n_steps: int) -> int:
        """The hot loop; returns the number of steps run. Its names are bound up front."""
        buffers = self.buffers
        pool, idx, pre, post = self.env_pool, buffers.idx, buffers.pre, buffers.post
        step_env, sample = pool.step_inplace, self._random.sample_into
        step_td, act_t, act_np = buffers.step_td, buffers.act_t, buffers.act_np
        policy, extras, pv, done = buffers.call, buffers.extras, buffers.pv, self._done
        limit = self.options.max_frames_per_traj
        carry = self._carry
        version = self.policy_version
        t = 0
        try:
            for t in range(n_steps):
                if self.before_step is not None:
                    self.before_step()
                    if self.policy_version != version:
                        version = self.policy_version
                        pv[:, t:] = version
                i = idx[t]
                if t < n_random:
                    sample(act_np)
                    for _key, dst, _ in extras:
                        dst[i] = 0
                    if carry is not None:
                        carry.keep(i)
                else:
                    td = policy(step_td)  # step_td, or its copy on policy_device
                    action = td.get("action")
                    if action is not act_t:
                        if action.dtype is not act_t.dtype:  # rare: never cast floats silently
                            check_action_dtype(pool.specs.action, action.dtype, action.detach())
                        act_t.copy_(action)
                    for key, dst, as_numpy in extras:
                        dst[i] = td.get(key).numpy() if as_numpy else td.get(key)
                    if carry is not None:
                        carry.take(i, step_td)
                for dst, src in pre:
                    dst[i] = src
                step_env(act_np)
                self.steps_done += 1  # a plain int: the worker's progress reports read it
                if limit:
                    self._apply_limit(limit)  # before `post`: it edits truncated
                    for dst, src in post:
                        dst[i] = src
                    if done.any():
                        self._reset_done(done, t)
                else:
                    for dst, src in post:
                        dst[i] = src
                    if pool.any_done:
                        np.logical_or(pool.terminated, pool.truncated, out=done)
                        self._reset_done(done, t)
        except _StopCollect:
            return t
        except SpecMismatchError as exc:  # an env returned what its spec does not say
            raise SpecMismatchError(f"worker {self.worker_index}, {exc}") from None
        return n_steps

    def _apply_limit(self, limit: int) -> None:
        np.add(self._steps, 1, out=self._steps)
        np.greater_equal(self._steps, limit, out=self._hit)
        np.logical_or(self.env_pool.truncated, self._hit, out=self._trunc)
        np.logical_or(self.env_pool.terminated, self._trunc, out=self._done)

    def _reset_done(self, mask: np.ndarray, t: int) -> None:
        # Episode ends are rare next to steps: allocations here are fine.
        self.env_pool.reset_where(mask)
        self._new_trajectories(mask)
        self.buffers.traj[mask, t + 1 :] = self._traj_ids.current[mask, None]
        if self._carry is not None:
            self._carry.reset(mask)

    def _new_trajectories(self, mask: np.ndarray) -> None:
        self._traj_ids.renew(mask)
        self._steps[mask] = 0

    # -- control ---------------------------------------------------------------------------

    def reset(self, reset_idx: np.ndarray | torch.Tensor | None = None) -> None:
        """Reset every env, or those where ``reset_idx`` (bool ``[N]``) is True."""
        n = self.num_envs
        if reset_idx is None:
            self.env_pool.reset()
            if not self._traj_fresh:
                self._new_trajectories(np.ones(n, dtype=bool))
            self._steps.fill(0)
            if self._carry is not None:
                self._carry.reset()
            return
        if isinstance(reset_idx, torch.Tensor):
            reset_idx = reset_idx.detach().cpu().numpy()
        mask = np.asarray(reset_idx, dtype=bool).reshape(-1)
        if mask.shape != (n,):
            raise ValueError(f"reset_idx must be a bool mask of shape ({n},), got {mask.shape}")
        if not self.env_pool.supports_partial_reset:
            raise ValueError(f"{type(self.env_pool).__name__} cannot reset single envs")
        self.env_pool.reset_where(mask)
        self._new_trajectories(mask)
        if self._carry is not None:
            self._carry.reset(mask)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed env i with ``seed + i`` (``seed`` if static) and reset; return the next seed."""
        next_seed = self.env_pool.set_seed(seed, static_seed=static_seed)
        if self._owns_random:
            self._random.set_seed(seed)
        self.reset()
        return next_seed

    def close(self) -> None:
        """Close the env pool. Idempotent."""
        if not self._closed:
            self._closed = True
            self.env_pool.close()

    def __enter__(self) -> Rollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _StopCollect(Exception):
    """Raised at a step boundary by the hook `Rollout.request_stop` installs."""


def _raise_stop() -> None:
    raise _StopCollect


def _check_args(frames_per_batch: int, n: int, worker_index: int, init_random: int | None) -> None:
    if not isinstance(frames_per_batch, int) or frames_per_batch <= 0:
        raise ValueError(f"frames_per_batch must be a positive int, got {frames_per_batch!r}")
    if frames_per_batch % n:
        lo = max(n, frames_per_batch - frames_per_batch % n)
        raise ValueError(
            f"frames_per_batch={frames_per_batch} is not a multiple of num_envs={n}: "
            f"use {lo} or {lo + n}"
        )
    if not isinstance(worker_index, int) or not 0 <= worker_index < 2**31:
        raise ValueError(f"worker_index must be an int in [0, 2**31), got {worker_index!r}")
    if init_random is not None and init_random < 0:
        raise ValueError(f"init_random_frames must be >= 0, got {init_random}")
