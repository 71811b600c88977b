"""TorchRL's weight-sync scheme objects, translated to asyncrl's where the meaning is the same.

A script ported from TorchRL passes ``weight_sync_schemes={"policy":
MultiProcessWeightSyncScheme()}``. asyncrl has its own schemes (they must
survive a network and report versions); this module maps TorchRL's objects to
them by class name, without importing torchrl (an optional dependency):

==================================  =============================================
TorchRL 0.14                        asyncrl
==================================  =============================================
``MultiProcessWeightSyncScheme``    :class:`ZmqWeightSyncScheme` (same strategy)
``SharedMemWeightSyncScheme``       :class:`SharedMemWeightSyncScheme` (same strategy)
``NoWeightSyncScheme``              :class:`NoWeightSyncScheme`
``DistributedWeightSyncScheme``     :class:`DistributedWeightSyncScheme` (same backend)
``RayWeightSyncScheme`` (gloo)      :class:`RayWeightSyncScheme` (same strategy; with
                                    ``backend="nccl"`` refused, naming the
                                    :class:`DistributedWeightSyncScheme`)
``RayModuleTransformScheme``        ``asyncrl.served.ServedModuleScheme`` (the module
                                    served once by the trainer, found by model id;
                                    one bound to TorchRL's ``RayModuleTransform`` refused,
                                    naming ``ServedModuleTransform``)
``RPCWeightSyncScheme``             refused: :class:`ZmqWeightSyncScheme` crosses hosts
==================================  =============================================

``sync=False`` (TorchRL: do not wait for the workers) is refused: asyncrl's
``update_policy_weights()`` waits for every worker's ack; ``weight_sender()
.send_async()`` is the call that does not. ``per_worker_weights=True`` is
refused too: use ``update_policy_weights(weights, worker_ids=[i])``.

>>> class MultiProcessWeightSyncScheme:  # stands in for TorchRL's class
...     __module__ = "torchrl.weight_update._mp"
...     strategy_str, sync = "state_dict", True
>>> from_torchrl_scheme("policy", MultiProcessWeightSyncScheme())
ZmqWeightSyncScheme()
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._distributed import DistributedWeightSyncScheme
from ._no_weights import NoWeightSyncScheme
from ._ray import RayWeightSyncScheme
from ._scheme import WeightSyncScheme
from ._shared_memory import SharedMemWeightSyncScheme
from ._zmq import ZmqWeightSyncScheme

__all__ = ["as_weight_sync_schemes", "from_torchrl_scheme"]

_TRANSLATED: dict[str, type[WeightSyncScheme]] = {
    "MultiProcessWeightSyncScheme": ZmqWeightSyncScheme,
    "SharedMemWeightSyncScheme": SharedMemWeightSyncScheme,
    "NoWeightSyncScheme": NoWeightSyncScheme,
    "DistributedWeightSyncScheme": DistributedWeightSyncScheme,
    "RayWeightSyncScheme": RayWeightSyncScheme,
}

_ACROSS_HOSTS = ("RPCWeightSyncScheme",)
#: TorchRL's scheme for a module served by a Ray actor: asyncrl's served module's scheme
#: (registered by ``asyncrl.served``, a floor above: found by its registered name).
_SERVED = "RayModuleTransformScheme"


def as_weight_sync_schemes(schemes: Mapping[str, Any] | None) -> dict[str, WeightSyncScheme]:
    """``{model_id: scheme}`` with TorchRL's scheme objects replaced by asyncrl's.

    Raises ``TypeError`` for anything that is not a scheme, and for TorchRL
    schemes without an asyncrl equivalent, naming the one to use.
    """
    if schemes is None:
        return {}
    if not isinstance(schemes, Mapping):
        raise TypeError("weight_sync_schemes must be a dict {model_id: scheme}, e.g. "
                        f"{{'policy': ZmqWeightSyncScheme()}}; got {type(schemes).__name__}")
    out: dict[str, WeightSyncScheme] = {}
    for model_id, scheme in schemes.items():
        if not isinstance(model_id, str):
            raise TypeError(f"weight_sync_schemes keys are model ids (str, e.g. 'policy'), "
                            f"got {model_id!r}")
        out[model_id] = (scheme if isinstance(scheme, WeightSyncScheme)
                         else from_torchrl_scheme(model_id, scheme))
    return out


def from_torchrl_scheme(model_id: str, scheme: Any) -> WeightSyncScheme:
    """asyncrl's scheme with the meaning of TorchRL's ``scheme``, or a ``TypeError``."""
    names = [cls.__name__ for cls in type(scheme).__mro__
             if (cls.__module__ or "").startswith("torchrl.")]
    where = f"weight_sync_schemes[{model_id!r}]"
    if not names:
        raise TypeError(f"{where} must be a weight-sync scheme (asyncrl.weights."
                        "ZmqWeightSyncScheme(), SharedMemWeightSyncScheme() or "
                        f"NoWeightSyncScheme(), or TorchRL's equivalent); got "
                        f"{type(scheme).__name__}")
    if names[0] != type(scheme).__name__:
        raise TypeError(f"{where}: {type(scheme).__name__} extends TorchRL's {names[0]}; "
                        "asyncrl translates TorchRL's own schemes only, not their subclasses' "
                        "code: subclass asyncrl.weights.ZmqWeightSyncScheme (or "
                        "SharedMemWeightSyncScheme) instead")
    # The most derived class TorchRL gave it decides (TorchRL's MultiProcess scheme
    # derives from its SharedMem one: their meanings differ).
    name = next((n for n in names if n in _TRANSLATED or n in _ACROSS_HOSTS or n == _SERVED),
                names[0])
    if name == _SERVED:
        return _served_scheme(where, scheme)
    if name in _ACROSS_HOSTS:
        raise TypeError(f"{where}: TorchRL's {name} has no asyncrl counterpart; asyncrl's "
                        "ZmqWeightSyncScheme() already reaches workers on other hosts "
                        "(from asyncrl.weights)")
    translated = _TRANSLATED.get(name)
    if translated is None:
        raise TypeError(f"{where}: TorchRL's {name} has no asyncrl counterpart; use "
                        "asyncrl.weights.ZmqWeightSyncScheme() (any host), "
                        "SharedMemWeightSyncScheme() (one host) or NoWeightSyncScheme()")
    strategy = _strategy(scheme)
    _refuse_options(where, name, scheme)
    if translated is DistributedWeightSyncScheme:
        # TorchRL's `timeout` bounds its store (an hour by default); ours bounds each
        # broadcast, so it keeps its own default: a hung worker is named within a minute.
        backend = getattr(scheme, "backend", "gloo")
        return DistributedWeightSyncScheme(strategy, backend=backend)
    if translated is RayWeightSyncScheme and getattr(scheme, "_backend", "gloo") != "gloo":
        # TorchRL's Ray scheme is a torch.distributed group among Ray actors; ours moves
        # CPU bytes through the object store: NCCL between GPUs is the distributed scheme.
        raise TypeError(f"{where}: TorchRL's RayWeightSyncScheme(backend="
                        f"{scheme._backend!r}) broadcasts between GPUs; use asyncrl.weights."
                        f"DistributedWeightSyncScheme(backend={scheme._backend!r}) (Ray's "
                        "object store, RayWeightSyncScheme(), holds CPU bytes)")
    return translated(strategy)


def _served_scheme(where: str, scheme: Any) -> WeightSyncScheme:
    """TorchRL's ``RayModuleTransformScheme`` as asyncrl's ``ServedModuleScheme``."""
    if getattr(scheme, "_ray_transform", None) is not None:
        raise TypeError(f"{where}: this RayModuleTransformScheme is bound to TorchRL's "
                        "RayModuleTransform (a Ray actor that asyncrl does not drive); serve "
                        "the module with asyncrl.ServedModule and call it through "
                        "asyncrl.served.ServedModuleTransform(served.handle) (or "
                        "asyncrl.ServedReward for gymnasium), then pass "
                        "RayModuleTransformScheme() unbound or ServedModuleScheme(served)")
    _refuse_options(where, "RayModuleTransformScheme", scheme)
    try:  # the backend is how TorchRL moves bytes to its actor: none move here
        return WeightSyncScheme.from_config({"scheme": "served", "strategy": _strategy(scheme)})
    except ValueError:
        raise TypeError(f"{where}: TorchRL's RayModuleTransformScheme translates to "
                        "asyncrl.served.ServedModuleScheme; import asyncrl.served (or asyncrl) "
                        "first") from None


def _strategy(scheme: Any) -> Any:
    strategy = getattr(scheme, "strategy_str", None)
    if strategy is None:  # a WeightStrategy object: its format
        strategy = getattr(getattr(scheme, "strategy", None), "extract_as", "tensordict")
    if strategy not in ("tensordict", "state_dict"):
        raise TypeError(f"TorchRL scheme {type(scheme).__name__} has strategy {strategy!r}; "
                        "asyncrl knows 'tensordict' and 'state_dict'")
    return strategy


def _refuse_options(where: str, name: str, scheme: Any) -> None:
    if getattr(scheme, "sync", True) is False:
        raise TypeError(f"{where}: TorchRL's {name}(sync=False) is not supported: asyncrl's "
                        "update_policy_weights() waits for every worker's ack; to send without "
                        "waiting use collector.weight_sender().send_async(...) with "
                        "sync left at True")
    if getattr(scheme, "per_worker_weights", False):
        raise TypeError(f"{where}: TorchRL's {name}(per_worker_weights=True) is not "
                        "supported: send one worker its own weights with "
                        "update_policy_weights(weights, worker_ids=[i])")
