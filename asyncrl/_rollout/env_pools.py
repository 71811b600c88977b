"""The env pools: N environments stepped as one batch, numpy in, numpy out.

Every pool writes into its own preallocated arrays and returns them: ``obs``
(a dict mirroring the observation specs), ``reward`` (float32[N]),
``terminated`` and ``truncated`` (bool[N]). The arrays are the same objects for
the whole life of the pool, so the rollout loop can copy from them without
looking anything up; a caller that keeps results across calls must copy them.

Episode ends are explicit: ``step`` returns the *terminal* observation of an
env that finished, and the caller resets it (``reset_where`` / ``reset_one``)
before the next step. Vector envs that reset by themselves are adapted so that
no frame is ever spent on a reset (see `GymVectorPool`). Pools are built by
`asyncrl._rollout.envs.make_env_pool`, which picks one for what the user gave.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import SpecMismatchError
from .env_specs import (
    ArraySpec,
    EnvSpecs,
    ObsSpecTree,
    array_spec_from_space,
    flatten_obs_specs,
    observation_specs_from_space,
)
from .infos import InfoReader

__all__ = ["EnvPool", "GymEnvListPool", "GymVectorPool", "TorchRLPool", "check_action_dtype"]

ObsDict = dict[str, Any]  # key -> np.ndarray (or nested ObsDict for Dict spaces)

_ndarray = np.ndarray


def check_observation(env: int | str, path: tuple[str, ...], value: Any,
                      buffer: np.ndarray) -> None:
    """Raise :class:`SpecMismatchError` if ``value`` cannot go into a row of ``buffer`` as is.

    The hot loop calls it only when the cheap test failed (``value`` is not an
    ndarray, or its dtype object or shape tuple is not the buffer's row's). A
    numpy value must have the spec's shape and a dtype the spec's holds without
    loss (float32 into float64 is fine, float64 or int64 into float32 is not: a
    silent cast would hide an env that changed what it returns); a Python scalar
    or a list must have the spec's shape. ``env`` names the env (its index in the
    worker, or ``"every env"`` for a vector env's batch).
    """
    want_shape, want = buffer.shape[1:], buffer.dtype
    if isinstance(value, _ndarray | np.generic):
        if type(env) is str:  # a vector env's batch: [num_envs, *shape]
            shape, got = value.shape[1:], value.dtype
        else:
            shape, got = value.shape, value.dtype
        if shape == want_shape and (got == want or np.can_cast(got, want, casting="safe")):
            return
    elif value.__class__ in (int, float, bool) and not want_shape:
        return  # a Discrete space's int: nothing to check
    else:
        shape, got = np.shape(value), np.asarray(value).dtype
        if shape == want_shape:
            return
    key = ".".join(path)
    what = f"{got} of shape {tuple(shape)}"
    where = f"env {env}" if type(env) is not str else env
    raise SpecMismatchError(
        f"{where}: observation {key!r}: the spec says {want} of shape {tuple(want_shape)}, the "
        f"env returned {what}; make the env return what its observation space declares "
        "(e.g. obs.astype(np.float32)), or declare the space it returns")


class _ObsLayout:
    """Flat, preallocated observation buffers plus a nested dict view of them."""

    def __init__(self, tree: ObsSpecTree, num_envs: int) -> None:
        self.paths: list[tuple[str, ...]] = []
        self.arrays: list[np.ndarray] = []
        self.nested: ObsDict = {}
        for path, spec in flatten_obs_specs(tree):
            arr = np.zeros((num_envs, *spec.shape), dtype=spec.dtype)
            self.paths.append(path)
            self.arrays.append(arr)
            node = self.nested
            for p in path[:-1]:
                node = node.setdefault(p, {})
            node[path[-1]] = arr
        # A Box/Discrete space yields bare arrays, a Dict space yields dicts.
        self.is_dict = self.paths != [("observation",)]
        #: One env's observation shape per array, made once (the step compares, never slices).
        self.row_shapes = [arr.shape[1:] for arr in self.arrays]

    def write_row(self, i: int, obs: Any) -> None:
        """Copy env ``i``'s observation into row ``i``, checked against the spec."""
        if not self.is_dict:
            arr = self.arrays[0]
            if obs.__class__ is not _ndarray or obs.dtype is not arr.dtype \
                    or obs.shape != self.row_shapes[0]:
                check_observation(i, self.paths[0], obs, arr)
            arr[i] = obs
            return
        for path, arr, shape in zip(self.paths, self.arrays, self.row_shapes, strict=True):
            value = obs
            for p in path:
                value = value[p]
            if value.__class__ is not _ndarray or value.dtype is not arr.dtype \
                    or value.shape != shape:
                check_observation(i, path, value, arr)
            arr[i] = value

    def write_rows(self, rows: np.ndarray | slice, batch: Any) -> None:
        """Copy rows of a batched observation (vector-env layout) into our buffers."""
        for path, arr in zip(self.paths, self.arrays, strict=True):
            value = batch
            if self.is_dict:
                for p in path:
                    value = value[p]
            if value.__class__ is not _ndarray or value.dtype is not arr.dtype \
                    or value.shape != arr.shape:
                check_observation("every env", path, value, arr)
            arr[rows] = np.asarray(value)[rows]

    def copy_row_from(self, i: int, other: _ObsLayout) -> None:
        for dst, src in zip(self.arrays, other.arrays, strict=True):
            dst[i] = src[i]

    def row(self, i: int) -> ObsDict:
        def sub(node: ObsDict) -> ObsDict:
            return {k: sub(v) if isinstance(v, dict) else v[i] for k, v in node.items()}

        return sub(self.nested)


class EnvPool(ABC):
    """N envs stepped as one batch, numpy in and out. Build one with `make_env_pool`.

    All returned arrays are the pool's own buffers, overwritten by the next
    call: copy what you keep.

    >>> from asyncrl._rollout.envs import make_env_pool
    >>> pool = make_env_pool("CartPole-v1", num_envs=2)
    >>> obs = pool.reset(seed=0)
    >>> obs["observation"].shape
    (2, 4)
    >>> next_obs, reward, terminated, truncated = pool.step(np.zeros(2, dtype=np.int64))
    >>> reward.dtype, terminated.dtype
    (dtype('float32'), dtype('bool'))
    >>> pool.close()
    """

    #: True when single envs can be reset without touching the others.
    supports_partial_reset: bool = True
    #: Reads ``info_keys`` from each step's info (set by `asyncrl._rollout.infos`); False: refused.
    reads_info: bool = True
    info_reader: InfoReader | None = None

    def __init__(self, specs: EnvSpecs) -> None:
        self.specs = specs
        self.num_envs = specs.num_envs
        self._layout = _ObsLayout(specs.observation, specs.num_envs)
        self.obs: ObsDict = self._layout.nested
        self.obs_paths: tuple[tuple[str, ...], ...] = tuple(self._layout.paths)
        self.obs_arrays: tuple[np.ndarray, ...] = tuple(self._layout.arrays)
        self.reward = np.zeros(self.num_envs, dtype=np.float32)
        self.terminated = np.zeros(self.num_envs, dtype=bool)
        self.truncated = np.zeros(self.num_envs, dtype=bool)
        #: True when some env finished in the last step (saves the caller a scan).
        self.any_done = False
        self._pending_seeds: list[int] | None = None
        self._closed = False

    # -- public API ----------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> ObsDict:
        """Reset every env (env i seeded with ``seed + i``); return the observations."""
        seeds: list[int] | None
        if seed is not None:
            seeds = [seed + i for i in range(self.num_envs)]
        else:
            seeds, self._pending_seeds = self._pending_seeds, None
        self._reset_all(seeds)
        self.any_done = False
        self.reward.fill(0.0)
        self.terminated.fill(False)
        self.truncated.fill(False)
        return self.obs

    def reset_one(self, i: int) -> ObsDict:
        """Reset env ``i`` only; return its observation (views of row i of ``obs``)."""
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[i] = True
        self.reset_where(mask)
        return self._layout.row(i)

    def reset_where(self, mask: np.ndarray) -> ObsDict:
        """Reset the envs where ``mask`` (bool[N]) is True; the others keep their state."""
        if mask.any():
            self._reset_rows(mask)
        return self.obs

    def step(self, actions: np.ndarray) -> tuple[ObsDict, np.ndarray, np.ndarray, np.ndarray]:
        """Step every env; returns ``(next_obs, reward, terminated, truncated)``.

        An env that finished returns its terminal observation and must be reset
        (``reset_where``) before the next step. Integer actions (Discrete,
        MultiDiscrete, MultiBinary) must come as integers: floats are refused,
        never rounded.
        """
        actions = np.asarray(actions)
        check_action_dtype(self.specs.action, actions.dtype, actions)
        self.step_inplace(actions)
        return self.obs, self.reward, self.terminated, self.truncated

    @abstractmethod
    def step_inplace(self, actions: np.ndarray) -> None:
        """`step` without building a result tuple: results land in the buffers."""

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the next `reset` (env i gets ``seed + i``, or ``seed`` if static).

        Returns the next unused seed (``seed + num_envs``, ``seed`` if static).
        """
        if static_seed:
            self._pending_seeds = [seed] * self.num_envs
            return seed
        self._pending_seeds = [seed + i for i in range(self.num_envs)]
        return seed + self.num_envs

    @property
    def user_env(self) -> Any:
        """The env the user's factory built (the first one of several): what
        ``getattr_env`` looks in."""
        return self

    @property
    def user_envs(self) -> list[Any]:
        """Every env the user's factory built (env state is read from each)."""
        return [self.user_env]

    def close(self) -> None:
        """Release the envs. Idempotent."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- for subclasses ------------------------------------------------------------------

    @abstractmethod
    def _reset_all(self, seeds: Sequence[int] | None) -> None: ...

    @abstractmethod
    def _reset_rows(self, mask: np.ndarray) -> None: ...

    @abstractmethod
    def _close(self) -> None: ...


class GymEnvListPool(EnvPool):
    """A list of gymnasium envs stepped in a plain loop.

    Faster than ``SyncVectorEnv`` for our use: no batching of observations
    through ``concatenate``, no info merging, no autoreset bookkeeping.
    """

    def __init__(self, envs: list[Any], owner: Any = None) -> None:
        first = envs[0]
        for env in envs[1:]:
            if env.observation_space != first.observation_space:
                raise ValueError(
                    f"all envs must share one observation space: {env.observation_space} != "
                    f"{first.observation_space}"
                )
            if env.action_space != first.action_space:
                raise ValueError(
                    f"all envs must share one action space: {env.action_space} != "
                    f"{first.action_space}"
                )
        super().__init__(
            EnvSpecs(
                observation=observation_specs_from_space(first.observation_space),
                action=array_spec_from_space(first.action_space),
                num_envs=len(envs),
            )
        )
        self._envs = envs
        self._int_actions = self.specs.action.n is not None
        self._owner = owner  # a SyncVectorEnv we took the envs from, closed with us

    @property
    def user_env(self) -> Any:
        return self._envs[0]

    @property
    def user_envs(self) -> list[Any]:
        return list(self._envs)

    def step_inplace(self, actions: np.ndarray) -> None:
        rew, term, trunc = self.reward, self.terminated, self.truncated
        # A Discrete action goes in as a Python int: gymnasium's Discrete.contains
        # checks that much faster than a numpy scalar.
        item = self._int_actions
        write = None if not self._layout.is_dict else self._layout.write_row
        buf = self._layout.arrays[0]
        # What a step's observation must be: compared by identity and one tuple
        # compare before the copy; anything else takes check_observation's slow path.
        dtype, shape, path = buf.dtype, self._layout.row_shapes[0], self._layout.paths[0]
        any_done, info_reader = False, self.info_reader
        for i, env in enumerate(self._envs):
            obs, r, te, tr, info = env.step(actions.item(i) if item else actions[i])
            if info_reader is not None:
                info_reader.read_env(i, info)
            if write is None:
                if obs.__class__ is not _ndarray or obs.dtype is not dtype \
                        or obs.shape != shape:
                    check_observation(i, path, obs, buf)
                buf[i] = obs
            else:
                write(i, obs)
            rew[i] = r
            term[i] = te
            trunc[i] = tr
            if te or tr:
                any_done = True
        self.any_done = any_done

    def _reset_all(self, seeds: Sequence[int] | None) -> None:
        for i, env in enumerate(self._envs):
            obs, _ = env.reset(seed=None if seeds is None else seeds[i])
            self._layout.write_row(i, obs)

    def _reset_rows(self, mask: np.ndarray) -> None:
        for i in np.flatnonzero(mask):
            obs, _ = self._envs[i].reset()
            self._layout.write_row(int(i), obs)

    def _close(self) -> None:
        if self._owner is not None:
            self._owner.close()
            return
        for env in self._envs:
            env.close()


class GymVectorPool(EnvPool):
    """A ``gymnasium.vector.VectorEnv``, adapted so that no frame is a reset step.

    - ``SAME_STEP`` (any VectorEnv): the env already reset a finished sub-env
      and put the terminal observation in ``info["final_obs"]``; we return the
      terminal observation and keep the reset one for ``reset_where``.
    - ``NEXT_STEP`` / ``DISABLED`` (gymnasium's Sync/AsyncVectorEnv only): we
      reset finished sub-envs at once with ``reset(options={"reset_mask": ...})``,
      which also clears their pending autoreset, so the next step is a real step.
      Other vector envs in these modes are refused: ask for ``SAME_STEP``
      (EnvPool's, which step envs by id, go to `EnvIdVectorPool` instead).
    """

    def __init__(self, venv: Any) -> None:
        from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

        mode = venv.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        mode = AutoresetMode(mode) if not isinstance(mode, AutoresetMode) else mode
        base = venv.unwrapped
        known = isinstance(base, SyncVectorEnv | AsyncVectorEnv)
        if mode != AutoresetMode.SAME_STEP and not known:
            raise ValueError(
                f"{type(base).__name__} uses autoreset mode {mode.name} and has no way to "
                "reset or step single envs, so every reset would cost a frame: build it with "
                "autoreset_mode=AutoresetMode.SAME_STEP (e.g. gym.make_vec(..., vector_kwargs="
                "{'autoreset_mode': AutoresetMode.SAME_STEP})), or give it EnvPool's "
                "step(actions, env_id=ids) / reset(env_id=ids), all_env_ids and config"
            )
        if (
            mode == AutoresetMode.NEXT_STEP
            and isinstance(base, AsyncVectorEnv)
            and not base.shared_memory
        ):
            # gymnasium's async worker clears its autoreset flag on a masked reset
            # only with shared memory; without it the next step would be a reset.
            raise ValueError(
                "AsyncVectorEnv(shared_memory=False) in NEXT_STEP mode cannot be reset per "
                "env: use shared_memory=True or autoreset_mode=AutoresetMode.SAME_STEP"
            )
        super().__init__(
            EnvSpecs(
                observation=observation_specs_from_space(venv.single_observation_space),
                action=array_spec_from_space(venv.single_action_space),
                num_envs=venv.num_envs,
            )
        )
        self._venv = venv
        self._same_step = mode == AutoresetMode.SAME_STEP
        self.supports_partial_reset = known
        # SAME_STEP: reset observations the env already produced, per finished env.
        self._auto_reset = np.zeros(self.num_envs, dtype=bool)
        self._done = np.zeros(self.num_envs, dtype=bool)
        self._reset_obs = _ObsLayout(self.specs.observation, self.num_envs)

    @property
    def user_env(self) -> Any:
        return self._venv

    def step_inplace(self, actions: np.ndarray) -> None:
        obs, rew, term, trunc, info = self._venv.step(actions)
        self._layout.write_rows(slice(None), obs)
        np.copyto(self.reward, rew, casting="unsafe")
        np.copyto(self.terminated, term, casting="unsafe")
        np.copyto(self.truncated, trunc, casting="unsafe")
        np.logical_or(self.terminated, self.truncated, out=self._done)
        self.any_done = bool(self._done.any())
        if self.info_reader is not None:
            self.info_reader.read_vector(info)
            if self._same_step and self.any_done:
                self.info_reader.read_final(info, self._done)
        if self._same_step and self.any_done:
            np.copyto(self._auto_reset, self._done)
            final = info["final_obs"]
            for i in np.flatnonzero(self._done):
                self._reset_obs.copy_row_from(int(i), self._layout)
                self._layout.write_row(int(i), final[i])

    def _reset_all(self, seeds: Sequence[int] | None) -> None:
        obs, _ = self._venv.reset(seed=None if seeds is None else list(seeds))
        self._layout.write_rows(slice(None), obs)
        self._auto_reset.fill(False)

    def _reset_rows(self, mask: np.ndarray) -> None:
        auto = mask & self._auto_reset
        for i in np.flatnonzero(auto):
            self._layout.copy_row_from(int(i), self._reset_obs)
        self._auto_reset[auto] = False
        rest = mask & ~auto
        if rest.any():
            if not self.supports_partial_reset:
                raise ValueError(
                    f"{type(self._venv.unwrapped).__name__} cannot reset single envs that "
                    "did not finish (needed by max_frames_per_traj and partial resets)"
                )
            obs, _ = self._venv.reset(options={"reset_mask": rest})
            self._layout.write_rows(rest, obs)

    def _close(self) -> None:
        self._venv.close()


class TorchRLPool(EnvPool):
    """A torchrl ``EnvBase`` (batch size ``[]`` or ``[N]``) behind the numpy interface.

    Slower than the gymnasium pools: every step goes through the env's
    TensorDict machinery and is copied into our buffers. Only flat
    observation keys, a Categorical/OneHot/Bounded/Unbounded action and one
    reward are supported; use the gymnasium env directly when you can.
    """

    #: False: every step goes through TorchRL (see `asyncrl._rollout.torchrl_fast`).
    fast_path = False
    reads_info = False  # a TorchRL env reads its own info (set_info_dict_reader)

    def __init__(self, env: Any) -> None:
        import torch

        batch = tuple(env.batch_size)
        if len(batch) > 1:
            raise ValueError(f"torchrl env batch_size must be [] or [N], got {list(batch)}")
        self._env = env
        self._batched = len(batch) == 1
        n = batch[0] if self._batched else 1
        self._obs_keys = [
            k for k in env.full_observation_spec.keys(True, True) if isinstance(k, str)
        ]
        obs_tree = {
            k: _spec_from_torchrl(env.full_observation_spec[k], batch) for k in self._obs_keys
        }
        action = _spec_from_torchrl(env.action_spec, batch)
        super().__init__(EnvSpecs(observation=obs_tree, action=action, num_envs=n))
        self._action = torch.zeros((*batch, *action.shape), dtype=_torch_dtype(action.dtype))
        self._td = env.reset()

    @property
    def user_env(self) -> Any:
        return self._env

    def _write(self, td: Any) -> None:
        for key, arr in zip(self._obs_keys, self._layout.arrays, strict=True):
            arr[...] = td.get(key).reshape(arr.shape).cpu().numpy()

    def step_inplace(self, actions: np.ndarray) -> None:
        import torch

        self._action.view(-1).copy_(torch.from_numpy(np.ascontiguousarray(actions)).view(-1))
        self._td.set(self._env.action_key, self._action)
        out = self._env.step(self._td).get("next")
        self._write(out)
        n = self.num_envs
        self.reward[:] = out.get("reward").reshape(n).float().cpu().numpy()
        self.terminated[:] = out.get("terminated").reshape(n).cpu().numpy()
        self.truncated[:] = out.get("truncated").reshape(n).cpu().numpy()
        self.any_done = bool(self.terminated.any() or self.truncated.any())
        self._td = out

    def _reset_all(self, seeds: Sequence[int] | None) -> None:
        if seeds is not None:
            self._env.set_seed(seeds[0], static_seed=len(set(seeds)) == 1 and len(seeds) > 1)
        self._td = self._env.reset()
        self._write(self._td)

    def _reset_rows(self, mask: np.ndarray) -> None:
        import torch
        from tensordict import TensorDict

        if not self._batched:
            self._reset_all(None)
            return
        reset_td = TensorDict(
            {"_reset": torch.from_numpy(mask.copy()).unsqueeze(-1)}, batch_size=self._env.batch_size
        )
        fresh = self._env.reset(reset_td)
        m = torch.from_numpy(mask.copy())
        for key in self._obs_keys:
            self._td.get(key)[m] = fresh.get(key)[m]
        self._write(self._td)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        # torchrl seeds at once and picks its own next seed; keep its answer.
        return int(self._env.set_seed(seed, static_seed=static_seed))

    def _close(self) -> None:
        self._env.close()


def check_action_dtype(spec: ArraySpec, dtype: Any, actions: Any = None) -> None:
    """Refuse floating-point actions for an env whose actions are integers.

    Casting would truncate silently (0.7 -> action 0). Integral floats (1.0) are
    refused too: TorchRL's ``Categorical`` spec does not contain a float tensor
    (``spec.is_in(torch.tensor(1.0))`` is False), and a float action usually means
    a policy head that was meant to be sampled or argmax-ed. ``dtype`` is a numpy
    or torch dtype; ``actions`` (optional) gives an example in the message.
    """
    if np.dtype(spec.dtype).kind not in "iub":
        return
    floating = getattr(dtype, "is_floating_point", None)
    if floating is None:
        floating = np.dtype(dtype).kind in "fc"
    if not floating and not getattr(dtype, "is_complex", False):
        return
    kind = f"Discrete({spec.n})" if spec.n is not None else f"{spec.dtype} {spec.shape}"
    example = ""
    if actions is not None and getattr(actions, "size", None) != 0:
        first = actions.reshape(-1)[0]
        example = f" (e.g. {round(float(first), 6)!r})"
    raise TypeError(
        f"the env's actions are integers ({kind}, dtype {spec.dtype}), but the policy gave "
        f"{str(dtype).removeprefix('torch.')} actions{example}; asyncrl never rounds "
        "actions: return integer actions (e.g. dist.sample().long() or logits.argmax(-1))")


def _torch_dtype(name: str) -> Any:
    import torch

    return torch.from_numpy(np.empty(0, dtype=name)).dtype


def _spec_from_torchrl(spec: Any, batch: tuple[int, ...]) -> ArraySpec:
    import torch

    shape = tuple(spec.shape)[len(batch) :]
    dtype = str(torch.empty(0, dtype=spec.dtype).numpy().dtype)
    name = type(spec).__name__
    if name in ("Categorical", "DiscreteTensorSpec"):
        return ArraySpec(shape, dtype, 0.0, float(spec.space.n - 1), int(spec.space.n))
    if name in ("OneHot", "OneHotDiscreteTensorSpec"):
        # TorchRL's default for discrete gym envs: the policy writes one-hot
        # actions and the env gets them as they are, as in TorchRL's collectors.
        return ArraySpec(shape, dtype, 0.0, 1.0, one_hot=True)
    low = high = None
    if hasattr(spec, "space") and hasattr(spec.space, "low"):
        low_t = spec.space.low.reshape(-1, *shape)[0] if batch else spec.space.low
        high_t = spec.space.high.reshape(-1, *shape)[0] if batch else spec.space.high
        low = _scalar_or_tuple(low_t.double().numpy())
        high = _scalar_or_tuple(high_t.double().numpy())
    return ArraySpec(shape, dtype, low, high)


def _scalar_or_tuple(a: np.ndarray) -> float | tuple[float, ...]:
    flat = a.reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return float(flat[0])
    return tuple(float(x) for x in flat)
