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

from importlib import metadata as _metadata

from ._errors import AsyncRLError as AsyncRLError
from ._errors import BadBatchError as BadBatchError
from ._errors import CollectorError as CollectorError
from ._errors import WorkerLostError as WorkerLostError
from ._policies import RandomPolicy as RandomPolicy
from .collectors import AsyncBatchedCollector as AsyncBatchedCollector
from .collectors import BlockingCollector as BlockingCollector
from .collectors import Collector as Collector
from .collectors import MultiAsyncCollector as MultiAsyncCollector
from .collectors import MultiCollector as MultiCollector
from .collectors import MultiSyncCollector as MultiSyncCollector
from .collectors import WorkerStatistics as WorkerStatistics

try:
    __version__ = _metadata.version("asyncrl")
except _metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "AsyncBatchedCollector",
    "AsyncRLError",
    "BadBatchError",
    "BlockingCollector",
    "Collector",
    "CollectorError",
    "MultiAsyncCollector",
    "MultiCollector",
    "MultiSyncCollector",
    "RandomPolicy",
    "WorkerLostError",
    "WorkerStatistics",
    "__version__",
]
