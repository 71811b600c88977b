"""``update_policy_weights(w, model_id=name)`` of a collector with no scheme for ``name``.

``AsyncBatchedCollector`` and the in-process ``Collector`` take no
``weight_sync_schemes`` for a served module; a model id (or a ``weights_dict`` key)
other than ``"policy"`` loads the weights into the :class:`~._module.ServedModule`
open in this process under that name, with the meaning a MultiCollector's
``ServedModuleScheme`` gives it (one copy for every worker: ``worker_ids`` refused;
no weights: the module's own ``module``; returns once the module's next call uses
them). What is left for the policy comes back for the collector to apply.

>>> import anyio
>>> rest = anyio.run(lambda: update_served_by_name(None, model_id="policy"))
>>> rest.model_id, rest.weights_dict                # no served module named: all the policy's
('policy', None)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._errors import UnknownModelError
from ._module import ServedModule

__all__ = ["PolicyUpdate", "update_by_name", "update_served_by_name"]


@dataclass(frozen=True)
class PolicyUpdate:
    """The arguments of an ``update_policy_weights`` call left for the policy."""

    policy_or_weights: Any = None
    weights: Any = None
    policy: Any = None
    worker_ids: Any = None
    model_id: str | None = None
    weights_dict: dict[str, Any] | None = None


async def update_served_by_name(policy_or_weights: Any = None, *, weights: Any = None,
                                policy: Any = None, worker_ids: Any = None,
                                model_id: str | None = None,
                                weights_dict: dict[str, Any] | None = None
                                ) -> PolicyUpdate | None:
    """Update the served modules an ``update_policy_weights`` call names; the rest.

    None: the call named served modules only (nothing left for the policy).
    """
    served = {k: w for k, w in (weights_dict or {}).items() if k != "policy"}
    if model_id in (None, "policy") and not served:
        return PolicyUpdate(policy_or_weights, weights, policy, worker_ids, model_id,
                            weights_dict)
    given = [name for name, value in (("policy_or_weights", policy_or_weights),
                                      ("weights", weights), ("policy", policy))
             if value is not None]
    if model_id not in (None, "policy"):
        if weights_dict is not None:
            raise TypeError("update_policy_weights: give model_id= or weights_dict=, not both")
        if len(given) > 1:
            raise TypeError("update_policy_weights: give the weights once (positionally, "
                            f"weights= or policy=), not {' and '.join(given)}")
        source = next((w for w in (policy_or_weights, weights, policy) if w is not None), None)
        await update_by_name(model_id, source, worker_ids=worker_ids)
        return None
    assert weights_dict is not None  # served is not empty
    if given:
        # Checked before any module is updated: a refused call changes nothing.
        raise TypeError("update_policy_weights: weights_dict={model_id: weights} names its "
                        f"models itself; do not also pass {' and '.join(given)}")
    for name in served:
        _named(name)  # every name open before the first update
    if worker_ids is not None:
        _one_copy(next(iter(served)))
    for name, value in served.items():
        await update_by_name(name, value)
    if "policy" not in weights_dict:
        return None
    return PolicyUpdate(worker_ids=worker_ids, model_id=model_id,
                        weights_dict={"policy": weights_dict["policy"]})


async def update_by_name(model_id: str, weights: Any, *, worker_ids: Any = None) -> int:
    """The served module open in this process under ``model_id`` loads ``weights``
    (None: its ``module``'s); its new version."""
    if worker_ids is not None:
        _one_copy(model_id)
    return await _named(model_id).update(weights)


def _one_copy(model_id: str) -> None:
    raise ValueError(f"model {model_id!r} is served once for every worker: leave "
                     "worker_ids out (there is one copy to update)")


def _named(model_id: str) -> ServedModule:
    try:
        return ServedModule.named(model_id)
    except KeyError:
        raise UnknownModelError(f"model_id={model_id!r}: this collector serves 'policy', and no "
                         f"served module is open in this process under {model_id!r} (open: "
                         f"{sorted(ServedModule._open)}); open ServedModule(..., "  # noqa: SLF001
                         f"name={model_id!r}) before updating it by model id") from None
