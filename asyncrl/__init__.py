"""asyncrl: async-first, ZeroMQ-based experience collection for reinforcement learning.

This module is the public face: the collectors (every name of
:mod:`asyncrl.collectors`, the same objects), their errors (one tree under
:class:`AsyncRLError`; the wire's errors a user catches, ``RemoteError``,
``PeerLostError``..., are asyncrl's subclasses of the :mod:`transports` classes
of the same name), the random policy, and served modules (one copy of a reward
model or encoder for every env: :mod:`asyncrl.served`). Weight sync lives in
:mod:`asyncrl.weights`, test doubles in :mod:`asyncrl.testing`; every other
module is private (``asyncrl._name``).

>>> import asyncrl
>>> async def main():                                              # doctest: +SKIP
...     async with asyncrl.MultiSyncCollector("CartPole-v1", num_workers=2,
...                                           frames_per_batch=1000, total_frames=10_000) as c:
...         async for batch in c:
...             ...
"""

import logging as _logging
from importlib import metadata as _metadata
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._spawn.torch_free import torch_free_process as _torch_free_process

# A torch-free process (an env worker of central inference: asyncrl._spawn.torch_free)
# imports the public face only when a name of it is asked for.
_TORCH_FREE = _torch_free_process()

if _TYPE_CHECKING or not _TORCH_FREE:
    from ._errors import AsyncRLError as AsyncRLError
    from ._errors import BadBatchError as BadBatchError
    from ._errors import CollectorError as CollectorError
    from ._errors import CollectorStopped as CollectorStopped
    from ._errors import NoLengthError as NoLengthError
    from ._errors import PeerLostError as PeerLostError
    from ._errors import ProtocolError as ProtocolError
    from ._errors import RefusedError as RefusedError
    from ._errors import RemoteError as RemoteError
    from ._errors import SpecMismatchError as SpecMismatchError
    from ._errors import TransportError as TransportError
    from ._errors import WorkerExit as WorkerExit
    from ._errors import WorkerLostError as WorkerLostError
    from ._observe.events import CollectorEvent as CollectorEvent
    from ._observe.events import EventStream as EventStream
    from ._observe.progress import Progress as Progress
    from ._observe.statistics import CollectorState as CollectorState
    from ._observe.statistics import CollectorStatistics as CollectorStatistics
    from ._observe.statistics import WorkerState as WorkerState
    from ._observe.statistics import WorkerStatistics as WorkerStatistics
    from ._rollout.policies import RandomPolicy as RandomPolicy
    from .collectors import AsyncBatchedCollector as AsyncBatchedCollector
    from .collectors import AsyncCollector as AsyncCollector
    from .collectors import BaseCollector as BaseCollector
    from .collectors import BlockingCollector as BlockingCollector
    from .collectors import Collector as Collector
    from .collectors import MultiAsyncCollector as MultiAsyncCollector
    from .collectors import MultiCollector as MultiCollector
    from .collectors import MultiSyncCollector as MultiSyncCollector
    from .collectors import Pausing as Pausing
    from .collectors import Started as Started
    from .collectors import UpdateRatio as UpdateRatio
    from .served import ServedModule as ServedModule
    from .served import ServedModuleError as ServedModuleError
    from .served import ServedModuleTimeout as ServedModuleTimeout
    from .served import ServedObservation as ServedObservation
    from .served import ServedReward as ServedReward

    # registers the "served" weight-sync scheme (TorchRL's RayModuleTransformScheme's)
    from .served._scheme import ServedModuleScheme as _ServedModuleScheme  # noqa: F401
else:
    _FACE = ("._errors", "._observe.events", "._observe.progress", "._observe.statistics",
             "._rollout.policies", ".collectors", ".served")

    def __getattr__(name: str) -> _Any:
        import importlib

        if name in __all__:
            for module in _FACE:
                value = getattr(importlib.import_module(module, __name__), name, _FACE)
                if value is not _FACE:
                    globals()[name] = value
                    return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# A library never configures logging: the application does (see docs/service.md).
_logging.getLogger("asyncrl").addHandler(_logging.NullHandler())

try:
    __version__ = _metadata.version("asyncrl")
except _metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "AsyncBatchedCollector",
    "AsyncCollector",
    "AsyncRLError",
    "BadBatchError",
    "BaseCollector",
    "BlockingCollector",
    "Collector",
    "CollectorError",
    "CollectorEvent",
    "CollectorState",
    "CollectorStatistics",
    "CollectorStopped",
    "EventStream",
    "MultiAsyncCollector",
    "MultiCollector",
    "MultiSyncCollector",
    "NoLengthError",
    "Pausing",
    "PeerLostError",
    "Progress",
    "ProtocolError",
    "RandomPolicy",
    "RefusedError",
    "RemoteError",
    "ServedModule",
    "ServedModuleError",
    "ServedModuleTimeout",
    "ServedObservation",
    "ServedReward",
    "SpecMismatchError",
    "Started",
    "TransportError",
    "UpdateRatio",
    "WorkerExit",
    "WorkerLostError",
    "WorkerState",
    "WorkerStatistics",
    "__version__",
]

from ._spawn import early as _early  # noqa: E402

# Last: the fork server forked now starts with all of the above imported (torch,
# tensordict, asyncrl: pages shared with this process, not imported twice) and imports
# the rest of what workers need while this process goes on (ASYNCRL_EARLY_FORK_SERVER=0
# turns it off; when it is safe: there). A torch-free process has nothing to share.
if not _TORCH_FREE:
    _early.start_early_fork_server()
