"""`EnvIdVectorPool`: a NEXT_STEP vector env that steps and resets envs by id (EnvPool).

EnvPool (``envpool.make_gymnasium(..., num_envs=8)``) resets a finished env on
the *next* step it is given (NEXT_STEP autoreset: that step ignores its action,
returns the new first observation, reward 0), and it can step or reset a subset
of its envs: ``step(actions, env_id=ids)``, ``reset(env_id=ids)``. That is what
keeps batches identical to a SAME_STEP env's: when envs finish, their reset step
is taken at once for those envs only (the others do not move), so it is never a
frame, never written, and every env's next frame starts from its reset
observation, as with SAME_STEP. Envs reset before they finish (``max_frames_per_traj``,
``Rollout.reset``) go through ``reset(env_id=ids)``.

EnvPool's async mode (``batch_size < num_envs``: each ``recv`` returns whichever
envs are ready) does not fit lockstep batches and is refused; seeds are fixed
when the env is made (``envpool.make_gymnasium(..., seed=0)``), since its
``reset`` takes none.

A real EnvPool is stepped through its C++ binding (`asyncrl._rollout.envpool_raw`)
when its layout checks out, through its public ``step`` / ``reset`` otherwise; the
batches are the same either way.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from .env_pools import EnvPool, check_observation
from .env_specs import EnvSpecs, array_spec_from_space, observation_specs_from_space
from .envpool_raw import RawEnvPool, resolve_raw_layout

__all__ = ["EnvIdVectorPool", "is_env_id_vector_env"]

_ALL = slice(None)
_log = logging.getLogger(__name__)


def is_env_id_vector_env(obj: object) -> bool:
    """True for a vector env with EnvPool's interface: ``all_env_ids`` and a ``config`` dict.

    The names are looked up statically first: an env whose ``__getattr__`` forwards to
    something else (TorchRL's batched envs raise RuntimeError before they start,
    wrappers recurse into what they wrap) is never asked.
    """
    if not (_defines(obj, "all_env_ids") and _defines(obj, "config")):
        return False
    try:
        config = obj.config  # type: ignore[attr-defined]  # (defined: checked above)
    except Exception:
        return False
    return (
        isinstance(config, dict)
        and "num_envs" in config
        and callable(getattr(obj, "step", None))
        and callable(getattr(obj, "reset", None))
    )


def _defines(obj: object, name: str) -> bool:
    """``name`` is an attribute of ``obj`` or its class, without calling ``__getattr__``."""
    try:
        inspect.getattr_static(obj, name)
    except AttributeError:
        return False
    return True


def _single_space(venv: Any, name: str) -> Any:
    # gymnasium's VectorEnv names the per-env space single_*; EnvPool's own spaces are per env.
    return getattr(venv, f"single_{name}", None) or getattr(venv, name)


class EnvIdVectorPool(EnvPool):
    """An EnvPool-style vector env behind the pool interface, no frame spent on resets.

    Built by `asyncrl._rollout.envs.make_env_pool` for any object
    `is_env_id_vector_env` accepts (EnvPool is not a dependency: the interface is
    detected). Refuses async mode (``batch_size < num_envs``) with what to do.
    """

    def __init__(self, venv: Any) -> None:
        config = venv.config
        num_envs = int(config["num_envs"])
        batch_size = int(config.get("batch_size", 0) or num_envs)
        if batch_size != num_envs:
            raise ValueError(
                f"{type(venv).__name__} is in async mode (batch_size={batch_size} < "
                f"num_envs={num_envs}): each step would return whichever envs are ready, "
                "which does not fit lockstep batches; make it with batch_size=num_envs "
                f"(e.g. envpool.make_gymnasium(..., num_envs={num_envs}), no batch_size)")
        super().__init__(
            EnvSpecs(
                observation=observation_specs_from_space(_single_space(venv, "observation_space")),
                action=array_spec_from_space(_single_space(venv, "action_space")),
                num_envs=num_envs,
            )
        )
        self._venv = venv
        self._done = np.zeros(num_envs, dtype=bool)
        #: Envs that finished and whose reset step the env still owes (NEXT_STEP).
        self._owed = np.zeros(num_envs, dtype=bool)
        act = self.specs.action
        # What a reset step is given: its action is ignored, any valid one does.
        self._idle_actions = np.zeros((num_envs, *act.shape), dtype=act.dtype)
        self._reset_takes_seed = "seed" in inspect.signature(venv.reset).parameters
        #: ``info["env_id"]`` of a whole step in id order, as bytes: EnvPool's sync mode
        #: answers so, and then rows are written through a slice, not a fancy index
        #: (4 fancy writes cost more than the rest of our step).
        self._in_order = np.arange(num_envs, dtype=np.int32).tobytes()
        #: EnvPool's C++ binding stepped directly (None: the public API; see envpool_raw).
        self._raw = self._raw_binding(venv)

    def _raw_binding(self, venv: Any) -> RawEnvPool | None:
        if self._reset_takes_seed:  # EnvPool's reset takes no seed: not EnvPool
            return None
        act = self.specs.action
        layout = resolve_raw_layout(venv, self.obs_paths, self._layout.is_dict, act.shape)
        if isinstance(layout, str):
            _log.debug("%s stepped through its public API: %s", type(venv).__name__, layout)
            return None
        return RawEnvPool(venv, layout, self.obs_arrays, self.reward, self.terminated,
                          self.truncated, act.shape)

    @property
    def user_env(self) -> Any:
        return self._venv

    @property
    def steps_raw(self) -> bool:
        """Whether EnvPool's C++ binding is stepped directly (`asyncrl._rollout.envpool_raw`)."""
        return self._raw is not None and self.info_reader is None

    def step_inplace(self, actions: np.ndarray) -> None:
        raw = self._raw
        if raw is not None and self.info_reader is None:  # infos: only the public API has them
            public = raw.step(actions)  # None: written
            if public is not None:  # its first step: EnvPool's own result, checked
                self._raw = raw if raw.ok else None
                self._write_step(*public)
        else:
            self._write_step(*self._venv.step(actions))
        np.logical_or(self.terminated, self.truncated, out=self._done)
        self.any_done = bool(self._done.any())
        if self.any_done:
            np.logical_or(self._owed, self._done, out=self._owed)

    def _write_step(self, obs: Any, rew: Any, term: Any, trunc: Any, info: Any) -> None:
        rows = self._rows(info)
        self._write(rows, obs)
        if self.info_reader is not None:
            self.info_reader.read_vector(info, None if rows is _ALL else rows)
        self.reward[rows] = rew
        self.terminated[rows] = term
        self.truncated[rows] = trunc

    def _reset_all(self, seeds: Sequence[int] | None) -> None:
        if self._raw is not None:
            result = self._raw.reset()  # None: written
        elif seeds is not None and self._reset_takes_seed:
            result = self._venv.reset(seed=list(seeds))
        else:
            result = self._venv.reset()
        if result is not None:  # the public API's (obs, info)
            self._raw = self._raw if self._raw is not None and self._raw.ok else None
            obs, info = result
            self._write(self._rows(info), obs)
        self._owed.fill(False)

    def _reset_rows(self, mask: np.ndarray) -> None:
        owed = mask & self._owed
        raw = self._raw
        if owed.any():
            # The reset step of the envs that finished, and only theirs: the others wait.
            ids = np.flatnonzero(owed).astype(np.int32)
            if raw is not None:
                raw.step_ids(self._idle_actions[ids], ids)
            else:
                obs, _, _, _, info = self._venv.step(self._idle_actions[ids], env_id=ids)
                self._write(self._rows(info, ids), obs)
            self._owed[ids] = False
        rest = mask & ~owed
        if rest.any():
            ids = np.flatnonzero(rest).astype(np.int32)
            result = raw.reset(ids) if raw is not None else self._venv.reset(env_id=ids)
            if result is not None:  # the public API's (obs, info)
                self._raw = raw if raw is not None and raw.ok else None
                obs, info = result
                self._write(self._rows(info, ids), obs)

    def _rows(self, info: Any, asked: np.ndarray | None = None) -> np.ndarray | slice:
        """Which envs a result's rows are: ``info["env_id"]`` when given, else what was asked."""
        ids = info.get("env_id") if isinstance(info, dict) else None
        if ids is None:
            return _ALL if asked is None else asked
        if asked is None and ids.__class__ is np.ndarray and ids.tobytes() == self._in_order:
            return _ALL  # every env, in id order
        # Any order: the rows are written where the env says they belong.
        return np.asarray(ids)

    def _write(self, rows: np.ndarray | slice, obs: Any) -> None:
        """Copy observations of the envs ``rows`` (in the order the env returned them)."""
        layout = self._layout
        for path, arr in zip(layout.paths, layout.arrays, strict=True):
            value = obs
            if layout.is_dict:
                for p in path:
                    value = value[p]
            if value.__class__ is not np.ndarray or value.dtype is not arr.dtype \
                    or value.shape[1:] != arr.shape[1:]:
                check_observation("every env", path, value, arr)
            arr[rows] = value

    def _close(self) -> None:
        self._venv.close()

