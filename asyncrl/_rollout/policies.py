"""Policies as the rollout sees them: one calling convention on a reused step TensorDict.

- `RandomPolicy`: uniform actions from a numpy Generator, allocation-free when
  the TensorDict already holds an ``"action"`` entry of the right shape.
- `PolicyAdapter`: wraps a plain ``nn.Module`` (observation tensor(s) in,
  action tensor out), a ``TensorDictModuleBase`` or any ``td -> td`` callable,
  and owns the exploration type and ``no_grad`` context set once per batch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType as ExplorationType
from tensordict.nn import set_interaction_type as set_exploration_type
from torch import nn

from .env_specs import ArraySpec, array_spec_from_space
from .plain_policies import PlainCall, check_plain_policy, is_plain
from .td_module_direct import direct_call

__all__ = [
    "ExplorationType",
    "PolicyAdapter",
    "RandomPolicy",
    "resolve_exploration_type",
    "torch_dtype",
]

# Pre-drawn sample blocks: up to this many calls, and this many numbers, at once.
_BLOCK_CALLS = 256
_BLOCK_ITEMS = 1 << 16

ExplorationLike: TypeAlias = ExplorationType | str | None
NestedKey: TypeAlias = str | tuple[str, ...]


def torch_dtype(numpy_name: str) -> torch.dtype:
    """The torch dtype of a numpy dtype name (``"float32"`` -> ``torch.float32``)."""
    return torch.from_numpy(np.empty(0, dtype=numpy_name)).dtype


def resolve_exploration_type(value: ExplorationLike) -> ExplorationType | None:
    """``ExplorationType``, its name or value (any case), or None (leave as is)."""
    if value is None or isinstance(value, ExplorationType):
        return value
    if isinstance(value, str):
        for member in ExplorationType:
            if value.lower() in (member.name.lower(), str(member.value).lower()):
                return member
    names = ", ".join(m.name for m in ExplorationType)
    raise ValueError(
        f"exploration_type must be an ExplorationType or one of {names}; got {value!r}"
    )


class RandomPolicy:
    """Uniform random actions: ``td -> td`` writing ``"action"``.

    Discrete / MultiDiscrete / MultiBinary: uniform over the valid integers.
    One-hot (TorchRL's ``OneHot``): a uniform category, one-hot on the last dim.
    Box: uniform over ``low..high``, standard normal on unbounded dims (then
    clipped to a one-sided bound). When ``td`` already holds an ``"action"``
    tensor of the right shape and dtype on CPU it is filled in place, with no
    allocation; otherwise a new tensor is set.

    >>> import gymnasium as gym, torch
    >>> from tensordict import TensorDict
    >>> policy = RandomPolicy(gym.spaces.Discrete(3), seed=0)
    >>> td = policy(TensorDict({"observation": torch.zeros(4, 2)}, batch_size=[4]))
    >>> td["action"].shape, td["action"].dtype
    (torch.Size([4]), torch.int64)
    >>> bool(((td["action"] >= 0) & (td["action"] < 3)).all())
    True
    """

    def __init__(
        self,
        action_spec: ArraySpec | Any,
        *,
        seed: int | None = None,
        action_key: NestedKey = "action",
    ) -> None:
        self.spec = (
            action_spec
            if isinstance(action_spec, ArraySpec)
            else array_spec_from_space(action_spec)
        )
        self.action_key = action_key
        self._rng = np.random.default_rng(seed)
        self._dtype = np.dtype(self.spec.dtype)
        self._torch_dtype = torch_dtype(self.spec.dtype)
        self._integer = self._dtype.kind in "biu"
        low, high = self.spec.bounds()
        shape = self.spec.shape
        if self._integer:
            if low is None or high is None:
                raise ValueError(f"integer action spec needs finite low/high bounds: {self.spec}")
            # floor(low + u * span) hits low..high; a scalar when uniform (faster ufuncs).
            self._low: np.ndarray | float = _scalar_if_uniform(low)
            self._span: np.ndarray | float = _scalar_if_uniform(high - low + 1.0)
            # The float->int cast truncates, which is floor for non-negative values.
            self._need_floor = bool(low.min(initial=0.0) < 0)
            self._need_add = bool(np.any(low != 0))
        else:
            self._low = np.full(shape, -np.inf) if low is None else low
            high_arr = np.full(shape, np.inf) if high is None else high
            self._finite = np.isfinite(self._low) & np.isfinite(high_arr)
            self._span = np.where(self._finite, high_arr - self._low, 0.0)
            self._high = high_arr
            self._all_finite = bool(self._finite.all())
            self._any_finite = bool(self._finite.any())
            self._clip = bool(np.isfinite(self._low).any() or np.isfinite(high_arr).any())
        self._block: np.ndarray | None = None  # pre-drawn samples, one row per call
        self._block_pos = 0
        self._dest: torch.Tensor | None = None
        self._dest_np: np.ndarray | None = None

    def set_seed(self, seed: int | None) -> None:
        self._rng = np.random.default_rng(seed)
        self._block = None  # samples drawn with the old generator are dropped

    def sample_into(self, out: np.ndarray) -> None:
        """Fill ``out`` (shape ``(*batch, *spec.shape)``, any strides) with random actions.

        Samples are drawn in blocks of many calls at once (one vectorised draw
        instead of several small ufunc calls per step), then handed out in order:
        the same seed gives the same sequence for the same ``out`` shape.
        """
        block = self._block
        if block is None or block.shape[1:] != out.shape or self._block_pos == len(block):
            block = self._refill(out.shape)
        np.copyto(out, block[self._block_pos], casting="unsafe")
        self._block_pos += 1

    def _refill(self, shape: tuple[int, ...]) -> np.ndarray:
        count = max(1, min(_BLOCK_CALLS, _BLOCK_ITEMS // max(1, math.prod(shape))))
        if self.spec.one_hot:
            categories = shape[-1]
            picks = self._rng.integers(0, categories, size=(count, *shape[:-1]))
            self._block = np.eye(categories, dtype=self._dtype)[picks]
            self._block_pos = 0
            return self._block
        scratch = np.empty((count, *shape), dtype=np.float64)
        rng = self._rng
        if self._integer:
            rng.random(out=scratch)
            np.multiply(scratch, self._span, out=scratch)
            if self._need_add:
                np.add(scratch, self._low, out=scratch)
            if self._need_floor:
                np.floor(scratch, out=scratch)
        elif self._all_finite:
            rng.random(out=scratch)
            np.multiply(scratch, self._span, out=scratch)
            np.add(scratch, self._low, out=scratch)
        else:
            rng.standard_normal(out=scratch)
            if self._any_finite:
                uniform = np.empty_like(scratch)
                rng.random(out=uniform)
                np.multiply(uniform, self._span, out=uniform)
                np.add(uniform, self._low, out=uniform)
                np.copyto(scratch, uniform, where=np.broadcast_to(self._finite, scratch.shape))
            if self._clip:
                np.clip(scratch, self._low, self._high, out=scratch)
        self._block = scratch.astype(self._dtype, casting="unsafe")
        self._block_pos = 0
        return self._block

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        dest = td.get(self.action_key, None)
        if dest is not None and dest is self._dest:
            assert self._dest_np is not None
            self.sample_into(self._dest_np)
            return td
        shape = (*td.batch_size, *self.spec.shape)
        if (
            isinstance(dest, torch.Tensor)
            and dest.shape == shape
            and dest.dtype == self._torch_dtype
            and dest.device.type == "cpu"
            and not dest.requires_grad
        ):
            # Remember the tensor and its numpy view: the rollout's step td keeps
            # the same "action" tensor, so later calls allocate nothing.
            self._dest, self._dest_np = dest, dest.numpy()
            self.sample_into(self._dest_np)
            return td
        action = torch.empty(shape, dtype=self._torch_dtype)
        self.sample_into(action.numpy())
        td.set(self.action_key, action.to(td.device) if td.device is not None else action)
        return td

    def __repr__(self) -> str:
        return f"RandomPolicy({self.spec})"


def _scalar_if_uniform(a: np.ndarray) -> np.ndarray | float:
    flat = a.reshape(-1)
    return float(flat[0]) if flat.size and np.all(flat == flat[0]) else a


class PolicyAdapter:
    """One calling convention for every kind of policy: ``adapter(td) -> td``.

    - a `RandomPolicy` or any ``td -> td`` callable (including
      ``TensorDictModuleBase``): called on the step TensorDict; it writes
      ``"action"`` and possibly more keys (log-probs, ``"loc"``, ...);
    - an ``nn.Module`` that is not a TensorDict module: called on the
      observation tensor(s) (positionally, in observation-key order); its
      result is written to ``"action"``; ``in_keys``, ``out_keys`` and ``method``
      (the collectors' ``policy_in_keys``, ``policy_out_keys``, ``policy_method``)
      say otherwise: see `asyncrl._rollout.plain_policies`;
    - None: a `RandomPolicy` over ``action_spec``.

    Calls run under ``exploration()``, which the rollout enters once per batch.

    >>> import torch
    >>> from tensordict import TensorDict
    >>> adapter = PolicyAdapter(torch.nn.Linear(4, 2), exploration_type="deterministic")
    >>> td = TensorDict({"observation": torch.zeros(3, 4)}, batch_size=[3])
    >>> with adapter.exploration():
    ...     adapter(td)["action"].shape
    torch.Size([3, 2])
    """

    def __init__(
        self,
        policy: Callable[..., Any] | nn.Module | None,
        *,
        action_spec: ArraySpec | None = None,
        exploration_type: ExplorationLike = ExplorationType.RANDOM,
        observation_keys: Sequence[NestedKey] = ("observation",),
        action_key: NestedKey = "action",
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        method: str | None = None,
    ) -> None:
        if policy is None:
            if action_spec is None:
                raise ValueError("policy=None needs an action_spec to build a RandomPolicy")
            policy = RandomPolicy(action_spec, action_key=action_key)
        if not callable(policy):
            raise TypeError(f"policy must be callable, got {type(policy).__name__}")
        self.policy = policy
        self.exploration_type = resolve_exploration_type(exploration_type)
        self.observation_keys = tuple(observation_keys)
        self.action_key = action_key
        # A plain module maps tensors to tensors; everything else speaks TensorDict
        # (a plain callable too, unless keys or a method say how to call it).
        described = (in_keys, out_keys, method) != (None, None, None)
        self.takes_tensors = is_plain(policy, forced=described)
        check_plain_policy(policy, in_keys=in_keys, out_keys=out_keys, method=method)
        self.is_random = isinstance(policy, RandomPolicy)
        #: How a plain policy is called: observation tensors in, outputs to their keys.
        self._plain: PlainCall | None = None
        self._described = described or action_key != "action"
        if self.takes_tensors:
            keys = tuple(in_keys) if in_keys is not None else self.observation_keys
            missing = [k for k in keys if k not in self.observation_keys]
            if missing:
                raise ValueError(
                    f"policy_in_keys names {missing}, which the env does not observe: its "
                    f"observation keys are {list(self.observation_keys)}")
            self._plain = PlainCall(policy, in_keys=keys, method=method,
                                    out_keys=out_keys if out_keys is not None else
                                    None if action_key == "action" else (action_key,))
        # A plain TensorDictModule is called without tensordict's per-call machinery
        # (several times the cost of a small network; see _td_module_direct).
        self._direct = direct_call(policy)

    @contextlib.contextmanager
    def exploration(self) -> Iterator[None]:
        """``no_grad`` plus the exploration type: enter once per batch, not per step."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            if self.exploration_type is not None:
                stack.enter_context(set_exploration_type(self.exploration_type))
            yield

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        if self._plain is not None:
            return self._plain(td)
        if self._direct is not None:
            return self._direct(td)
        out = self.policy(td)
        if out is not td and out is not None:
            # A policy that returns a new TensorDict: bring its entries back.
            td.update(out)
        return td

    def tensor_call(self, output_key: NestedKey = "action"
                    ) -> Callable[[torch.Tensor], Any] | None:
        """``f(observation) -> output`` without a TensorDict, where the policy allows it.

        For a policy that reads one observation and writes only ``output_key``: a
        plain ``nn.Module`` (``self.policy`` itself) or a plain ``TensorDictModule``
        of one in and one out key (its network). ``f`` returns None when this call
        must take the TensorDict path (a hook was added to the module since). None
        for any other policy. The central inference loop calls it per batch: a
        TensorDict per call costs as much as a small network (``benchmarks/LOG.md``).
        """
        if len(self.observation_keys) != 1 or self.action_key != output_key \
                or self._described:
            return None
        if self.takes_tensors:
            return self.policy
        direct = self._direct
        if direct is None or direct._single != (self.observation_keys[0], output_key):
            return None
        net = direct.net

        def call(observation: torch.Tensor) -> Any:
            if direct.bypassed:
                return None
            out = net(observation)
            return out if isinstance(out, torch.Tensor) else direct.outputs(out)[0]

        return call

    def __repr__(self) -> str:
        return f"PolicyAdapter({self.policy!r}, exploration_type={self.exploration_type})"
