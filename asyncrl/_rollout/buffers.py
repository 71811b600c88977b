"""The rollout's buffers, planned once: what a batch holds, and what each step writes where.

Layout: every buffer is a torch tensor of shape ``[N, T, ...]`` (env first,
time last: TorchRL's layout for a batched env, contiguous for the codec),
written through numpy views with a precomputed ``(slice(None), t)`` index per
step, so a step creates no TensorDict, tensor, dict or list of ours. The step
TensorDict given to the policy is built once; its observation entries *share
memory with the env pool's buffers*, so a step result is visible to the policy
without a copy. ``traj_ids``, ``policy_version`` and ``("next", "done")`` are
filled once per batch and patched only where they change.

This module decides all of it before the first step (a dry policy call finds the
keys the policy writes); the hot loop (:mod:`asyncrl._rollout.loop`) only reads
:class:`RolloutBuffers`' attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from .device_policy import DevicePolicyCall
from .devices import HOST
from .env_pools import EnvPool, check_action_dtype
from .infos import info_buffers
from .options import RolloutOptions
from .policies import PolicyAdapter, torch_dtype
from .recurrent import RecurrentCarry

__all__ = ["Observations", "RolloutBuffers"]

_RESERVED_ROOT = frozenset({"action", "done", "terminated", "truncated", "next", "collector"})

#: A key a policy writes besides the action: its path, per-env shape and dtype.
Extra = tuple[tuple[str, ...], tuple[int, ...], torch.dtype]


def _td_key(path: tuple[str, ...]) -> str | tuple[str, ...]:
    return path[0] if len(path) == 1 else path


def _as_tuple(key: str | tuple[str, ...]) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


class Observations(NamedTuple):
    """The pool's observations a batch holds: a recurrent policy's state is its carry's."""

    paths: tuple[tuple[str, ...], ...]
    arrays: list[np.ndarray]  # the pool's buffers, written in place by every step
    keys: list[str | tuple[str, ...]]  # as TensorDict keys

    @classmethod
    def of(cls, pool: EnvPool, owned: frozenset[tuple[str, ...]]) -> Observations:
        """The pool's observations but those at ``owned`` (a carry's), keys checked."""
        keep = [j for j, p in enumerate(pool.obs_paths) if p not in owned]
        paths = tuple(pool.obs_paths[j] for j in keep)
        for path in paths:
            if path[0] in _RESERVED_ROOT or path == ("reward",):
                raise ValueError(
                    f"observation key {path!r} clashes with a batch key; rename the Dict sub-space"
                )
        return cls(paths, [pool.obs_arrays[j] for j in keep], [_td_key(p) for p in paths])


class RolloutBuffers:
    """A rollout's step TensorDict, its ``[N, T]`` batch buffers and the fixed writes of a step.

    Built once per :class:`~asyncrl._rollout.loop.Rollout`, on a reset pool: the step
    TensorDict the policy reads and writes (on ``policy_device`` a copy of it), one
    buffer per batch key (observations, action, what the policy writes besides,
    rewards, done flags, collector ids, a carried state, infos), and the
    ``(destination, source)`` pairs a step copies before (``pre``) and after
    (``post``) the env steps. ``truncated`` is the array ``("next", "truncated")`` is
    written from (the pool's, or the rollout's own under ``max_frames_per_traj``).

    >>> from asyncrl._rollout.envs import make_env_pool
    >>> from asyncrl._rollout.loop import Rollout
    >>> with Rollout(make_env_pool("CartPole-v1", num_envs=2), None, frames_per_batch=8) as r:
    ...     tuple(r.buffers.data[("next", "reward")].shape), len(r.buffers.idx)
    ((2, 4, 1), 4)
    """

    def __init__(
        self,
        pool: EnvPool,
        adapter: PolicyAdapter,
        carry: RecurrentCarry | None,
        observations: Observations,
        *,
        options: RolloutOptions,
        steps: int,
        worker_index: int,
        info: Any,
        next_observations: bool,
        truncated: np.ndarray,
    ) -> None:
        self._pool, self._adapter, self._carry = pool, adapter, carry
        #: The pool's observations the batch holds.
        self.observations, self._options = observations, options
        self._num_envs = pool.num_envs
        self._build_step_td()
        try:
            extras = self._discover_extras()
        except KeyError as exc:  # a recurrent state nothing could size: say so
            if carry is not None:
                carry.explain_missing(exc)
            raise
        self._allocate(extras, steps, worker_index, info, next_observations, truncated)

    def _build_step_td(self) -> None:
        pool, n, obs = self._pool, self._num_envs, self.observations
        act = pool.specs.action
        # Observation tensors are views of the pool's buffers: env writes land there.
        self._obs_t = [torch.from_numpy(a) for a in obs.arrays]
        # Pinned when a CUDA policy writes it: the action's copy back is then a plain DMA.
        #: The action the env steps with, as the policy sees it and as numpy.
        self.act_t = torch.zeros((n, *act.shape), dtype=torch_dtype(act.dtype),
                                 pin_memory=self._options.devices.pins_host_buffers)
        self.act_np = self.act_t.numpy()
        entries: dict[Any, torch.Tensor] = dict(zip(obs.keys, self._obs_t, strict=True))
        entries["action"] = self.act_t
        #: The TensorDict the policy reads and writes at each step (observations: the pool's).
        self.step_td = TensorDict(entries, batch_size=[n])
        if self._carry is not None:
            self._carry.install(self.step_td)
        # What the policy reads and writes: this td itself (a host policy, no copy), or
        # device copies of it (policy_device: see DevicePolicyCall).
        #: The policy as a step calls it: the adapter, or a DevicePolicyCall around it.
        self.call: Callable[[TensorDictBase], Any] = self._adapter
        self._policy_td, self._policy_obs = self.step_td, self._obs_t
        self._policy_act = self.act_t
        if self._options.devices.moves_observations and not self._adapter.is_random:
            call = DevicePolicyCall(self._adapter, obs.keys, self._obs_t,
                                    self._options.policy_device or HOST, action=self.act_t)
            self.call, self._policy_td = call, call.td
            self._policy_obs, self._policy_act = call.inputs, call.action

    def _discover_extras(self) -> list[Extra]:
        """Dry policy call on the reset observation: which keys does it write?"""
        if self._adapter.is_random:
            return []
        td = self._policy_td
        # Without our "action" entry, a policy that writes none is caught here.
        del td["action"]
        with self._adapter.exploration():
            td = self.call(self.step_td)
        for key, tensor in zip(self.observations.keys, self._policy_obs, strict=True):
            if not _same_memory(td.get(key), tensor):
                raise ValueError(
                    f"the policy replaced the observation entry {key!r}: policies must "
                    "not write observation keys (write a new key instead)"
                )
        n, act = self._num_envs, self._pool.specs.action
        action = td.get("action", None)
        if not isinstance(action, torch.Tensor) or tuple(action.shape) != (n, *act.shape):
            got = None if action is None else tuple(getattr(action, "shape", ()))
            raise ValueError(
                f"the policy must write 'action' of shape {(n, *act.shape)} "
                f"(num_envs, *action_spec.shape); it wrote {got}"
            )
        check_action_dtype(act, action.dtype, action.detach())
        td.set("action", self._policy_act)  # in-place writers then fill ours: no copy
        carried: frozenset[tuple[str, ...]] = frozenset()
        if self._carry is not None:
            self._carry.bind(td)
            carried = self._carry.paths
        obs_paths = set(self.observations.paths)
        extras = []
        for key in td.keys(include_nested=True, leaves_only=True):
            path = _as_tuple(key)
            if path in obs_paths or path == ("action",) or path in carried:
                continue
            extras.append(self._check_extra(path, td.get(key)))
        return extras

    def _check_extra(self, path: tuple[str, ...], value: Any) -> Extra:
        if path[0] in _RESERVED_ROOT:
            hint = (
                " (a recurrent state K is read at K and written at ('next', *K))"
                if path[0] == "next" else ""
            )
            raise ValueError(f"the policy wrote the reserved key {path!r}{hint}")
        if not isinstance(value, torch.Tensor) or value.shape[:1] != (self._num_envs,):
            raise ValueError(
                f"the policy wrote {path!r} as {type(value).__name__} of shape "
                f"{tuple(getattr(value, 'shape', ()))}: expected a tensor with leading dim "
                f"{self._num_envs}"
            )
        return path, tuple(value.shape[1:]), value.dtype

    def _allocate(self, extras: list[Extra], t: int, worker_index: int, info: Any,
                  next_observations: bool, truncated: np.ndarray) -> None:
        n = self._num_envs
        specs = self._pool.specs

        # Pinned when they feed a CUDA device (the batch's copy to storing_device, the
        # extras a CUDA policy writes): DMA copies without the driver's staging.
        pin = self._options.devices.pins_host_buffers

        def buf(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros((n, t, *shape), dtype=dtype, pin_memory=pin)

        data: dict[Any, torch.Tensor] = {}
        obs_bufs, next_bufs = [], []
        for path, spec in specs.flat_observation().items():
            if path not in self.observations.paths:
                continue  # carried by the recurrent policy's state instead
            dtype = torch_dtype(spec.dtype)
            obs_bufs.append(data.setdefault(path, buf(spec.shape, dtype)))
            if next_observations:
                next_bufs.append(data.setdefault(("next", *path), buf(spec.shape, dtype)))
        act = specs.action
        data[("action",)] = action = buf(act.shape, torch_dtype(act.dtype))
        extra_bufs = [data.setdefault(p, buf(s, d)) for p, s, d in extras]
        for name in ("done", "terminated", "truncated"):
            # Root done state of the current obs: always False, as every finished
            # episode is reset before its next frame.
            data[(name,)] = buf((1,), torch.bool)
        for name in ("reward", "done", "terminated", "truncated"):
            data[("next", name)] = buf((1,), torch.float32 if name == "reward" else torch.bool)
        for name in ("traj_ids", "worker_id", "policy_version"):
            data[("collector", name)] = buf((), torch.int64)
        data[("collector", "worker_id")].fill_(worker_index)
        if self._carry is not None:
            self._carry.allocate(data, t)
        # Info entries of each step (a frame that ends an episode: the terminal step's).
        info_pairs = [(data.setdefault(p, b).numpy(), src)
                      for p, b, src in info_buffers(info, buf)]
        #: Every batch buffer, ``[N, T, ...]``, by its key as a tuple.
        self.data = data
        #: The batch as a TensorDict of ``data`` (``collect`` returns a copy of its structure).
        self.template = _nest(data, [n, t])
        #: Step t's index into a buffer: ``(slice(None), t)``, made once.
        self.idx = [(slice(None), i) for i in range(t)]
        self._plan(obs_bufs, next_bufs, action, extras, extra_bufs, truncated)
        self.post += info_pairs

    def _plan(
        self,
        obs_bufs: list[torch.Tensor],
        next_bufs: list[torch.Tensor],
        action: torch.Tensor,
        extras: list[Extra],
        extra_bufs: list[torch.Tensor],
        truncated: np.ndarray,
    ) -> None:
        """Fixed (destination, source) pairs written at every step."""
        pool, d, obs_arrays = self._pool, self.data, self.observations.arrays
        nxt = {
            k: d[("next", k)].numpy()[..., 0] for k in ("reward", "done", "terminated", "truncated")
        }
        # traj_ids, policy_version and ("next", "done") are not written per step:
        # they are filled per batch and patched where they change (resets, updates).
        self.traj = d[("collector", "traj_ids")].numpy()
        #: Written before the env steps (the observation it acts on, the action).
        self.pre = [(b.numpy(), a) for b, a in zip(obs_bufs, obs_arrays, strict=True)]
        self.pre.append((action.numpy(), self.act_np))
        #: Written after the env steps (next observation, reward, terminated, truncated, infos).
        self.post = [(b.numpy(), a) for b, a in zip(next_bufs, obs_arrays, strict=True)
                     ] if next_bufs else []
        self.post += [
            (nxt["reward"], pool.reward),
            (nxt["terminated"], pool.terminated),
            (nxt["truncated"], truncated),
        ]
        # numpy writes are ~2x cheaper than torch indexing; keep torch for dtypes
        # numpy lacks (bfloat16) and for tensors the policy leaves off the CPU.
        call = self.call if isinstance(self.call, DevicePolicyCall) else None
        #: Copies what a policy off the host wrote to the batch buffers (once per batch).
        self.flush_extras: Callable[[], None] | None = None if call is None else call.flush
        if call is not None:  # written on the policy's device; to the host once per batch
            extra_bufs = call.twin_buffers(extra_bufs)
        as_numpy = [_numpy_ok(dt) and call is None for _, _, dt in extras]
        #: What the policy writes besides the action: (its key, the buffer, written as numpy).
        self.extras = [
            (_td_key(p), b.numpy() if np_ok else b, np_ok)
            for (p, _, _), b, np_ok in zip(extras, extra_bufs, as_numpy, strict=True)
        ]
        self.pv = d[("collector", "policy_version")].numpy()
        self.next_done, self.next_truncated = nxt["done"], nxt["truncated"]
        self.next_terminated = nxt["terminated"]


_NUMPY_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                           torch.int64, torch.float16, torch.float32, torch.float64})


def _numpy_ok(dtype: torch.dtype) -> bool:
    return dtype in _NUMPY_DTYPES


def _same_memory(a: Any, b: torch.Tensor) -> bool:
    """``a`` is ``b`` or a view of the same memory (TorchRL's RNN modules re-set views)."""
    return a is b or (
        isinstance(a, torch.Tensor)
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def _nest(flat: dict[Any, torch.Tensor], batch_size: list[int]) -> TensorDict:
    out = TensorDict({}, batch_size=batch_size)
    for path, tensor in flat.items():
        out.set(_td_key(path), tensor)
    return out
