"""An env's state beyond its step: wrappers' running statistics, read and written as plain data.

gymnasium's ``NormalizeObservation`` and ``NormalizeReward`` (single and vector)
learn as they step: ``obs_rms`` / ``return_rms`` (a ``RunningMeanStd``: ``mean``,
``var``, ``count``) and the running discounted return (``discounted_reward``,
the vector wrapper's ``accumulated_reward``). :func:`read_env_state` finds them
by walking each env's wrapper chain (``.env``, a ``SyncVectorEnv``'s ``.envs``),
looking only at what each object holds itself (never through a forwarding
``__getattr__``); an env or wrapper that defines ``state_dict()`` /
``load_state_dict()`` (TorchRL's transformed envs do) has those used instead.

The state is plain data (msgpack and arrays, never a pickle), one entry per env
of the pool and per wrapper, keyed by depth and class::

    {"env0": {"0.NormalizeReward": {"return_rms": {"mean": ..., "var": ..., "count": ...},
                                    "discounted_reward": array([...])},
              "1.NormalizeObservation": {"obs_rms": {"mean": ..., "var": ..., "count": ...}}}}

:func:`load_env_state` writes such a state back, or any part of it (what is
named is written, the rest stays). An env in an ``AsyncVectorEnv``'s processes
is out of reach: put the wrapper around the vector env (gymnasium.wrappers.vector).

>>> import gymnasium as gym
>>> from gymnasium.wrappers import NormalizeObservation
>>> env = NormalizeObservation(gym.make("Pendulum-v1"))
>>> sorted(read_env_state([env])["env0"])
['0.NormalizeObservation']
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["OBS_STATS", "chain_attr", "env_roots", "is_running_stats", "load_env_state",
           "plain_stats", "read_env_state", "stats_of"]

#: The running-statistics attribute ``sync_env_statistics`` merges across workers.
OBS_STATS = "obs_rms"
_STATS_FIELDS = ("mean", "var", "count")
#: NormalizeReward's running discounted return (gymnasium's single-env / vector wrapper).
_ACCUMULATORS = ("discounted_reward", "accumulated_reward")
_MAX_DEPTH = 32


def env_roots(pool: Any) -> list[Any]:
    """The envs the user's factory built that ``pool`` steps (one, or one per env)."""
    roots = getattr(pool, "user_envs", None)
    if roots is not None:
        return list(roots)
    return [getattr(pool, "user_env", pool)]


def chain_attr(root: Any, name: str, default: Any = None) -> Any:
    """``name`` held by ``root`` or by an env inside it (``.env``), outermost first.

    What gymnasium's ``get_wrapper_attr`` does for single envs, for vector wrappers
    too (``NormalizeReward(NormalizeObservation(venv))``'s ``obs_rms``)."""
    for _, obj in _chain(root):
        own = getattr(obj, "__dict__", {})
        if name in own:
            return own[name]
        if not isinstance(inspect.getattr_static(obj, name, _ABSENT), _Absent):
            return getattr(obj, name)
    return default


class _Absent:
    pass


_ABSENT = _Absent()


def is_running_stats(value: Any) -> bool:
    """A ``RunningMeanStd``-like object: ``mean``, ``var`` and ``count`` of its own."""
    own = getattr(value, "__dict__", None)
    return isinstance(own, dict) and all(name in own for name in _STATS_FIELDS)


def stats_of(value: Any) -> dict[str, Any]:
    """A ``RunningMeanStd``-like object as ``{"mean": array, "var": array, "count": float}``."""
    return {"mean": np.array(value.mean, copy=True), "var": np.array(value.var, copy=True),
            "count": float(value.count)}


def plain_stats(value: Any) -> Any:
    """``value`` with every ``RunningMeanStd``-like object in it turned into :func:`stats_of`."""
    if is_running_stats(value):
        return stats_of(value)
    if isinstance(value, Mapping):
        return {k: plain_stats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_stats(v) for v in value]
    return value


def read_env_state(roots: Sequence[Any]) -> dict[str, Any]:
    """``{"env<i>": {wrapper key: its state}}`` for the envs in ``roots`` (see the module)."""
    return {f"env{i}": {key: state for key, obj in _chain(root) if (state := _state_of(obj))}
            for i, root in enumerate(roots)}


def load_env_state(roots: Sequence[Any], state: Any) -> None:
    """Write ``state`` (all of :func:`read_env_state`'s answer, or a part) into ``roots``.

    Raises ``ValueError`` naming what does not fit (an env or wrapper that is not
    there, a field of another shape) before anything is written.
    """
    if not isinstance(state, Mapping):
        raise ValueError(f"an env state is a dict {{'env0': {{...}}, ...}}, got "
                         f"{type(state).__name__}")
    writes = [write for env_key, wrappers in state.items()
              for write in _planned(roots, env_key, wrappers)]
    for write in writes:
        write()


# -- the wrapper chain ---------------------------------------------------------------------------
def _chain(root: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(key, object)`` for ``root`` and each env inside it, outermost first."""
    obj: Any = root
    for depth in range(_MAX_DEPTH):
        key = f"{prefix}{depth}.{type(obj).__name__}"
        yield key, obj
        own = getattr(obj, "__dict__", {})
        subs = own.get("envs")
        if isinstance(subs, list) and "env" not in own:  # a SyncVectorEnv's own envs
            for i, sub in enumerate(subs):
                yield from _chain(sub, f"{key}/{i}/")
            return
        obj = own.get("env")
        if obj is None or isinstance(obj, str):
            return


def _own_hooks(obj: Any) -> bool:
    # getattr_static: a wrapper that forwards unknown names must not lend its env's hooks
    return all(callable(inspect.getattr_static(obj, name, None))
               for name in ("state_dict", "load_state_dict"))


def _state_of(obj: Any) -> dict[str, Any]:
    if _own_hooks(obj):
        return {"state_dict": plain_stats(dict(obj.state_dict()))}
    own = getattr(obj, "__dict__", {})
    found: dict[str, Any] = {name: stats_of(value) for name, value in own.items()
                             if is_running_stats(value)}
    for name in _ACCUMULATORS:
        if isinstance(own.get(name), np.ndarray | float | int):
            found[name] = np.array(own[name], copy=True)
    return found


# -- writing ---------------------------------------------------------------------------------------
def _planned(roots: Sequence[Any], env_key: Any, wrappers: Any) -> list[Any]:
    """The writes ``wrappers`` asks of env ``env_key``, every one checked first."""
    index = _env_index(env_key, len(roots))
    if not isinstance(wrappers, Mapping):
        raise ValueError(f"the state of {env_key} is a dict {{wrapper key: state}}, got "
                         f"{type(wrappers).__name__}")
    chain = dict(_chain(roots[index]))
    writes = []
    for key, fields in wrappers.items():
        obj = chain.get(key)
        if obj is None:
            raise ValueError(f"{env_key} has no wrapper {key!r} to load state into; its "
                             f"chain is: {', '.join(chain)}. Load a state read from envs "
                             "built the same way")
        if not isinstance(fields, Mapping):
            raise ValueError(f"the state of {env_key}'s {key!r} is a dict, got "
                             f"{type(fields).__name__}")
        writes += [_field_write(obj, f"{env_key}'s {key!r}", name, value)
                   for name, value in fields.items()]
    return writes


def _env_index(env_key: Any, count: int) -> int:
    text = str(env_key)
    if not (text.startswith("env") and text[3:].isdigit() and int(text[3:]) < count):
        raise ValueError(f"an env state's keys are 'env0'..'env{count - 1}' (this worker "
                         f"steps {count} env(s)), got {env_key!r}")
    return int(text[3:])


def _field_write(obj: Any, where: str, name: str, value: Any) -> Any:
    if name == "state_dict" and _own_hooks(obj):
        return lambda: obj.load_state_dict(value)
    current = getattr(obj, "__dict__", {}).get(name)
    if is_running_stats(current):
        fields = _checked_stats(current, value, f"{where}.{name}")
        return lambda: _assign_stats(current, fields)
    if name in _ACCUMULATORS and current is not None:
        array = _same_shape(np.asarray(current), value, f"{where}.{name}")
        return lambda: setattr(obj, name, array)
    raise ValueError(f"{where} has no running statistics or state named {name!r}")


def _checked_stats(current: Any, value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping) or set(value) != set(_STATS_FIELDS):
        raise ValueError(f"{what} takes a dict with keys mean, var, count, got {value!r:.200}")
    count = value["count"]
    if not isinstance(count, int | float) or not count >= 0:
        raise ValueError(f"{what}'s count must be a number >= 0, got {count!r:.80}")
    mean = _same_shape(np.asarray(current.mean), value["mean"], f"{what}.mean")
    var = _same_shape(np.asarray(current.var), value["var"], f"{what}.var")
    # A NaN here would normalise every later observation to NaN: refused, as the trainer's
    # merge refuses it (asyncrl.collectors._env_statistics).
    if not (np.isfinite(mean).all() and np.isfinite(var).all() and np.isfinite(count)) \
            or (var < 0).any():
        raise ValueError(f"{what} must be finite, with a variance >= 0 and a finite count, "
                         f"got mean {mean!r:.120}, var {var!r:.120}, count {count!r:.40}")
    return {"mean": mean, "var": var, "count": float(count)}


def _assign_stats(current: Any, fields: dict[str, Any]) -> None:
    for name, value in fields.items():
        setattr(current, name, value)


def _same_shape(current: np.ndarray, value: Any, what: str) -> np.ndarray:
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if array.shape != current.shape or array.dtype.kind not in "fiu":
        raise ValueError(f"{what} must be numbers of shape {current.shape}, got "
                         f"{array.dtype} of shape {array.shape}")
    return array.astype(current.dtype, copy=True)
