"""``update_policy_weights``'s arguments, in every spelling TorchRL 0.14 accepts.

TorchRL's ``update_policy_weights_(policy_or_weights=None, *, weights=None,
policy=None, worker_ids=None, model_id=None, weights_dict=None)`` takes the
weights positionally or by one of three keywords, or several models at once;
a dict keyed by worker index gives each worker its own weights. This module
turns any of these into the list of sends a collector makes.

>>> weight_updates("w")
[WeightUpdate(model_id='policy', weights='w', worker_ids=None)]
>>> weight_updates(weights_dict={"policy": "p", "critic": "c"})[1]
WeightUpdate(model_id='critic', weights='c', worker_ids=None)
>>> weight_updates({0: "w0", 1: "w1"})[1]
WeightUpdate(model_id='policy', weights='w1', worker_ids=[1])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["WeightUpdate", "weight_updates"]


class WeightUpdate(NamedTuple):
    """One send: ``weights`` (None: the registered model's) of ``model_id`` to ``worker_ids``."""

    model_id: str
    weights: Any
    worker_ids: Any


def weight_updates(policy_or_weights: Any = None, *, weights: Any = None, policy: Any = None,
                   worker_ids: Any = None, model_id: str | None = None,
                   weights_dict: Mapping[str, Any] | None = None) -> list[WeightUpdate]:
    """The sends ``update_policy_weights(...)`` stands for; ``ValueError`` on a conflict."""
    given = [name for name, value in (("policy_or_weights", policy_or_weights),
                                      ("weights", weights), ("policy", policy))
             if value is not None]
    if len(given) > 1:
        raise ValueError(f"update_policy_weights: pass the weights once, got {' and '.join(given)}"
                         " (policy_or_weights, weights= and policy= are the same argument)")
    source = policy_or_weights if policy_or_weights is not None else (
        weights if weights is not None else policy)
    if weights_dict is not None:
        if given or model_id is not None:
            raise ValueError("update_policy_weights: weights_dict={model_id: weights} names its "
                             f"models itself; do not also pass {', '.join(given) or 'model_id'}")
        return [WeightUpdate(str(key), value, worker_ids) for key, value in weights_dict.items()]
    model_id = "policy" if model_id is None else model_id
    if _per_worker(source):
        if worker_ids is not None:
            raise ValueError("update_policy_weights: weights keyed by worker index already say "
                             "which workers get them; do not also pass worker_ids")
        return [WeightUpdate(model_id, value, [int(index)])
                for index, value in source.items()]
    return [WeightUpdate(model_id, source, worker_ids)]


def _per_worker(source: Any) -> bool:
    # TorchRL's {0: weights_0, 1: weights_1}: a plain dict keyed by ints (a state dict's
    # keys are strings, a TensorDict is not a dict).
    return (isinstance(source, dict) and bool(source)
            and all(isinstance(k, int) and not isinstance(k, bool) for k in source))
