"""The six rollout options of TorchRL's collectors, as one object checked once.

``max_frames_per_traj``, ``reset_at_each_iter``, ``reset_when_done``,
``set_truncated``, ``exploration_type`` and ``storing_device`` are collector
arguments (TorchRL's names) that only the rollout reads. A collector builds one
:class:`RolloutOptions` from them in its constructor, so a wrong value fails
there, in the trainer, rather than in every worker; the object then travels as
it is: ``WorkerSpec.rollout`` -> the worker -> ``Rollout(options=...)``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import torch

from ._policies import ExplorationType, resolve_exploration_type

__all__ = ["RolloutOptions"]


@dataclass(frozen=True)
class RolloutOptions:
    """How a rollout steps its envs and stores its frames (TorchRL's meanings).

    Values are normalised once, here, so every reader sees one spelling:
    ``max_frames_per_traj`` <= 0 (TorchRL's -1) becomes None (no limit),
    ``exploration_type`` an ``ExplorationType`` (or None: leave the caller's
    context as it is), ``storing_device`` a ``torch.device`` or None.

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
        set_(self, "storing_device", _device(self.storing_device))


def _frames_limit(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"max_frames_per_traj must be an int (-1 or None: no limit), got "
                        f"{type(value).__name__} {value!r}")
    limit = int(value)
    return limit if limit > 0 else None  # TorchRL spells "no limit" -1


def _device(value: Any) -> torch.device | None:
    if value is None or isinstance(value, torch.device):
        return value
    try:
        return torch.device(value)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"storing_device must be a torch.device or a device name such as "
                         f"'cpu' or 'cuda:0', got {value!r} ({exc})") from None
