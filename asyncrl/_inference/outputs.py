"""What the served policy writes: its outputs' layout, found by calling it once.

Central inference serves a policy it did not write: before any env worker asks, the
policy is called once on one observation (:func:`discover_outputs`) and what it wrote
(``action``, and every other key: log-probs, values, distribution parameters) becomes
the :class:`OutputLayout` that answer blocks, chunks and batches are laid out by. A
policy that writes a reserved key, a batch-less value, or float actions for an env
that takes integers is refused here, naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict

from .._rollout.policies import PolicyAdapter

__all__ = ["OutputLayout", "discover_outputs", "key_of"]

Path = tuple[str, ...]
#: Root keys of TorchRL's batch layout that the collector writes: a policy must not.
_RESERVED_ROOT = frozenset({"action", "done", "terminated", "truncated", "next", "collector"})


@dataclass
class OutputLayout:
    """What the policy writes for a batch of ``n``: ``action`` and the extras, per row."""

    action: tuple[torch.dtype, tuple[int, ...]]
    extras: list[tuple[Path, torch.dtype, tuple[int, ...]]] = field(default_factory=list)

    def block_tensors(self, rows: int) -> dict[str, torch.Tensor]:
        dtype, shape = self.action
        out = {"action": torch.zeros((rows, *shape), dtype=dtype)}
        for j, (_, dt, sh) in enumerate(self.extras):
            out[f"x{j}"] = torch.zeros((rows, *sh), dtype=dt)
        return out


def key_of(path: Path) -> Any:
    """A key path as TensorDict takes it: a string for a root key, else the tuple."""
    return path[0] if len(path) == 1 else path


def discover_outputs(adapter: PolicyAdapter, obs: dict[Path, torch.Tensor],
                     action: tuple[torch.dtype, tuple[int, ...]]) -> OutputLayout:
    """Call the policy once on ``obs`` (batch of 1): which keys, shapes and dtypes does it write?"""
    td = TensorDict({key_of(p): v for p, v in obs.items()}, batch_size=[1])
    with adapter.exploration():
        td = adapter(td)
    dtype, shape = action
    got = td.get("action", None)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (1, *shape):
        raise ValueError(f"the policy must write 'action' of shape (batch, *{shape}); for a "
                         f"batch of 1 it wrote {None if got is None else tuple(got.shape)}")
    if got.dtype.is_floating_point and not dtype.is_floating_point:
        raise ValueError(f"the policy writes {got.dtype} actions, the env takes {dtype}: "
                         "round or sample integer actions in the policy (never cast silently)")
    extras = []
    for key in td.keys(include_nested=True, leaves_only=True):
        path = (key,) if isinstance(key, str) else tuple(key)
        if path in obs or path == ("action",):
            continue
        if path[0] in _RESERVED_ROOT:
            raise ValueError(f"the policy wrote the reserved key {path!r}")
        value = td.get(key)
        if not isinstance(value, torch.Tensor) or value.shape[:1] != (1,):
            raise ValueError(f"the policy wrote {path!r} as {type(value).__name__}: expected a "
                             "tensor with the batch as its first dimension")
        extras.append((path, value.dtype, tuple(value.shape[1:])))
    return OutputLayout(action=action, extras=extras)
