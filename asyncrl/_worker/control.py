"""What a coordinator's control message does in a worker: seed, reset, state, attributes.

The worker's event loop decides when an operation may run (never while a batch
steps the envs, never while a weight version is being written in); this module
is what it then does, on the worker's rollout, policy and envs. Each operation
returns what goes back in the ack (plain data: it crosses the wire).

>>> run_control(Control("teleport", {}), rollout=None, policy=None, env_pool=None)
... # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: unknown control operation 'teleport'; expected one of: getattr_env, ...
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from .._protocol import Control
from .._rollout.env_state import env_roots, load_env_state, plain_stats, read_env_state
from .._rollout.loop import Rollout
from .._rollout.reach import env_attr, policy_attr, wire_value
from .._rollout.seeding import seed_global_rngs

log = logging.getLogger("asyncrl.worker")

#: Operations that read or write the policy's weights: not while a version is written in.
TOUCHES_WEIGHTS = frozenset({"state_dict", "load_state_dict", "getattr_policy"})


def run_control(control: Control, *, rollout: Rollout | None, policy: Any,
                env_pool: Any) -> Any:
    """Run ``control`` on the worker's rollout, policy and envs; return the ack's result."""
    operation = _OPERATIONS.get(control.op)
    if operation is None:
        raise ValueError(f"unknown control operation {control.op!r}; expected one of: "
                         f"{', '.join(sorted(_OPERATIONS))}")
    if rollout is None:
        raise RuntimeError(f"control operation {control.op!r} came before the worker's "
                           "rollout was built: the coordinator sends it after the welcome")
    return operation(control.args, rollout, policy, env_pool)


def _seed(args: dict[str, Any], rollout: Rollout, policy: Any, env_pool: Any) -> Any:
    seed = int(args["seed"])
    seed_global_rngs(seed)  # the policy's sampling too, as TorchRL's workers do
    return rollout.set_seed(seed, bool(args.get("static_seed", False)))


def _reset(args: dict[str, Any], rollout: Rollout, policy: Any, env_pool: Any) -> Any:
    rollout.reset(args.get("reset_idx"))
    return None


def _state_dict(args: dict[str, Any], rollout: Rollout, policy: Any, env_pool: Any) -> Any:
    """TorchRL's keys: ``policy_state_dict`` (a module's) and ``env_state_dict`` (see
    :mod:`asyncrl._rollout.env_state`; left out when no env holds any); ``env_only``:
    the env's alone."""
    state: dict[str, Any] = {}
    if isinstance(policy, torch.nn.Module) and not args.get("env_only"):
        state["policy_state_dict"] = dict(policy.state_dict())
    env_state = read_env_state(env_roots(env_pool))
    if any(env_state.values()):
        state["env_state_dict"] = env_state
    return state


def _load_state_dict(args: dict[str, Any], rollout: Rollout, policy: Any, env_pool: Any) -> Any:
    """What :func:`_state_dict` answered, or a part; ``reset_envs``: a replacement worker's
    carried state, so its envs are reset again (their first observation normalised with it)."""
    if "env_state_dict" in args:
        try:
            load_env_state(env_roots(env_pool), args["env_state_dict"])
        except ValueError as exc:
            if args.get("reset_envs"):  # nobody waits for a carry's ack: say it here too
                log.warning("the env state carried from the worker this one replaces was "
                            "not loaded: %s", exc)
            raise
        if args.get("reset_envs"):
            rollout.reset()
    if isinstance(policy, torch.nn.Module) and "policy_state_dict" in args:
        policy.load_state_dict(args["policy_state_dict"])
    return None


def _getattr_env(args: dict[str, Any], rollout: Rollout, policy: Any, env_pool: Any) -> Any:
    name = str(args["attr"])
    # A RunningMeanStd (obs_rms) travels as {"mean", "var", "count"}: no pickle on the wire.
    return wire_value(plain_stats(env_attr(env_pool, name)), what=f"the env's {name!r}")


def _getattr_policy(args: dict[str, Any], rollout: Rollout, policy: Any, env_pool: Any) -> Any:
    name = str(args["attr"])
    # policy=None: the RandomPolicy the rollout made (inside its adapter)
    stepped = policy if policy is not None else rollout.stepped_policy
    return wire_value(policy_attr(stepped, name), what=f"the policy's {name!r}")


_OPERATIONS = {
    "seed": _seed,
    "reset": _reset,
    "state_dict": _state_dict,
    "load_state_dict": _load_state_dict,
    "getattr_env": _getattr_env,
    "getattr_policy": _getattr_policy,
}

__all__ = ["TOUCHES_WEIGHTS", "run_control"]
