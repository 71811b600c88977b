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

from typing import Any

import torch

from .._protocol import Control
from .._rollout.loop import Rollout
from .._rollout.reach import env_attr, policy_attr, wire_value
from .._rollout.seeding import seed_global_rngs

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
    if isinstance(policy, torch.nn.Module):
        return {"policy_state_dict": dict(policy.state_dict())}
    return {}


def _load_state_dict(args: dict[str, Any], rollout: Rollout, policy: Any, env_pool: Any) -> Any:
    if isinstance(policy, torch.nn.Module):
        policy.load_state_dict(args["policy_state_dict"])
    return None


def _getattr_env(args: dict[str, Any], rollout: Rollout, policy: Any, env_pool: Any) -> Any:
    name = str(args["attr"])
    return wire_value(env_attr(env_pool, name), what=f"the env's {name!r}")


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
