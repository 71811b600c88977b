"""The rollout's policy call when the policy runs off the host (``policy_device``).

Env pools write observations into host arrays; a policy on a GPU reads them
from device tensors allocated once here. Per step: one copy per observation
key host -> device, the forward on the device, and the rollout copies the
action back into its host action buffer for the envs: one synchronisation per
step. The other keys the policy writes (log-probs, distribution parameters) are
written into device twins of their batch buffers, with no synchronisation, and
copied to the host once per batch (:meth:`DevicePolicyCall.flush`). Nothing is
allocated per step. A policy on the host uses none of this: it reads the pool's
buffers themselves, with no copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

__all__ = ["DevicePolicyCall", "check_policy_device"]


class DevicePolicyCall:
    """``call(host_td) -> device_td``: the observations copied in, the policy run there.

    ``observations`` are the host tensors the env pool writes (in key order);
    :attr:`td` is the device step TensorDict the policy reads and writes, with
    :attr:`inputs` (its observation tensors) and :attr:`action` (the action
    tensor an in-place policy fills).

    >>> import torch
    >>> obs = torch.zeros(2, 3)
    >>> call = DevicePolicyCall(lambda td: td.set("action", td["observation"].sum(-1)),
    ...                         ["observation"], [obs], torch.device("cpu"),
    ...                         action=torch.zeros(2))
    >>> _ = obs.fill_(1.0)
    >>> call(None)["action"]
    tensor([3., 3.])
    """

    def __init__(self, policy: Callable[[TensorDictBase], Any], keys: Sequence[Any],
                 observations: Sequence[torch.Tensor], device: torch.device, *,
                 action: torch.Tensor) -> None:
        self.policy = policy
        self.device = device
        self.inputs = [torch.empty(t.shape, dtype=t.dtype, device=device) for t in observations]
        self.action = torch.zeros(action.shape, dtype=action.dtype, device=device)
        batch = list(observations[0].shape[:1]) if observations else [action.shape[0]]
        entries: dict[Any, torch.Tensor] = dict(zip(keys, self.inputs, strict=True))
        entries["action"] = self.action
        self.td = TensorDict(entries, batch_size=batch, device=device)
        self._copies = list(zip(self.inputs, observations, strict=True))
        self._twins: list[tuple[torch.Tensor, torch.Tensor]] = []
        # A host -> device copy from pageable memory is synchronous anyway; the action's
        # copy back (the rollout's) waits for the forward: nothing to overlap beyond that.
        self._non_blocking = device.type == "cuda"

    def twin_buffers(self, host_buffers: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Device twins of ``host_buffers`` (allocated once), copied into them by :meth:`flush`."""
        self._twins = [(host, torch.zeros(host.shape, dtype=host.dtype, device=self.device))
                       for host in host_buffers]
        return [twin for _, twin in self._twins]

    def flush(self) -> None:
        """Copy the twins into their host buffers (once per batch)."""
        for host, twin in self._twins:
            host.copy_(twin)

    def __call__(self, _host_td: Any) -> TensorDictBase:
        non_blocking = self._non_blocking
        for dst, src in self._copies:
            dst.copy_(src, non_blocking=non_blocking)
        out = self.policy(self.td)
        return self.td if out is None else out


def check_policy_device(policy: Any, device: torch.device | None) -> None:
    """A module given to a rollout must already live on ``policy_device`` (moved once)."""
    if device is None or not isinstance(policy, nn.Module):
        return
    for name, tensor in [*policy.named_parameters(), *policy.named_buffers()]:
        here = tensor.device
        if here.type != device.type or device.index not in (None, here.index):
            raise ValueError(
                f"the policy's {name!r} is on {tensor.device} but policy_device is {device}: "
                "move the policy there once before building the rollout "
                "(asyncrl._rollout.devices.place_policy; the collectors do it for you)")
