"""asyncrl: async-first, ZeroMQ-based experience collection for reinforcement learning.

This module is the public face: the collectors, their errors and the random
policy. Weight sync lives in :mod:`asyncrl.weights`, test doubles in
:mod:`asyncrl.testing`; every other module is private (``asyncrl._name``).

>>> import asyncrl
>>> async def main():                                              # doctest: +SKIP
...     async with asyncrl.MultiSyncCollector("CartPole-v1", num_workers=2,
...                                           frames_per_batch=1000, total_frames=10_000) as c:
...         async for batch in c:
...             ...
"""

import logging as _logging
from importlib import metadata as _metadata

from ._errors import AsyncRLError as AsyncRLError
from ._errors import BadBatchError as BadBatchError
from ._errors import CollectorError as CollectorError
from ._errors import CollectorStopped as CollectorStopped
from ._errors import WorkerLostError as WorkerLostError
from ._events import CollectorEvent as CollectorEvent
from ._events import EventStream as EventStream
from ._policies import RandomPolicy as RandomPolicy
from ._progress import Progress as Progress
from ._statistics import CollectorStatistics as CollectorStatistics
from ._statistics import WorkerState as WorkerState
from ._statistics import WorkerStatistics as WorkerStatistics
from ._utd import UpdateRatio as UpdateRatio
from .collectors import AsyncBatchedCollector as AsyncBatchedCollector
from .collectors import AsyncCollector as AsyncCollector
from .collectors import BlockingCollector as BlockingCollector
from .collectors import Collector as Collector
from .collectors import MultiAsyncCollector as MultiAsyncCollector
from .collectors import MultiCollector as MultiCollector
from .collectors import MultiSyncCollector as MultiSyncCollector

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
    "BlockingCollector",
    "Collector",
    "CollectorError",
    "CollectorEvent",
    "CollectorStatistics",
    "CollectorStopped",
    "EventStream",
    "MultiAsyncCollector",
    "MultiCollector",
    "MultiSyncCollector",
    "Progress",
    "RandomPolicy",
    "UpdateRatio",
    "WorkerLostError",
    "WorkerState",
    "WorkerStatistics",
    "__version__",
]
