"""Collectors: in-process, multi-process sync (on-policy) and async (off-policy)."""

from .._statistics import WorkerStatistics as WorkerStatistics
from ._base import BaseCollector as BaseCollector
from ._batched import AsyncBatchedCollector as AsyncBatchedCollector
from ._blocking import BlockingCollector as BlockingCollector
from ._inprocess import Collector as Collector
from ._multi import MultiAsyncCollector as MultiAsyncCollector
from ._multi import MultiCollector as MultiCollector
from ._multi import MultiSyncCollector as MultiSyncCollector
from ._operations import Pausing as Pausing
from ._single_async import AsyncCollector as AsyncCollector
from ._started import Started as Started
from ._torchrl_habits import NoLengthError as NoLengthError

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
    "WorkerStatistics",
]
