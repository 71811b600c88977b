"""Weights into AsyncBatchedCollector's served policy: a loader run between two calls."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn


def weight_loader(target: nn.Module, weights: Any) -> Callable[[], None]:
    """A function copying ``weights`` into ``target`` in place (run between two calls)."""
    if isinstance(weights, nn.Module):
        source = weights

        def load_module() -> None:
            with torch.no_grad():
                target.load_state_dict(source.state_dict())

        return load_module
    if isinstance(weights, TensorDictBase):
        params = weights

        def load_td() -> None:
            from tensordict import TensorDict

            with torch.no_grad():  # copied in place: the served module never shares memory
                TensorDict.from_module(target).update_(params)
        return load_td
    if isinstance(weights, Mapping):
        state = weights

        def load_state() -> None:
            with torch.no_grad():
                target.load_state_dict(state)
        return load_state
    raise TypeError(f"weights must be None, an nn.Module, a state dict or a TensorDict, got "
                    f"{type(weights).__name__}")


__all__ = ["weight_loader"]
