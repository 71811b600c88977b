"""Weights into AsyncBatchedCollector's served policy: a loader run between two calls.

:class:`ServedWeights` is what the collector's ``policy_version``,
``inference_statistics()`` and ``update_policy_weights`` ask, whichever
:class:`~.policy_server.PolicyServer` serves; :func:`weight_loader` is how either
server copies weights into its module; :func:`given_weights` reads TorchRL's ways
to give them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from .._errors import CollectorError
from .inference_loop import InferenceStatistics
from .policy_server import PolicyServer

log = logging.getLogger("asyncrl.collectors")


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


class ServedWeights:
    """The served policy's weights, seen from the collector: the version, updates, statistics.

    The collector owns one; its :class:`~.policy_server.PolicyServer` is set once open.

    >>> weights = ServedWeights(version=3, verbose=False)
    >>> weights.version, weights.statistics().calls
    (3, 0)
    """

    def __init__(self, *, version: int, verbose: bool) -> None:
        self.initial_version = version
        self.verbose = verbose
        #: The server, once the collector is open (it stays set after close).
        self.server: PolicyServer | None = None

    @property
    def version(self) -> int:
        """The version of the weights the inference loop uses now."""
        return self.initial_version if self.server is None else self.server.version

    def statistics(self) -> InferenceStatistics:
        """Policy calls so far, observations served, and how many calls had each batch size."""
        return InferenceStatistics(0, 0, {}) if self.server is None else self.server.statistics()

    async def update(self, weights: Any, *, trained: Any,
                     run_error: BaseException | None) -> int:
        """Load ``weights`` (None: those of ``trained``, the module the user trains) into the
        served policy between two calls; the new version, once in use. ``run_error``:
        the error that stopped the run, if any (raised instead)."""
        if self.server is None:
            raise CollectorError("update_policy_weights needs an open collector: "
                                 "use 'async with' first")
        if run_error is not None:
            raise run_error
        if weights is None:
            if not isinstance(trained, nn.Module):
                raise CollectorError(
                    "update_policy_weights() without weights copies them from the policy= "
                    "module given to the constructor; there is none (policy_factory or a "
                    "plain callable): pass weights= (a state dict, module or TensorDict)")
            weights = trained
        version = await self.server.update(weights)
        if self.verbose:
            log.info("policy version %d in use", version)
        return version


__all__ = ["ServedWeights", "given_weights", "weight_loader"]
