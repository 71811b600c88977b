"""Served modules: one copy of a module (a reward model, an encoder) for every env, synced.

A :class:`ServedModule` is hosted once per trainer (a thread of its process, or a
process of its own with ``server_backend="process"``; batched like central inference's
policy); envs in every local worker call it through
:class:`ServedReward` / :class:`ServedObservation` (gymnasium wrappers) or
:class:`ServedModuleTransform` (TorchRL's ``TransformedEnv``; needs torchrl), each
holding the module's :class:`ServedModuleHandle` (plain data). Its weights are updated
by model id through a collector (``weight_sync_schemes={name: ServedModuleScheme(served)}``,
``update_policy_weights(w, model_id=name)``), or with :meth:`ServedModule.update`.
docs/served_modules.md has the whole story.

The names that need torch are imported when first asked for: an env worker of central
inference (torch-free) imports the wrappers only.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._client import ServedModuleClient as ServedModuleClient
from ._errors import ServedModuleError as ServedModuleError
from ._errors import ServedModuleTimeout as ServedModuleTimeout
from ._errors import UnknownModelError as UnknownModelError
from ._handle import ServedModuleHandle as ServedModuleHandle

if _TYPE_CHECKING:
    from ._gym import ServedObservation as ServedObservation
    from ._gym import ServedReward as ServedReward
    from ._module import ServedModule as ServedModule
    from ._scheme import ServedModuleScheme as ServedModuleScheme
    from ._torchrl import ServedModuleTransform as ServedModuleTransform

_LAZY = {"ServedModule": "_module", "ServedModuleScheme": "_scheme",
         "ServedReward": "_gym", "ServedObservation": "_gym",
         "ServedModuleTransform": "_torchrl"}

__all__ = ["ServedModule", "ServedModuleClient", "ServedModuleError", "ServedModuleHandle",
           "ServedModuleScheme", "ServedModuleTimeout", "ServedModuleTransform",
           "ServedObservation", "ServedReward", "UnknownModelError"]


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'asyncrl.served' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
