"""asyncrl: async-first, ZeroMQ-based experience collection for reinforcement learning.

>>> import asyncrl
>>> async def main():                                              # doctest: +SKIP
...     async with asyncrl.MultiSyncCollector("CartPole-v1", num_workers=2,
...                                           frames_per_batch=1000, total_frames=10_000) as c:
...         async for batch in c:
...             ...
"""

from ._errors import AsyncRLError as AsyncRLError
from ._errors import CollectorError as CollectorError
from ._errors import WorkerLostError as WorkerLostError
from ._policies import RandomPolicy as RandomPolicy
from .collectors import BlockingCollector as BlockingCollector
from .collectors import Collector as Collector
from .collectors import MultiAsyncCollector as MultiAsyncCollector
from .collectors import MultiCollector as MultiCollector
from .collectors import MultiSyncCollector as MultiSyncCollector

__version__ = "0.1.0"
