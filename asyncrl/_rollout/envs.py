"""`make_env_pool`: what a user gives, turned into an `EnvPool`.

A gymnasium id, an import path ``"pkg.mod:factory"``, a factory, a gymnasium
env or vector env, or a torchrl env: each is detected here and handed to the
pool that steps it fastest (`asyncrl._rollout.gym_pools`, `asyncrl._rollout.env_id_pools`,
`asyncrl._rollout.torchrl_pools`; what they share is in `asyncrl._rollout.env_pools`).
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .env_id_pools import EnvIdVectorPool, is_env_id_vector_env
from .env_pools import EnvPool, check_action_dtype
from .env_specs import ArraySpec, EnvSpecs
from .gym_pools import GymEnvListPool, GymVectorPool

__all__ = ["ArraySpec", "EnvPool", "EnvSpecs", "check_action_dtype", "make_env_pool",
           "resolve_import_path"]


_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def resolve_import_path(path: str) -> Any:
    """``"pkg.mod:attr.sub"`` -> the object; a clear ``ValueError`` when it does not resolve."""
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"expected an import path 'package.module:name', got {path!r}")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} of {path!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attr_path!r}") from None
    return target


def _resolve_import_path(path: str) -> Callable[..., Any]:
    obj = resolve_import_path(path)
    if not callable(obj):
        raise ValueError(f"env factory {path!r} is not callable ({type(obj).__name__})")
    return obj  # type: ignore[no-any-return]


def _gym_make(env_id: str, kwargs: Mapping[str, Any]) -> Any:
    import gymnasium as gym

    try:
        return gym.make(env_id, **kwargs)
    except gym.error.Error as exc:
        raise ValueError(f"cannot make gymnasium env {env_id!r}: {exc}") from exc


def _is_torchrl_env(obj: object) -> bool:
    if "torchrl" not in sys.modules:
        return False  # no object can be a torchrl env before torchrl is imported (2 s saved)
    try:
        from torchrl.envs import EnvBase
    except ImportError:
        return False
    return isinstance(obj, EnvBase)


def _torchrl_pool(env: Any, factory: Callable[[], Any] | None, num_envs: int) -> EnvPool:
    if factory is not None and num_envs > 1 and tuple(env.batch_size) == ():
        from torchrl.envs import SerialEnv

        env.close()
        env = SerialEnv(num_envs, factory)
    from .torchrl_fast import torchrl_env_pool  # the fast path when the env allows it

    return torchrl_env_pool(env)


def _autoreset_mode(venv: Any) -> str:
    """The name of a vector env's autoreset mode (gymnasium's default: NEXT_STEP)."""
    mode = getattr(venv, "metadata", None) or {}
    mode = mode.get("autoreset_mode", "NEXT_STEP") if isinstance(mode, dict) else "NEXT_STEP"
    return str(getattr(mode, "name", mode)).upper().replace("_", "")  # "SameStep" too


def _pool_from_object(
    first: Any,
    make_more: Callable[[], Any] | None,
    num_envs: int,
    factory: Callable[[], Any] | None,
) -> EnvPool:
    import gymnasium as gym
    from gymnasium.vector import SyncVectorEnv, VectorEnv

    if is_env_id_vector_env(first) and _autoreset_mode(first) != "SAMESTEP":
        return EnvIdVectorPool(first)  # EnvPool: steps and resets envs by id
    if isinstance(first, VectorEnv):
        if first.unwrapped is first and isinstance(first, SyncVectorEnv):
            # A bare SyncVectorEnv holds plain envs: loop over them ourselves (faster,
            # and its autoreset mode no longer matters since we never call its step).
            return GymEnvListPool(list(first.envs), owner=first)
        return GymVectorPool(first)
    if isinstance(first, gym.Env):
        envs = [first]
        try:
            while len(envs) < num_envs:
                if make_more is None:
                    raise ValueError(
                        f"num_envs={num_envs} needs a factory, got one env instance: pass "
                        "a callable or a gymnasium id"
                    )
                env = make_more()
                if not isinstance(env, gym.Env):
                    raise TypeError(
                        f"env factory returned {type(env).__name__}, not a gymnasium.Env"
                    )
                envs.append(env)
            return GymEnvListPool(envs)
        except BaseException:
            for env in envs:
                env.close()
            raise
    if _is_torchrl_env(first):
        return _torchrl_pool(first, factory, num_envs)
    raise TypeError(
        f"cannot build an env pool from {type(first).__name__}: expected a gymnasium.Env, a "
        "gymnasium.vector.VectorEnv or a torchrl EnvBase"
    )


def make_env_pool(
    create_env_fn: str | Callable[..., Any] | Any,
    *,
    create_env_kwargs: Mapping[str, Any] | None = None,
    num_envs: int = 1,
) -> EnvPool:
    """Build an `EnvPool` of ``num_envs`` envs.

    ``create_env_fn`` may be a gymnasium id (``"CartPole-v1"``), an import path
    ``"pkg.mod:factory"``, a callable returning a ``gymnasium.Env`` (called
    ``num_envs`` times) or a ``gymnasium.vector.VectorEnv`` (its ``num_envs``
    wins), a ``VectorEnv`` instance (any autoreset mode; EnvPool's
    ``make_gymnasium`` too, see `EnvIdVectorPool`), or a torchrl ``EnvBase`` (instance or
    factory; slower, see `TorchRLPool`).

    >>> pool = make_env_pool("CartPole-v1", num_envs=4)
    >>> pool.num_envs, pool.specs.action.n
    (4, 2)
    >>> pool.close()
    """
    if isinstance(create_env_fn, EnvPool):
        return create_env_fn
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
    if create_env_kwargs is not None and not isinstance(create_env_kwargs, Mapping):
        raise TypeError(
            f"create_env_kwargs must be a dict of keyword arguments, got "
            f"{type(create_env_kwargs).__name__}; a list of one dict per worker is for "
            "MultiSyncCollector / MultiAsyncCollector")
    kwargs = dict(create_env_kwargs or {})
    if isinstance(create_env_fn, str):
        if _IMPORT_PATH.match(create_env_fn):
            create_env_fn = _resolve_import_path(create_env_fn)
        else:
            # Also covers gymnasium's own "module:EnvId-v0" form (not an identifier).
            env_id = create_env_fn
            first = _gym_make(env_id, kwargs)
            return _pool_from_object(first, lambda: _gym_make(env_id, kwargs), num_envs, None)
    if not callable(create_env_fn) or _is_torchrl_env(create_env_fn):
        return _pool_from_object(create_env_fn, None, num_envs, None)
    fn = create_env_fn

    def factory() -> Any:
        return fn(**kwargs)

    return _pool_from_object(factory(), factory, num_envs, factory)
