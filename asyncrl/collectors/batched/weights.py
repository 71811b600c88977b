"""Weights into AsyncBatchedCollector's served policy: a loader run between two calls.

:class:`ServedPolicy` is the collector's face on the policy it serves (in a
thread of the trainer's process or a dedicated process): the version in use,
the server's statistics, and ``update_policy_weights``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase
from torch import nn

from ..._errors import CollectorError
from ..._inference.loop import InferenceLoop, InferenceStatistics
from .._started import Kind, Started, started_at_call

if TYPE_CHECKING:
    from transports import Hub

    from .server import InferenceProcess

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


class ServedPolicy:
    """The served policy, seen from the collector (mixed into AsyncBatchedCollector).

    >>> await collector.update_policy_weights(policy)   # doctest: +SKIP
    >>> collector.policy_version, collector.inference_statistics().calls  # doctest: +SKIP
    (1, 412)
    """

    # Set by the collector: the thread server's loop or the process's handle (one of them,
    # once open), the hub, the run's error, the trained module, and options.
    _loop: InferenceLoop | None
    _server: InferenceProcess | None
    _hub: Hub | None
    _error: BaseException | None
    _initial_version: int
    policy: Any
    #: An update started without ``await`` does not hold the next batch: its frames
    #: carry the version that chose their actions.
    sync_updates = False

    if TYPE_CHECKING:
        def _start_call(self, name: str, work: Callable[[], Any], *, before_next_batch: bool,
                        kind: Kind = "barrier", in_order: bool = True) -> Started[Any]: ...
    verbose: bool

    @property
    def policy_version(self) -> int:
        """The version of the weights the inference loop uses now."""
        if self._server is not None:
            return self._server.version
        if self._loop is None:
            return self._initial_version
        return self._loop.version

    def inference_statistics(self) -> InferenceStatistics:
        """Policy calls so far, observations served, and how many calls had each batch size.

        With ``server_backend="process"``: the process's latest report (at most 0.2 s old).
        """
        if self._server is not None:
            return self._server.statistics()
        if self._loop is None:
            return InferenceStatistics(0, 0, {})
        return self._loop.statistics()

    # The signature of the multi-process collectors (TorchRL's names, asyncrl's weights=).
    @started_at_call("update")
    async def update_policy_weights(self, policy_or_weights: Any = None, *, weights: Any = None,
                                    policy: Any = None, worker_ids: Any = None,
                                    model_id: str | None = None,
                                    weights_dict: dict[str, Any] | None = None) -> None:
        """Load new weights into the served policy between two calls; return once in use.

        The weights (positionally, or as ``weights=`` / ``policy=``, TorchRL's names):
        None (copy them from the ``policy`` given to the constructor, the one you
        train), an ``nn.Module``, a state dict, or a TensorDict of parameters
        (``TensorDict.from_module``). Every frame whose action the next calls choose
        is stamped with the new version (see :attr:`policy_version`).
        """
        weights = given_weights(policy_or_weights, weights=weights, policy=policy,
                                worker_ids=worker_ids, model_id=model_id,
                                weights_dict=weights_dict)
        if self._loop is None and self._server is None:
            raise CollectorError("update_policy_weights needs an open collector: "
                                 "use 'async with' first")
        if self._error is not None:
            raise self._error
        if weights is None:
            if not isinstance(self.policy, nn.Module):
                raise CollectorError(
                    "update_policy_weights() without weights copies them from the policy= "
                    "module given to the constructor; there is none (policy_factory or a "
                    "plain callable): pass weights= (a state dict, module or TensorDict)")
            weights = self.policy
        if self._server is not None:
            assert self._hub is not None
            version = await self._server.update(self._hub, weights)
        else:
            assert self._loop is not None
            version = await self._loop.update(weight_loader(self._server_policy_module(), weights))
        if self.verbose:
            log.info("policy version %d in use", version)

    def _server_policy_module(self) -> nn.Module:
        assert self._loop is not None
        policy = self._loop.adapter.policy
        if not isinstance(policy, nn.Module):
            raise CollectorError(f"the served policy is a {type(policy).__name__}, which has "
                                 "no weights to update (give an nn.Module)")
        return policy


__all__ = ["ServedPolicy", "given_weights", "weight_loader"]
