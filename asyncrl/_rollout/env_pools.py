"""The env pools: N environments stepped as one batch, numpy in, numpy out.

Every pool writes into its own preallocated arrays and returns them: ``obs``
(a dict mirroring the observation specs), ``reward`` (float32[N]),
``terminated`` and ``truncated`` (bool[N]). The arrays are the same objects for
the whole life of the pool, so the rollout loop can copy from them without
looking anything up; a caller that keeps results across calls must copy them.

Episode ends are explicit: ``step`` returns the *terminal* observation of an
env that finished, and the caller resets it (``reset_where`` / ``reset_one``)
before the next step. Vector envs that reset by themselves are adapted so that
no frame is ever spent on a reset (see `asyncrl._rollout.gym_pools.GymVectorPool`).
Pools are built by `asyncrl._rollout.envs.make_env_pool`, which picks one for what
the user gave.

This module holds what every pool shares (`EnvPool`, the observation buffers and
their checks); the pools themselves are in `asyncrl._rollout.gym_pools`,
`asyncrl._rollout.env_id_pools` (EnvPool) and `asyncrl._rollout.torchrl_pools`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import SpecMismatchError
from .env_specs import ArraySpec, EnvSpecs, ObsSpecTree, flatten_obs_specs
from .infos import InfoReader

__all__ = ["EnvPool", "ObsDict", "ObsLayout", "check_action_dtype", "check_observation"]

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


class ObsLayout:
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

    def copy_row_from(self, i: int, other: ObsLayout) -> None:
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
        self._layout = ObsLayout(specs.observation, specs.num_envs)
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
