"""A policy that writes down where it ran (importable by worker processes)."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn


def device_code(device: torch.device) -> float:
    """0 for the CPU, 1 + index for CUDA (other kinds: -1)."""
    if device.type == "cpu":
        return 0.0
    if device.type == "cuda":
        return 1.0 + (device.index or 0)
    return -1.0


class DeviceProbe(TensorDictModuleBase):
    """Action = 1 if its parameter is positive; writes the devices it saw.

    ``("probe", "input")``: the device code of the observation it was given;
    ``("probe", "param")``: that of its parameter; ``("probe", "value")``: the
    parameter's value (weights that reached it show there).
    """

    in_keys = ["observation"]
    out_keys = ["action", ("probe", "input"), ("probe", "param"), ("probe", "value")]

    def __init__(self, value: float = 1.0) -> None:
        super().__init__()
        self.value = nn.Parameter(torch.tensor([float(value)]))

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        obs = td.get("observation")
        n = obs.shape[0]
        positive = (self.value > 0).to(torch.int64)
        td.set("action", positive.expand(n).clone())
        td.set(("probe", "input"), torch.full((n,), device_code(obs.device), device=obs.device))
        td.set(("probe", "param"),
               torch.full((n,), device_code(self.value.device), device=obs.device))
        td.set(("probe", "value"), self.value.detach().expand(n).clone())
        return td
