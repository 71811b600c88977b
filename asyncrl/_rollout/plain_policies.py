"""Plain torch policies: a module (or one of its methods) from tensors to a tensor, tuple or dict.

CleanRL's and SB3-style agents are plain ``nn.Module`` objects: CleanRL's
``Agent`` has no ``forward`` but ``get_action_and_value(x)``, which returns a
tuple ``(action, log_prob, entropy, value)``. Three collector arguments say how
to call one, and where its outputs go:

- ``policy_in_keys``: the observation keys given to it, positionally (default:
  every observation key, in the env's order);
- ``policy_out_keys``: the keys its outputs are written to (default ``("action",)``);
  a tuple output lands under them in order, a dict output under its own keys
  (only those named, when given); one of them must be ``"action"``;
- ``policy_method``: the name of the method to call instead of ``forward``.

What can be checked without running the policy fails in the collector's
constructor (`check_plain_policy`); what needs its output fails at the rollout's
first (dry) call, before any frame, with the argument that fixes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

from .keys import NestedKey, normalise_keys

__all__ = ["NestedKey", "PlainCall", "check_plain_policy", "normalise_keys", "normalise_method"]


def normalise_method(method: Any) -> str | None:
    if method is None:
        return None
    if not isinstance(method, str) or not method.isidentifier():
        raise TypeError(f"policy_method must be the name of a method of the policy (e.g. "
                        f"'get_action_and_value'), got {method!r}")
    return method


def is_plain(policy: Any, *, forced: bool = False) -> bool:
    """Called on tensors: a module that is not a TensorDict module (or any callable, if forced)."""
    if isinstance(policy, TensorDictModuleBase):
        return False
    return isinstance(policy, nn.Module) or (forced and callable(policy))


def check_plain_policy(policy: Any, *, in_keys: Any = None, out_keys: Any = None,
                       method: Any = None) -> None:
    """Refuse, with the argument that fixes it, what fails before any output is seen.

    ``policy`` None (a factory or random actions) is not checked here: the worker's
    rollout checks the policy it builds.
    """
    given = [name for name, value in (("policy_in_keys", in_keys), ("policy_out_keys", out_keys),
                                      ("policy_method", method)) if value is not None]
    if policy is None:
        return
    if isinstance(policy, TensorDictModuleBase):
        if given:
            raise TypeError(
                f"{', '.join(given)} describe how to call a plain module; "
                f"{type(policy).__name__} is a TensorDict module, which reads its own in_keys "
                "and writes its own out_keys: drop them, or pass the plain module inside")
        return
    if method is not None:
        target = getattr(policy, method, None)
        if not callable(target):
            raise ValueError(
                f"policy_method={method!r}: {type(policy).__name__} has no such method; "
                f"its methods: {', '.join(_methods(policy)) or 'none of its own'}")
        return
    if isinstance(policy, nn.Module) and type(policy).forward is nn.Module.forward:
        methods = _methods(policy)
        hint = f" (its methods: {', '.join(methods)})" if methods else ""
        example = methods[0] if methods else "get_action_and_value"
        raise TypeError(
            f"{type(policy).__name__} has no forward(){hint}: name the method that returns "
            f"the action with policy_method={example!r}, and its outputs with "
            "policy_out_keys=('action', ...) when it returns several")


def _methods(policy: Any) -> list[str]:
    """Public methods the policy's own classes define (not nn.Module's)."""
    names = []
    for cls in type(policy).__mro__:
        if cls in (nn.Module, object) or cls.__module__.startswith("torch."):
            continue
        names += [n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")]
    return sorted(set(names))


class PlainCall:
    """``td -> td`` around a plain policy: inputs from ``in_keys``, outputs to ``out_keys``.

    >>> import torch
    >>> from tensordict import TensorDict
    >>> class Agent(torch.nn.Module):
    ...     def act(self, x):
    ...         return x.sum(-1).long(), x.mean(-1)
    >>> call = PlainCall(Agent(), in_keys=("observation",), out_keys=("action", "value"),
    ...                  method="act")
    >>> td = call(TensorDict({"observation": torch.ones(2, 3)}, batch_size=[2]))
    >>> td["action"].tolist(), td["value"].tolist()
    ([3, 3], [1.0, 1.0])
    """

    def __init__(self, policy: Any, *, in_keys: Sequence[NestedKey],
                 out_keys: Sequence[NestedKey] | None = None, method: str | None = None) -> None:
        check_plain_policy(policy, method=method)
        self.policy = policy
        self.fn: Callable[..., Any] = getattr(policy, method) if method else policy
        self.in_keys = tuple(in_keys)
        #: None: not given (one tensor goes to "action"; a tuple needs names).
        self.out_keys = None if out_keys is None else tuple(out_keys)
        self._name = f"{type(policy).__name__}.{method}()" if method else type(policy).__name__
        #: Where a single tensor output goes (None: the outputs are named several keys).
        self._single: NestedKey | None = "action"
        if self.out_keys is not None:
            self._single = self.out_keys[0] if len(self.out_keys) == 1 else None

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        keys = self.in_keys
        out = self.fn(td.get(keys[0])) if len(keys) == 1 else self.fn(*[td.get(k) for k in keys])
        if isinstance(out, torch.Tensor) and self._single is not None:
            td.set(self._single, out)  # the common case first: one tensor, one key
            return td
        return self._write(td, out)

    def _write(self, td: TensorDictBase, out: Any) -> TensorDictBase:
        names = self.out_keys
        if isinstance(out, tuple | list):
            if names is None:
                raise TypeError(
                    f"{self._name} returned a {type(out).__name__} of {len(out)} outputs: name "
                    f"them, in order, with policy_out_keys=('action', ...) ({len(out)} keys; "
                    "e.g. CleanRL's get_action_and_value: ('action', 'sample_log_prob', "
                    "'entropy', 'state_value'))")
            if len(out) != len(names):
                raise ValueError(
                    f"{self._name} returned {len(out)} outputs but policy_out_keys names "
                    f"{len(names)} ({list(names)}): give one key per output, in order")
            for key, value in zip(names, out, strict=True):
                td.set(key, self._tensor(key, value))
            return td
        if isinstance(out, TensorDictBase):
            out = dict(out.items(include_nested=True, leaves_only=True))
        if isinstance(out, Mapping):
            for key in names if names is not None else list(out):
                if key not in out:
                    raise KeyError(
                        f"{self._name} returned a dict without {key!r} (its keys: "
                        f"{sorted(map(str, out.keys()))}): fix policy_out_keys")
                td.set(key, self._tensor(key, out[key]))
            return td
        if isinstance(out, torch.Tensor):
            raise ValueError(
                f"{self._name} returned one tensor but policy_out_keys names {len(names or ())} "
                f"keys ({list(names or ())}): give policy_out_keys=('action',) or return a tuple")
        raise TypeError(
            f"{self._name} returned {type(out).__name__}: a plain policy returns a tensor, a "
            "tuple of tensors (named by policy_out_keys) or a dict of tensors")

    def _tensor(self, key: NestedKey, value: Any) -> torch.Tensor:
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{self._name}'s output for {key!r} is {type(value).__name__}, not a tensor: "
                "return tensors, or leave that output out of policy_out_keys")
        return value
