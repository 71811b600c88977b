"""Collectors: in-process, multi-process sync (on-policy) and async (off-policy).

Every name here is also on :mod:`asyncrl` (the same object): import from either.
"""

from .._errors import NoLengthError as NoLengthError
from .._observe.statistics import WorkerStatistics as WorkerStatistics
from ._base import BaseCollector as BaseCollector
from ._blocking import BlockingCollector as BlockingCollector
from ._inprocess import Collector as Collector
from ._operations import Pausing as Pausing
from ._started import Started as Started
from ._update_ratio import UpdateRatio as UpdateRatio
from .batched.collector import AsyncBatchedCollector as AsyncBatchedCollector
from .multi.collector import MultiAsyncCollector as MultiAsyncCollector
from .multi.collector import MultiCollector as MultiCollector
from .multi.collector import MultiSyncCollector as MultiSyncCollector
from .multi.single import AsyncCollector as AsyncCollector

__all__ = [
    "AsyncBatchedCollector",
    "AsyncCollector",
    "BaseCollector",
    "BlockingCollector",
    "Collector",
    "MultiAsyncCollector",
    "MultiCollector",
    "MultiSyncCollector",
    "NoLengthError",
    "Pausing",
    "Started",
    "UpdateRatio",
    "WorkerStatistics",
]
