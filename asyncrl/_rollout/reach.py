"""``getattr_env`` / ``getattr_policy``: the user's env and policy, behind asyncrl's layers.

A worker steps an :class:`~asyncrl._rollout.env_pools.EnvPool` and calls its policy
through a :class:`~asyncrl._rollout.policies.PolicyAdapter`; the user asked for an
attribute of what *they* built. :func:`env_attr` looks in the user's env first
(through gymnasium wrappers, as ``Env.get_wrapper_attr`` does, and TorchRL
transforms, as ``TransformedEnv`` does), then in the pool (``num_envs``);
:func:`policy_attr` looks in the policy, then in its sub-modules (a
``ProbabilisticActor``'s ``return_log_prob`` is its last module's). A dotted
name (``"action_spec.shape"``) walks on from there with plain ``getattr``.

Across processes the value travels in a control reply, which is msgpack and
tensors, never a pickle: :func:`wire_value` turns what can travel into plain
values and refuses the rest with a ``TypeError`` that names the type and
what to ask for instead.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .env_state import chain_attr

__all__ = ["env_attr", "policy_attr", "user_env", "wire_value"]

_MISSING = object()


def user_env(pool: Any) -> Any:
    """The env the user's factory built (the pool itself when it holds none)."""
    return getattr(pool, "user_env", pool)


def env_attr(pool: Any, name: str) -> Any:
    """``name`` (maybe dotted) of the user's env inside ``pool``; AttributeError if none has it."""
    head, *rest = _split(name)
    env = user_env(pool)
    value = _gym_or_plain(env, head)
    if value is _MISSING and env is not pool:
        value = _plain_attr(pool, head)  # asyncrl's batching: num_envs
    if value is _MISSING:
        raise AttributeError(f"the env ({_describe_env(env)}) has no attribute {head!r}")
    return _walk(value, rest, name)


def policy_attr(policy: Any, name: str) -> Any:
    """``name`` (maybe dotted) of ``policy`` or, failing that, of its first sub-module with it."""
    from .policies import PolicyAdapter

    head, *rest = _split(name)
    inner = policy.policy if isinstance(policy, PolicyAdapter) else policy
    value = _plain_attr(inner, head)
    if value is _MISSING and isinstance(inner, torch.nn.Module):
        for module in inner.modules():
            if module is not inner:
                value = _plain_attr(module, head)
                if value is not _MISSING:
                    break
    if value is _MISSING:
        raise AttributeError(f"the policy ({type(inner).__name__}) and its sub-modules have "
                             f"no attribute {head!r}")
    return _walk(value, rest, name)


def wire_value(value: Any, *, what: str) -> Any:
    """``value`` as msgpack values and tensors, or a TypeError naming its type.

    Kept: None, bool, int, float, str, bytes, tensors (detached), numpy arrays,
    TensorDicts; lists, tuples (as lists) and str-keyed dicts of those. Turned
    into plain values: numpy scalars (``.item()``), ``torch.Size`` (a list),
    ``torch.dtype`` / ``torch.device`` (their str), enums (their value).
    """
    from tensordict import TensorDictBase

    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray | TensorDictBase):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, torch.dtype | torch.device):
        return str(value)
    if isinstance(value, enum.Enum):
        return wire_value(value.value, what=what)
    if isinstance(value, list | tuple):  # torch.Size too
        return [wire_value(v, what=what) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: wire_value(v, what=what) for k, v in value.items()}
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    raise TypeError(
        f"{what} is a {kind}, which cannot be sent back from a worker process: replies "
        "carry plain values (numbers, strings, lists, str-keyed dicts), tensors, numpy "
        "arrays and TensorDicts only (asyncrl never pickles). Ask for a plain part of it "
        "with a dotted name (e.g. 'action_spec.shape'), or build the env or policy in "
        "the trainer to inspect the object itself")


# -- lookups ------------------------------------------------------------------------------------
def _split(name: str) -> list[str]:
    parts = str(name).split(".")
    if not all(p.isidentifier() for p in parts):
        raise ValueError(f"expected an attribute name, maybe dotted ('action_spec.shape'), "
                         f"got {name!r}")
    return parts


def _plain_attr(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError:
        return _MISSING


def _gym_or_plain(env: Any, name: str) -> Any:
    """gymnasium's own reach first (wrappers, then the env inside), else ``getattr``.

    Only for gymnasium's types: other envs may answer any name (a TorchRL
    ParallelEnv forwards unknown attributes to its workers as method calls).
    """
    if not _is_gymnasium(env):
        return _plain_attr(env, name)
    if hasattr(env, "get_wrapper_attr"):
        try:
            return env.get_wrapper_attr(name)
        except AttributeError:
            pass
    value = _plain_attr(env, name)
    if value is _MISSING:  # a vector env's wrappers forward nothing: walk them
        value = chain_attr(env, name, _MISSING)
    if value is _MISSING and env.unwrapped is not env:
        value = _plain_attr(env.unwrapped, name)
    return value


def _is_gymnasium(env: Any) -> bool:
    try:
        import gymnasium as gym
    except ImportError:
        return False
    return isinstance(env, gym.Env | gym.vector.VectorEnv)


def _walk(value: Any, rest: list[str], name: str) -> Any:
    done = name.split(".")[0]
    for part in rest:
        try:
            value = getattr(value, part)
        except AttributeError:
            raise AttributeError(f"{done} ({type(value).__name__}) has no attribute "
                                 f"{part!r}") from None
        done += f".{part}"
    return value


def _describe_env(env: Any) -> str:
    chain = [type(env).__name__]
    inner = env
    for _ in range(16):
        # Wrappers only, by type: gymnasium's .env, TorchRL's TransformedEnv.base_env
        # (a plain getattr could reach a ParallelEnv's workers).
        if _is_gymnasium(inner) and hasattr(inner, "env"):
            inner = inner.env
        elif type(inner).__name__ == "TransformedEnv":
            inner = inner.base_env
        else:
            break
        chain.append(type(inner).__name__)
    return " -> ".join(chain)
