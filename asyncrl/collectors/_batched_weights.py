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


def given_weights(policy_or_weights: Any = None, *, weights: Any = None, policy: Any = None,
                  worker_ids: Any = None, model_id: str | None = None,
                  weights_dict: dict[str, Any] | None = None) -> Any:
    """The weights of an ``update_policy_weights`` call, from TorchRL's ways to give them.

    Central inference serves one model from one copy: ``worker_ids`` and any model
    but ``"policy"`` are refused. None: the caller copies from its ``policy=``.
    """
    if worker_ids is not None:
        raise ValueError("worker_ids: central inference serves every env from one policy "
                         "copy; leave worker_ids out")
    if weights_dict is not None:
        if set(weights_dict) != {"policy"}:
            raise ValueError(f"weights_dict for models {sorted(weights_dict)}: central "
                             "inference serves one model, 'policy'")
        weights = weights_dict["policy"] if weights is None else weights
    if model_id not in (None, "policy"):
        raise ValueError(f"model_id={model_id!r}: central inference serves one model, "
                         "'policy'")
    given = [w for w in (policy_or_weights, weights, policy) if w is not None]
    if len(given) > 1:
        raise TypeError("update_policy_weights: give the weights once (positionally, "
                        "weights= or policy=), not several of them")
    return given[0] if given else None


__all__ = ["given_weights", "weight_loader"]
