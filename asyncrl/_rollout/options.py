"""The rollout options of TorchRL's collectors, as one object checked once.

``max_frames_per_traj``, ``reset_at_each_iter``, ``reset_when_done``,
``set_truncated``, ``exploration_type`` and the devices (``policy_device``,
``env_device``, ``storing_device``, resolved by
:class:`~asyncrl._rollout.devices.DeviceLayout`) are collector arguments (TorchRL's
names) that only the rollout reads; so are ``policy_in_keys``, ``policy_out_keys``
and ``policy_method``, how to call a plain torch module, and ``info_keys``. A collector builds one
:class:`RolloutOptions` from them in its constructor, so a wrong value fails
there, in the trainer, rather than in every worker; the object then travels as
it is: ``WorkerSpec.rollout`` -> the worker -> ``Rollout(options=...)``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .devices import DeviceLayout, check_device
from .infos import normalise_info_keys
from .plain_policies import NestedKey, normalise_keys, normalise_method
from .policies import ExplorationType, resolve_exploration_type

__all__ = ["RolloutOptions"]


@dataclass(frozen=True)
class RolloutOptions:
    """How a rollout steps its envs and stores its frames (TorchRL's meanings).

    Values are normalised once, here, so every reader sees one spelling:
    ``max_frames_per_traj`` <= 0 (TorchRL's -1) becomes None (no limit),
    ``exploration_type`` an ``ExplorationType`` (or None: leave the caller's
    context as it is), each device a ``torch.device`` this machine has, or None.

    >>> options = RolloutOptions(max_frames_per_traj=-1, exploration_type="mode",
    ...                          storing_device="cpu")
    >>> options.max_frames_per_traj, options.exploration_type.name, options.storing_device
    (None, 'MODE', device(type='cpu'))
    >>> RolloutOptions(reset_when_done=False)
    Traceback (most recent call last):
    ...
    ValueError: reset_when_done=False is not supported: ...
    """

    max_frames_per_traj: int | None = None
    reset_at_each_iter: bool = False
    reset_when_done: bool = True
    set_truncated: bool = False
    #: Also given as a name (``"random"``, ``"MODE"``): resolved to the member.
    exploration_type: ExplorationType | None = ExplorationType.RANDOM
    #: Also given as a device name (``"cpu"``, ``"cuda:0"``): made a ``torch.device``.
    storing_device: torch.device | None = None
    #: Where the policy runs: observations are moved there, actions back (None: the host).
    policy_device: torch.device | None = None
    #: Where env outputs live: the host, or the policy's device (see ``DeviceLayout``).
    env_device: torch.device | None = None
    #: How to call a plain module (see `asyncrl._rollout.plain_policies`): the observation
    #: keys it takes, the keys its outputs go to, the method called instead of forward.
    policy_in_keys: Sequence[NestedKey] | None = None  # normalised to a tuple
    policy_out_keys: Sequence[NestedKey] | None = None  # normalised to a tuple
    policy_method: str | None = None
    #: Info entries that go into the batch under ``"next"`` (see `asyncrl._rollout.infos`):
    #: keys, or ``{key: spec}``; normalised to ``((path, spec or None), ...)``.
    info_keys: Any = None

    def __post_init__(self) -> None:
        if not self.reset_when_done:
            raise ValueError(
                "reset_when_done=False is not supported: gymnasium envs must be reset once "
                "an episode ends, so the rollout always resets finished envs"
            )
        # Frozen: the normalised values are written past the dataclass's guard.
        set_ = object.__setattr__
        set_(self, "max_frames_per_traj", _frames_limit(self.max_frames_per_traj))
        set_(self, "exploration_type", resolve_exploration_type(self.exploration_type))
        for name in ("policy_in_keys", "policy_out_keys"):
            set_(self, name, normalise_keys(name, getattr(self, name)))
        set_(self, "policy_method", normalise_method(self.policy_method))
        set_(self, "info_keys", normalise_info_keys(self.info_keys))
        for name in ("storing_device", "policy_device", "env_device"):
            set_(self, name, check_device(name, getattr(self, name)))

    @property
    def devices(self) -> DeviceLayout:
        """The three devices as one :class:`~asyncrl._rollout.devices.DeviceLayout`."""
        return DeviceLayout(self.policy_device, self.env_device, self.storing_device)


def _frames_limit(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"max_frames_per_traj must be an int (-1 or None: no limit), got "
                        f"{type(value).__name__} {value!r}")
    limit = int(value)
    return limit if limit > 0 else None  # TorchRL spells "no limit" -1

