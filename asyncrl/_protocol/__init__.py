"""Every asyncrl message, typed and validated.

Coordinator <-> worker and coordinator <-> relay messages, the meta of a
weight message and the acks it gets (from a worker, or from a relay for its
members). Each message is a small dataclass; ``to_body()`` gives the msgpack
body sent with ``kind=<KIND>`` (``to_meta()`` for :class:`WeightMeta`);
``from_body()`` validates a body that came from the network, raises
:class:`transports.ProtocolError` naming the bad field, and makes every text
in it printable (see :mod:`transports._printable`), so that nothing a peer
sends reaches a log, an event or a metric label raw.

By concept: :mod:`.admission` (hello, welcome, refuse, rejoin, leaving, a
relay's hello), :mod:`.collection` (collect, preempt, batch, error, control),
:mod:`.logs` (forwarded log records), :mod:`.progress` (a collecting worker's
step count), :mod:`.shared_batches` (a local worker's batches in shared memory),
:mod:`.weights` (weight meta, chunks and acks), :mod:`.central_inference` (an env
worker's layout, welcome, observations, actions and chunks: AsyncBatchedCollector),
:mod:`.served` (a served module's route, calls and answers over a remote worker's link),
:mod:`.fields`, the validators they share, and :mod:`.decoding`, where a body becomes
a message or a ProtocolError.
In a torch-free process (an env worker of central inference:
``transports.TORCH_FREE``) the collection messages, which carry TensorDicts, are absent.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from transports import TORCH_FREE as _TORCH_FREE

from .admission import MAX_REASON as MAX_REASON
from .admission import PROTOCOL as PROTOCOL
from .admission import Closing as Closing
from .admission import Hello as Hello
from .admission import Leaving as Leaving
from .admission import Refuse as Refuse
from .admission import Rejoin as Rejoin
from .admission import RelayHello as RelayHello
from .admission import RelayWelcome as RelayWelcome
from .admission import Role as Role
from .admission import Welcome as Welcome
from .central_inference import Actions as Actions
from .central_inference import EnvChunk as EnvChunk
from .central_inference import EnvClose as EnvClose
from .central_inference import EnvLayout as EnvLayout
from .central_inference import EnvWelcome as EnvWelcome
from .central_inference import Observations as Observations
from .served import ServedAnswer as ServedAnswer
from .served import ServedCall as ServedCall
from .served import ServedRoute as ServedRoute

if _TYPE_CHECKING or not _TORCH_FREE:  # (batches are TensorDicts: not in an env worker)
    from .collection import Batch as Batch
    from .collection import Collect as Collect
    from .collection import Control as Control
    from .collection import ErrorReport as ErrorReport
    from .collection import Preempt as Preempt
    from .compact_frames import compact as compact
    from .compact_frames import drop_twins as drop_twins
    from .compact_frames import rebuild as rebuild
else:

    def __getattr__(name: str) -> object:
        # An env that imports torch-side asyncrl (asyncrl.testing's envs) gets them here.
        import importlib

        for module in (".collection", ".compact_frames"):
            value = getattr(importlib.import_module(module, __name__), name, __getattr__)
            if value is not __getattr__:
                return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

from .decoding import decode as decode
from .fields import MAX_KEY as MAX_KEY
from .fields import MAX_MODEL_ID as MAX_MODEL_ID
from .fields import MAX_RELAY_MEMBERS as MAX_RELAY_MEMBERS
from .logs import MAX_LOG_LOGGER as MAX_LOG_LOGGER
from .logs import MAX_LOG_MESSAGE as MAX_LOG_MESSAGE
from .logs import MAX_LOG_RECORDS as MAX_LOG_RECORDS
from .logs import MAX_LOG_TRACEBACK as MAX_LOG_TRACEBACK
from .logs import LogEntry as LogEntry
from .logs import WorkerLog as WorkerLog
from .progress import Progress as Progress
from .shared_batches import BatchSlots as BatchSlots
from .shared_batches import SharedBatch as SharedBatch
from .weights import CHUNK as CHUNK
from .weights import MAX_CHUNK_PARTS as MAX_CHUNK_PARTS
from .weights import MAX_CHUNKS as MAX_CHUNKS
from .weights import MAX_INSTANCE as MAX_INSTANCE
from .weights import MAX_LAYOUT_KEYS as MAX_LAYOUT_KEYS
from .weights import RELAY_TO as RELAY_TO
from .weights import WEIGHTS_KIND as WEIGHTS_KIND
from .weights import RelayAck as RelayAck
from .weights import RelayAttached as RelayAttached
from .weights import WeightChunk as WeightChunk
from .weights import WeightMeta as WeightMeta
from .weights import WeightsApplied as WeightsApplied

__all__ = [
    "CHUNK",
    "MAX_CHUNKS",
    "MAX_CHUNK_PARTS",
    "MAX_INSTANCE",
    "MAX_KEY",
    "MAX_LAYOUT_KEYS",
    "MAX_LOG_LOGGER",
    "MAX_LOG_MESSAGE",
    "MAX_LOG_RECORDS",
    "MAX_LOG_TRACEBACK",
    "MAX_MODEL_ID",
    "MAX_REASON",
    "MAX_RELAY_MEMBERS",
    "PROTOCOL",
    "RELAY_TO",
    "WEIGHTS_KIND",
    "Actions",
    "Batch",
    "BatchSlots",
    "Closing",
    "Collect",
    "Control",
    "EnvChunk",
    "EnvClose",
    "EnvLayout",
    "EnvWelcome",
    "ErrorReport",
    "Hello",
    "Leaving",
    "LogEntry",
    "Observations",
    "Preempt",
    "Progress",
    "Refuse",
    "Rejoin",
    "RelayAck",
    "RelayAttached",
    "RelayHello",
    "RelayWelcome",
    "Role",
    "ServedAnswer",
    "ServedCall",
    "ServedRoute",
    "SharedBatch",
    "WeightChunk",
    "WeightMeta",
    "WeightsApplied",
    "Welcome",
    "WorkerLog",
    "compact",
    "decode",
    "drop_twins",
    "rebuild",
]
